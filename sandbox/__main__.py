"""``python -m sandbox gc [--run-id ID]``: remove leftover ecredit containers and temp trees;
``python -m sandbox doctor [--ray-address HEAD:PORT] [--json]``: prove the reward-integrity
rules on this host (or on every sandbox node of a Ray cluster).

Containers are removed by run label (all runs, or one); ``--ray-address`` does the same on
every sandbox node of a Ray cluster (:func:`sandbox.cluster.dispatch.gc_cluster`). Temp directories
(``ecredit-rollouts-*`` working roots, ``ecredit-snap-*`` snapshot indexes,
``ecredit-podman-*`` service sockets) are removed when the process that made them is
gone (:func:`sandbox.runtimes.tempdirs.gc_temp_dirs`); a live run's directories are kept.

``doctor`` prints the host's facts and one line per live probe (``held`` / ``FAILED
<reason>``), exit 0 only when all hold (design page, "Threat model"). The probes are judged
by the integrity rules of ``eval``, which ``sandbox`` does not import: this command runs
``python -m eval.doctor`` as a subprocess (:func:`sandbox.doctor.gate.doctor_command`), here
or, with ``--ray-address``, as one pinned task per sandbox node
(:func:`sandbox.cluster.dispatch.doctor_cluster`).
"""

from __future__ import annotations

import json
import subprocess
import sys

from sandbox.bounds import ArgumentParser, InDir, Text
from sandbox.cluster.dispatch import doctor_cluster, gc_cluster
from sandbox.doctor.gate import doctor_command
from sandbox.runtimes.podman_runtime import gc
from sandbox.runtimes.tempdirs import gc_temp_dirs


def main(argv=None) -> int:
    ap = ArgumentParser(prog="python -m sandbox")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gc", help="remove containers labelled by ecredit runs and the temp "
                                  "directories of dead ecredit processes")
    g.add_argument("--run-id", type=Text(), default=None, help="only this run's containers")
    g.add_argument("--temp-root", type=InDir(), default=None,
                   help="where to look for ecredit-rollouts-* / ecredit-snap-* / "
                        "ecredit-podman-* (default: the system temp directory)")
    g.add_argument("--no-temp", action="store_true", help="leave temp directories alone")
    g.add_argument("--ray-address", type=Text(), default=None,
                   help="also remove the containers on every sandbox node of this running Ray "
                        "cluster (auto, HOST:PORT): one pinned task per node")
    d = sub.add_parser("doctor", help="report this host's facts and prove each reward-integrity "
                                      "rule with a live probe (exit 0 only when all hold)")
    d.add_argument("--json", action="store_true", help="print one JSON report")
    d.add_argument("--only", action="append", choices=("agent", "trials"), default=None,
                   help="run only this probe group (repeatable; default: all)")
    d.add_argument("--ray-address", type=Text(), default=None,
                   help="run it on every sandbox node of this running Ray cluster (auto, "
                        "HOST:PORT) instead of here: one pinned task per node")
    args = ap.parse_args(argv)
    if args.cmd == "doctor":
        return _doctor(args)
    if args.cmd == "gc" and args.ray_address:
        for node, names in gc_cluster(args.ray_address, args.run_id):
            print(f"node {node[:12]}: removed {len(names)} container(s)"
                  + (": " + " ".join(names) if names else ""))
    if args.cmd == "gc":
        names = gc(args.run_id)
        print(f"removed {len(names)} container(s)" + (": " + " ".join(names) if names else ""))
        if not args.no_temp:
            dirs = gc_temp_dirs(args.temp_root)
            print(f"removed {len(dirs)} temp director(ies)" + (": " + " ".join(dirs) if dirs
                                                              else ""))
    return 0


def _doctor(args) -> int:
    extra = [f"--only={g}" for g in args.only or ()]
    if not args.ray_address:
        return subprocess.call(doctor_command(["--json"] if args.json else [], extra))
    reports = doctor_cluster(args.ray_address, extra)
    held = bool(reports) and all(r.get("held") for r in reports.values())
    if args.json:
        print(json.dumps(reports, sort_keys=True, default=str))
        return 0 if held else 1
    for node, rep in sorted(reports.items()):
        for p in rep.get("probes", []):
            print(f"node {node[:12]}: {p['name']}: "
                  + ("held" if p["held"] else f"FAILED {p['reason']}"))
        if rep.get("error"):
            print(f"node {node[:12]}: FAILED {rep['error']}")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
