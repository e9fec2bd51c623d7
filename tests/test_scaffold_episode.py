"""The mini-swe-agent scaffold in the evaluation loop: a scripted 10-turn episode whose tokens,
tool results and snapshots are checked exactly (design page, "Generation engines and scaffolds").

The policy's sampling is scripted (the qwen2_5 family model and tokenizer, TRL's template and
tool-call parser); the tools are real: mini-swe-agent's ``bash`` in the rollout workspace
(a Podman container of the task's image, the bash timeout), a snapshot after every action, its
shipped SWE-bench templates. The episode has a draft edit, the gold fix, a malformed action
(empty command), a command that hangs past the bash timeout, the stop signal mid-output
(not a stop), the stop signal on a failing command (not a stop), and the stop.
"""

from __future__ import annotations

import json
import subprocess

import pytest

MODULE = "inflection/__init__.py"
BUG = "    if not word and word.lower() in UNCOUNTABLES:"
FIX = "    if not word or word.lower() in UNCOUNTABLES:"
DRAFT = "    # draft\n" + BUG
STOP = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def _edit(old: str, new: str) -> str:
    return (f"python3 - <<'EOF'\nfrom pathlib import Path\np = Path('{MODULE}')\n"
            f"p.write_text(p.read_text().replace({old!r}, {new!r}, 1))\nEOF")


COMMANDS = ["ls", f"grep -n 'if not word and' {MODULE}", _edit(BUG, DRAFT), _edit(DRAFT, FIX),
            "git status --short", "", "sleep 30", f"echo checking; echo {STOP}",
            f"echo {STOP}; false", f"echo {STOP} && git diff"]


def _turn(k: int) -> str:
    call = {"name": "bash", "arguments": {"command": COMMANDS[k - 1]}}
    return f"THOUGHT: step {k}.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"


def _scripted(model_dir, texts):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ecredit_trl.agent.generation import Policy
    from eval.evaluation.modelref import resolve_model

    class Scripted(Policy):
        def generate(self, input_ids, max_new_tokens, settings, seed):
            self.inputs.append(list(input_ids))
            ids = self.tokenizer(texts[len(self.script)], add_special_tokens=False)["input_ids"]
            self.script.append(ids + [self.eos_token_ids[0]])
            return self.script[-1][:max_new_tokens]

    # the family's small vocabulary makes the prompt long: more positions, same weights
    cfg = AutoConfig.from_pretrained(model_dir, max_position_embeddings=1 << 15)
    p = Scripted(AutoModelForCausalLM.from_pretrained(model_dir, config=cfg),
                 AutoTokenizer.from_pretrained(model_dir), resolve_model(model_dir))
    p.inputs, p.script = [], []
    return p


@pytest.fixture(scope="module")
def family_dir():
    from ecredit_trl.policy.families import ensure_family_model

    return ensure_family_model("qwen2_5")


def _run(policy, rt, tmp_path, *, turns: int, bash_timeout_s: float = 3.0):
    """One episode on the first bundled training task; returns (row, env calls, file text at
    every snapshot)."""
    from ecredit_trl.agent.env import AgentContext, env_for, release
    from ecredit_trl.agent.rollouts import GenerationSettings, run_rollout
    from ecredit_trl.agent.scaffolds import get_scaffold
    from eval.tasks.splits import load_tasks

    sc = get_scaffold("mini-swe-agent")
    policy.use_scaffold(sc)
    task = load_tasks("bundled:train", purpose="train")[0]
    ctx = AgentContext(tasks={task.instance_id: task}, runtime=rt, scaffold=sc,
                       bash_timeout_s=bash_timeout_s, workroot=str(tmp_path / "work"))
    env = env_for(sc, ctx)
    try:
        row = run_rollout(policy, env, task, rollout_index=0, seed=0,
                          settings=GenerationSettings(max_turns=turns, max_new_tokens=1 << 14,
                                                      bash_timeout_s=bash_timeout_s))
        texts = [subprocess.run(["git", "--git-dir", str(env.snapshot_repo), "show",
                                 f"{c.tree}:{MODULE}"], capture_output=True, text=True,
                                check=True).stdout for c in env.calls]
        calls = list(env.calls)
    finally:
        release(env)
    return row, calls, texts


