"""Sealing holdouts: ``python -m eval.holdout`` (the manifest format is :mod:`eval.tasks.sealed`).

``python -m eval.holdout seal --name holdout100 --from FILE [--rows SOURCE]`` seals a
user-given list (:func:`seal_list`). ``FILE`` holds instance ids (one a line, ``#`` comments
and blank lines skipped, or a JSON list of strings) or task rows (``.jsonl`` / ``.parquet``,
or a ``.json`` list of objects, in the SWE-bench format). With ids only, their rows are taken
from ``--rows`` (any :func:`eval.tasks.splits.load_tasks` source; default ``official500``). The
rows are written next to the manifest (``datasets/<name>.rows.jsonl``) and both sha256 (of
the sorted ids, of the rows file) go into ``datasets/<name>.json``; from then on training
refuses those ids and ``eval.run --split holdout100`` reports against 100 tasks. The name
``holdout100`` takes exactly 100 ids unless ``--allow-size``. Such a list is the user's own:
instances (or whole repositories) they keep out of every training set; this project ships
none.

``python -m eval.holdout seal --pool P --n 100 --seed S --out datasets/<name>.json`` instead
draws ``n`` ids from a pool (selection rule: :mod:`eval.tasks.sealed`); ``--force --reason TEXT``
reseals an existing manifest (its pool changed) and records old/new sha256 in its
``reseals`` list. Other subcommands:
``show PATH`` (verify and print a summary), ``check --source S`` (exit 1 listing sealed ids
found in a source).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

from eval.files import atomic_write_text, datasets_dir
from eval.tasks.schema import Task, read_rows, tasks_from_rows
from eval.tasks.sealed import (
    SealedTaskError,
    file_sha256,
    list_manifest,
    make_manifest,
    read_manifest,
    write_manifest,
)
from eval.tasks.splits import load_tasks
from sandbox.bounds import ArgumentParser, InFile, Int, OutFile, Source, Text

#: Names whose size is fixed (eval reports against these denominators; eval.run).
FIXED_SIZES = {"holdout100": 100}
_ROW_SUFFIXES = (".jsonl", ".parquet")


def seal(pool: str, n: int, seed: int, out: str | Path, *, name: str | None = None,
         force: bool = False, pool_ids: list[str] | None = None,
         reason: str | None = None) -> dict:
    """Seal ``n`` ids of ``pool`` into ``out`` and return the manifest.

    Args:
        pool: a :func:`eval.tasks.splits.load_tasks` source name (recorded in the manifest).
        pool_ids: the pool's ids when already loaded (else the pool is loaded).
        reason: with ``force``, why a manifest at ``out`` is replaced (a reseal, e.g. the
            bundled recipe changed its ids): the new manifest keeps the old one's
            ``reseals`` list and appends ``{"reason", "at", "old_sha256", "new_sha256",
            "old_pool_sha256", "new_pool_sha256", "old_pool_size", "new_pool_size",
            "old_n", "new_n"}`` (``at``: UTC date).

    Raises: ValueError (bad n, pool problems, ``reason`` without ``force``),
    FileExistsError (different manifest at out).
    """
    if reason is not None and not force:
        raise ValueError("reason: a reseal reason goes with force (replacing a manifest)")
    if pool_ids is None:
        pool_ids = [t.instance_id for t in load_tasks(pool, purpose="eval")]
    manifest = make_manifest(pool, pool_ids, n, seed, name or Path(out).stem)
    if reason is not None and Path(out).is_file():
        manifest["reseals"] = reseal_history(read_manifest(out), manifest, reason)
    write_manifest(manifest, out, force=force)
    return manifest


def reseal_history(old: dict, new: dict, reason: str, at: str | None = None) -> list[dict]:
    """``old``'s ``reseals`` list plus one entry recording the change to ``new`` (see
    :func:`seal`); ``at`` defaults to today's UTC date (ISO)."""
    import datetime

    at = at or datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    entry = {"reason": reason, "at": at}
    for k in ("sha256", "pool_sha256", "pool_size", "n"):
        entry[f"old_{k}"], entry[f"new_{k}"] = old.get(k), new.get(k)
    return [*old.get("reseals", []), entry]


