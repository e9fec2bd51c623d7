"""Guard per rollout: whatever one rollout's records do, the run goes on.

The real trainer path in this process (`ecredit_trl.train.main`: Podman, tiny policy,
real TRL step, real verifier trials), with two failures injected: one rollout's agent
container cannot start (an infra failure of that rollout), and building another
rollout's query plan raises. Both rollouts are excluded with their reason (and the
traceback) in ``trajectories.jsonl`` and counted in the ledger; the others are verified.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

pytestmark = [pytest.mark.podman, pytest.mark.slow]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_broken_rollout_records_exclude_that_rollout_only(tmp_path, monkeypatch, warm_policy):
    import ecredit_trl.agent.episode_record as record_mod  # builds the records
    import sandbox.workspace.rollout as env_mod  # the workspace opens the rollout's session
    from ecredit_trl.train import main
    from sandbox.images import build_offline
    from sandbox.snapshots.snapshot import SnapshotError

    build_offline(log=lambda *_: None)
    real_open, real_plan = env_mod.open_session, record_mod.plan_query
    opened = []

    def open_session(*a, **kw):  # the first rollout's container cannot start
        opened.append(1)
        if len(opened) == 1:
            raise RuntimeError("OCI runtime error: injected")
        return real_open(*a, **kw)

    # The first rollout planned has its records break. Which rollout that is (and which one
    # opened the failing container) depends on the order episodes end in when they run
    # concurrently, so the broken one is whichever reached planning first; a rollout whose
    # container never started is never planned.
    broken_idx: list[int] = []
    lock = threading.Lock()

    def plan_query(repo, snapshots, **kw):
        with lock:
            first = not broken_idx
            if first:
                broken_idx.append(kw["rollout_index"])
        if first:
            raise SnapshotError("injected: bad object in the snapshot store")
        return real_plan(repo, snapshots, **kw)

    monkeypatch.setattr(env_mod, "open_session", open_session)
    monkeypatch.setattr(record_mod, "plan_query", plan_query)
    runs = tmp_path / "runs"
    rc = main(["--arm", "B", "--max_steps", "1", "--runs_dir", str(runs), "--max_tasks", "2",
               "--save_steps", "100", "--verifier_retries", "0"])
    assert rc == 0
    (run,) = runs.iterdir()
    trajs = {t["rollout_index"]: t for t in _jsonl(run / "trajectories.jsonl")}
    (ledger,) = _jsonl(run / "ledger.jsonl")
    assert len(trajs) == ledger["rollouts"] == 4
    setup = [t for t in trajs.values() if t["exclusion"] == "sandbox_setup"]
    assert len(setup) == 1 and setup[0]["reward"] is None
    assert setup[0]["failure"][0] == "sandbox_setup" and "injected" in setup[0]["failure"][1]
    assert setup[0]["factual"] is None  # no trial for an infra-failed rollout
    (bi,) = broken_idx
    broken = trajs[bi]
    assert broken not in setup
    assert broken["exclusion"] == "record_error" and broken["reward"] is None
    assert "Traceback" in broken["record_error"]
    assert "SnapshotError: injected: bad object" in broken["record_error"]
    assert broken["factual"] is None and broken["counterfactual"] is None
    others = [t for t in trajs.values() if t is not broken and t not in setup]
    assert len(others) == 2 and all(t["factual"] is not None for t in others)
    assert ledger["trials_factual"] == 2
    assert ledger["rollouts_excluded"]["record_error"] == 1
    assert ledger["rollouts_excluded"]["sandbox_setup"] == 1
    assert ledger["reward_unavailable"] >= 2
    for key in ("calls_not_run", "calls_after_submit"):
        assert ledger[key] == sum(t[key] for t in trajs.values())
    # tokens after an accepted submit get no credit: L counts the turns up to the submit
    for t in trajs.values():
        sub = t["submit_turn"]
        gens = [turn["generated_tokens"] for turn in t["turns"]]
        assert t["L"] == (sum(gens[:sub]) if sub else sum(gens))
        assert [bool(turn.get("after_submit")) for turn in t["turns"]] == \
            [sub is not None and k > sub for k in range(1, len(gens) + 1)]
    # the disk limits of the run are on record in its manifest
    man = json.loads((run / "manifest.json").read_text())
    assert man["config"]["ecredit"]["agent_max_file_mib"] == 100
    assert man["config"]["ecredit"]["agent_tree_budget_mib"] == 2048