def test_ten_turn_episode_tokens_snapshots_and_stop_rules_exact(family_dir, podman_runtime, tmp_path):
    policy = _scripted(family_dir, [_turn(k) for k in range(1, 11)])
    row, calls, texts = _run(policy, podman_runtime, tmp_path, turns=12)

    # ten turns, one bash action each, the tenth is the stop: the loop ends there
    assert row["stop_reason"] == "submit" and row["submitted"] is True
    assert [c.turn for c in calls] == list(range(1, 11)) and len(row["turns"]) == 10
    assert [c.name for c in calls] == ["bash"] * 10
    assert [c.status for c in calls] == ["ok"] * 5 + ["error"] + ["ok"] * 4
    assert [c.submits for c in calls] == [False] * 9 + [True]
    assert row["format_errors"] == 1  # the empty command, counted as TRL counts a refused call
    # exact tokens: each turn's ids are the scripted ids; the next prompt is the previous
    # prompt + those ids + the rendered tool result, appended (history never rewritten)
    assert [t["generated_tokens"] for t in row["turns"]] == [len(s) for s in policy.script]
    for k in range(9):
        before, ids, nxt = policy.inputs[k], policy.script[k], policy.inputs[k + 1]
        assert nxt[:len(before) + len(ids)] == before + ids
        obs = calls[k].error and f"ERROR: {calls[k].error}"
        suffix = nxt[len(before) + len(ids):]
        if obs:  # the refused call's result is the config's format-error text
            assert suffix == policy.tool_suffix_ids([{"role": "tool", "name": "bash",
                                                      "content": obs}])
    tail = policy.tokenizer.decode(policy.inputs[6][len(policy.inputs[5]):])
    assert "Tool call error" in tail and "non-empty 'command'" in tail
    hang = policy.tokenizer.decode(policy.inputs[7][len(policy.inputs[6]):])
    assert "<returncode>-1</returncode>" in hang and "timed out after 3 seconds" in hang
    assert calls[6].seconds < 10
    mid = policy.tokenizer.decode(policy.inputs[8][len(policy.inputs[7]):])
    assert "<returncode>0</returncode>" in mid and f"checking\n{STOP}" in mid
    fail = policy.tokenizer.decode(policy.inputs[9][len(policy.inputs[8]):])
    assert "<returncode>1</returncode>" in fail

    # a snapshot after every action: the base, the draft, the fix, then unchanged
    base = texts[0]
    assert BUG in base and texts[1] == base
    assert texts[2] == base.replace(BUG, DRAFT, 1)
    assert texts[3] == base.replace(BUG, FIX, 1)
    assert texts[3:] == [texts[3]] * 7
    assert len({c.tree for c in calls}) == 3
    assert [sorted(t["writes"]) for t in row["turns"]] == [[], [], [MODULE], [MODULE]] + [[]] * 6
    assert f"+{FIX}" in row["artifact"] and "draft" not in row["artifact"]


def test_turn_without_a_tool_call_ends_the_episode_as_a_format_error(family_dir, podman_runtime, tmp_path):
    policy = _scripted(family_dir, [_turn(1), "THOUGHT: I will just describe the fix."])
    row, calls, _ = _run(policy, podman_runtime, tmp_path, turns=5)
    assert row["stop_reason"] == "no_tool_call" and len(row["turns"]) == 2
    assert len(calls) == 1 and row["format_errors"] == 1 and row["submitted"] is False
    assert row["artifact"] == ""


