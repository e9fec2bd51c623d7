"""``python -m sandbox gc [--run-id ID]``: remove leftover ecredit containers and temp trees.

Containers are removed by run label (all runs, or one). Temp directories
(``ecredit-rollouts-*`` working roots, ``ecredit-snap-*`` snapshot indexes,
``ecredit-podman-*`` service sockets) are removed when the process that made them is
gone (:func:`sandbox.disk.gc_temp_dirs`); a live run's directories are kept.
"""

from __future__ import annotations

import argparse
import sys

from sandbox.disk import gc_temp_dirs
from sandbox.podman_runtime import gc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sandbox")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gc", help="remove containers labelled by ecredit runs and the temp "
                                  "directories of dead ecredit processes")
    g.add_argument("--run-id", default=None, help="only this run's containers")
    g.add_argument("--temp-root", default=None,
                   help="where to look for ecredit-rollouts-* / ecredit-snap-* / "
                        "ecredit-podman-* (default: the system temp directory)")
    g.add_argument("--no-temp", action="store_true", help="leave temp directories alone")
    args = ap.parse_args(argv)
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
