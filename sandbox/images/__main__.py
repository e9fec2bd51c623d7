"""``python -m sandbox.images build-offline [--force] [--mirror URI]`` / ``name`` /
``pull --split official500|holdout100|FILE [--registry URL] [--concurrency N] ...``.

``pull`` reads a ``.txt`` / ``.jsonl`` / ``.json`` FILE itself (:func:`images_from_file`).
Any other ``--split`` (a split name, a ``.parquet`` or sealed manifest) needs the task
loaders of ``eval``, which ``sandbox`` must not import (design page, "Layers"): the command
is handed to ``python -m eval.images pull`` in a subprocess with the same arguments.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sandbox.bounds import ArgumentParser, Text
from sandbox.images import DEFAULT_RECIPE, ImageBuildError, build_offline
from sandbox.images.cli import add_pull_arguments, run_pull
from sandbox.images.pull import images_from_file

OWN_SUFFIXES = (".txt", ".jsonl", ".json")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = ArgumentParser(prog="python -m sandbox.images")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-offline", help="debootstrap + podman import (skips when built)")
    b.add_argument("--force", action="store_true")
    b.add_argument("--mirror", type=Text(), default=None, help="Debian mirror (default: the host's apt source)")
    sub.add_parser("name", help="print the default image name")
    add_pull_arguments(sub.add_parser("pull", help="pull the task images local storage lacks"))
    args = ap.parse_args(argv)
    if args.cmd == "name":
        print(DEFAULT_RECIPE.image)
        return 0
    if args.cmd == "pull":
        if Path(args.split).suffix not in OWN_SUFFIXES:
            # split names and other task files need eval's loaders: a subprocess, no import
            return subprocess.run([sys.executable, "-m", "eval.images", *argv]).returncode
        try:
            images = images_from_file(args.split)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return run_pull(images, args)
    try:
        print(build_offline(force=args.force, mirror=args.mirror))
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
