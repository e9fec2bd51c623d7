"""Evidence of a failed agent exec, collected on the host: cgroup counters and the kernel's OOM
record of one container, and the uid that keeps the agent from stopping its own container.

Facts only: who the failure is charged to (the agent or the infrastructure) is decided by
:func:`eval.integrity.agent.classify_exec_failure` on the evidence that
:meth:`sandbox.workspace.session.PodmanSession.diagnose` gathers with these functions (design
page, "Who caused a failure decides the reward"). The agent cannot forge any of it: cgroup
files are read-only inside the container and read on the host from the service-reported
``CgroupPath``, and the kernel log is the kernel's.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

KEEPER_USER = "65534:65534"
"""uid:gid of an agent container's init and main process (``nobody``): the agent's commands
run as the image's user (root for SWE-bench images) with every capability dropped, so they
cannot signal (and so stop) the container (kill(2) needs CAP_KILL across uids)."""
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":  # cgroup v2: no limit
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _keyed(path: Path) -> dict[str, int]:
    """``key value`` lines of a cgroup file (``memory.events``, ``pids.events``)."""
    out = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def read_cgroup(cgroup_path: str | None, root: Path = CGROUP_ROOT) -> dict | None:
    """The pids and memory counters of one container's cgroup, read on the host.

    Args:
        cgroup_path: the container's ``State.CgroupPath`` (as Podman reports it, e.g.
            ``/libpod_parent/libpod-<id>``).
        root: the cgroup mount (v1: one directory per controller below it; v2: unified).

    Returns: ``{"pids_current", "pids_max", "pids_max_events", "memory_limit_bytes",
    "memory_peak_bytes", "memory_current_bytes", "oom_kill"}`` (ints, None where a file is
    missing), or None when the cgroup is gone (the container stopped) or no path is known.
    """
    if not cgroup_path:
        return None
    rel = cgroup_path.lstrip("/")
    v1 = (root / "pids" / rel).is_dir() or (root / "memory" / rel).is_dir()
    if v1:
        pids, mem = root / "pids" / rel, root / "memory" / rel
        oom = _keyed(mem / "memory.oom_control")
        return {"pids_current": _int(pids / "pids.current"), "pids_max": _int(pids / "pids.max"),
                "pids_max_events": _keyed(pids / "pids.events").get("max"),
                "memory_limit_bytes": _int(mem / "memory.limit_in_bytes"),
                "memory_peak_bytes": _int(mem / "memory.max_usage_in_bytes"),
                "memory_current_bytes": _int(mem / "memory.usage_in_bytes"),
                "oom_kill": oom.get("oom_kill")}
    d = root / rel
    if not d.is_dir():
        return None
    return {"pids_current": _int(d / "pids.current"), "pids_max": _int(d / "pids.max"),
            "pids_max_events": _keyed(d / "pids.events").get("max"),
            "memory_limit_bytes": _int(d / "memory.max"),
            "memory_peak_bytes": _int(d / "memory.peak"),
            "memory_current_bytes": _int(d / "memory.current"),
            "oom_kill": _keyed(d / "memory.events").get("oom_kill")}


def memcg_oom_logged(cgroup_path: str | None, kmsg: str = "/dev/kmsg") -> str | None:
    """The kernel log's record of an OOM kill at the memory limit of the cgroup
    ``cgroup_path`` (the service-reported ``CgroupPath``, e.g. ``/libpod_parent/libpod-<id>``;
    unique per container), or None (no such record, no path, or the log is unreadable: it
    needs root). Reads every record in the ring buffer, non-blocking (a few ms).

    Source: the kernel's OOM report, ``oom-kill:constraint=CONSTRAINT_MEMCG,...,
    oom_memcg=<path>,task_memcg=...`` (mm/oom_kill.c ``dump_oom_summary``; /dev/kmsg format:
    Documentation/ABI/testing/dev-kmsg).
    """
    if not cgroup_path:
        return None
    needle = f"oom_memcg={cgroup_path}"
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        while True:
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:
                return None
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # a record was overwritten while reading
                    continue
                return None
            if not rec:
                return None
            # one record per read from /dev/kmsg ("prio,seq,usec,flags;text"); any file of
            # such lines reads the same
            for raw in rec.decode("utf-8", errors="replace").splitlines():
                line = raw.split(";", 1)[-1].strip()
                if ("oom-kill:" in line and "constraint=CONSTRAINT_MEMCG" in line
                        and (f"{needle}," in line or line.endswith(needle))):
                    return line[:500]
    finally:
        os.close(fd)


__all__ = ["KEEPER_USER", "memcg_oom_logged", "read_cgroup"]
