"""``benchmarks/generation_speed.py``: a short run on a random model of the embedded shape
prints its table and rows for every engine and batch (seconds), and the weight-read floor's
arithmetic."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import generation_speed  # noqa: E402 - after the benchmarks path entry


def test_short_run_prints_every_engine_and_batch(tmp_path):
    out = tmp_path / "rows.json"
    engines = list(generation_speed.ENGINES)
    proc = subprocess.run(
        [sys.executable, "benchmarks/generation_speed.py", "--model", "random", "--batch", "1",
         "3", "--new-tokens", "3", "--prompt-tokens", "5", "--repeats", "1", "--engines",
         *engines, "--device", "cpu", "--json", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env=os.environ | {"PYTHONPATH": str(REPO_ROOT), "ECREDIT_ROLLOUT_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["device"] == "cpu" and got["weight_floor_ms"] is None and got["params_m"] > 1
    assert sorted((r["engine"], r["batch"]) for r in got["rows"]) == sorted(
        (e, b) for e in engines for b in (1, 3))
    # a 3-token run's step times are differences of noisy walls: present, not compared
    assert all(r["tokens_per_s"] > 0 and isinstance(r["ms_per_step"], float)
               and isinstance(r["cpu_ms_per_step"], float) for r in got["rows"])
    header = next(x for x in proc.stdout.splitlines() if x.startswith("| batch |"))
    assert "sampler / plain wall / CPU" in header and "plain-static ms/step wall / CPU" in header
    assert [x.split(" | ")[0] for x in proc.stdout.splitlines()
            if x.startswith(("| 1 |", "| 3 |"))] == ["| 1", "| 3"]


def test_weight_read_floor():
    # a 7.62 B model in bf16 (15.24 GB) at an H200's 4.8 TB/s: about 3.2 ms a step
    assert generation_speed.weight_floor_ms(15_240_000_000, 4800) == pytest.approx(3.175)
    assert generation_speed.device_bandwidth("NVIDIA H200") == 4800
    assert generation_speed.device_bandwidth("NVIDIA H100 80GB HBM3") == 3350
    assert generation_speed.device_bandwidth("NVIDIA H100 PCIe") == 2000
    assert generation_speed.device_bandwidth("Some Other GPU") is None
