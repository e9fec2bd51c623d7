"""Record files that a crash cannot leave half-written (shared by eval, the pilot and runs),
and where the project's ``datasets/`` folder is.

Text and JSON go to a temporary file in the target's folder, are fsync-ed, then
renamed over the target (the folder is fsync-ed too, so the rename survives a power loss).
This is the project's one atomic writer: run records (:mod:`ecredit_trl.runs.records`) and
the warm starts wrap it. JSONL is appended a line at a time with flush + fsync,
and a reader ignores a truncated last line. Files are created 0644 (``mkstemp``
alone would make them 0600, unreadable to the other users of a shared machine).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8, surrogates kept) to ``path`` atomically.

    Raises: OSError from the file system; the previous content of ``path`` is intact
    and no temporary file is left behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fd = None  # the file object owns (and closes) it now
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if fd is not None:
            os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def write_json(path: str | os.PathLike, obj, *, indent: int | None = 2) -> Path:
    """``obj`` as key-sorted JSON (``indent`` spaces, None: one line), atomically (see
    :func:`atomic_write_text`); values JSON cannot hold are written as ``str(value)``."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=True, default=str)
                             + "\n")


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict], *,
                ensure_ascii: bool = True) -> Path:
    """Replace ``path`` by ``rows``, one key-sorted JSON object a line, atomically (see
    :func:`atomic_write_text`; a whole file rewritten, not appended). ``ensure_ascii=False``
    keeps non-ASCII text as UTF-8 instead of ``\\u`` escapes."""
    return atomic_write_text(path, "".join(
        json.dumps(r, sort_keys=True, default=str, ensure_ascii=ensure_ascii) + "\n"
        for r in rows))


def read_json_object(path: str | os.PathLike, error: type[Exception] = ValueError,
                     what: str = "") -> dict:
    """The JSON object stored in the file ``path``.

    Args:
        error: the exception class raised (the caller's named error, e.g. a config error).
        what: what the file is, put before the path in messages (``"run config"``).

    Raises: ``error`` naming ``what`` and the path when the file cannot be read, is not
        UTF-8, is not valid JSON (with the line) or holds something other than an object.
    """
    where = f"{what} {path}" if what else str(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno})") from None
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise error(f"{where}: cannot read: {exc.strerror or exc}") from exc
    if not isinstance(data, dict):
        raise error(f"{where}: expected a JSON object, got {type(data).__name__}")
    return data


def append_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> Path:
    """Append ``rows``, one JSON object a line, each flushed and fsync-ed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8", errors="surrogateescape") as fh:
        for row in rows:
            fh.write(json.dumps(row, sort_keys=True, default=str) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
    return path


def read_jsonl(path: str | os.PathLike, error=ValueError) -> list[dict]:
    """Rows of a JSONL file ([] when absent); a truncated last line is ignored.

    Raises: ``error`` (default ValueError) naming the path and line of a corrupt line
    that is not the last.
    """
    path = Path(path)
    if not path.exists():
        return []
    # rows end at "\n" alone: str.splitlines would also break a row at a U+2028, U+2029 or
    # U+0085 inside a string, which json.dumps(ensure_ascii=False) writes as they are
    lines = path.read_text(encoding="utf-8", errors="surrogateescape").split("\n")
    if lines[-1] == "":
        lines.pop()
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i == len(lines):
                break
            raise error(f"{path}:{i}: corrupt JSON line ({exc.msg})") from None
    return rows


def save_figure(fig, path: str | os.PathLike, dpi: int = 110) -> Path:
    """Save a matplotlib figure as PNG atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.fchmod(fd, 0o644)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=dpi)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _fsync_dir(directory: Path) -> None:
    """fsync a directory so a rename in it survives a power loss (best effort)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def datasets_dir() -> Path:
    """The project's ``datasets/`` folder (manifests, recipes): ``$ECREDIT_DATASETS_DIR``
    or ``<repo root>/datasets``."""
    env = os.environ.get("ECREDIT_DATASETS_DIR")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "datasets"