def test_scaffold_config_errors_name_the_field(tmp_path):
    from ecredit_trl.agent.scaffolds import get_scaffold

    with pytest.raises(ValueError, match="scaffold: unknown scaffold 'nope'"):
        get_scaffold("nope")
    bad = tmp_path / "c.yaml"
    bad.write_text("agent:\n  system_template: hi\n")
    with pytest.raises(ValueError, match="agent.instance_template must be a string"):
        get_scaffold("mini-swe-agent", str(bad))
    bad.write_text("agent:\n  system_template: hi\n  instance_template: '{{ nope }}'\n"
                   "model:\n  observation_template: '{{ output.output }}'\n")
    with pytest.raises(ValueError, match="a template does not render"):
        get_scaffold("mini-swe-agent", str(bad))
    sc = get_scaffold("mini-swe-agent")
    assert sc.record()["name"] == "mini-swe-agent" and len(sc.config_hash) == 64
    assert [t["function"]["name"] for t in sc.tools()] == ["bash"]


def test_the_embedded_policy_gets_the_compact_config_of_the_shipped_shape():
    from ecredit_trl.agent.scaffolds import default_scaffold_config, get_scaffold
    from ecredit_trl.agent.scaffolds.mini_swe_agent import EMBEDDED_CONFIG, shipped_config_path

    assert default_scaffold_config("mini-swe-agent", None, embedded_policy=True) == EMBEDDED_CONFIG
    assert default_scaffold_config("mini-swe-agent", None, embedded_policy=False) is None
    assert default_scaffold_config("mini-swe-agent", "/x.yaml", embedded_policy=True) == "/x.yaml"
    assert default_scaffold_config("ecredit", None, embedded_policy=True) is None
    compact, shipped = get_scaffold("mini-swe-agent", EMBEDDED_CONFIG), get_scaffold("mini-swe-agent")
    assert compact.source == EMBEDDED_CONFIG and shipped.source == shipped_config_path()
    for sec in ("agent", "environment", "model"):  # mini-swe-agent's keys, nothing new
        assert set(compact.config[sec]) <= set(shipped.config[sec])
    assert compact.tools() == shipped.tools()  # the same action: one bash tool
    task = type("T", (), {"problem_statement": "p", "instance_id": "t"})()
    assert "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in compact.prompt(task)[1]["content"]
    assert len(compact.prompt(task)[1]["content"]) * 10 < len(shipped.prompt(task)[1]["content"])


def test_study_trains_and_evaluates_with_the_scaffold_of_its_train_section(tmp_path):
    from ecredit_trl.agent.scaffolds.mini_swe_agent import EMBEDDED_CONFIG
    from ecredit_trl.study.config import config_from_dict
    from ecredit_trl.study.runner import eval_command, train_command

    c = config_from_dict({"arms": ["M"], "seeds": [0],
                          "train": {"max_steps": 1, "scaffold": "mini-swe-agent"},
                          "eval": {"splits": ["bundled:train"], "n": 1}})
    tc = train_command(c, "M", 0, tmp_path / "runs" / "M-s0")
    assert tc[tc.index("--scaffold") + 1] == "mini-swe-agent"
    ev = eval_command(c, "/m", "bundled:train", tmp_path / "e")
    assert ev[ev.index("--scaffold") + 1] == "mini-swe-agent"
    # the runs train the embedded policy, so they (and their evaluations) use the compact config
    assert ev[ev.index("--scaffold-config") + 1] == EMBEDDED_CONFIG
    with_model = config_from_dict({"arms": ["M"], "seeds": [0], "model": "/m",
                                   "train": {"max_steps": 1, "scaffold": "mini-swe-agent"},
                                   "eval": {"splits": ["bundled:train"], "n": 1}})
    assert "--scaffold-config" not in eval_command(with_model, "/m", "bundled:train",
                                                   tmp_path / "e3")
    assert "--scaffold" not in eval_command(
        config_from_dict({"arms": ["M"], "seeds": [0],
                          "eval": {"splits": ["bundled:train"], "n": 1}}),
        "/m", "bundled:train", tmp_path / "e2")
