"""A trainer SIGKILLed mid-round: its agent containers keep running (conmon
outlives the private Podman service); the next start of a run in the same runs directory
removes them, a finished run leaves no temp trees, and ``python -m sandbox gc`` removes
the killed run's temp trees (working roots, snapshot indexes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT

pytestmark = [pytest.mark.podman, pytest.mark.slow]

ARGS = ["--arm", "O", "--max_tasks", "2", "--num_generations", "2",
        "--per_device_train_batch_size", "2", "--max_completion_length", "256",
        "--save_steps", "100", "--verifier_retries", "0"]


def _podman(*args: str) -> str:
    from sandbox.runtimes.podman_runtime import podman_env

    return subprocess.run(["podman", *args], capture_output=True, text=True,
                          env=podman_env()).stdout


def _containers(run: str, *filters: str) -> list[str]:
    out = _podman("ps", "-a", "--filter", f"label=ecredit.run={run}",
                  *[f"--filter={f}" for f in filters], "--format", "{{.Names}}")
    return out.split()


def _owner(d: Path) -> int | None:
    try:
        return json.loads((d / ".ecredit-owner.json").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def _start(runs: Path, tmp: Path, *extra: str, base: bool = True) -> subprocess.Popen:
    """train.py with ``ARGS`` + ``extra`` (``base=False``: ``extra`` alone, for a resume,
    which takes its run's arguments from the manifest)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1", TMPDIR=str(tmp))
    return subprocess.Popen([sys.executable, "ecredit_trl/train.py", "--runs_dir", str(runs),
                             *(ARGS if base else []), *extra], cwd=REPO_ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_killed_run_leaves_nothing_after_next_start_and_gc(tmp_path, warm_policy):
    from sandbox.images import build_offline
    from sandbox.runtimes.podman_runtime import gc

    build_offline(log=lambda *_: None)
    runs, tmp = tmp_path / "runs", tmp_path / "tmp"
    tmp.mkdir()
    first = _start(runs, tmp, "--max_steps", "3", "--run_name_prefix", "killed")
    run_name = None
    try:
        # wait for the run directory, then for a running agent container of that run
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and first.poll() is None:
            dirs = list(runs.glob("killed-*")) if runs.is_dir() else []
            if dirs:
                run_name = dirs[0].name
                if _containers(run_name, "label=ecredit.role=agent", "status=running"):
                    break
            time.sleep(0.2)
        assert run_name and first.poll() is None, first.stdout.read()[-3000:]
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
        time.sleep(2)  # the service got SIGTERM from the kernel (PDEATHSIG) and exited
        left = _containers(run_name, "label=ecredit.role=agent", "status=running")
        assert left, "the killed run's agent containers should outlive it (the fault)"
        killed_roots = [d for d in tmp.glob("ecredit-rollouts-*") if _owner(d) == first.pid]
        assert killed_roots, sorted(p.name for p in tmp.iterdir())

        # the next start in the same runs directory detects the dead session and removes
        # its containers; its own run finishes and removes its own temp trees
        second = _start(runs, tmp, "--max_steps", "1", "--run_name_prefix", "next")
        out, _ = second.communicate(timeout=600)
        assert second.returncode == 0, out[-4000:]
        assert "container(s) left by that session" in out, out[-3000:]
        assert _containers(run_name) == []
        (next_run,) = runs.glob("next-*")
        assert _containers(next_run.name) == []
        mine = [d for d in tmp.glob("ecredit-*") if _owner(d) == second.pid]
        assert mine == []  # the finished run cleaned its temp root and snapshot indexes
        term = json.loads((runs / run_name / "receipts" / "s00-termination.json").read_text())
        assert term["detected"] is True

        # gc removes the killed run's temp trees (its owner is dead); nothing is left
        proc = subprocess.run([sys.executable, "-m", "sandbox", "gc", "--run-id", run_name,
                               "--temp-root", str(tmp)],
                              cwd=REPO_ROOT, capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
        assert proc.returncode == 0, proc.stderr
        assert [d.name for d in tmp.iterdir() if d.name.startswith("ecredit-")] == []
    finally:
        for p in (first,):
            if p.poll() is None:
                p.kill()
        if run_name:
            gc(run_name)


def _run_name(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / "manifest.json").read_text())["run_name"]
    except (OSError, ValueError, KeyError):
        return None


def test_resume_removes_every_container_of_the_killed_session(tmp_path, warm_policy):
    """SIGKILL a run written to ``--output_dir`` (as the study writes its units:
    the directory's name is not the run's name) while its verifier trials run, then resume it
    to completion: every container of the killed session, whatever its role, is removed and
    named in the resume receipt."""
    from sandbox.images import build_offline
    from sandbox.runtimes.podman_runtime import gc

    build_offline(log=lambda *_: None)
    runs, tmp, out = tmp_path / "runs", tmp_path / "tmp", tmp_path / "runs" / "unit-B-s0"
    tmp.mkdir()
    first = _start(runs, tmp, "--max_steps", "3", "--save_steps", "1",
                   "--output_dir", str(out))
    run_name = None
    try:
        deadline = time.monotonic() + 500
        verifiers: list[str] = []
        while time.monotonic() < deadline and first.poll() is None:
            run_name = run_name or _run_name(out)
            if run_name and (out / "checkpoint-1").is_dir():
                verifiers = _containers(run_name, "label=ecredit.role=verifier")
                if verifiers:
                    break
            time.sleep(0.1)
        assert verifiers and first.poll() is None, first.stdout.read()[-3000:]
        assert run_name != out.name  # the fault's precondition: label != directory name
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
        left = _containers(run_name)
        assert left, "the killed session should leave containers behind (the fault)"

        again = _start(runs, tmp, "--resume-from", str(out / "checkpoint-1"), base=False)
        text, _ = again.communicate(timeout=900)
        assert again.returncode == 0, text[-4000:]
        assert _containers(run_name) == [], text[-3000:]
        (resume,) = (out / "receipts").glob("s01-resume.json")
        found = json.loads(resume.read_text())["detected_unterminated"]
        removed = [n for f in found for n in f["containers_removed"]]
        assert set(verifiers) <= set(removed), (verifiers, found)
        term = json.loads((out / "receipts" / "s01-termination.json").read_text())
        assert term["class"] == "completed"
    finally:
        if first.poll() is None:
            first.kill()
        if run_name:
            gc(run_name)
