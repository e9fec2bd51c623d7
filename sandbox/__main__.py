"""``python -m sandbox gc [--run-id ID]``: remove leftover ecredit containers."""

from __future__ import annotations

import argparse
import sys

from sandbox.podman_runtime import gc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sandbox")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gc", help="remove containers labelled by ecredit runs")
    g.add_argument("--run-id", default=None, help="only this run's containers")
    args = ap.parse_args(argv)
    if args.cmd == "gc":
        names = gc(args.run_id)
        print(f"removed {len(names)} container(s)" + (": " + " ".join(names) if names else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
