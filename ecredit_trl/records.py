"""Run records written so that a crash never leaves a half-written file.

JSON files are written to a temporary file in the same directory, fsync-ed,
then renamed over the target; JSONL files are appended one line at a time
with flush + fsync, so the last good line survives a crash.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


class RecordWriteError(OSError):
    """A record could not be written; the message names the path."""


def write_json(path: str | os.PathLike, obj, *, indent: int = 2) -> Path:
    """Atomically write ``obj`` as JSON to ``path`` (temp file + fsync + rename).

    Raises: RecordWriteError naming the path (disk full, permissions...); the
    previous content of ``path``, if any, is left intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=indent, sort_keys=True, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise RecordWriteError(exc.errno, f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


def append_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> Path:
    """Append ``rows`` to ``path``, one JSON object per line, each flushed and fsync-ed.

    Raises: RecordWriteError naming the path; lines written before stay intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "a") as f:
            for row in rows:
                f.write(json.dumps(row, sort_keys=True, default=str) + "\n")
                f.flush()
                os.fsync(f.fileno())
    except OSError as exc:
        raise RecordWriteError(exc.errno, f"cannot append to {path}: {exc.strerror or exc}") from exc
    return path


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a JSONL file; a truncated last line (crash mid-write) is ignored.

    Raises: ValueError naming the path and line for a corrupt line that is not the last.
    """
    path = Path(path)
    lines = path.read_text().splitlines()
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i == len(lines):
                break
            raise ValueError(f"{path}:{i}: corrupt JSON line: {exc}") from exc
    return rows
