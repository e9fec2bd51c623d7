"""The main job end to end: `accelerate launch ecredit_trl/train.py --arm X` (Podman, tiny policy).

Real accelerate launches, real TRL steps, real verifier trials. The embedded
policy and the bundled tasks come from their caches (built on first use).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

pytestmark = pytest.mark.podman

ACCELERATE = str(Path(sys.executable).with_name("accelerate"))


def _launch(tmp_path: Path, arm: str, *extra: str, config: str | None = None,
            timeout: int = 600) -> Path:
    runs = tmp_path / "runs"
    cmd = [ACCELERATE, "launch"]
    cmd += ["--config_file", config] if config else ["--num_processes", "1"]
    cmd += ["ecredit_trl/train.py", "--arm", arm, "--runs_dir", str(runs), *extra]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
                          env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (run_dir,) = list(runs.iterdir())
    return run_dir


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def warm_policy():
    """Build (or reuse) the embedded policy once, outside the timed launches."""
    from ecredit_trl.policy.warmstart import ensure_default_policy
    from eval.tasks.splits import load_tasks

    return ensure_default_policy(load_tasks("bundled:train", purpose="train"))


#: arm M runs with every ablation verified by a trial of its own, arm B with the default (an
#: empty ablation takes U(P\b) from the task's empty-patch control): both paths end to end
OWN_TRIAL = {"M": ("--reuse_control_for_empty_ablation", "false")}


@pytest.mark.parametrize("arm", ["O", "B", "M", "E"])
def test_each_arm_runs_two_steps(arm, tmp_path, warm_policy):
    run = _launch(tmp_path, arm, "--max_steps", "2", *OWN_TRIAL.get(arm, ()))
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["ecredit"]["arm"] == arm
    ledger = _jsonl(run / "ledger.jsonl")
    assert [r["step"] for r in ledger] == [1, 2]
    trajs = _jsonl(run / "trajectories.jsonl")
    assert len(trajs) == sum(r["rollouts"] for r in ledger) == 2 * 4
    assert len({t["rollout_index"] for t in trajs}) == len(trajs)
    for t in trajs:  # replay format of the credit issue, plus our fields
        assert set(t) >= {"task_id", "rollout_index", "format_error", "turns"}
        # turns whose only files were generated ones (never recorded) are named, not blocks
        assert all(g["turn"] not in t["eligible_turns"] for g in t["generated_only"])
        assert sum(turn["generated_tokens"] for turn in t["turns"]) == t["generated_tokens"]
    cf = sum(r["trials_counterfactual"] for r in ledger)
    factual = sum(r["trials_factual"] for r in ledger)
    assert factual == len(trajs)  # one factual trial per rollout
    # each factual record states its protected set and what the artifact touched
    assert all("conftest.py" in t["factual"]["protected"] for t in trajs if t["factual"])
    assert sum(r["protected_paths_touched"] for r in ledger) == sum(
        1 for t in trajs if t["factual"] and t["factual"]["protected_touched"])
    reused = sum(r["counterfactual_from_control"] for r in ledger)
    if arm in ("B", "M"):
        queried = [t for t in trajs if t["counterfactual"]]
        assert queried, "no counterfactual was answered"
        assert all(t["exclusion"] is None for t in queried)
        from_control = [t for t in queried if t["counterfactual"].get("source") == "control"]
        assert cf + reused == len(queried)  # exactly one per admitted rollout
        assert reused == len(from_control)
        for t in queried:  # only an empty ablation (the control's artifact) takes the control's
            if t in from_control:
                assert t["ablation"]["artifact_empty"] and t["counterfactual"]["trial_id"]
            else:
                assert t["counterfactual"]["trial_id"] == f"cf-{t['rollout_index']}"
        if arm in OWN_TRIAL:
            assert cf >= 1 and reused == 0, "no counterfactual trial was answered"
        assert any(t["contrast"] is not None for t in trajs)
    else:
        assert cf == reused == 0 and all(t["contrast"] is None for t in trajs)
    for t in trajs:  # at most one counterfactual per rollout, by construction of the record
        assert t["counterfactual"] is None or isinstance(t["counterfactual"], dict)
    assert (run / "checkpoint-final" / "config.json").exists()
    assert (run / "metrics.jsonl").exists()
    # run records (design page, "Run records"): manifest, start / checkpoint / termination receipts
    man = json.loads((run / "manifest.json").read_text())
    assert man["world_size"] == 1 and man["tasks"]["n"] == len(cfg["tasks"])
    assert len(man["config_sha256"]) == 64 and len(man["code"]["sha256"]) == 64
    assert man["images"] and all(d.startswith("sha256:") for d in man["images"].values())
    assert man["packages"]["trl"] and man["sealed_holdouts"]
    receipts = sorted(p.name for p in (run / "receipts").iterdir())
    assert receipts == ["s00-checkpoint-000002.json", "s00-checkpoint-final.json",
                        "s00-start.json", "s00-termination.json"]
    term = json.loads((run / "receipts" / "s00-termination.json").read_text())
    assert term["class"] == "completed" and term["step"] == 2
    ck = json.loads((run / "receipts" / "s00-checkpoint-000002.json").read_text())
    assert ck["state_present"]["optimizer"] and ck["state_present"]["rng"] == ["rng_state.pth"]
    final = json.loads((run / "receipts" / "s00-checkpoint-final.json").read_text())
    assert final["reason"] == "final" and not final["state_present"]["optimizer"]
    assert final["weights"]["sha256"] == ck["weights"]["sha256"]  # same weights saved twice


def test_two_cpu_ranks_verify_each_rollout_once_and_stay_in_sync(tmp_path, warm_policy):
    run = _launch(tmp_path, "B", "--max_steps", "1", "--per_device_train_batch_size", "2",
                  "--num_generations", "4",
                  config=str(REPO_ROOT / "accelerate_configs" / "cpu_2proc.yaml"))
    ranks = [json.loads((run / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["param_sha256"] == ranks[1]["param_sha256"]
    trajs = _jsonl(run / "trajectories.jsonl")
    assert sorted(t["rollout_index"] for t in trajs) == [0, 1, 2, 3]
    rollout_trials = [tid for r in ranks for tid in r["trial_ids"] if tid.startswith("f-")]
    assert len(rollout_trials) == len(set(rollout_trials))
    expected = {f"f-{t['rollout_index']}" for t in trajs}
    assert set(rollout_trials) == expected
    # per-rank resume state in the checkpoint, bound to a world size of 2
    assert json.loads((run / "manifest.json").read_text())["world_size"] == 2
    ck = json.loads((run / "receipts" / "s00-checkpoint-000001.json").read_text())
    assert ck["state_present"]["rng"] == ["rng_state_0.pth", "rng_state_1.pth"]
    assert ck["state_present"]["ecredit_state"] == ["ecredit_state_0.json",
                                                    "ecredit_state_1.json"]
