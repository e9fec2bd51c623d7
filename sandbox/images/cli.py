"""The ``pull`` command line shared by ``python -m sandbox.images`` and ``python -m eval.images``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sandbox.bounds import Float, Int, OutFile, Source, Text
from sandbox.images.pull import ImagePullError, pull_images


def add_pull_arguments(p: argparse.ArgumentParser) -> None:
    """The ``pull`` options (shared with ``python -m eval.images pull``)."""
    p.add_argument("--split", type=Source(), required=True,
                   help="official500, holdout100, bundled[:...] or a task/name FILE")
    p.add_argument("--registry", type=Text(), default=None,
                   help="mirror: host[:port][/prefix], or oci-archive:DIR / docker-archive:DIR "
                        "/ dir:DIR holding one saved image per name")
    p.add_argument("--concurrency", type=Int(ge=1), default=4, help="pulls at once")
    p.add_argument("--attempts", type=Int(ge=1), default=4, help="tries per image")
    p.add_argument("--backoff-s", type=Float(ge=0, why="seconds"), default=5.0,
                   help="seconds before the 2nd try; doubles each time")
    p.add_argument("--url", type=Text(), default=None, help="Podman API URL (default: a private local service)")
    p.add_argument("--no-tls-verify", action="store_true", help="plain-HTTP / self-signed mirror")
    p.add_argument("--no-space-check", action="store_true",
                   help="pull even when the estimate exceeds the free space")
    p.add_argument("--json", type=OutFile(), default=None, help="write the report (JSON) here")


def run_pull(images: list[str], args) -> int:
    """Pull ``images`` with the parsed ``pull`` options; print the summary; exit status 0 when
    nothing failed, 1 otherwise, 2 when pulling could not start."""
    try:
        report = pull_images(images, registry=args.registry, url=args.url,
                             concurrency=args.concurrency, attempts=args.attempts,
                             backoff_s=args.backoff_s, tls_verify=not args.no_tls_verify,
                             check_space=not args.no_space_check,
                             log=lambda m: print(m, flush=True))
    except (ImagePullError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=1) + "\n")
    print(report.summary(), flush=True)
    return 1 if report.counts()["failed"] else 0
