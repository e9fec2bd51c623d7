"""Sealed holdout manifests: their format, selection, reading, and the training guard.

A manifest (written by ``python -m eval.holdout seal``, see :mod:`eval.holdout`)::

    {"schema": 1, "name": ..., "sealed": true, "pool": P, "pool_size": ..., "pool_sha256": ...,
     "n": n, "seed": S, "method": ..., "ids": [sorted ids], "sha256": ids_sha256(ids)}

A user-given list (``python -m eval.holdout seal --name N --from FILE``, :func:`list_manifest`)
has ``"method": LIST_METHOD``, ``"seed": null``, ``"from"`` (the file given) and the rows it
was sealed with: ``"rows_file"`` (a ``.jsonl`` next to the manifest, one
:meth:`eval.tasks.schema.Task.to_dict` a line, sorted by id) and ``"rows_sha256"`` (sha256 of that
file's bytes).

Selection (version-independent, no RNG state): sort the pool ids by
``sha256(f"{seed}:{id}")`` and take the first ``n``. ``sha256`` = :func:`ids_sha256` of the
sorted ids. Every manifest under ``datasets/`` with ``"sealed": true`` is binding
(design page, "Evaluation"): :func:`check_not_sealed` (used by ``load_tasks(..., purpose="train")``)
refuses any of their ids. This module loads no tasks (the split loader :mod:`eval.tasks.splits`
sits on top of it).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from eval.files import datasets_dir, read_json_object, write_json

SCHEMA = 1
METHOD = "first n of pool ids sorted by sha256(f'{seed}:{id}')"
LIST_METHOD = "user-given list (eval.holdout seal --from)"


class SealedTaskError(ValueError):
    """Training was asked to use ids listed in a sealed manifest; the message lists them."""


def ids_sha256(ids) -> str:
    """sha256 (hex) of ``"\\n".join(sorted(ids))`` encoded as UTF-8."""
    return hashlib.sha256("\n".join(sorted(ids)).encode("utf-8")).hexdigest()


def select_ids(pool_ids: list[str], n: int, seed: int) -> list[str]:
    """The ``n`` sealed ids (sorted) chosen from ``pool_ids`` with ``seed`` (see module doc).

    Raises: ValueError when ``n`` is not in ``1..len(unique pool)`` or the pool repeats ids.
    """
    uniq = set(pool_ids)
    if len(uniq) != len(pool_ids):
        raise ValueError("pool: instance ids repeat")
    if not 1 <= n <= len(uniq):
        raise ValueError(f"n: must be in 1..{len(uniq)} (pool size), got {n}")
    ranked = sorted(uniq, key=lambda i: (hashlib.sha256(f"{seed}:{i}".encode()).hexdigest(), i))
    return sorted(ranked[:n])


def make_manifest(pool_source: str, pool_ids: list[str], n: int, seed: int,
                  name: str) -> dict:
    """The manifest dict for ``n`` ids sealed out of ``pool_ids`` (no file written)."""
    ids = select_ids(pool_ids, n, seed)
    return {
        "schema": SCHEMA, "name": name, "sealed": True, "pool": pool_source,
        "pool_size": len(pool_ids), "pool_sha256": ids_sha256(pool_ids),
        "n": n, "seed": seed, "method": METHOD, "ids": ids, "sha256": ids_sha256(ids),
    }


def file_sha256(path: str | Path) -> str:
    """sha256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def list_manifest(name: str, ids: list[str], *, from_file: str, pool: str, rows_file: str,
                  rows_sha256: str) -> dict:
    """The manifest dict of a user-given id list (no file written; see the module doc).

    Raises: ValueError when ``ids`` is empty or repeats an id.
    """
    if not ids or len(set(ids)) != len(ids):
        raise ValueError("ids: must be a non-empty list without repeats")
    ids = sorted(ids)
    return {
        "schema": SCHEMA, "name": name, "sealed": True, "method": LIST_METHOD,
        "from": from_file, "pool": pool, "pool_size": None, "pool_sha256": None,
        "n": len(ids), "seed": None, "ids": ids, "sha256": ids_sha256(ids),
        "rows_file": rows_file, "rows_sha256": rows_sha256,
    }


