"""Run records written so that a crash never leaves a half-written file.

JSON files are written by the project's one atomic writer (:mod:`eval.files`: a temporary
file in the same directory, fsync-ed, then renamed over the target), its errors named here
as :class:`RecordWriteError`; JSONL files are appended one line at a time with flush + fsync,
so the last good line survives a crash. A line that
cannot be written completely (disk full) is cut off again, so the file ends
with the last complete line.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from eval import files


class RecordWriteError(OSError):
    """A record could not be written; the message names the path (``errno`` is kept)."""


def _dumps(obj) -> str:
    """One JSONL line's text (key-sorted, as :func:`eval.files.write_json` writes)."""
    return json.dumps(obj, sort_keys=True, default=str)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Atomically replace ``path`` by ``text`` (:func:`eval.files.atomic_write_text`: temp
    file + fsync + rename).

    Raises: RecordWriteError naming the path (disk full, permissions...); the
    previous content of ``path``, if any, is left intact and no temp file stays.
    """
    with _named(path):
        return files.atomic_write_text(path, text)


def write_json(path: str | os.PathLike, obj, *, indent: int | None = 2) -> Path:
    """Atomically write ``obj`` as key-sorted JSON to ``path`` (:func:`eval.files.write_json`).

    Raises: RecordWriteError naming the path (disk full, permissions...); the
    previous content of ``path``, if any, is left intact.
    """
    with _named(path):
        return files.write_json(path, obj, indent=indent)


def write_jsonl_atomic(path: str | os.PathLike, rows: Iterable[dict]) -> Path:
    """Atomically replace ``path`` by ``rows`` as JSONL (used to rewrite a whole file).

    Raises: RecordWriteError naming the path; the old file stays intact.
    """
    with _named(path):
        return files.write_jsonl(path, rows)


@contextlib.contextmanager
def _named(path: str | os.PathLike):
    """Re-raise an OSError of the block as RecordWriteError naming ``path`` (errno kept)."""
    try:
        yield
    except OSError as exc:
        raise RecordWriteError(exc.errno, f"cannot write {path}: {exc.strerror or exc}") from exc


def append_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> Path:
    """Append ``rows`` to ``path``, one JSON object per line, each written and fsync-ed.

    A line that fails half-way (``ENOSPC``...) is truncated away again, so the
    file always ends with the last complete line.

    Raises: RecordWriteError naming the path and the row that failed; lines
    written before stay intact.
    """
    path = Path(path)
    fd = None
    i = -1
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        for n, row in enumerate(rows):
            i = n
            data = (_dumps(row) + "\n").encode("utf-8")
            start = os.lseek(fd, 0, os.SEEK_END)
            try:
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                os.fsync(fd)
            except OSError:
                try:
                    os.ftruncate(fd, start)
                except OSError:
                    pass
                raise
    except OSError as exc:
        where = f" (row {i} of this append)" if i >= 0 else ""
        raise RecordWriteError(exc.errno, f"cannot append to {path}{where}: "
                                          f"{exc.strerror or exc}") from exc
    finally:
        if fd is not None:
            os.close(fd)
    return path


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a JSONL file; a truncated last line (crash mid-write) is ignored.

    Raises: FileNotFoundError for a missing file; ValueError naming the path and line
    for a corrupt line that is not the last.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    return files.read_jsonl(path)

