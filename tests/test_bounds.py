"""Bounds of every flag of every command line (design page, "Bad input").

Generated from the parsers the CLI reference is made from (``docs/gen_ref.py``: each CLI's
``main()`` captured at ``parse_args``) and from the training fields: every value-taking flag
must declare a :class:`sandbox.bounds.Bound` (a new flag without one fails here), and for each
flag the values at and just inside its bounds parse while those just outside, of the wrong
type, and (paths) missing / a directory / of the wrong format are refused by argparse itself -
exit 2, one line naming the flag - so before anything is loaded, written or started. In
process (parse only: seconds); a few real command lines at the end run with no Podman
reachable, so any container start would fail differently than the one-line refusal.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import shutil
import subprocess
import sys
import typing

import pytest
from conftest import REPO_ROOT
from trl import GRPOConfig

sys.path.insert(0, str(REPO_ROOT / "docs"))
import gen_ref  # noqa: E402 - after the docs path entry

from ecredit_trl.config import (  # noqa: E402
    INHERITED,
    ECreditConfig,
    ModelArguments,
    RunArguments,
    check_resume_sizes,
)
from ecredit_trl.train import build_parser, embedded_defaults, parse_args  # noqa: E402
from sandbox.bounds import Bound, BoundError, bound_of, flag_bounds  # noqa: E402

CLIS = [rel for rel in gen_ref.cli_sources() if rel != gen_ref.TRAIN]


def _parsers(rel: str):
    """(subcommand path, parser) of a CLI and each of its subcommands, and the CLI's parser."""
    root = gen_ref.capture_parser(rel)
    out, todo = [], [([], root)]
    while todo:
        path, p = todo.pop()
        out.append((path, p))
        todo += [(path + [name], sub) for name, sub in gen_ref.subcommands(p)]
    return out, root


def _action(parser, flag):
    return next(a for a in parser._actions
                if (max(a.option_strings, key=len) if a.option_strings else a.dest) == flag)


def _argv(action, value: str) -> list[str]:
    values = [value] * (action.nargs if isinstance(action.nargs, int) else 1)
    return ([action.option_strings[0]] if action.option_strings else []) + values


def _required(parser, tmp, skip) -> list[str]:
    """Valid values of the parser's required arguments other than ``skip``."""
    out = []
    for flag, b in flag_bounds(parser):
        a = _action(parser, flag)
        if a is skip or not (a.required or not a.option_strings and a.nargs not in ("?", "*")):
            continue
        value = next(v for v, ok in b.samples(tmp / "req" / flag.strip("-")) if ok)
        out += _argv(a, value)
    return out


