"""``benchmarks/study_budget.py``: its figures from crafted run and eval records."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("study_budget",
                                                  ROOT / "benchmarks" / "study_budget.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["study_budget"] = mod
    spec.loader.exec_module(mod)
    return mod


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _step(step, wall, factual, cf=0, control=0, resolved=1, rollouts=4):
    return {"step": step, "wall_s": wall, "generation_busy_s": 1.0, "tool_busy_s": 0.5,
            "verifier_busy_s": wall - 2, "trials_factual": factual,
            "trials_counterfactual": cf, "trials_control": control, "resolved": resolved,
            "rollouts": rollouts}


def _slot(task, i, sha, nbytes=10, resolved=False):
    return {"task_id": task, "rollout_index": i, "artifact_sha256": sha,
            "artifact_bytes": nbytes, "resolved": resolved}


def test_eval_summary_counts_repeated_task_artifacts(bench, tmp_path):
    d = tmp_path / "ev"
    d.mkdir()
    _jsonl(d / "slots.jsonl", [
        _slot("t1", 0, "a"), _slot("t1", 1, "a", resolved=True), _slot("t1", 2, "b"),
        _slot("t2", 0, "a"),            # same artifact, other task: not a repeat
        _slot("t2", 1, "e", nbytes=0),  # empty: answered by the control, never counted
        _slot("t2", 2, "x"), _slot("t2", 2, "a"),  # resumed: the last row of a slot counts
    ])
    (d / "results.json").write_text(json.dumps({
        "split": "bundled:train", "wall_s": 60.0, "cost": {"service_s": 30.0},
        "summary": {"success": 1 / 6}}))
    e = bench.eval_summary(d)
    assert (e["slots"], e["nonempty"], e["unique_task_artifact"], e["cache_saves"],
            e["controls"]) == (6, 5, 3, 2, 2)


def test_run_summary_and_projection(bench, tmp_path):
    o, m = tmp_path / "o", tmp_path / "m"
    for d, arm, rows in ((o, "O", [_step(1, 10, 8, control=2), _step(2, 20, 8, control=2)]),
                         (m, "M", [_step(1, 30, 8, cf=4, control=2)])):
        d.mkdir()
        _jsonl(d / "ledger.jsonl", rows)
        (d / "config.json").write_text(json.dumps({"arm": arm}))
    ro, rm = bench.run_summary(o), bench.run_summary(m)
    assert (ro["arm"], ro["steps"], ro["wall_s"], ro["factual"], ro["resolved_rate"]) == (
        "O", 2, 15.0, 8.0, 0.25)
    evals = [{"split": "s", "wall_s": 100.0}, {"split": "s", "wall_s": 200.0}]
    p = bench.project([ro], evals, arms={"O": 2, "M": 1}, steps=4, startup_s=5.0,
                      cf_share=0.5, step_s=None)
    # O step 15 s; M scales by (8·1.5 + 2) / (8 + 2) = 1.4 (the cf_share, no B/M run given)
    assert p["train_s"] == {"O": 2 * (5 + 4 * 15.0), "M": 1 * (5 + 4 * 15.0 * 1.4)}
    assert p["eval_s"] == {"s": 4 * 150.0}
    # a measured M run replaces cf_share (4 / 8 = 0.5 here too) and step_s the mean step
    p2 = bench.project([ro, rm], evals, arms={"O": 1}, steps=2, startup_s=0.0,
                       cf_share=0.9, step_s=12.0)
    assert p2["cf_share"] == 0.5 and p2["train_s"] == {"O": 24.0}


def test_empty_ledger_is_refused_naming_the_file(bench, tmp_path):
    (tmp_path / "ledger.jsonl").write_text("")
    with pytest.raises(ValueError, match="ledger.jsonl: no step rows"):
        bench.run_summary(tmp_path)


def test_service_projection_from_the_seeds_service_times(bench, capsys):
    """64 rollouts a step, up to 2 trials each (B, M), 115-237 s a trial, 24 at once: an O step
    is ceil(64/24) = 3 waves, a B/M step ceil(128/24) = 6 waves; an official500 eval at n=2 is
    500*2 slots + 500 controls = 1500 trials = ceil(1500/24) = 63 waves."""
    p = bench.service_projection(arms={"O": 3, "M": 3}, steps=80, rollouts=64,
                                 trials_per_rollout=2, trial_s=(115.0, 237.0), concurrency=24,
                                 splits={"official500": (500, 2)})
    assert p["per_step"]["O"] == {"trials": 64, "waves": 3, "wall_s": [3 * 115.0, 3 * 237.0]}
    assert p["per_step"]["M"]["trials"] == 128 and p["per_step"]["M"]["waves"] == 6
    assert p["train"]["M"] == {"trials": 3 * 80 * 128, "wall_s": [3 * 80 * 6 * 115.0,
                                                                  3 * 80 * 6 * 237.0]}
    assert p["eval"]["official500"] == {"trials": 7 * 1500, "wall_s": [7 * 63 * 115.0,
                                                                       7 * 63 * 237.0]}
    trials = 3 * 80 * 64 + 3 * 80 * 128 + 7 * 1500
    assert p["trials"] == trials
    assert p["trial_hours"] == pytest.approx([trials * 115 / 3600, trials * 237 / 3600])
    two = bench.service_projection(arms={"O": 1}, steps=1, rollouts=64, trials_per_rollout=2,
                                   trial_s=(100.0, 100.0), concurrency=24, hosts=2)
    assert two["per_step"]["O"]["waves"] == 2  # 48 trials at once
    with pytest.raises(ValueError, match="concurrency"):
        bench.service_projection(arms={"O": 1}, steps=1, rollouts=1, trials_per_rollout=1,
                                 trial_s=(1.0, 2.0), concurrency=0)
    assert bench.main(["--service", "--arms", "O:1", "--steps", "2",
                       "--split", "holdout100=100x16"]) == 0
    out = capsys.readouterr().out
    assert "| one O step | 64 (3 waves) | 5.8-11.8 min |" in out
    assert bench.main(["--service", "--split", "bad"]) == 2
