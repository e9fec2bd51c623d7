"""``python -m sandbox gc [--run-id ID]``: remove leftover ecredit containers and temp trees.

Containers are removed by run label (all runs, or one); ``--ray-address`` does the same on
every sandbox node of a Ray cluster (:func:`sandbox.cluster.dispatch.gc_cluster`). Temp directories
(``ecredit-rollouts-*`` working roots, ``ecredit-snap-*`` snapshot indexes,
``ecredit-podman-*`` service sockets) are removed when the process that made them is
gone (:func:`sandbox.runtimes.tempdirs.gc_temp_dirs`); a live run's directories are kept.
"""

from __future__ import annotations

import sys

from sandbox.bounds import ArgumentParser, InDir, Text
from sandbox.cluster.dispatch import gc_cluster
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
    args = ap.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
