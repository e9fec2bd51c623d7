"""Exact resume and stops of real training processes (Podman, tiny policy, CPU).

One straight 4-step run is the reference. Two interrupted histories of the same
configuration must reproduce it exactly (selections, ledger rows except
timings, final parameters within 1e-6):

* sandbox service killed: the Podman service of the run is killed right after
  step 2 → bounded health checks → emergency checkpoint-2 + termination
  receipt (exit 75) → ``--resume-from checkpoint-2`` on a new service.
* signals: SIGTERM during step 2 → checkpoint-2 + receipt ``sigterm`` (exit
  143) → resume, SIGKILL once step 3 is logged (no receipt) → the next start reports
  it as terminated without receipt → resume from checkpoint-2 again.

The three histories run side by side (they share the two CPU cores).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from ecredit_trl.runs.timings import TIMING_FIELDS

pytestmark = [pytest.mark.podman, pytest.mark.slow]

TIMING_KEYS = {"queue_wait_s", "setup_s", "verify_s", "cleanup_s", "wall_s", "gpu_hours",
               *TIMING_FIELDS}
TRAJ_KEYS = ("task_id", "rollout_index", "step", "selected_turn", "selected_paths",
             "eligible_turns", "exclusion", "reward", "resolved", "utility", "utility_ablated",
             "contrast", "advantage", "generated_tokens", "turns", "format_error",
             "factual_outcome", "counterfactual_outcome", "shrinkage", "m", "L")
# 3 tasks, 1 prompt x 2 generations per step: an epoch is 3 steps, so the resumes land
# mid-epoch (step 2) and the runs cross an epoch boundary (step 4)
ARGS = ["--arm", "B", "--max_steps", "4", "--max_tasks", "3", "--num_generations", "2",
        "--per_device_train_batch_size", "2", "--max_completion_length", "256",
        "--save_steps", "100", "--sandbox_retries", "3", "--sandbox_retry_backoff_s", "0.5",
        "--verifier_retries", "0"]


class Proc:
    """A training process whose output lines are collected as they come."""

    def __init__(self, runs: Path, *args: str) -> None:
        # killed sessions leave their temp roots behind (gc's job): keep them in the test's dir
        tmp = runs.parent / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                   PYTHONUNBUFFERED="1", TMPDIR=str(tmp))
        self.cmd = [sys.executable, "ecredit_trl/train.py", "--runs_dir", str(runs), *args]
        self.p = subprocess.Popen(self.cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        self._cv = threading.Condition()
        self._triggers: list[tuple[re.Pattern, object]] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def on_line(self, pattern: str, action) -> None:
        """Run ``action()`` in the reader thread as soon as a line matches (once); register
        before the line can come."""
        with self._cv:
            self._triggers.append((re.compile(pattern), action))

    def _pump(self) -> None:
        for line in self.p.stdout:
            with self._cv:
                self.lines.append(line)
                fire = [t for t in self._triggers if t[0].search(line)]
                self._triggers = [t for t in self._triggers if t not in fire]
                self._cv.notify_all()
            for _, action in fire:
                action()

    def wait_for(self, pattern: str, timeout: float = 300) -> str:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for line in self.lines:
                    if rx.search(line):
                        return line
                if self.p.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"no line matching {pattern!r}:\n{self.text[-4000:]}")
                self._cv.wait(1.0)

    def finish(self, timeout: float = 400) -> int:
        rc = self.p.wait(timeout=timeout)
        time.sleep(0.2)  # let the pump drain
        return rc

    @property
    def text(self) -> str:
        return "".join(self.lines)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _run_dir(proc: Proc) -> Path:
    line = proc.wait_for(r"\[ecredit\] run \S+ (started|resumed)")
    return Path(line.split("records in ")[1].strip())


def _receipt(run: Path, name: str) -> dict:
    return json.loads((run / "receipts" / name).read_text())


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _same_history(ref: Path, run: Path) -> None:
    """Selections, ledger rows (timings aside) and final parameters equal."""
    la = [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in _jsonl(ref / "ledger.jsonl")]
    lb = [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in _jsonl(run / "ledger.jsonl")]
    assert [r["step"] for r in lb] == [1, 2, 3, 4]
    assert la == lb
    ta, tb = _jsonl(ref / "trajectories.jsonl"), _jsonl(run / "trajectories.jsonl")
    assert len(ta) == len(tb) == 8
    assert [{k: t.get(k) for k in TRAJ_KEYS} for t in ta] == \
        [{k: t.get(k) for k in TRAJ_KEYS} for t in tb]
    assert [[c["name"] for c in t["tool_calls"]] for t in ta] == \
        [[c["name"] for c in t["tool_calls"]] for t in tb]
    wa, wb = _weights(ref / "checkpoint-final"), _weights(run / "checkpoint-final")
    assert wa.keys() == wb.keys()
    worst = max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa)
    assert worst <= 1e-6, f"final parameters differ by {worst}"


def test_interrupted_runs_resume_exactly(tmp_path, warm_policy):
    from sandbox.images import build_offline
    from sandbox.runtimes.podman_runtime import PodmanService, gc

    build_offline(log=lambda *_: None)
    runs = tmp_path / "runs"
    service1, service2 = PodmanService(), None
    procs: list[Proc] = []
    straight = Proc(runs, *ARGS)
    podman_stop = Proc(runs, *ARGS, "--podman_endpoints", service1.url)
    signals = Proc(runs, *ARGS)
    procs += [straight, podman_stop, signals]
    try:
        # the sandbox service is killed right after step 2 (while step 3 starts); SIGTERM
        # arrives right after step 1 (during step 2), whatever the other processes are doing
        podman_stop.on_line(r"\[ecredit\] step 2/4",
                            lambda: os.killpg(service1.proc.pid, signal.SIGKILL))
        signals.on_line(r"\[ecredit\] step 1/4", lambda: signals.p.send_signal(signal.SIGTERM))
        run_p = _run_dir(podman_stop)
        run_s = _run_dir(signals)

        assert podman_stop.finish() == 75, podman_stop.text[-4000:]
        assert "sandbox service unavailable" in podman_stop.text
        term = _receipt(run_p, "s00-termination.json")
        assert term["class"] == "exception" and term["error"]["type"] == "SandboxUnavailable"
        assert "unreachable after 3 attempts" in term["error"]["message"]
        assert Path(term["traceback_file"]).is_file()
        assert term["resumable_checkpoint"] == str(run_p / "checkpoint-2")
        ck = _receipt(run_p, "s00-checkpoint-000002.json")
        assert ck["reason"] == "infra_stop" and ck["state_present"]["optimizer"]
        assert [r["step"] for r in _jsonl(run_p / "ledger.jsonl")] == [1, 2]
        service2 = PodmanService()
        resumed_p = Proc(runs, "--resume-from", str(run_p / "checkpoint-2"),
                         "--podman_endpoints", service2.url)
        procs.append(resumed_p)

        assert signals.finish() == 143, signals.text[-4000:]
        term = _receipt(run_s, "s00-termination.json")
        assert term["class"] == "sigterm" and term["signal"]["during_step"] == 2
        assert term["step"] == 2 and term["resumable_checkpoint"] == str(run_s / "checkpoint-2")
        assert _receipt(run_s, "s00-checkpoint-000002.json")["reason"] == "signal"
        # -- resume, then SIGKILL past the checkpoint ----------------------------------------
        # as soon as step 3 is logged (step 4 under way, no checkpoint after 2): a fixed
        # sleep instead raced the run's end once its steps got faster
        killed = Proc(runs, "--resume-from", str(run_s / "checkpoint-2"))
        procs.append(killed)
        killed.on_line(r"\[ecredit\] step 3/4", killed.p.kill)
        killed.wait_for(r"resumed from checkpoint-2 \(session 1\)")
        assert killed.finish() == -signal.SIGKILL, killed.text[-4000:]
        assert not (run_s / "receipts" / "s01-termination.json").exists()
        again = Proc(runs, "--resume-from", str(run_s / "checkpoint-2"))
        procs.append(again)

        assert straight.finish() == 0, straight.text[-4000:]
        assert resumed_p.finish() == 0, resumed_p.text[-4000:]
        assert again.finish() == 0, again.text[-4000:]
    finally:
        for proc in procs:
            if proc.p.poll() is None:
                proc.p.kill()
        for svc in (service1, service2):
            if svc is not None:
                svc.stop()
        for run in runs.iterdir() if runs.is_dir() else []:  # left by killed services/processes
            gc(run.name)
    run_ref = next(p for p in runs.iterdir() if p not in (run_p, run_s))

    # the straight run: one session, completed
    assert _receipt(run_ref, "s00-termination.json")["class"] == "completed"
    # podman-stop history: resumed with an (unbound) new endpoint, recorded
    res = _receipt(run_p, "s01-resume.json")
    assert res["step"] == 2 and res["previous_sessions"][0]["class"] == "exception"
    assert any(d["field"] == "podman_endpoints" for d in res["binding"]["informational"])
    assert _receipt(run_p, "s01-termination.json")["class"] == "completed"
    _same_history(run_ref, run_p)

    # signal history: the SIGKILLed session was reported at the next start, never silently
    assert f"run {run_s.name}: session 1" in again.text
    assert "terminated without receipt" in again.text
    det = _receipt(run_s, "s01-termination.json")
    assert det["detected"] is True and det["class"] in ("unknown", "oom")
    res = _receipt(run_s, "s02-resume.json")
    assert [p["class"] for p in res["previous_sessions"]] == ["sigterm", det["class"]]
    assert res["previous_sessions"][1]["detected"] is True
    found = res["detected_unterminated"][0]
    assert {"session": 1, "class": det["class"]}.items() <= found.items()
    assert isinstance(found["containers_removed"], list)  # the killed session's sandboxes
    assert _receipt(run_s, "s02-termination.json")["class"] == "completed"
    _same_history(run_ref, run_s)
    # rows the killed session wrote past the checkpoint (if any) were moved aside, not lost
    moved = res["superseded_rows"]
    for name, n in moved.items():
        assert len(_jsonl(run_s / "superseded" / f"{name[:-6]}.s02.jsonl")) == n
