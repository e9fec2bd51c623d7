"""``train.py --use_vllm true --vllm_mode colocate`` end to end on this CPU host, with the
official template's training settings (studies/official500_lora.yaml: arm M, LoRA r 16,
credit settings, ``use_vllm``) and the sizes, model and tasks swapped for local stand-ins: the
embedded warm-started policy (LoRA r 16 on it), the bundled training tasks, Podman with real
verifier trials. (A family model through vLLM with LoRA: tests/test_vllm_colocate.py.)

Checked as in tests/test_family_e2e.py: tool calls parsed and run (a
file changed), factual and counterfactual trials, the credit C non-zero exactly on the selected
turn's tokens; and here: every step's rollouts came from vLLM with the weights pushed before
each generation round (the CPU route, :mod:`ecredit_trl.policy.vllm_sync`), and the run reached
step 1 and beyond (its ledger holds both steps).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_family_e2e import _capture_credit, _check_credit, _jsonl

import ecredit_trl.policy.vllm_sync as vllm_sync
from ecredit_trl.study.positive_control import train_flags
from ecredit_trl.trainer.agreement import HEALTHY_FP32_MEAN

pytestmark = [pytest.mark.podman, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parent.parent
#: the template's sizes that a tiny CPU run cannot take, and the stand-ins
STAND_INS = {"max_steps": 2, "per_device_train_batch_size": 4, "num_generations": 4,
             "max_turns": 4, "max_completion_length": 1024, "vllm_max_model_length": 2048,
             "verifier_concurrency": 2, "bf16": False, "use_cpu": True, "learning_rate": 1e-4}


def test_official_template_trains_through_vllm_colocate(tmp_path, monkeypatch, podman_runtime,
                                                         warm_policy):
    from ecredit_trl.train import main

    policy = warm_policy  # the embedded stand-in for the template's model (LoRA on it)
    template = yaml.safe_load((REPO_ROOT / "studies/official500_lora.yaml").read_text())
    train = template["train"]
    assert train["use_vllm"] is True and train["lora_r"] == 16
    train = {**train, **STAND_INS, "tasks": "bundled:train"}

    pushes = []
    real = vllm_sync.reload_weights
    monkeypatch.setattr(vllm_sync, "reload_weights", lambda gen: pushes.append(real(gen)))
    seen = _capture_credit(monkeypatch)
    runs = tmp_path / "runs"
    rc = main(["--arm", "M", "--model", policy, *train_flags(train), "--vllm_mode", "colocate",
               "--runs_dir", str(runs), "--verifier_retries", "0", "--seed", "0"])
    assert rc == 0
    (run,) = runs.iterdir()
    assert len(pushes) == 2 and all(n > 0 for n in pushes)  # one push per generation round
    rows = _jsonl(run / "trajectories.jsonl")
    assert len(rows) == 8  # 2 steps x 4 rollouts
    assert [r["step"] for r in _jsonl(run / "ledger.jsonl")] == [1, 2]
    ran = [c for r in rows for c in r["tool_calls"] if c["ok"]]
    assert {c["name"] for c in ran} >= {"view", "str_replace", "submit"}
    assert any(c["ok"] and c["name"] == "str_replace" and r["turns"][c["turn"] - 1]["writes"]
               for r in rows for c in r["tool_calls"]), "no tool call changed the snapshot"
    scored = [r for r in rows if r["factual"] is not None]
    assert scored and all(r["factual_outcome"] not in (None, "infra_error") for r in scored)
    queried = [r for r in rows if r["counterfactual"] is not None]
    assert queried and all(r["selected_turn"] in r["eligible_turns"] for r in queried)
    assert _check_credit(seen, rows) >= 1, "no rollout got credit (no D != 0)"
    man = json.loads((run / "manifest.json").read_text())
    ecfg = man["config"]["ecredit"]
    assert ecfg["use_vllm"] is True and ecfg["vllm_mode"] == "colocate"
    assert man["config"]["model"]["lora"]["r"] == 16


def test_embedded_default_arm_m_through_vllm_colocate(tmp_path, monkeypatch, warm_policy):
    """The embedded default (tiny policy, bundled tasks, Podman) with ``--use_vllm true
    --vllm_mode colocate``: tool calls executed, factual and counterfactual trials, credit on
    the selected turn's tokens, the weights pushed before both generation rounds."""
    from ecredit_trl.train import main

    pushes = []
    real = vllm_sync.reload_weights
    monkeypatch.setattr(vllm_sync, "reload_weights", lambda gen: pushes.append(real(gen)))
    seen = _capture_credit(monkeypatch)
    runs = tmp_path / "runs"
    assert main(["--arm", "M", "--use_vllm", "true", "--vllm_mode", "colocate",
                 "--runs_dir", str(runs), "--reuse_control_for_empty_ablation", "false"]) == 0
    (run,) = runs.iterdir()
    assert len(pushes) == 2
    ledger = _jsonl(run / "ledger.jsonl")
    rows = _jsonl(run / "trajectories.jsonl")
    assert [r["step"] for r in ledger] == [1, 2] and len(rows) == 8
    assert {c["name"] for r in rows for c in r["tool_calls"] if c["ok"]} & {"view", "bash",
                                                                          "str_replace"}
    assert sum(r["trials_factual"] for r in ledger) == 8
    assert sum(r["trials_counterfactual"] for r in ledger) >= 1
    assert _check_credit(seen, rows) >= 1
    # vLLM in float32 samples what the trainer computes: TRL's figures, in the ledger too
    print("vLLM colocate agreement:", [(r["sampling_logp_diff_mean"], r["sampling_logp_diff_max"])
                                       for r in ledger])
    assert all(r["sampling_logp_diff_mean"] < HEALTHY_FP32_MEAN for r in ledger)
    assert all(0 < r["importance_ratio_min"] <= r["importance_ratio_max"] for r in ledger)
