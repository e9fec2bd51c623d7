"""The CPU picture of ``benchmarks/step_pipeline.py`` and the OpenMP default.

Pure parts on known samples (rounds found from the ledger rows, utilisation, the share of
saturated periods), this run's containers found by name in real cgroup / storage files laid
out as Podman's cgroupfs manager and c/storage write them, and ``OMP_WAIT_POLICY`` set by
``ecredit_trl.train`` before torch loads unless the user set it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("step_pipeline",
                                                  ROOT / "benchmarks" / "step_pipeline.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["step_pipeline"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_cpu_picture_of_known_samples(bench):
    S = bench.CpuSample
    # 2 cores; machine busy grows 2/s from t=1 to t=3 (saturated), 1/s otherwise
    samples = [S(0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0), S(1.0, 1.0, 2.0, 0.5, 0.2, 0, 0.1),
               S(2.0, 3.0, 4.0, 1.0, 0.6, 0, 0.5), S(3.0, 5.0, 6.0, 1.5, 1.0, 1, 0.9),
               S(4.0, 6.0, 8.0, 1.5, 1.5, 1, 0.9)]
    pic = bench.cpu_picture(samples, wall_s=[2.0], ncpu=2, run_cpu_s=1.7)
    run = pic["run"]
    assert run["seconds"] == 4.0 and run["machine_busy"] == 6.0
    assert run["trainer_tree"] == 1.7 and run["run_containers"] == 0.9
    assert run["all_containers"] == 1.5 and run["other"] == pytest.approx(6.0 - 1.7 - 0.9)
    (rnd,) = pic["rounds"]  # ledger row 1 appeared at t=3, the round took 2 s: [1, 3]
    assert rnd["seconds"] == 2.0 and rnd["machine_busy"] == 4.0
    assert rnd["trainer_tree"] == pytest.approx(0.8) and rnd["run_containers"] == 0.8
    assert pic["saturated"] == 0.5  # periods [1,2] and [2,3] of four
    tot = bench.add_cpu(pic["rounds"] * 2, ncpu=2)
    assert tot["seconds"] == 4.0 and tot["util"] == 1.0
    assert bench.add_cpu([], ncpu=2) is None


def test_machine_cpu_reads_proc_stat(bench):
    busy, total = bench.machine_cpu()
    assert 0 < busy <= total


def test_run_containers_counts_only_this_runs_containers(bench, tmp_path, monkeypatch):
    cg, store = tmp_path / "libpod_parent", tmp_path / "containers.json"
    usage = {"aaa": 2_500_000_000, "bbb": 7_000_000_000, "ccc": 1_000_000_000}
    for cid, ns in usage.items():
        (cg / f"libpod-{cid}").mkdir(parents=True)
        (cg / f"libpod-{cid}" / "cpuacct.usage").write_text(f"{ns}\n")
    (cg / "conmon").mkdir()
    store.write_text(json.dumps([{"id": "aaa", "names": ["ecredit-run1-f-0-abc"]},
                                 {"id": "bbb", "names": ["ecredit-run2-f-0-abc"]},
                                 {"id": "ccc", "names": ["ecredit-run1-agent-1234"]}]))
    monkeypatch.setattr(bench, "CGROUP_CONTAINERS", str(cg))
    monkeypatch.setattr(bench, "CONTAINERS_JSON", str(store))
    own = bench.RunContainers()
    assert own.sample() == 0.0  # the run's directory (its name) is not known yet
    own.prefix = "ecredit-run1-"
    assert own.sample() == pytest.approx(3.5)
    # a removed container keeps its last reading; a new one is looked up by name
    (cg / "libpod-aaa" / "cpuacct.usage").unlink()
    (cg / "libpod-aaa").rmdir()
    (cg / "libpod-ddd").mkdir()
    (cg / "libpod-ddd" / "cpuacct.usage").write_text("500000000\n")
    store.write_text(json.dumps([{"id": "ddd", "names": ["ecredit-run1-cf-0-abc"]}]))
    assert own.sample() == pytest.approx(4.0)


@pytest.mark.parametrize("given, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_train_sets_a_passive_openmp_wait_policy_before_torch(given, expected):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    env["PYTHONPATH"] = str(ROOT)
    # what libgomp reads is the value at the moment torch is first imported: record it there
    # (a meta-path hook that sees the first `import torch`), not after train.py has loaded
    code = ("import os, sys\n"
            "seen = []\n"
            "class Hook:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch' and not seen:\n"
            "            seen.append(os.environ.get('OMP_WAIT_POLICY', '<unset>'))\n"
            "        return None\n"
            "sys.meta_path.insert(0, Hook())\n"
            "import ecredit_trl.train\n"
            "print(seen[0] if seen else '<torch not imported>', os.environ['OMP_WAIT_POLICY'])\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == [expected, expected]


def test_both_runs_take_the_runtime_flag(bench, tmp_path):
    """On a host without Podman the benchmark runs on the local runtime (the GPU check passes
    its own choice through); Podman stays the default."""
    local = bench.parse_args(["--runtime", "local", "--steps", "2"])
    cmd = bench.train_command("overlapped", local, tmp_path)
    assert cmd[cmd.index("--runtime") + 1] == "local"
    assert cmd[cmd.index("--pipeline") + 1] == "overlapped" and cmd[cmd.index("--max_steps") + 1] == "2"
    default = bench.train_command("sequential", bench.parse_args([]), tmp_path)
    assert default[default.index("--runtime") + 1] == "podman"
    with pytest.raises(SystemExit):
        bench.parse_args(["--runtime", "docker"])
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    step = script[script.index("step step-pipeline 200"):].split("\n\n")[0]
    assert '--runtime "$GPU_CHECK_RUNTIME"' in step.split("else")[0]
