"""The embedded default policy: tokenizer, tiny model, demonstrations, cached warm start."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from ecredit_trl.agent import editor

SOURCE = "\n".join([
    '"""Tiny arithmetic helpers."""',
    "",
    "",
    "def add(a, b):",
    '    """Sum of a and b."""',
    "    return a + b",
    "",
    "",
    "def sub(a, b):",
    "    return a - b",
    "",
    "",
    "def clamp(x, lo, hi):",
    "    if x < lo:",
    "        return lo",
    "    if x > hi:",
    "        return hi",
    "    return x",
    "",
])


def _git(repo: Path, *args: str, input: str | None = None) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@e", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env, input=input).stdout


def make_task(root: Path, iid: str = "synth__calc-1", bug: tuple[str, str] = ("a * b", "a + b")):
    """A git repo whose base commit has ``bug[0]`` where the pristine source has ``bug[1]``
    (one line of ``calc.py``); the gold patch restores it."""
    repo = root / iid
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    buggy = SOURCE.replace(f"return {bug[1]}", f"return {bug[0]}", 1)
    assert buggy != SOURCE
    (repo / "calc.py").write_text(buggy)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "calc.py").write_text(SOURCE)
    patch = _git(repo, "diff")
    _git(repo, "checkout", "-q", "--", ".")
    return SimpleNamespace(instance_id=iid, repo_dir=str(repo), base_commit=base, patch=patch,
                           problem_statement=f"{iid}: test_add fails: assert add(2, 3) == 5")


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return make_task(tmp_path_factory.mktemp("repos"))


def test_tokenizer_round_trip_and_tool_template():
    from trl.chat_template_utils import (
        add_response_schema,
        get_training_chat_template,
        is_chat_template_stop_token_trained,
        parse_response,
        supports_tool_calling,
    )

    from ecredit_trl.agent.prompts import policy_tools
    from ecredit_trl.policy.tiny_model import TAG_TOKENS, build_tokenizer, chat_template

    tok = build_tokenizer([SOURCE] * 20, vocab_size=400)
    for s in (SOURCE, "  x\t= 1234 é 中文 <tool_call>\n{}\n</tool_call><|im_end|>"):
        assert tok.decode(tok(s)["input_ids"]) == s
    for t in TAG_TOKENS + ("<|im_start|>", "<|im_end|>"):
        assert len(tok(t)["input_ids"]) == 1
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.chat_template == chat_template()
    trl_copy = Path(__import__("trl").__file__).parent / "chat_templates" / "qwen3.jinja"
    assert chat_template().encode() == trl_copy.read_bytes()
    assert supports_tool_calling(tok)
    add_response_schema(tok)  # raises on an unrecognised template
    training = get_training_chat_template(tok)
    assert is_chat_template_stop_token_trained(tok, training)

    tools = policy_tools()
    args = {"path": "calc.py", "line": 6}
    msgs = [{"role": "user", "content": "fix it"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "view", "arguments": json.dumps(args)}}]},
            {"role": "tool", "name": "view", "content": "OUTPUT-123"}]
    text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, chat_template=training)
    assert '<tool_call>\n{"name": "view", "arguments": {"path": "calc.py", "line": 6}}\n</tool_call>' in text
    assert "<tool_response>\nOUTPUT-123\n</tool_response>" in text
    assert '"name": "str_replace"' in text
    prompt = tok.apply_chat_template(msgs[:1], tools=tools, add_generation_prompt=True,
                                     chat_template=training, return_dict=False)
    gen = tok('<think>\n\n</think>\n\n<tool_call>\n{"name": "view", "arguments": '
              '{"path": "calc.py", "line": 6}}\n</tool_call><|im_end|>')["input_ids"]
    parsed = parse_response(tok, gen, prefix=prompt, tools=tools)
    assert parsed["tool_calls"][0]["function"] == {"name": "view", "arguments": args}


def test_model_forward_shapes():
    import torch

    from ecredit_trl.policy.tiny_model import build_model, build_tokenizer

    tok = build_tokenizer([SOURCE] * 5, vocab_size=300)
    model = build_model(tok, seed=0)
    assert model.config.tie_word_embeddings and model.config.hidden_size == 192
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = torch.randint(0, len(tok), (2, 7))
    out = model(input_ids=ids)
    assert out.logits.shape == (2, 7, len(tok)) and out.logits.dtype == torch.float32
    again = build_model(tok, seed=0)
    assert torch.equal(again.model.embed_tokens.weight, model.model.embed_tokens.weight)
    # ~2.2M parameters at the default 2.4k vocabulary
    n = sum(p.numel() for p in model.parameters()) + (2400 - len(tok)) * 192
    assert 2.0e6 < n < 2.4e6


def test_submit_output_matches_agent(tmp_path):
    from ecredit_trl.agent.env import AgentContext, SWEAgentEnv
    from ecredit_trl.policy.demos import SUBMIT_OUTPUT

    env = SWEAgentEnv(AgentContext(tasks={}, workroot=str(tmp_path)))
    assert env.submit() == SUBMIT_OUTPUT


def test_demo_conversation_has_exact_editor_outputs(task, tmp_path):
    from ecredit_trl.agent.env import _clone_at
    from ecredit_trl.agent.prompts import policy_tools, task_prompt
    from ecredit_trl.policy.demos import SUBMIT_OUTPUT, demo_conversations

    (demo,) = demo_conversations([task], strict=True)
    assert demo["instance_id"] == task.instance_id
    assert json.loads(demo["tools"]) == policy_tools()
    m = demo["messages"]
    assert [x["role"] for x in m] == ["user", "assistant", "tool", "assistant", "tool",
                                      "assistant", "tool", "assistant"]
    assert m[:1] == task_prompt(task)
    calls = [x["tool_calls"][0]["function"] for x in m[1:7:2]]
    assert [c["name"] for c in calls] == ["view", "str_replace", "submit"]
    assert all(isinstance(c["arguments"], str) for c in calls)
    args = [json.loads(c["arguments"]) for c in calls]
    assert args[0] == {"path": "calc.py", "line": 6}
    assert args[1] == {"path": "calc.py", "old_str": "return a * b", "new_str": "return a + b"}
    assert args[2] == {}
    assert "tool_calls" not in m[7] and m[7]["content"]

    # replay the calls on a fresh checkout: every tool message is exactly the editor's output
    root = tmp_path / "replay"
    _clone_at(task.repo_dir, task.base_commit, root)
    assert m[2]["content"] == editor.view(root, **args[0])
    assert m[4]["content"] == editor.str_replace(root, **args[1])
    assert m[6]["content"] == SUBMIT_OUTPUT
    assert (root / "calc.py").read_text() == SOURCE  # the gold fix


def test_gold_edits_widen_until_unique():
    from ecredit_trl.policy.demos import gold_edits

    old = "x = 1\ny = 2\nx = 1\nz = 3\n"
    new = "x = 1\ny = 2\nx = 2\nz = 3\n"
    (e,) = gold_edits("f.py", old, new)
    assert old.count(e.old_str) == 1 and old.replace(e.old_str, e.new_str) == new
    assert e.line in (2, 3)
    # a dropped line (insertion in the gold direction) and a deleted one
    for a, b in (("a\nb\nd\n", "a\nb\nc\nd\n"), ("a\nb\nX\nc\n", "a\nb\nc\n")):
        es = gold_edits("f.py", a, b)
        text = a
        for e in es:
            assert text.count(e.old_str) == 1
            text = text.replace(e.old_str, e.new_str)
        assert text == b


def test_ensure_default_policy_trains_once_and_reuses(task, tmp_path):
    from ecredit_trl.policy.warmstart import ensure_default_policy, load_policy

    lines: list[str] = []
    path = ensure_default_policy([task], cache_dir=tmp_path, steps=2, log=lines.append,
                                 isolate=False, vocab_size=400)
    p = Path(path)
    assert p.parent == tmp_path / "policy" and len(p.name) == 64
    info = json.loads((p / "warmstart.json").read_text())
    assert info["tasks"] == [task.instance_id] and info["recipe"]["steps"] == 2
    assert info["chat_template_ok"] is True
    model, tok = load_policy(path)
    assert model.config.vocab_size == len(tok)
    assert not [x for x in (tmp_path / "policy").iterdir() if x.name.startswith(".")]
    stamp = (p / "warmstart.json").stat().st_mtime_ns
    lines.clear()
    assert ensure_default_policy([task], cache_dir=tmp_path, steps=2, log=lines.append,
                                 isolate=False, vocab_size=400) == path
    assert (p / "warmstart.json").stat().st_mtime_ns == stamp
    assert any("reusing" in x for x in lines) and not any("step" in x for x in lines)
    # another recipe is another cache entry; the default path trains in a child process
    lines.clear()
    other = ensure_default_policy([task], cache_dir=tmp_path, steps=1, log=lines.append,
                                  vocab_size=400)
    assert other != path and (Path(other) / "warmstart.json").is_file()
    assert any("step 1/1" in x for x in lines)


def test_policy_tools_are_what_trl_renders_for_the_environment(tmp_path):
    """SFT demonstrations must see the system prompt GRPO renders: TRL 1.16 lists the
    environment's public methods with ``inspect.getmembers`` (name order)."""
    import inspect

    from transformers.utils import get_json_schema

    from ecredit_trl.agent.env import AgentContext, SWEAgentEnv
    from ecredit_trl.agent.prompts import policy_tools

    env = SWEAgentEnv(AgentContext(tasks={}, workroot=str(tmp_path)))
    methods = [getattr(env, n) for n, _ in inspect.getmembers(SWEAgentEnv, inspect.isfunction)
               if not n.startswith("_") and n not in ("reset", "get_reward")]
    assert [get_json_schema(m) for m in methods] == policy_tools()


