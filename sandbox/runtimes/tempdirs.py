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
        root: the temp directory to scan (default: :func:`tempfile.gettempdir`).
        unmarked_idle_s: a directory without an owner marker (made by code that does
            not mark, or by an older version) is removed only when nothing in it changed
            for this many seconds, so a live process's directory is never taken.

    Returns: the removed paths. A directory whose owner is alive is always kept.
    """
    base = Path(root or tempfile.gettempdir())
    removed = []
    for d in sorted(base.iterdir()):
        if not d.name.startswith(TEMP_PREFIXES) or d.is_symlink() or not d.is_dir():
            continue
        alive = owner_alive(d)
        if alive or (alive is None and _idle_s(d) < unmarked_idle_s):
            continue
        shutil.rmtree(d, ignore_errors=True)
        if not d.exists():
            removed.append(str(d))
    return removed
