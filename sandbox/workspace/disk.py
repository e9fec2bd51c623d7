"""Disk use of rollout trees, and removal of temp directories left by dead processes.

A rollout's working tree is a host directory the agent writes through a bind mount
(no quota there), and every snapshot copies new files into a git object store. The
agent environment therefore measures the tree (and the snapshot store) at every
snapshot (:func:`tree_usage`) and ends the episode when it grows past its budget.

Temp directories (``ecredit-rollouts-*`` working roots, ``ecredit-snap-*`` private
snapshot indexes, ``ecredit-podman-*`` private service sockets and logs) carry an owner marker (:func:`mark_owner`: pid + process start
time); :func:`gc_temp_dirs` removes those whose owner is gone, which is how
``python -m sandbox gc`` cleans up after a killed run without touching a live one.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

TEMP_PREFIXES = ("ecredit-rollouts-", "ecredit-snap-", "ecredit-podman-")
OWNER_FILE = ".ecredit-owner.json"


@dataclass(frozen=True)
class TreeUsage:
    """Apparent size of the regular files under some directories.

    Attributes:
        total_bytes: sum of ``st_size`` over regular files (each inode once; symlinks
            are not followed and count 0).
        files: number of regular files counted.
        largest_path: the largest file (absolute path), or "" when there is none.
        largest_bytes: its size in bytes.
    """

    total_bytes: int
    files: int
    largest_path: str
    largest_bytes: int


def tree_usage(dirs: Iterable[str | os.PathLike],
               stores: Iterable[str | os.PathLike] = ()) -> TreeUsage:
    """Walk ``dirs`` and ``stores`` (missing ones count 0); sum the apparent size of files.

    Apparent size (not allocated blocks) is what a snapshot would hash and store, so a
    sparse file counts at its full length. Hard links count once. Files under
    ``stores`` (git object stores: a compressed object can be a few bytes larger than
    its file) count in the total but not as ``largest``. Cost: one ``lstat`` per entry
    (a SWE-bench checkout of ~6k files takes tens of milliseconds).
    """
    seen: set[tuple[int, int]] = set()
    total = files = largest = 0
    largest_path = ""
    store_set = {os.path.abspath(s) for s in stores}
    stack = [(Path(d), False) for d in dirs] + [(Path(s), True) for s in store_set]
    while stack:
        d, in_store = stack.pop()
        try:
            it = os.scandir(d)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        with it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    if os.path.abspath(e.path) not in store_set:  # each store walked once
                        stack.append((Path(e.path), in_store))
                elif stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
                    files += 1
                    if not in_store and st.st_size > largest:
                        largest, largest_path = st.st_size, e.path
    return TreeUsage(total, files, largest_path, largest)


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
