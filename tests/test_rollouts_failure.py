"""Evaluation rollouts whose episode ends on the disk budget (issue 11 §4): the row records
the failure, loads in the replay format, and nothing raises (the files are gone)."""

from __future__ import annotations

from test_rollouts import _call, _policy, task, tiny  # noqa: F401 - fixtures

from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release
from ecredit_trl.agent.rollouts import GenerationSettings, run_rollout
from ecredit_trl.credit.trajectory import parse_trajectory


def test_disk_budget_rollout_is_recorded_not_raised(tiny, task, tmp_path):  # noqa: F811
    policy = _policy(tiny, [_call("create", path="big.txt", file_text="x" * 300),
                            _call("view", path="calc.py")])
    env = SWEAgentEnv(AgentContext(tasks={task.instance_id: task}, runtime=None,
                                   workroot=str(tmp_path / "work"), tree_budget_bytes=200))
    try:
        row = run_rollout(policy, env, task, rollout_index=0, seed=0,
                          settings=GenerationSettings(max_turns=3))
    finally:
        release(env)
    assert row["failure"][0] == "disk_budget" and "rollout budget of 200" in row["failure"][1]
    assert row["artifact"] == ""
    assert [c["status"] for c in row["tool_calls"]] == ["ok", "ended"]
    assert parse_trajectory(row).K == len(row["turns"]) >= 1
    assert all(t["writes"] == {} for t in row["turns"])

