"""How many torch threads a job takes: the warm start counts what is busy *now*
(:func:`ecredit_trl.agent.generation.busy_cpus`), other jobs the load average."""

from __future__ import annotations

import os
import subprocess
import sys

from ecredit_trl.agent import generation
from ecredit_trl.agent.generation import busy_cpus, torch_threads


def test_busy_cpus_sees_a_spinning_process():
    """A process spinning on one CPU shows as at least most of a CPU busy, whatever else runs."""
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = busy_cpus(window_s=0.5)
    finally:
        spin.kill()
        spin.wait()
    assert busy is not None and 0.7 <= busy <= (os.cpu_count() or 1) + 1e-9


def test_torch_threads_counts_busy_cpus_now_only_when_asked(monkeypatch):
    cpus = os.cpu_count() or 1
    monkeypatch.delenv("ECREDIT_WARMSTART_THREADS", raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (float(cpus), 0.0, 0.0))  # the minute's average
    monkeypatch.setattr(generation, "busy_cpus", lambda window_s=0.25: 0.3)  # idle now
    assert torch_threads() == 1  # the load average: every CPU looks taken
    assert torch_threads(now=True) == cpus  # what runs now: nothing
    monkeypatch.setattr(generation, "busy_cpus", lambda window_s=0.25: cpus - 0.2)
    assert torch_threads(now=True) == 1
    monkeypatch.setattr(generation, "busy_cpus", lambda window_s=0.25: None)  # unreadable
    assert torch_threads(now=True) == 1  # falls back to the load average
    monkeypatch.setenv("ECREDIT_WARMSTART_THREADS", "3")
    assert torch_threads(now=True) == 3  # the override wins

