"""Evaluation rollouts whose episode ends on a failure: the row
records the failure and who caused it, loads in the replay format, and nothing raises (after
the disk budget the files are gone). ``eval.run`` scores them by the training rule: an
episode the policy broke (disk budget, a fork flood in its own container) is a failed slot
with the failure value; one broken from outside is unknown (``agent_sandbox_error``)."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest
from test_agent_failures import FLOOD
from test_rollouts import _call, _policy, task, tiny  # noqa: F401 - fixtures

from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release
from ecredit_trl.agent.rollouts import GenerationSettings, run_rollout
from ecredit_trl.credit.trajectory import parse_trajectory


def _rollout(policy, task, tmp_path, runtime=None, before=None, **ctx):  # noqa: F811
    env = SWEAgentEnv(AgentContext(tasks={task.instance_id: task}, runtime=runtime,
                                   workroot=str(tmp_path / "work"), **ctx))
    if before is not None:  # something outside the episode happens before a bash call
        real = env.bash

        def bash(command):
            before(env, command)
            return real(command)

        env.bash = bash
    try:
        return run_rollout(policy, env, task, rollout_index=0, seed=0,
                           settings=GenerationSettings(max_turns=3))
    finally:
        release(env)


def test_disk_budget_rollout_is_recorded_not_raised(tiny, task, tmp_path):  # noqa: F811
    policy = _policy(tiny, [_call("create", path="big.txt", file_text="x" * 300),
                            _call("view", path="calc.py")])
    row = _rollout(policy, task, tmp_path, tree_budget_bytes=200)
    assert row["failure"][0] == "disk_budget" and "rollout budget of 200" in row["failure"][1]
    assert row["failure_class"] == "agent_disk_budget"
    assert row["failure_evidence"]["tree_budget_bytes"] == 200
    assert row["artifact"] == ""
    assert [c["status"] for c in row["tool_calls"]] == ["ok", "ended"]
    assert parse_trajectory(row).K == len(row["turns"]) >= 1
    assert all(t["writes"] == {} for t in row["turns"])


@pytest.mark.podman
def test_eval_scores_agent_failures_and_leaves_infra_unknown(tiny, task, tmp_path,  # noqa: F811
                                                             podman_runtime):
    """Three real episodes in Podman: a fork flood (pids limit 64) then a call, a tree over
    its budget, and a container removed from outside before the second call. ``eval.run``'s
    slot routing: the first two are failed slots (U = -1: the task lists a PASS_TO_PASS
    test), the third unknown; the summary counts them so."""
    from eval.evaluation.report import summarize
    from eval.evaluation.verification import SlotVerifier
    from sandbox.images import default_image
    from sandbox.runtimes.podman_runtime import podman_env
    from sandbox.trials.trial import Limits

    task.image = default_image()
    flood = _rollout(_policy(tiny, [_call("bash", command=FLOOD), _call("bash", command="ls"),
                                     _call("submit")]),
                     task, tmp_path / "a", podman_runtime, limits=Limits(pids=64))
    assert flood["failure_class"] == "agent_pids"
    assert flood["failure"][0] == "sandbox_error"
    assert [c["status"] for c in flood["tool_calls"]] == ["ok", "infra"]
    disk = _rollout(_policy(tiny, [_call("bash", command="head -c 3000 /dev/zero > z"),
                                    _call("submit"), _call("submit")]),
                    task, tmp_path / "b", podman_runtime, tree_budget_bytes=2000)
    assert disk["failure_class"] == "agent_disk_budget"

    def remove_before_second(env, command):
        if command == "ls":
            subprocess.run(["podman", "rm", "-f", env.session.name], check=True,
                           capture_output=True, env=podman_env())

    gone = _rollout(_policy(tiny, [_call("bash", command="true"), _call("bash", command="ls"),
                                    _call("submit")]),
                    task, tmp_path / "c", podman_runtime, before=remove_before_second)
    assert gone["failure"][0] == "sandbox_error" and gone["failure_class"] is None
    assert gone["failure_evidence"]["container"] == "missing"

    tid = task.instance_id
    spec = SimpleNamespace(FAIL_TO_PASS=["test_calc.py::test_add"],
                           PASS_TO_PASS=["test_calc.py::test_sub"], repo="demo/calc")
    final: dict = {}
    sv = SlotVerifier(out=tmp_path / "ev", by_id={tid: spec}, binding="b" * 16,
                      source="rollouts", todo={(tid, i) for i in range(3)}, final=final,
                      timeout_s=60)
    sv.controls[tid] = {"exit_class": "ok", "log": "", "trial_id": "ctl"}  # not needed here
    for i, row in enumerate((flood, disk, gone)):
        sv.take_rollout(None, {**row, "rollout_index": i})
    assert sv.pending == {} and sv.waiting_ctrl == []  # no trial for any of them
    for i, cls in ((0, "agent_pids"), (1, "agent_disk_budget")):
        slot = final[(tid, i)]
        assert slot["failure_class"] == cls and slot["resolved"] is False
        assert slot["utility"] == -1.0 and slot["classification"]["unknown"] is False
        assert slot["failure_evidence"] == (flood, disk)[i]["failure_evidence"]
    assert final[(tid, 2)]["unknown_reason"] == "agent_sandbox_error"
    assert final[(tid, 2)]["failure"][0] == "sandbox_error"
    s = summarize(list(final.values()), [(tid, "demo/calc")], 3, 1)
    assert (s["resolved"], s["failed"], s["unknown"]) == (0, 2, 1)
    assert s["unknown_reasons"] == {"agent_sandbox_error": 1}
