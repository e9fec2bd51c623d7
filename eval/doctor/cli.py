"""``python -m sandbox doctor [--json] [--only GROUP ...]``: the host's facts and every
integrity probe, one line a probe, ``held`` or ``FAILED <reason>`` (design page, "Threat
model"). Exit 0 only when every probe held, 1 otherwise, 2 for bad input. A full run's report is
cached by the host's facts (:func:`sandbox.doctor.gate.save_report`): a Ray sandbox node with
the same facts reuses it.

``python -m sandbox doctor`` hands over to this module (``python -m eval.doctor``) in a
subprocess: the probes are judged by :mod:`eval.integrity`, which the sandbox does not
import.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from eval.doctor.probes import ProbeResult, agent_probes
from eval.doctor.trial_probes import trial_probes
from sandbox.bounds import ArgumentParser, InDir
from sandbox.doctor.facts import facts_key, host_facts
from sandbox.doctor.gate import save_report
from sandbox.images import build_offline
from sandbox.runtimes.podman_runtime import PodmanRuntime, gc
from sandbox.workspace.health import EXHAUSTION_COUNTERS

GROUPS = ("agent", "trials")
"""Probe groups ``--only`` selects: the agent's container and tree, the verifier trials."""


def fact_lines(facts: dict) -> list[str]:
    """The facts as ``fact <name>: <value>`` lines (the report's head)."""
    return [f"fact {k}: {v}" for k, v in facts.items()]


def run_doctor(groups=GROUPS, workroot: str | None = None) -> dict:
    """Run the probes of ``groups`` on this host's Podman; the report as
    ``{"facts", "facts_key", "probes": [{"name", "held", "reason", "detail"}], "held",
    "seconds"}``. A probe that raised is a FAILED line naming the exception. Never raises
    for a probe; raises PodmanUnavailable when no Podman service starts."""
    t0 = time.monotonic()
    facts = host_facts()
    build_offline(log=lambda *_: None)
    rt = PodmanRuntime()
    results: list[ProbeResult] = []
    try:
        with tempfile.TemporaryDirectory(prefix="ecredit-doctor-", dir=workroot) as root:
            if "agent" in groups:
                results += _guarded("agent", lambda: agent_probes(rt, Path(root)))
            if "trials" in groups:
                results += _guarded("trials", lambda: trial_probes(rt))
    finally:
        rt.close()
        gc(rt.run_id)
    for r in results:
        if r.name == "pids" and r.detail.get("processes_cgroup"):
            facts["pids_counted_in"] = r.detail["processes_cgroup"]
        if r.name == "exhaustion_evidence" and r.detail.get("counters"):
            facts["exhaustion_counters"] = ", ".join(
                EXHAUSTION_COUNTERS[k] for k, kept in r.detail["counters"].items() if kept) \
                or "none"
    return {"facts": facts, "facts_key": facts_key(facts),
            "probes": [{"name": r.name, "held": r.held, "reason": r.reason,
                        "detail": r.detail} for r in results],
            "held": bool(results) and all(r.held for r in results),
            "seconds": round(time.monotonic() - t0, 1)}


def _guarded(group: str, fn) -> list[ProbeResult]:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a probe that breaks is a failed probe
        return [ProbeResult(group, False, f"the probes raised {type(exc).__name__}: {exc}")]


def main(argv=None) -> int:
    ap = ArgumentParser(prog="python -m sandbox doctor")
    ap.add_argument("--json", action="store_true", help="print the report as one JSON object")
    ap.add_argument("--only", action="append", choices=GROUPS, default=None,
                    help="run only this probe group (repeatable; default: all)")
    ap.add_argument("--workroot", type=InDir(), default=None,
                    help="where the probe workspaces are made (default: the temp directory)")
    args = ap.parse_args(argv)
    report = run_doctor(tuple(args.only or GROUPS), args.workroot)
    if not args.only:  # a full run is what a sandbox node's gate reuses
        save_report(report)
    if args.json:
        print(json.dumps(report, sort_keys=True, default=str))
    else:
        print("\n".join(fact_lines(report["facts"])))
        for p in report["probes"]:
            print(ProbeResult(p["name"], p["held"], p["reason"]).line())
        print(f"{'all held' if report['held'] else 'NOT ALL HELD'} "
              f"({report['seconds']} s, facts key {report['facts_key']})")
    return 0 if report["held"] else 1


if __name__ == "__main__":
    sys.exit(main())
