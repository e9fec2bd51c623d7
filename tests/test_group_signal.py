"""SIGTERM to a training run's whole process group while a snapshot and a trial are in flight.

A batch scheduler (or the study runner) signals the group: the run's git and Podman
children die with it, and the exception their deaths raise must not decide how the
session ended. The receipt's class is the signal's, the exception is listed as the
signal's consequence, the exit status is 143, and the run resumes to completion.

The snapshot is held in flight by a ``git`` on ``PATH`` that runs the real git after a
pause on ``commit-tree`` (the commit of a rollout's base snapshot at its reset), leaving a
marker while it waits; the trial is a real control container of the run (``pipeline:
overlapped`` starts the round's controls before the episodes reset).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT

pytestmark = [pytest.mark.podman, pytest.mark.slow]

ARGS = ["--arm", "O", "--max_steps", "2", "--max_tasks", "2", "--num_generations", "2",
        "--per_device_train_batch_size", "2", "--max_completion_length", "256",
        "--save_steps", "1", "--verifier_retries", "0", "--pipeline", "overlapped"]

# armed by step 1's checkpoint, which git itself looks for: the save is synchronous, so every
# commit of step 2 sees it, however late the test's polling would (step 1 runs at full speed).
# Held: the commit of a rollout's base snapshot S_0 at the episode's reset, which the round's
# controls (already submitted) overlap; killed, it raises out of the step
SLOW_GIT = """#!/bin/sh
case " $* " in
  *" commit-tree "*) if ls -d {runs}/grp-*/checkpoint-1 >/dev/null 2>&1; then
      m="{marks}/snap.$$"; : > "$m"; sleep 5; rm -f "$m"; fi ;;
esac
exec {git} "$@"
"""


def _running_trials(run: str) -> list[str]:
    from sandbox.runtimes.podman_runtime import podman_env

    out = subprocess.run(["podman", "ps", "--filter", f"label=ecredit.run={run}",
                          "--filter", "label=ecredit.role=verifier", "--format", "{{.Names}}"],
                         capture_output=True, text=True, env=podman_env()).stdout
    return out.split()


def _train(runs: Path, tmp: Path, path: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1", TMPDIR=str(tmp), PATH=path)
    return subprocess.Popen([sys.executable, "ecredit_trl/train.py", "--runs_dir", str(runs),
                             *args], cwd=REPO_ROOT, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)


def test_group_sigterm_during_snapshot_and_trial_is_a_sigterm(tmp_path, warm_policy):
    from sandbox.images import build_offline

    build_offline(log=lambda *_: None)
    runs, tmp, marks, shim = (tmp_path / n for n in ("runs", "tmp", "marks", "bin"))
    for d in (tmp, marks, shim):
        d.mkdir()
    (shim / "git").write_text(SLOW_GIT.format(runs=runs, marks=marks, git=shutil.which("git")))
    (shim / "git").chmod(0o755)
    path = f"{shim}{os.pathsep}{os.environ['PATH']}"
    p = _train(runs, tmp, path, *ARGS, "--run_name_prefix", "grp")
    try:
        deadline = time.monotonic() + 600
        run = None
        while time.monotonic() < deadline and p.poll() is None:
            dirs = list(runs.glob("grp-*")) if runs.is_dir() else []
            run = dirs[0] if dirs else None
            # during step 2, a snapshot and a trial in flight at once
            if list(marks.glob("snap.*")) and _running_trials(run.name):
                break
            time.sleep(0.1)
        assert run is not None and p.poll() is None, p.stdout.read()[-3000:]
        os.killpg(p.pid, signal.SIGTERM)
        out = p.communicate(timeout=300)[0]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 143, out[-3000:]
    term = json.loads((run / "receipts" / "s00-termination.json").read_text())
    assert term["class"] == "sigterm", term
    assert term["signal"]["name"] == "SIGTERM" and term["signal"]["during_step"] == 2
    assert "error" not in term  # an exception that followed is the signal's consequence
    # the base commit killed with the group: its error is listed as the signal's consequence
    assert term["signal"]["consequence"]["type"] == "SnapshotError", term
    assert "commit-tree" in term["signal"]["consequence"]["message"]
    assert term["resumable_checkpoint"] == str(run / "checkpoint-1"), term
    r = _train(runs, tmp, os.environ["PATH"], "--resume-from", term["resumable_checkpoint"])
    rest = r.communicate(timeout=600)[0]
    assert r.returncode == 0, rest[-3000:]
    assert json.loads((run / "receipts" / "s01-termination.json").read_text())["class"] == \
        "completed"
    steps = [json.loads(x)["step"] for x in (run / "ledger.jsonl").read_text().splitlines()
             if x.strip()]
    assert steps == [1, 2]


def test_a_sigterm_repeated_while_the_session_closes_is_still_a_sigterm(tmp_path, warm_policy):
    """The group's SIGTERM is followed by more: the kernel's death signal when the launcher
    dies with the group, a scheduler that repeats its signal until the job is gone. Each
    one, until the termination receipt is written, is a request: the run is not killed
    between the end of its step and its receipt (a later start would record it as
    ``unknown`` with no checkpoint of the step)."""
    runs, tmp = tmp_path / "runs", tmp_path / "tmp"
    tmp.mkdir()
    p = _train(runs, tmp, os.environ["PATH"], *ARGS, "--run_name_prefix", "rep")
    try:
        deadline = time.monotonic() + 600
        run = None
        while time.monotonic() < deadline and p.poll() is None:
            dirs = list(runs.glob("rep-*")) if runs.is_dir() else []
            run = dirs[0] if dirs else None
            if run is not None and (run / "checkpoint-1").is_dir():
                break
            time.sleep(0.05)
        assert run is not None and p.poll() is None, p.stdout.read()[-3000:]
        os.killpg(p.pid, signal.SIGTERM)
        sent = 1
        while p.poll() is None and time.monotonic() < deadline:  # every 20 ms until it exits
            time.sleep(0.02)
            try:
                os.kill(p.pid, signal.SIGTERM)
                sent += 1
            except ProcessLookupError:
                break
        out = p.communicate(timeout=300)[0]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert sent > 10  # the repeats covered the close, not just the step
    # its own exit status 143, or a repeat that came after the receipt, while the interpreter
    # exits with the default handler back: either way a shell reads 143
    assert p.returncode in (143, -signal.SIGTERM), out[-3000:]
    term = json.loads((run / "receipts" / "s00-termination.json").read_text())
    assert term["class"] == "sigterm" and not term.get("detected"), term
    assert term["resumable_checkpoint"], term
