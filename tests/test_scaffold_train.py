"""The mini-swe-agent scaffold end to end (Podman): two real GRPO steps of arm M through
``accelerate launch ecredit_trl/train.py --scaffold mini-swe-agent`` on the embedded default
(its warm start in the scaffold's format, with the compact config the embedded policy gets),
then ``eval.run`` of that run, which takes the run's scaffold and config file by default
(design page, "Generation engines and scaffolds")."""

from __future__ import annotations

import json

import pytest
from test_train import _jsonl, _launch

pytestmark = pytest.mark.podman


@pytest.fixture(scope="module")
def mswea_policy():
    """The embedded policy for mini-swe-agent (built on the cached built-in one, then reused),
    trained with the compact config the run picks for it."""
    from ecredit_trl.agent.scaffolds import get_scaffold
    from ecredit_trl.agent.scaffolds.mini_swe_agent import EMBEDDED_CONFIG
    from ecredit_trl.policy.scaffold_warmstart import ensure_scaffold_policy
    from ecredit_trl.policy.warmstart import ensure_default_policy
    from eval.tasks.splits import load_tasks

    tasks = load_tasks("bundled:train", purpose="train")
    return ensure_scaffold_policy(ensure_default_policy(tasks), tasks,
                                  get_scaffold("mini-swe-agent", EMBEDDED_CONFIG))


@pytest.fixture(scope="module")
def m_run(tmp_path_factory, mswea_policy):
    """Two GRPO steps of arm M with ``--scaffold mini-swe-agent`` (the run directory), every
    ablation verified by a counterfactual trial of its own (none taken from the control)."""
    return _launch(tmp_path_factory.mktemp("m"), "M", "--scaffold", "mini-swe-agent",
                   "--max_steps", "2", "--reuse_control_for_empty_ablation", "false")


def test_arm_m_trains_two_steps_with_mini_swe_agent_actions(m_run, mswea_policy):
    from ecredit_trl.agent.scaffolds.mini_swe_agent import EMBEDDED_CONFIG

    run = m_run
    man = json.loads((run / "manifest.json").read_text())
    assert man["scaffold"]["name"] == "mini-swe-agent"
    assert len(man["scaffold"]["config_hash"]) == 64
    # no --model and no --scaffold_config: the compact config shipped for the embedded policy
    assert man["scaffold"]["config_source"] == EMBEDDED_CONFIG
    assert man["model"]["path"] == mswea_policy  # the scaffold's own warm start
    ledger = _jsonl(run / "ledger.jsonl")
    trajs = _jsonl(run / "trajectories.jsonl")
    assert [r["step"] for r in ledger] == [1, 2] and len(trajs) == 8
    assert {t["scaffold"] for t in trajs} == {"mini-swe-agent"}
    calls = [c for t in trajs for c in t["tool_calls"]]
    assert calls and {c["name"] for c in calls} == {"bash"}
    # real bash actions that edit files: turns with writes, made by a bash command
    edits = [t for t in trajs if any(turn["writes"] for turn in t["turns"])]
    assert edits, "no rollout edited a file"
    assert any("python3 - <<'EOF'" in c["arguments"]["command"] for c in calls)
    assert sum(r["trials_factual"] for r in ledger) == len(trajs)
    cf = sum(r["trials_counterfactual"] for r in ledger)
    assert cf >= 1 and cf == sum(1 for t in trajs if t["counterfactual"])


def test_eval_run_of_the_run_grades_every_slot_with_its_scaffold(tmp_path, m_run,
                                                                   podman_runtime):
    """``eval.run --model RUN`` with no scaffold flag evaluates with the run's own scaffold and
    config file (the compact one), as it reuses the run's rollout settings."""
    from ecredit_trl.agent.scaffolds.mini_swe_agent import EMBEDDED_CONFIG
    from eval.evaluation.options import EvalOptions
    from eval.run import evaluate
    from eval.tasks.schema import save_tasks
    from eval.tasks.splits import load_tasks

    split = tmp_path / "two.jsonl"
    save_tasks(load_tasks("bundled:train", purpose="train")[:2], split)
    res = evaluate(EvalOptions(model=str(m_run), split=str(split), n=2, out=tmp_path / "ev"),
                   runtime=podman_runtime, log=lambda *_: None)
    s = res["summary"]
    assert s["denominator"]["slots"] == 4 and s["unknown"] == 0
    assert s["resolved"] + s["failed"] == 4
    assert "scaffold" not in res["overrides"]  # none given: the run's, bound through the model
    rows = [json.loads(x) for x in (tmp_path / "ev" / "rollouts.jsonl").read_text().splitlines()]
    man = json.loads((m_run / "manifest.json").read_text())
    assert [r["scaffold"] for r in rows] == [man["scaffold"]] * 4
    assert man["scaffold"]["config_source"] == EMBEDDED_CONFIG
    assert {c["name"] for r in rows for c in r["tool_calls"]} == {"bash"}
