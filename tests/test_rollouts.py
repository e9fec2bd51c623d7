"""ecredit_trl.agent.rollouts (scripted generations through TRL's parser and the real agent env) and
eval.evaluation.modelref (run dirs, adapters, fingerprints). No Podman: the agent has no bash sandbox."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from conftest import git

from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release
from ecredit_trl.agent.rollouts import GenerationSettings, Policy, rollout_seed, run_rollout
from ecredit_trl.credit.trajectory import parse_trajectory
from eval.evaluation.modelref import resolve_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from ecredit_trl.policy.tiny_model import build_model, build_tokenizer

    out = tmp_path_factory.mktemp("tiny")
    tok = build_tokenizer(["def add(a, b):\n    return a + b\n"] * 5, vocab_size=300)
    build_model(tok, seed=0).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture
def task(tmp_path):
    repo = tmp_path / "origin"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    return SimpleNamespace(instance_id="demo__calc-1", repo_dir=str(repo),
                           base_commit=git(repo, "rev-parse", "HEAD"), image="unused",
                           workdir="/testbed", problem_statement="add() subtracts.")


class Scripted(Policy):
    """A Policy whose turns are fixed texts (tokenised, EOS appended): the real template,
    TRL parser, tool execution and suffix logic run on them."""

    def __init__(self, model, tok, ref, texts):
        super().__init__(model, tok, ref)
        self.texts = list(texts)

    def generate(self, input_ids, max_new_tokens, settings, seed):
        ids = self.tokenizer(self.texts.pop(0), add_special_tokens=False)["input_ids"]
        return (ids + [self.tokenizer.eos_token_id])[:max_new_tokens]


def _call(name, **args):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def _policy(tiny, texts):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ref = resolve_model(tiny)
    return Scripted(AutoModelForCausalLM.from_pretrained(tiny), AutoTokenizer.from_pretrained(tiny),
                    ref, texts)


def _run(policy, task, tmp_path, **settings):
    env = SWEAgentEnv(AgentContext(tasks={task.instance_id: task}, runtime=None,
                                   workroot=str(tmp_path / "work")))
    try:
        return run_rollout(policy, env, task, rollout_index=0, seed=0,
                           settings=GenerationSettings(**settings))
    finally:
        release(env)


FIX = [_call("view", path="calc.py"),
       _call("str_replace", path="calc.py", old_str="return a - b", new_str="return a + b"),
       _call("submit")]


def test_scripted_episode_edits_and_submits(tiny, task, tmp_path):
    row = _run(_policy(tiny, FIX), task, tmp_path)
    assert row["stop_reason"] == "submit" and row["submitted"] and not row["format_error"]
    assert [c["name"] for c in row["tool_calls"]] == ["view", "str_replace", "submit"]
    assert [c["turn"] for c in row["tool_calls"]] == [1, 2, 3]
    assert [list(t["writes"]) for t in row["turns"]] == [[], ["calc.py"], []]
    assert row["turns"][1]["writes"]["calc.py"] == "def add(a, b):\n    return a + b\n"
    assert "+    return a + b" in row["artifact"] and row["format_errors"] == 0
    assert row["generated_tokens"] == sum(t["generated_tokens"] for t in row["turns"])
    assert row["completion_tokens"] > row["generated_tokens"]  # tool results are in between
    traj = parse_trajectory(json.loads(json.dumps(row)))
    assert traj.K == 3 and traj.L == row["generated_tokens"]


def test_last_allowed_turn_is_not_executed(tiny, task, tmp_path):
    """As TRL with max_tool_calling_iterations = max_turns - 1."""
    row = _run(_policy(tiny, FIX), task, tmp_path, max_turns=2)
    assert row["stop_reason"] == "max_turns" and row["artifact"] == ""
    assert [c["name"] for c in row["tool_calls"]] == ["view"]
    assert row["format_errors"] == 1  # the requested str_replace never reached the env


def test_plain_text_is_a_format_error(tiny, task, tmp_path):
    row = _run(_policy(tiny, ["I think the bug is in calc.py."]), task, tmp_path)
    assert row["stop_reason"] == "no_tool_call" and row["format_error"]
    assert row["tool_calls"] == [] and len(row["turns"]) == 1


def test_token_budget_ends_the_episode(tiny, task, tmp_path):
    # 60: the view result does not fit; 200: the second turn is cut mid-call
    for budget, calls in ((60, ["view"]), (200, ["view"])):
        row = _run(_policy(tiny, FIX), task, tmp_path, max_new_tokens=budget)
        assert row["stop_reason"] == "token_budget", budget
        assert row["completion_tokens"] <= budget
        assert [c["name"] for c in row["tool_calls"]] == calls


def test_bad_tool_arguments_go_back_to_the_model(tiny, task, tmp_path):
    row = _run(_policy(tiny, [_call("view", nope="x"), _call("nosuchtool"), _call("submit")]),
               task, tmp_path)
    assert row["stop_reason"] == "submit"
    assert [c["name"] for c in row["tool_calls"]] == ["submit"]
    assert row["format_errors"] == 2


def test_seed_is_order_independent_and_sampling_is_seeded(tiny, task, tmp_path):
    from ecredit_trl.agent.prompts import task_prompt
    from ecredit_trl.agent.rollouts import load_rollout_policy

    assert rollout_seed(0, "t", 1) == rollout_seed(0, "t", 1) != rollout_seed(0, "t", 2)
    p = load_rollout_policy(tiny, device="cpu")
    ids = p.render_prompt(task_prompt(task))
    s = GenerationSettings(max_new_tokens=16)
    assert p.generate(ids, 16, s, 5) == p.generate(ids, 16, s, 5)


def test_settings_validation():
    with pytest.raises(ValueError, match="max_turns"):
        GenerationSettings(max_turns=0)
    with pytest.raises(ValueError, match="temperature"):
        GenerationSettings(temperature=-0.5)
    assert GenerationSettings(temperature=0).greedy and not GenerationSettings().greedy


def test_rollouts_take_the_training_runs_scaffold_unless_told(tmp_path):
    from types import SimpleNamespace as NS

    from ecredit_trl.agent.rollouts import scaffold_for
    from eval.evaluation.modelref import ModelRef

    def ref(ecredit):
        return ModelRef(given="x", model_dir="x", run_dir=None, adapter=False, base_model=None,
                        sha256="0", run_config=None if ecredit is None else {"ecredit": ecredit})

    def cli(scaffold=None, config=None):
        return NS(scaffold=scaffold, scaffold_config=config)

    run = ref({"scaffold": "mini-swe-agent", "scaffold_config": "/c/compact.yaml"})
    assert run.scaffold_defaults() == {"scaffold": "mini-swe-agent",
                                       "scaffold_config": "/c/compact.yaml"}
    assert scaffold_for(run, cli()) == ("mini-swe-agent", "/c/compact.yaml")
    assert scaffold_for(run, cli(config="/u.yaml")) == ("mini-swe-agent", "/u.yaml")
    # the run's config file goes with its scaffold only
    assert scaffold_for(run, cli("ecredit")) == ("ecredit", None)
    assert scaffold_for(run, cli("mini-swe-agent")) == ("mini-swe-agent", "/c/compact.yaml")
    # a bare model directory, or a run from before scaffolds were recorded
    for bare in (ref(None), ref({"arm": "B"})):
        assert bare.scaffold_defaults() == {}
        assert scaffold_for(bare, cli()) == ("ecredit", None)
        assert scaffold_for(bare, cli("mini-swe-agent")) == ("mini-swe-agent", None)


def test_resolve_run_dir_and_adapter(tiny, tmp_path):
    import shutil

    run = tmp_path / "runs" / "ecredit-B-x"
    shutil.copytree(tiny, run / "checkpoint-final")
    (run / "config.json").write_text(json.dumps({"ecredit": {
        "arm": "B", "seed": 3, "max_turns": 5, "max_completion_length": 300,
        "temperature": 0.7}, "model": {"path": str(tiny)}}))
    ref = resolve_model(run)
    assert ref.run_dir == str(run.resolve()) and ref.model_dir.endswith("checkpoint-final")
    assert ref.arm == "B" and ref.seed == 3
    assert ref.generation_defaults() == {"max_turns": 5, "max_new_tokens": 300,
                                         "temperature": 0.7}
    assert ref.sha256 == resolve_model(tiny).sha256  # same files, same fingerprint
    assert resolve_model(run / "checkpoint-final").run_dir == ref.run_dir
    with pytest.raises(FileNotFoundError, match="no such path"):
        resolve_model(tmp_path / "nope")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "ledger.jsonl").write_text("")
    with pytest.raises(FileNotFoundError, match="checkpoint-final"):
        resolve_model(tmp_path / "half")

    # a LoRA adapter is loaded on its base and merged
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from ecredit_trl.agent.rollouts import load_rollout_policy

    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny),
                          LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    adir = tmp_path / "adapter"
    lora.save_pretrained(adir)
    aref = resolve_model(adir)
    assert aref.adapter and aref.base_model == str(tiny) and aref.sha256 != ref.sha256
    pol = load_rollout_policy(adir, device="cpu")
    assert not hasattr(pol.model, "peft_config")
