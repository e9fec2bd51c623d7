"""``pipeline: overlapped`` computes what ``pipeline: sequential`` computes.

The real trainer path in this process (``ecredit_trl.train.main``: Podman, the embedded
policy, bundled tasks, real TRL steps, real verifier trials), run twice with the same
seed: once with the sequential order, once overlapped (tool calls in parallel, trials
submitted as episodes end). Rollout 2's factual trial is given an image that does not
exist (a real ``infra_error`` trial: the container cannot be made), so its factual utility
is unavailable: the overlapped run has already submitted its counterfactual trial, which
must be discarded and counted, never used. (An artifact that does not apply no longer
serves: with a healthy control and a failing retry it is the policy's failure, scored;
see the design page, "Who caused a failure decides the reward".)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.podman, pytest.mark.slow]

TIMING = {"seconds", "queue_wait_s", "setup_s", "test_s", "apply_s", "cleanup_s", "service_s",
          "wall_s", "gpu_hours", "verify_s", "endpoint", "generation_busy_s", "tool_busy_s",
          "verifier_busy_s", "generation_wait_s", "verifier_idle_s", "rollout_setup_s"}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _strip(x):
    """A record without its timings (and the per-run Podman endpoint)."""
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k not in TIMING}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def _run(tmp_path: Path, pipeline: str) -> Path:
    from ecredit_trl.train import main

    runs = tmp_path / pipeline
    rc = main(["--arm", "B", "--max_steps", "2", "--runs_dir", str(runs), "--max_tasks", "2",
               "--save_strategy", "no", "--verifier_retries", "0", "--pipeline", pipeline,
               "--agent_concurrency", "4",
               # every ablation its own trial, so the overlapped run submits rollout 3's
               # counterfactual before its factual result (an empty ablation taken from the
               # control would submit nothing to discard)
               "--reuse_control_for_empty_ablation", "false"])
    assert rc == 0
    (run,) = runs.iterdir()
    return run


def test_overlapped_pipeline_gives_the_sequential_records(tmp_path, monkeypatch, warm_policy):
    import dataclasses

    from ecredit_trl.trainer.trials import TrialPipelineMixin

    real_spec = TrialPipelineMixin._spec

    def spec(self, task, artifact, trial_id):  # rollout 3's factual trial cannot start
        s = real_spec(self, task, artifact, trial_id)
        return (dataclasses.replace(s, image="localhost/ecredit-no-such-image:0")
                if trial_id == "f-3" else s)

    monkeypatch.setattr(TrialPipelineMixin, "_spec", spec)
    seq, ovl = _run(tmp_path, "sequential"), _run(tmp_path, "overlapped")
    t_seq, t_ovl = _jsonl(seq / "trajectories.jsonl"), _jsonl(ovl / "trajectories.jsonl")
    l_seq, l_ovl = _jsonl(seq / "ledger.jsonl"), _jsonl(ovl / "ledger.jsonl")
    assert len(t_seq) == len(t_ovl) == 8 and [r["step"] for r in l_ovl] == [1, 2]
    assert [_strip(t) for t in t_ovl] == [_strip(t) for t in t_seq]
    assert any(t["contrast"] is not None for t in t_ovl)  # the comparison has substance
    # rollout 3 (one the warm-started policy edits in, with these seeds): admitted by its plan,
    # factual infra failure -> no utility, no counterfactual
    t2 = t_ovl[3]
    assert t2["rollout_index"] == 3 and t2["selected_turn"] is not None
    assert t2["factual_outcome"] == "infra_error" and t2["exclusion"] == "no_original_utility"
    assert t2["counterfactual"] is None and t2["contrast"] is None
    # ledger: the same counts; the overlapped run paid for one counterfactual it discarded
    assert [r["counterfactual_discarded"] for r in l_seq] == [0, 0]
    assert [r["counterfactual_discarded"] for r in l_ovl] == [1, 0]
    keep = lambda r: {k: v for k, v in _strip(r).items() if k != "counterfactual_discarded"}  # noqa: E731
    assert [keep(r) for r in l_ovl] == [keep(r) for r in l_seq]
    ids = {p: json.loads((run / "ranks" / "rank0.json").read_text())["trial_ids"]
           for p, run in (("sequential", seq), ("overlapped", ovl))}
    assert set(ids["overlapped"]) - set(ids["sequential"]) == {"cf-3"}
    # the stage timings are on record and add up
    for r in l_ovl + l_seq:
        assert r["generation_busy_s"] > 0 and r["verifier_busy_s"] > 0 and r["tool_busy_s"] > 0
        assert r["verifier_busy_s"] + r["verifier_idle_s"] == pytest.approx(r["wall_s"], abs=2e-3)
        assert r["generation_busy_s"] + r["generation_wait_s"] + r["rollout_setup_s"] < r["wall_s"]
    for run, name in ((seq, "sequential"), (ovl, "overlapped")):
        man = json.loads((run / "manifest.json").read_text())
        assert man["config"]["ecredit"]["pipeline"] == name