def read_list(path: str | Path) -> tuple[list[str], list[dict] | None, list[int] | None]:
    """``(ids, rows, row_numbers)`` of a ``--from`` file: rows are ``None`` for an id list.

    Raises:
        FileNotFoundError: no such file.
        ValueError: an empty list, an id that is not a non-empty string without spaces,
            repeated ids (all named), a row without ``instance_id``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--from: no such file: {path}")
    rows = nums = None
    if path.suffix.lower() in _ROW_SUFFIXES:
        rows, nums = read_rows(path)
    elif path.suffix.lower() == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc.msg})") from None
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of ids or rows, got "
                             f"{type(data).__name__}")
        if data and all(isinstance(r, dict) for r in data):
            rows, nums = data, list(range(1, len(data) + 1))
        else:
            ids = data
    else:
        lines = path.read_text(encoding="utf-8").splitlines()
        ids = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    if rows is not None:
        ids = []
        for row, n in zip(rows, nums, strict=True):
            if not isinstance(row, dict) or not isinstance(row.get("instance_id"), str):
                raise ValueError(f"{path} row {n}: field 'instance_id' missing")
            ids.append(row["instance_id"])
    bad = [i for i in ids if not isinstance(i, str) or not i or any(c.isspace() for c in i)]
    if bad:
        raise ValueError(f"{path}: not an instance id: {bad[0]!r}")
    dups = sorted(i for i, c in Counter(ids).items() if c > 1)
    if dups:
        raise ValueError(f"{path}: ids repeat: {', '.join(dups[:10])}")
    if not ids:
        raise ValueError(f"{path}: no ids in the list")
    return ids, rows, nums


def _list_tasks(path: Path, ids, rows, nums, rows_source: str) -> list[Task]:
    if rows is not None:
        return tasks_from_rows(rows, source=str(path), official=True, row_numbers=nums)
    by_id = {t.instance_id: t for t in load_tasks(rows_source, purpose="eval")}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise ValueError(f"--from {path}: {len(missing)} id(s) not in --rows {rows_source}: "
                         f"{', '.join(missing[:10])}")
    return [by_id[i] for i in ids]


def seal_list(name: str, from_path: str | Path, *, rows: str = "official500",
              out: str | Path | None = None, allow_size: bool = False,
              force: bool = False) -> dict:
    """Seal a user-given list of ids or rows as ``name`` (see the module docstring).

    Args:
        name: manifest name; :data:`FIXED_SIZES` names take exactly that many ids.
        from_path: the list (ids or rows, see :func:`read_list`).
        rows: where the rows of an id list come from (a :func:`eval.tasks.splits.load_tasks`
            source); unused when ``from_path`` holds rows.
        out: manifest path (default ``datasets/<name>.json``); the rows go to
            ``<out stem>.rows.jsonl`` next to it.
        allow_size: accept another size for a fixed-size name.
        force: replace a different manifest at ``out`` (a sealed list is binding).

    Returns: the manifest.

    Raises: ValueError (wrong size, bad list, ids not found, malformed rows),
    FileNotFoundError, FileExistsError (a different manifest at ``out``). Nothing is
    written on error: the rows file and the manifest are each written atomically, the
    manifest last, and a rows file written by this call is removed if the manifest fails.
    """
    from_path = Path(from_path)
    ids, row_list, nums = read_list(from_path)
    want = FIXED_SIZES.get(name)
    if want is not None and len(ids) != want and not allow_size:
        raise ValueError(f"--from {from_path}: {name} takes {want} ids (eval reports against a "
                         f"fixed denominator of {want}), the list holds {len(ids)}; pass "
                         "--allow-size to seal it anyway")
    tasks = sorted(_list_tasks(from_path, ids, row_list, nums, rows), key=lambda t: t.instance_id)
    out = Path(out) if out is not None else datasets_dir() / f"{name}.json"
    rows_path = out.with_name(out.stem + ".rows.jsonl")
    text = "".join(json.dumps(t.to_dict(), ensure_ascii=False, sort_keys=True) + "\n"
                   for t in tasks)
    man = list_manifest(name, ids, from_file=str(from_path),
                        pool=str(from_path) if row_list is not None else rows,
                        rows_file=rows_path.name,
                        rows_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest())
    if out.exists() and not force:
        try:
            old = read_manifest(out)
        except (OSError, ValueError):
            old = None
        same = old == man and rows_path.is_file() and file_sha256(rows_path) == man["rows_sha256"]
        if same:
            return man
        raise FileExistsError(f"{out}: a different sealed manifest exists; pass --force to "
                              "replace it (this changes a binding holdout)")
    had_rows = rows_path.exists()
    atomic_write_text(rows_path, text)
    try:
        write_manifest(man, out, force=True)
    except BaseException:
        if not had_rows:
            rows_path.unlink(missing_ok=True)
        raise
    return man


def main(argv=None) -> int:
    """CLI entry point. Exit 0 when done; ``check``: 1 when the source holds sealed ids, 2 when
    it cannot be read; ``seal`` / ``show``: 1 on any error."""
    ap = ArgumentParser(prog="python -m eval.holdout", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("seal", help="seal a user-given list (--from) or n ids of a pool")
    s.add_argument("--from", type=InFile(), dest="from_path", default=None,
                   help="ids (one a line / JSON list) or rows (.jsonl/.parquet) to seal")
    s.add_argument("--rows", type=Source(), default="official500",
                   help="with an id list: the load_tasks source of their rows")
    s.add_argument("--allow-size", action="store_true",
                   help="accept another size than the name's (holdout100: 100)")
    s.add_argument("--pool", type=Source(), default=None, help="load_tasks source, e.g. official500, bundled")
    s.add_argument("--n", type=Int(ge=1), default=None)
    s.add_argument("--seed", type=Int(ge=0, le=2**32 - 1, why="32-bit seeds"), default=None)
    s.add_argument("--out", type=OutFile(), default=None, help="manifest path (--from: datasets/<name>.json)")
    s.add_argument("--name", type=Text(), default=None, help="manifest name (default: file stem)")
    s.add_argument("--force", action="store_true", help="replace a different manifest at --out")
    s.add_argument("--reason", type=Text(), default=None,
                   help="with --pool --force: why the manifest is resealed (recorded in it)")
    sh = sub.add_parser("show", help="verify a manifest and print its summary")
    sh.add_argument("path", type=InFile("json"))
    c = sub.add_parser("check", help="exit 1 when a source holds sealed ids")
    c.add_argument("--source", type=Source(), required=True)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "seal":
            man = _seal_cli(ap, args)
            print(json.dumps({k: man.get(k) for k in ("name", "pool", "pool_size", "n", "seed",
                                                       "sha256", "rows_sha256")}))
        elif args.cmd == "show":
            man = read_manifest(args.path)
            print(json.dumps({k: v for k, v in man.items() if k != "ids"}, sort_keys=True))
        elif args.cmd == "check":
            load_tasks(args.source, purpose="train")
            print(f"{args.source}: no sealed ids")
    except SealedTaskError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        # check: 1 says "sealed ids found", so a source it cannot read is bad input (2)
        return 2 if args.cmd == "check" else 1
    return 0


def _seal_cli(ap: argparse.ArgumentParser, args) -> dict:
    if args.from_path is not None:
        if args.pool is not None or args.n is not None or args.seed is not None:
            ap.error("seal: --from takes no --pool/--n/--seed")
        if not args.name:
            ap.error("seal: --from needs --name (e.g. --name holdout100)")
        return seal_list(args.name, args.from_path, rows=args.rows, out=args.out,
                         allow_size=args.allow_size, force=args.force)
    if args.pool is None or args.n is None or args.seed is None or args.out is None:
        ap.error("seal: give --from FILE --name NAME, or --pool P --n N --seed S --out PATH")
    return seal(args.pool, args.n, args.seed, args.out, name=args.name, force=args.force,
                reason=args.reason)


if __name__ == "__main__":
    sys.exit(main())
