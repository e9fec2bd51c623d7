"""Sealing holdouts: ``python -m eval.holdout`` (the manifest format is :mod:`eval.sealed`).

``python -m eval.holdout seal --pool P --n 100 --seed S --out datasets/<name>.json`` picks
``n`` ids from the pool (any :func:`eval.splits.load_tasks` source) and writes a sealed
manifest (format, selection rule and the training guard: :mod:`eval.sealed`). Other
subcommands: ``show PATH`` (verify and print a summary), ``check --source S`` (exit 1 listing
sealed ids found in a source).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from eval.sealed import make_manifest, read_manifest, write_manifest
from eval.splits import load_tasks


def seal(pool: str, n: int, seed: int, out: str | Path, *, name: str | None = None,
         force: bool = False, pool_ids: list[str] | None = None) -> dict:
    """Seal ``n`` ids of ``pool`` into ``out`` and return the manifest.

    Args:
        pool: a :func:`eval.splits.load_tasks` source name (recorded in the manifest).
        pool_ids: the pool's ids when already loaded (else the pool is loaded).

    Raises: ValueError (bad n, pool problems), FileExistsError (different manifest at out).
    """
    if pool_ids is None:
        pool_ids = [t.instance_id for t in load_tasks(pool, purpose="eval")]
    manifest = make_manifest(pool, pool_ids, n, seed, name or Path(out).stem)
    write_manifest(manifest, out, force=force)
    return manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.holdout", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("seal", help="seal n ids of a pool into a manifest")
    s.add_argument("--pool", required=True, help="load_tasks source, e.g. official500, bundled")
    s.add_argument("--n", type=int, required=True)
    s.add_argument("--seed", type=int, required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--name", default=None, help="manifest name (default: file stem)")
    s.add_argument("--force", action="store_true", help="replace a different manifest at --out")
    sh = sub.add_parser("show", help="verify a manifest and print its summary")
    sh.add_argument("path")
    c = sub.add_parser("check", help="exit 1 when a source holds sealed ids")
    c.add_argument("--source", required=True)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "seal":
            man = seal(args.pool, args.n, args.seed, args.out, name=args.name, force=args.force)
            print(json.dumps({k: man[k] for k in ("name", "pool", "pool_size", "n", "seed",
                                                   "sha256")}))
        elif args.cmd == "show":
            man = read_manifest(args.path)
            print(json.dumps({k: v for k, v in man.items() if k != "ids"}, sort_keys=True))
        elif args.cmd == "check":
            load_tasks(args.source, purpose="train")
            print(f"{args.source}: no sealed ids")
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
