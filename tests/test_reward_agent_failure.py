"""A rollout that breaks its own agent container is scored, not masked.

The real trainer path in this process (``ecredit_trl.train.main``: Podman, the embedded
policy, a real TRL step, real verifier trials, ``terminal_reward: utility``). The embedded
policy never writes a bash command, so the first rollout's first ``view`` is replaced by what
an adversarial policy would do instead: a fork flood of background sleeps up to its
container's pids limit, then another bash call, which cannot start. Everything after that
is the trainer's own: the rollout is ``agent_pids`` with its evidence, gets the failure
value as reward (no trial), C = 0 on every token, and takes part in its group's baseline:
its advantage is TRL's group-normalised one, negative, not forced to 0.
"""

from __future__ import annotations

import functools
import json
import threading
from pathlib import Path

import pytest
import torch
from test_agent_failures import FLOOD

pytestmark = [pytest.mark.podman, pytest.mark.slow]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_agent_pids_rollout_is_scored_in_the_group_baseline(tmp_path, monkeypatch, warm_policy):
    from ecredit_trl.agent.env import SWEAgentEnv
    from ecredit_trl.train import main
    from ecredit_trl.trainer import ECreditGRPOTrainer
    from eval.tasks.splits import load_tasks

    real_view = SWEAgentEnv.view
    flooded: list = []
    lock = threading.Lock()

    @functools.wraps(real_view)  # TRL builds the tool schema from its signature and doc
    def view(self, path, line=0):
        with lock:
            first = not flooded
            if first:
                flooded.append(self.task.instance_id)
        if first:
            self.bash(FLOOD)
            return self.bash("echo next")
        return real_view(self, path, line)

    seen: list[tuple] = []  # (failure class, exclusion, A, |C| summed over tokens)
    real_record = ECreditGRPOTrainer._record_round

    def record_round(self, rnd, inj, **kw):
        seen.extend((r.failure_class, r.exclusion, float(inj.A[i]), float(inj.C[i].abs().sum()))
                    for i, r in enumerate(rnd.records))
        return real_record(self, rnd, inj, **kw)

    monkeypatch.setattr(SWEAgentEnv, "view", view)
    monkeypatch.setattr(ECreditGRPOTrainer, "_record_round", record_round)
    runs = tmp_path / "runs"
    rc = main(["--arm", "M", "--max_steps", "1", "--runs_dir", str(runs), "--max_tasks", "2",
               "--save_strategy", "no", "--verifier_retries", "0",
               "--terminal_reward", "utility",
               # GRPO's own negative advantages (the default weights them 0), so the loss
               # itself shows the failure being paid for
               "--negative_advantage_weight", "1"])
    assert rc == 0 and flooded
    (run,) = runs.iterdir()
    trajs = _jsonl(run / "trajectories.jsonl")
    (ledger,) = _jsonl(run / "ledger.jsonl")
    (t,) = [t for t in trajs if t["failure_class"] == "agent_pids"]
    task = {x.instance_id: x for x in load_tasks("bundled:train", purpose="train")}[t["task_id"]]
    value = -1.0 if task.PASS_TO_PASS else 0.0  # the contract's failure value
    assert t["exclusion"] is None and t["failure"][0] == "sandbox_error"
    assert t["reward"] == t["utility"] == value and t["resolved"] is False
    assert t["factual"] is None and t["counterfactual"] is None and t["contrast"] is None
    ev = t["failure_evidence"]
    assert ev["service_ok"] is True and ev["container"] == "running"
    assert ev["cgroup"]["pids_current"] >= ev["cgroup"]["pids_max"] - 4
    assert [c["status"] for c in t["tool_calls"]][:2] == ["ok", "infra"]
    # C = 0 on every token of it (arm M: credit exists only with a contrast)
    (mine,) = [s for s in seen if s[0] == "agent_pids"]
    assert mine[3] == 0.0 and mine[1] is None
    # in the group baseline: TRL's advantage from every reward of the group, this one included
    group = [x for x in trajs if x["task_id"] == t["task_id"] and x["step"] == t["step"]]
    # (a row TRL masks, reward None, would be out of it: nanmean / nanstd)
    rewards = torch.tensor([x["reward"] for x in group if x["reward"] is not None])
    assert len(group) > 1 and len(rewards) > 1
    assert rewards.max() > rewards.min(), "the group's rewards are all equal: no baseline to see"
    expected = (value - rewards.mean()) / (rewards.std() + 1e-4)
    assert t["advantage"] == pytest.approx(float(expected), abs=1e-3)
    assert t["advantage"] < 0 and mine[2] == pytest.approx(t["advantage"], abs=1e-6)
    assert ledger["reward_unavailable"] == sum(1 for x in trajs if x["reward"] is None)
    assert "agent_pids" not in ledger["rollouts_excluded"]
    assert ledger["rollouts_excluded"].get("sandbox_error", 0) == 0