def test_ensure_default_policy_refuses_sealed_tasks(tmp_path):
    from ecredit_trl.policy.warmstart import ensure_default_policy
    from eval.tasks.sealed import SealedTaskError, sealed_ids

    sealed = sorted(sealed_ids())
    if not sealed:
        pytest.skip("no sealed manifest under datasets/")
    fake = SimpleNamespace(instance_id=sealed[0], base_commit="0" * 40, patch="",
                           problem_statement="x")
    with pytest.raises(SealedTaskError):
        ensure_default_policy([fake], cache_dir=tmp_path, steps=1, log=None)
    assert not (tmp_path / "policy").exists()


def test_the_shared_sft_path_refuses_long_examples_and_restores_threads(tmp_path, monkeypatch):
    """``run_sft_job``: an example longer than the model's positions is refused before
    training, naming the warm start's unit; the torch thread count set for training is the
    caller's again after a failed training."""
    import torch

    from ecredit_trl.policy.sft import Prepared, run_sft_job
    from ecredit_trl.policy.tiny_model import build_model, build_tokenizer

    (tmp_path / "job.json").write_text(json.dumps({"recipe": {
        "steps": 1, "batch_size": 1, "learning_rate": 1e-3, "lr_scheduler_type": "constant",
        "warmup_steps": 0, "weight_decay": 0.0, "max_grad_norm": 1.0, "seed": 0}}))
    (tmp_path / "demos.jsonl").write_text('{"x": 1}\n')
    tok = build_tokenizer([SOURCE] * 20, vocab_size=400)
    model = build_model(tok, seed=0)
    limit = model.config.max_position_embeddings

    def too_long(meta, demos):
        assert demos == [{"x": 1}] and meta["recipe"]["steps"] == 1
        return Prepared(model, tok, [{"input_ids": [1, 2]}], [limit + 1],
                        {"completion_only_loss": True}, unit="episode")

    with pytest.raises(RuntimeError, match=f"^an episode has {limit + 1} tokens, more than "
                                           f"the model's {limit} positions$"):
        run_sft_job(tmp_path, too_long, log=None)

    def bad_rows(meta, demos):  # rows SFTTrainer cannot read: training fails
        return Prepared(model, tok, [{"no_such_column": 1}], [4], {"completion_only_loss": True})

    monkeypatch.setenv("ECREDIT_WARMSTART_THREADS", "1")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        lines: list[str] = []
        with pytest.raises(KeyError, match="text"):  # TRL looks for a text column
            run_sft_job(tmp_path, bad_rows, log=lines.append)
        assert lines == ["warmstart: 1 torch thread(s)"]  # training was reached
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert not (tmp_path / "model").exists()
