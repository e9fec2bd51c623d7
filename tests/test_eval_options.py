"""eval.run's options as a dataclass: the flags are its fields, validation names the flag."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from eval.evaluation.options import OVERRIDE_FIELDS, EvalOptions, add_option_args, flag_of
from eval.evaluation.slots import EvalInputError
from eval.run import _parser

REQUIRED = dict(split="bundled", n=1, out="ev", model="m")


def test_every_field_is_a_flag_with_its_default_and_help():
    ap = _parser()
    actions = {a.dest: a for a in ap._actions}
    for f in dataclasses.fields(EvalOptions):
        a = actions[f.name]
        assert flag_of(f.name) in a.option_strings, f.name
        assert a.default == f.default, f.name
        assert a.help == f.metadata["help"] and a.help, f.name
    assert actions["chat_template"].option_strings == ["--chat-template", "--chat_template"]
    assert actions["use_vllm"].nargs == 0  # a switch
    # the fields' bounds are the flags' types (sandbox.bounds): converted and checked
    assert actions["n"].type("3") == 3 and actions["temperature"].type("0.5") == 0.5
    assert (actions["n"].type.kind, actions["temperature"].type.kind) == ("int", "float")


def test_options_from_parsed_flags():
    args = _parser().parse_args(["--model", "m", "--split", "s", "--n", "3", "--out", "o",
                                 "--max-new-tokens", "48", "--use-vllm", "--batch-size", "1"])
    o = EvalOptions.from_args(args)
    assert (o.model, o.split, o.n, o.out, o.batch_size, o.use_vllm) == ("m", "s", 3, "o", 1, True)
    # None settings are the run's defaults; the vLLM engine is bound (other samples)
    assert o.overrides == {"max_new_tokens": 48, "engine": "vllm"}
    assert dataclasses.replace(o, use_vllm=False).overrides == {"max_new_tokens": 48}
    assert set(OVERRIDE_FIELDS) <= {f.name for f in dataclasses.fields(EvalOptions)}


@pytest.mark.parametrize("change, message", [
    ({"split": None, "out": None}, r"^missing --split, --out \(or use --replay RESULTS\)"),
    ({"n": 0}, r"^--n: must be an int >= 1, got 0"),
    ({"n": 1.5}, r"^--n: must be an int >= 1"),
    ({"concurrency": 0}, r"^--concurrency: must be >= 1, got 0"),
    ({"batch_size": 0}, r"^--batch-size: must be >= 1"),
    ({"agent_concurrency": 0}, r"^--agent-concurrency: must be >= 1"),
    ({"model": None}, r"^--model is required unless --rollouts is given"),
])
def test_bad_options_are_refused_at_construction_naming_the_flag(change, message):
    with pytest.raises(EvalInputError, match=message):
        EvalOptions(**{**REQUIRED, **change})
    EvalOptions(**{**REQUIRED, "model": None, "rollouts": "r.jsonl"})  # rollouts alone: fine


def test_add_option_args_adds_only_the_fields_named():
    ap = argparse.ArgumentParser()
    add_option_args(ap, ["n", "reuse_verdicts"])
    args = ap.parse_args(["--n", "2", "--reuse-verdicts", "d"])
    assert vars(args) == {"n": 2, "reuse_verdicts": "d"}