def write_manifest(manifest: dict, out: str | Path, *, force: bool = False) -> Path:
    """Write ``manifest`` as JSON (temp file + rename).

    An existing manifest with the same ids is left alone; one with other ids is refused
    unless ``force`` (a sealed list is binding: changing it is a deliberate act).

    Raises: FileExistsError naming ``out``.
    """
    out = Path(out)
    if out.exists() and not force:
        try:
            old = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            old = None
        if isinstance(old, dict) and old.get("sha256") == manifest["sha256"]:
            if old == manifest:
                return out
        raise FileExistsError(f"{out}: a different sealed manifest exists; pass --force to "
                              "replace it (this changes a binding holdout)")
    return write_json(out, manifest)


def read_manifest(path: str | Path) -> dict:
    """Read and verify a sealed manifest.

    Raises:
        FileNotFoundError: no file (the message says how to seal one).
        ValueError: not a sealed manifest, a missing field, or ``sha256`` not matching the ids.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"sealed manifest not found: {path} (write one with "
                                "`python -m eval.holdout seal --pool P --n N --seed S --out PATH`)")
    man = read_json_object(path)
    if man.get("sealed") is not True:
        raise ValueError(f"{path}: not a sealed manifest (no \"sealed\": true)")
    for key in ("ids", "sha256", "pool", "seed", "n"):
        if key not in man:
            raise ValueError(f"{path}: field {key!r} missing")
    ids = man["ids"]
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValueError(f"{path}: field 'ids' must be a list of strings")
    if len(set(ids)) != len(ids) or len(ids) != man["n"]:
        raise ValueError(f"{path}: field 'ids' holds {len(set(ids))} unique of {len(ids)} ids, "
                         f"n says {man['n']}")
    if ids_sha256(ids) != man["sha256"]:
        raise ValueError(f"{path}: field 'sha256' does not match its ids (edited by hand?)")
    if man.get("rows_file") is not None and not (
            isinstance(man["rows_file"], str) and isinstance(man.get("rows_sha256"), str)):
        raise ValueError(f"{path}: fields 'rows_file' / 'rows_sha256' must be strings")
    return man


def manifests(directory: str | Path | None = None) -> dict[Path, dict]:
    """Every sealed manifest (``"sealed": true``) under ``directory`` (default
    :func:`eval.files.datasets_dir`), verified. Other JSON files are ignored.

    Raises: ValueError for a sealed manifest that fails verification.
    """
    root = Path(directory) if directory is not None else datasets_dir()
    out: dict[Path, dict] = {}
    if not root.is_dir():
        return out
    for p in sorted(root.rglob("*.json")):
        try:
            head = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(head, dict) and head.get("sealed") is True:
            out[p] = read_manifest(p)
    return out


def sealed_ids(directory: str | Path | None = None) -> dict[str, str]:
    """id -> manifest file name, over every sealed manifest (see :func:`manifests`)."""
    out: dict[str, str] = {}
    for p, man in manifests(directory).items():
        for i in man["ids"]:
            out.setdefault(i, p.name)
    return out


def check_not_sealed(task_ids, directory: str | Path | None = None) -> None:
    """Refuse sealed ids (design page, "Evaluation": training refuses any holdout task).

    Raises: SealedTaskError listing every sealed id found (and its manifest).
    """
    sealed = sealed_ids(directory)
    hits = [i for i in dict.fromkeys(task_ids) if i in sealed]
    if hits:
        listing = ", ".join(f"{i} ({sealed[i]})" for i in hits)
        raise SealedTaskError(f"{len(hits)} task(s) are sealed for evaluation and may not be "
                              f"used for training: {listing}")
