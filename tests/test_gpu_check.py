"""``scripts/gpu_check.sh --dry-run`` on this CPU host: lists every step of the GPU check -
among them the real-size steps (the Qwen2.5-1.5B and 7B shapes) and the generation speed
benchmark - checks their flags, and passes."""

from __future__ import annotations

import os
import re
import subprocess

from conftest import REPO_ROOT


def test_dry_run_lists_the_real_size_and_generation_steps(tmp_path):
    env = os.environ | {"PYTHONPATH": str(REPO_ROOT), "GPU_CHECK_RUNTIME": "local",
                        "GPU_CHECK_OUT": str(tmp_path), "GPU_CHECK_BUDGET_S": "1200"}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=900, env=env)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-2000:]
    listed = re.findall(r"^\[gpu_check\] step (\S+): (.*)$", out, re.MULTILINE)
    names = [n for n, _ in listed]
    assert names[:5] == ["device", "main-job", "real-size", "generation-speed", "trainer-tests"]
    cmd = dict(listed)
    assert "benchmarks/real_size_step.py --shape 1.5B 7B --dry-run" in cmd["real-size"]
    assert "benchmarks/generation_speed.py --help" in cmd["generation-speed"]
    # the real-size step checked train.py's flags for both shapes
    assert re.search(r"shape 1\.5B: 28 layers, hidden 1536, vocab 151936; 4 rollouts x 1024 "
                     r"tokens, 1 step, arm M, LoRA r 16, bf16, gradient checkpointing", out)
    assert re.search(r"shape 7B: 28 layers, hidden 3584, vocab 152064", out)
    summary = out[out.index("[gpu_check] summary (dry mode"):]
    for name in ("main-job", "real-size", "generation-speed"):
        assert f"  {name}: ok in " in summary, summary
