"""The main job with a LoRA adapter (peft) instead of full weights."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

pytestmark = pytest.mark.podman


def test_lora_run_saves_an_adapter(tmp_path):
    accelerate = str(Path(sys.executable).with_name("accelerate"))
    runs = tmp_path / "runs"
    proc = subprocess.run(
        [accelerate, "launch", "--num_processes", "1", "ecredit_trl/train.py", "--arm", "M",
         "--max_steps", "1", "--lora-r", "8", "--lora-alpha", "16", "--runs_dir", str(runs)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
        env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run,) = list(runs.iterdir())
    final = run / "checkpoint-final"
    adapter = json.loads((final / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and adapter["lora_alpha"] == 16
    assert (final / "adapter_model.safetensors").stat().st_size > 0
    assert not (final / "model.safetensors").exists()  # an adapter, not full weights
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["model"]["lora_r"] == 8
