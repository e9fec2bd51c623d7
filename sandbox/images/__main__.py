"""``python -m sandbox.images build-offline [--force] [--mirror URI]`` / ``name``."""

from __future__ import annotations

import argparse
import sys

from sandbox.images import DEFAULT_RECIPE, ImageBuildError, build_offline


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sandbox.images")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-offline", help="debootstrap + podman import (skips when built)")
    b.add_argument("--force", action="store_true")
    b.add_argument("--mirror", default=None, help="Debian mirror (default: the host's apt source)")
    sub.add_parser("name", help="print the default image name")
    args = ap.parse_args(argv)
    if args.cmd == "name":
        print(DEFAULT_RECIPE.image)
        return 0
    try:
        print(build_offline(force=args.force, mirror=args.mirror))
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
