"""``python -m sandbox gc [--run-id ID]``: remove leftover ecredit containers and temp trees;
``python -m sandbox doctor [--ray-address HEAD:PORT] [--json]``: prove the reward-integrity
rules on this host (or on every sandbox node of a Ray cluster).

Containers are removed by run label (all runs, or one); ``--ray-address`` does the same on
every sandbox node of a Ray cluster (:func:`sandbox.cluster.dispatch.gc_cluster`). Temp directories
(``ecredit-rollouts-*`` working roots, ``ecredit-snap-*`` snapshot indexes,
``ecredit-podman-*`` service sockets) are removed when the process that made them is
gone (:func:`sandbox.runtimes.tempdirs.gc_temp_dirs`); a live run's directories are kept.

``doctor`` prints the host's facts and one line per live probe (``held`` / ``FAILED
<reason>``), exit 0 only when all hold (design page, "Threat model"); with ``--ray-address``
first the cluster's Ray authentication mode, a failed check unless it is ``token`` (or
``--sandbox-allow-unauthenticated``); a failed one probes no node (nothing runs on such a
cluster). The probes are judged
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
from sandbox.cluster.auth import AUTH_FIX, TOKEN
from sandbox.cluster.dispatch import doctor_cluster, gc_cluster
from sandbox.doctor.gate import doctor_command
from sandbox.runtimes.podman_runtime import gc
from sandbox.runtimes.protocol import FLAGS
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
    g.add_argument(FLAGS["allow_unauthenticated"], action="store_true",
                   help="--ray-address: use a cluster without Ray token authentication")
    d = sub.add_parser("doctor", help="report this host's facts and prove each reward-integrity "
                                      "rule with a live probe (exit 0 only when all hold)")
    d.add_argument("--json", action="store_true", help="print one JSON report")
    d.add_argument("--only", action="append", choices=("agent", "trials"), default=None,
                   help="run only this probe group (repeatable; default: all)")
    d.add_argument("--ray-address", type=Text(), default=None,
                   help="run it on every sandbox node of this running Ray cluster (auto, "
                        "HOST:PORT) instead of here: one pinned task per node; also reports "
                        "the cluster's Ray authentication mode, a failed check when it is not "
                        "token")
    d.add_argument(FLAGS["allow_unauthenticated"], action="store_true",
                   help="--ray-address: a cluster without Ray token authentication passes "
                        "the authentication check (a loopback-only test cluster)")
    args = ap.parse_args(argv)
    if args.cmd == "doctor":
        return _doctor(args)
    if args.cmd == "gc" and args.ray_address:
        for node, names in gc_cluster(args.ray_address, args.run_id,
                                      args.sandbox_allow_unauthenticated):
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
    cluster = doctor_cluster(args.ray_address, extra, args.sandbox_allow_unauthenticated)
    reports, mode = cluster["nodes"], cluster["auth_mode"]
    auth_held = mode == TOKEN or args.sandbox_allow_unauthenticated
    held = bool(reports) and all(r.get("held") for r in reports.values()) and auth_held
    if args.json:
        print(json.dumps({**cluster, "auth_held": auth_held}, sort_keys=True, default=str))
        return 0 if held else 1
    print(f"cluster: ray_auth_mode={mode}: " + (
        "held" if mode == TOKEN else "allowed (--sandbox-allow-unauthenticated)" if auth_held
        else "FAILED anyone who reaches the cluster's ports can run code on its nodes (its "
             "nodes were not probed); " + AUTH_FIX))
    for node, rep in sorted(reports.items()):
        for p in rep.get("probes", []):
            print(f"node {node[:12]}: {p['name']}: "
                  + ("held" if p["held"] else f"FAILED {p['reason']}"))
        if rep.get("error"):
            print(f"node {node[:12]}: FAILED {rep['error']}")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
