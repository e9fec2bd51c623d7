"""Whether a sandbox node may serve: the doctor's report of its host, cached by the host's
facts, and the decision drawn from it (design page, "Threat model").

A node *serves* when every probe of ``python -m sandbox doctor`` held on its host. The
report is kept under ``$ECREDIT_CACHE/doctor/<facts key>.json`` (``ECREDIT_CACHE`` defaults to
``~/.cache/ecredit-trl``; ``ECREDIT_DOCTOR_CACHE`` names the folder itself; the key is :func:`sandbox.doctor.facts.facts_key`), so a node whose
kernel, cgroups, runtime, storage and kernel-log access are what they were when it was
probed reuses that report; any change of those facts probes it afresh. A node where a rule
did not hold is *refused*; with ``allow_unheld`` (``--sandbox-allow-unheld``) it serves,
and the rules that did not hold travel with what it serves (:data:`NODE_UNHELD`).

The probes are judged by the integrity rules (``eval``), which the sandbox does not import:
the report comes from ``python -m eval.doctor --json`` run as a subprocess on the node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.doctor.facts import facts_key, host_facts

NODE_UNHELD = "node_rule_unheld"
"""The reason a failure on a node that serves with rules not held is counted under."""
DOCTOR_TIMEOUT_S = 600.0
"""Longest a node's doctor run may take (seconds); past it the node is refused."""


def doctor_command(head: list[str] = (), extra: list[str] = ()) -> list[str]:
    """The argv of the doctor (``python -m eval.doctor``) with this interpreter."""
    return [sys.executable, "-m", "eval.doctor", *head, *extra]


def cache_dir() -> Path:
    """``$ECREDIT_DOCTOR_CACHE`` when set, else ``$ECREDIT_CACHE/doctor``
    (``~/.cache/ecredit-trl/doctor`` when neither is set)."""
    if os.environ.get("ECREDIT_DOCTOR_CACHE"):
        return Path(os.environ["ECREDIT_DOCTOR_CACHE"]).expanduser()
    env = os.environ.get("ECREDIT_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "ecredit-trl"
    return root / "doctor"


def cache_path(key: str) -> Path:
    """Where the report of hosts with facts key ``key`` is kept."""
    return cache_dir() / f"{key}.json"


def save_report(report: dict) -> Path:
    """Write ``report`` (with its ``facts_key``) to :func:`cache_path`, atomically."""
    path = cache_path(report["facts_key"])
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".report-")
    with os.fdopen(fd, "w") as fh:
        json.dump(report, fh, sort_keys=True, default=str)
    os.replace(tmp, path)
    return path


def load_report(key: str) -> dict | None:
    """The cached report of facts key ``key``, or None (none, or unreadable)."""
    try:
        report = json.loads(cache_path(key).read_text())
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) and report.get("facts_key") == key else None


def run_report(timeout_s: float = DOCTOR_TIMEOUT_S, extra: list[str] = ()) -> dict:
    """Run the doctor here (:func:`doctor_command` with ``--json`` and ``extra``) and return
    its report (a full run caches it); a run that fails to report is a report with
    ``error`` set and no probe held."""
    try:
        proc = subprocess.run(doctor_command(["--json"], extra), capture_output=True, text=True,
                              timeout=timeout_s)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return {"held": False, "probes": [], "error": f"the doctor did not report: "
                f"{type(exc).__name__}: {str(exc)[:300]}"}


@dataclass
class NodeVerdict:
    """A node's gate: ``serve`` (whether it may run sandboxes), ``unheld`` (the probes that
    did not hold there; empty when all held), ``facts_key``, ``cached`` (the report was
    reused) and ``reason`` (one line: why it is refused, or which rules it serves without)."""

    serve: bool
    unheld: list[str] = field(default_factory=list)
    facts_key: str = ""
    cached: bool = False
    reason: str = ""


def decide(report: dict, allow_unheld: bool = False) -> NodeVerdict:
    """The gate's decision on a doctor report (pure): serve when every probe held; else
    refused, or served with ``unheld`` named when ``allow_unheld``. A report without probes
    (the doctor did not run) never serves."""
    probes = report.get("probes") or []
    unheld = [p["name"] for p in probes if not p.get("held")]
    key = report.get("facts_key", "")
    if not probes:
        return NodeVerdict(False, ["doctor"], key, reason=report.get("error")
                           or "the doctor reported no probe")
    if not unheld:
        return NodeVerdict(True, [], key)
    why = "; ".join(f"{p['name']}: {p.get('reason', '')}" for p in probes if not p.get("held"))
    if allow_unheld:
        return NodeVerdict(True, unheld, key, reason=f"serving with rules not held, their "
                           f"failures counted as {NODE_UNHELD}: {why}")
    return NodeVerdict(False, unheld, key, reason=f"refused: rules not held here: {why}")


def node_verdict(allow_unheld: bool = False) -> NodeVerdict:
    """This host's gate: the cached report of its facts key, else a doctor run now (cached
    when it reported). Never raises."""
    key = facts_key(host_facts())
    report = load_report(key)
    cached = report is not None
    if report is None:
        report = run_report()
        if report.get("facts_key"):
            save_report(report)
    verdict = decide({**report, "facts_key": report.get("facts_key") or key}, allow_unheld)
    verdict.cached = cached
    return verdict


__all__ = ["DOCTOR_TIMEOUT_S", "NODE_UNHELD", "NodeVerdict", "cache_dir", "cache_path",
           "decide", "doctor_command", "load_report", "node_verdict", "run_report",
           "save_report"]
