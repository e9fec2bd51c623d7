"""Removal of temp directories left by dead processes.

Temp directories (``ecredit-rollouts-*`` working roots, ``ecredit-snap-*`` private
snapshot indexes, ``ecredit-podman-*`` private service sockets and logs, ``ecredit-trial-inputs-*`` verifier
trials' archives) carry an owner marker (:func:`mark_owner`: pid + process start
time); :func:`gc_temp_dirs` removes those whose owner is gone, which is how
``python -m sandbox gc`` cleans up after a killed run without touching a live one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

TEMP_PREFIXES = ("ecredit-rollouts-", "ecredit-snap-", "ecredit-podman-",
                 "ecredit-trial-inputs-")
OWNER_FILE = ".ecredit-owner.json"
#: A unix socket's path must fit ``sun_path``: 108 bytes on Linux, its closing NUL included
#: (unix(7)); a longer one fails to bind ("invalid argument").
MAX_SOCKET_PATH = 107
#: Where a socket goes when the temp directory's path is too long for one (:func:`socket_dir`).
SHORT_ROOT = "/tmp"


def socket_dir(prefix: str, name: str, root: str | os.PathLike | None = None) -> Path:
    """A new owner-marked directory for a unix socket called ``name``: under ``root`` (default:
    :func:`tempfile.gettempdir`, which follows ``TMPDIR``) when the socket's path fits
    :data:`MAX_SOCKET_PATH` bytes there, else under :data:`SHORT_ROOT`, so that a deep
    ``TMPDIR`` does not stop a service from binding. :func:`gc_temp_dirs` scans both roots.

    Raises: OSError naming the path when neither root gives a path short enough.
    """
    base = Path(root or tempfile.gettempdir())
    for where in dict.fromkeys([base, Path(SHORT_ROOT)]):
        # mkdtemp's suffix is 8 characters: the length is known before the directory exists
        if len(os.fsencode(where / f"{prefix}{'x' * 8}" / name)) <= MAX_SOCKET_PATH:
            d = Path(tempfile.mkdtemp(prefix=prefix, dir=where))
            mark_owner(d)
            return d
    raise OSError(f"no directory short enough for a unix socket: {base / prefix}*/{name} and "
                  f"{SHORT_ROOT}/{prefix}*/{name} exceed {MAX_SOCKET_PATH} bytes")


def _start_time(pid: int) -> str | None:
    """Start time of ``pid`` in clock ticks since boot (/proc), None when it is not running."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces: fields after the last ')'
    return data.rsplit(")", 1)[1].split()[19]


def mark_owner(directory: str | os.PathLike, pid: int | None = None) -> None:
    """Write the owner marker of ``directory``: this process (pid and start time)."""
    pid = os.getpid() if pid is None else pid
    body = {"pid": pid, "start_time": _start_time(pid), "created": time.time()}
    Path(directory, OWNER_FILE).write_text(json.dumps(body))


def owner_alive(directory: str | os.PathLike) -> bool | None:
    """True/False when ``directory`` has an owner marker and its process is alive/gone;
    None when there is no readable marker."""
    try:
        body = json.loads(Path(directory, OWNER_FILE).read_text())
        pid = int(body["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    now = _start_time(pid)
    return now is not None and now == body.get("start_time")


def _idle_s(directory: Path) -> float:
    """Seconds since anything directly in ``directory`` (or the directory) changed."""
    newest = directory.lstat().st_mtime
    try:
        with os.scandir(directory) as it:
            for e in it:
                try:
                    newest = max(newest, e.stat(follow_symlinks=False).st_mtime)
                except FileNotFoundError:
                    pass
    except OSError:
        pass
    return time.time() - newest


def gc_temp_dirs(root: str | os.PathLike | None = None, *,
                 unmarked_idle_s: float = 6 * 3600) -> list[str]:
    """Remove ``ecredit-rollouts-*`` / ``ecredit-snap-*`` / ``ecredit-podman-*`` directories
    left by dead processes.

    Args:
        root: the temp directory to scan (default: :func:`tempfile.gettempdir`, and
            :data:`SHORT_ROOT` too, where :func:`socket_dir` puts a socket that a long
            ``TMPDIR`` cannot hold).
        unmarked_idle_s: a directory without an owner marker (made by code that does
            not mark, or by an older version) is removed only when nothing in it changed
            for this many seconds, so a live process's directory is never taken.

    Returns: the removed paths. A directory whose owner is alive is always kept.
    """
    bases = [Path(root)] if root else list(dict.fromkeys([Path(tempfile.gettempdir()),
                                                         Path(SHORT_ROOT)]))
    found = sorted(d for base in bases if base.is_dir() for d in base.iterdir())
    removed = []
    for d in found:
        if not d.name.startswith(TEMP_PREFIXES) or d.is_symlink() or not d.is_dir():
            continue
        alive = owner_alive(d)
        if alive or (alive is None and _idle_s(d) < unmarked_idle_s):
            continue
        shutil.rmtree(d, ignore_errors=True)
        if not d.exists():
            removed.append(str(d))
    return removed