def _parse(parser, argv):
    """(exit code or None, stderr lines) of ``parser.parse_args(argv)``."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            parser.parse_args(argv)
            code = None
        except SystemExit as exc:
            code = exc.code
    return code, [ln for ln in err.getvalue().splitlines() if ln.strip()]


@pytest.mark.parametrize("rel", CLIS)
def test_every_flag_declares_bounds_and_refuses_outside_them(rel, tmp_path):
    """Each value-taking flag: its samples (:meth:`Bound.samples`) at, inside and outside its
    bounds; the allowed ones parse (with the CLI's required arguments), the others exit 2 in
    one line naming the flag."""
    undeclared, wrong = [], []
    parsers, root = _parsers(rel)
    for path, parser in parsers:
        for flag, b in flag_bounds(parser):
            if b is None:
                undeclared.append(" ".join(path + [flag]))
                continue
            action = _action(parser, flag)
            for value, ok in b.samples(tmp_path / f"s{len(path)}{flag.strip('-')}"):
                argv = path + _argv(action, value)
                if ok:
                    argv += _required(parser, tmp_path, action)
                code, err = _parse(root, argv)
                name = argparse._get_action_name(action)  # as argparse names it in errors
                if ok and code is not None:
                    wrong.append(f"{argv}: refused a value its bounds allow: {err}")
                elif not ok and not (code == 2 and len(err) == 1 and name in err[0]):
                    wrong.append(f"{argv}: exit {code}, stderr {err}")
    assert undeclared == [], "declare bounds: type=Int(ge=1) etc. (sandbox.bounds)"
    assert wrong == []


def _settable(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init and "bool" not in str(f.type)]


def test_the_training_fields_declare_bounds():
    """Our fields (ECreditConfig's own, ModelArguments, RunArguments) each declare bounds,
    as does every GRPOConfig field the embedded default sets or the code reads (vLLM fields
    excepted: their checks sit with the vLLM settings); INHERITED names real fields only."""
    own = {f.name for f in gen_ref.own_config_fields()}
    missing = [f"{c.__name__}.{f.name}" for c in (ECreditConfig, ModelArguments, RunArguments)
               for f in _settable(c) if (c is not ECreditConfig or f.name in own)
               and bound_of(c, f.name) is None]
    assert missing == []
    # the declared annotations, not ``Field.type``: building an HfArgumentParser narrows
    # ``dict | str | None`` to ``str`` on the shared Field objects, so the latter depends on
    # which test ran first
    grpo = typing.get_type_hints(GRPOConfig)
    relied = (set(embedded_defaults(False)) | set(gen_ref._reads(gen_ref.ROOT, set(grpo)))) - own
    # mappings handed through to transformers (``*_kwargs``) are checked by their reader
    relied = {n for n in relied if "bool" not in str(grpo[n]) and not n.startswith("vllm")
              and "dict" not in str(grpo[n])
              and n not in ("report_to", "lr_scheduler_type")}
    assert sorted(n for n in relied if bound_of(ECreditConfig, n) is None) == []
    assert not [n for n in INHERITED if n.startswith("vllm")]


def _train_flags():
    parser = build_parser()
    out = []
    for a in parser._actions:
        if isinstance(a.type, Bound):
            out.append((a.option_strings[0], a))
    return parser, out


def test_training_flags_refuse_outside_their_bounds(tmp_path):
    """Every bounded training field, through train.py's own parser: the allowed samples parse,
    the others are refused by argparse in one line naming the flag (so before the config
    object, the run directory, the tasks or the policy)."""
    parser, flags = _train_flags()
    assert len(flags) >= 70
    wrong = []
    for i, (flag, action) in enumerate(flags):
        for value, ok in action.type.samples(tmp_path / str(i)):
            argv = _argv(action, value)
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                try:
                    parser.parse_known_args(argv)
                    code = None
                except SystemExit as exc:
                    code = exc.code
            lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
            if ok and code is not None:
                wrong.append(f"{argv}: refused: {lines}")
            elif not ok and not (code == 2 and len(lines) == 1 and flag in lines[0]):
                wrong.append(f"{argv}: exit {code}, {lines}")
    assert wrong == []


def test_a_resume_with_changed_sizes_is_refused_in_one_line():
    cfg, _ = parse_args(["--arm", "B", "--num_generations", "2"])
    recorded = {"config": {"ecredit": {"per_device_train_batch_size": 4, "num_generations": 4,
                                       "gradient_accumulation_steps": 1}}, "world_size": 1}
    with pytest.raises(BoundError) as got:
        check_resume_sizes(recorded, cfg, [])
    assert str(got.value) == (
        "resume refused: changed sizes (num_generations 4 -> 2) would change the run's data "
        "order and groups; pass the original values, or accept each with --allow-changed "
        "FIELD --reason TEXT")
    check_resume_sizes(recorded, cfg, ["num_generations"])  # accepted explicitly


def _no_podman_env(tmp_path) -> dict:
    """An environment in which any container start fails: no podman on PATH (only python and
    git), a Podman socket that does not exist."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    os.symlink(sys.executable, bindir / "python")
    os.symlink(shutil.which("git"), bindir / "git")
    return os.environ | {"PATH": str(bindir), "CONTAINER_HOST": f"unix://{tmp_path}/none.sock"}


@pytest.mark.parametrize("argv,flag", [
    (["-m", "eval.run", "--n", "0", "--split", "bundled:train", "--model", "org/name"], "--n"),
    (["-m", "ecredit_trl.study", "run", "--config", "missing.yaml"], "--config"),
])
def test_real_command_lines_refuse_before_any_container(argv, flag, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, *argv, "--out", str(out)], cwd=REPO_ROOT,
                          env=_no_podman_env(tmp_path), capture_output=True, text=True,
                          timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and flag in lines[0], proc.stderr[-2000:]
    assert not out.exists()


def test_a_study_train_mapping_is_checked_against_the_bounds():
    """A study's ``train:`` values meet the same bounds before its folder is made."""
    from ecredit_trl.study.config import StudyConfigError, validate_train

    with pytest.raises(StudyConfigError) as got:
        validate_train({"max_steps": -3})
    assert str(got.value).startswith("config: train.max_steps: -3: not allowed (out of range); "
                                     "allowed: an integer >= 1")
    assert validate_train({"max_steps": 3, "top_p": 1.0}) == {"max_steps": 3, "top_p": 1.0}
