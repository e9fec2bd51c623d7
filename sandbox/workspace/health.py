"""Evidence of a failed agent exec, collected on the host: cgroup counters and the kernel's OOM
record of one container, and the uid that keeps the agent from stopping its own container.

Facts only: who the failure is charged to (the agent or the infrastructure) is decided by
:func:`eval.integrity.agent.classify_exec_failure` on the evidence that
:meth:`sandbox.workspace.session.PodmanSession.diagnose` gathers with these functions (design
page, "Who caused a failure decides the reward"). The agent cannot forge any of it: cgroup
files are read-only inside the container and read on the host from the service-reported
``CgroupPath``, and the kernel log is the kernel's.

The same facts are read on every host layout the rules must hold on (design page, "Threat
model"), not only this machine's:

* **cgroup v1 and v2**, with or without ``memory.peak`` (v2 has it from kernel 5.19 only):
  the limit being reached is also read from the cgroup's own event counters (v2
  ``memory.events`` ``max`` / ``oom``; v1 ``memory.failcnt``);
* **nested cgroups**: crun's systemd driver runs a container's processes in a ``container``
  child of the ``libpod-<id>.scope`` that Podman reports, and kernels before "cgroup/pids:
  Separate semantics of pids.events" count a refused fork in the *forking* process's
  cgroup: every counter is read over the reported cgroup's whole subtree;
* **another cgroup namespace** (a node that is itself a container): the kernel prints
  cgroup paths from its root namespace, so a record matches when the reported path is a
  trailing run of its components (any prefix), and an unreadable ``/dev/kmsg`` is reported
  as such (:func:`memcg_oom_record`), never as "no record".
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

KEEPER_USER = "65534:65534"
"""uid:gid of an agent container's init and main process (``nobody``): the agent's commands
run as the image's user (root for SWE-bench images) with every capability dropped, so they
cannot signal (and so stop) the container (kill(2) needs CAP_KILL across uids)."""
CGROUP_ROOT = Path("/sys/fs/cgroup")
MAX_SUBTREE_CGROUPS = 64
"""At most this many cgroups of a container's subtree are read (the reported cgroup first,
then its descendants, breadth first): a container's own processes cannot create cgroups
(the cgroup file system is read-only inside, no capability), so real subtrees hold 1–3."""


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


def subtree(top: Path, limit: int = MAX_SUBTREE_CGROUPS) -> list[Path]:
    """``top`` and the cgroups below it (breadth first, at most ``limit``; symlinks never
    followed); ``[]`` when ``top`` is not a directory."""
    if not top.is_dir():
        return []
    out, queue = [], [top]
    while queue and len(out) < limit:
        d = queue.pop(0)
        out.append(d)
        try:
            with os.scandir(d) as it:
                queue += sorted(Path(e.path) for e in it if e.is_dir(follow_symlinks=False))
        except OSError:
            continue
    return out


def _sum(values) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _binding(dirs: list[Path], limit_file: str, current_file: str) -> Path | None:
    """The cgroup of ``dirs`` whose limit is closest to being hit (least headroom): where
    the container's limit is set (the scope, its ``container`` child, or both)."""
    best, room = None, None
    for d in dirs:
        lim = _int(d / limit_file)
        if lim is None:
            continue
        r = lim - (_int(d / current_file) or 0)
        if room is None or r < room:
            best, room = d, r
    return best


def _pids(dirs: list[Path]) -> dict:
    b = _binding(dirs, "pids.max", "pids.current")
    return {"pids_current": _int((b or dirs[0]) / "pids.current") if dirs else None,
            "pids_max": _int(b / "pids.max") if b else None,
            # counted where the fork was refused (kernels before the pids.events split) or
            # where the limit is (after it, hierarchically): any cgroup of the subtree
            "pids_max_events": _sum(_keyed(d / "pids.events").get("max") for d in dirs)}


def _memory_v2(dirs: list[Path]) -> dict:
    b = _binding(dirs, "memory.max", "memory.current")
    ev = [_keyed(d / "memory.events") for d in dirs]
    return {"memory_limit_bytes": _int(b / "memory.max") if b else None,
            "memory_peak_bytes": _int((b or dirs[0]) / "memory.peak"),  # kernel >= 5.19
            "memory_current_bytes": _int((b or dirs[0]) / "memory.current"),
            "memory_max_events": _sum(e.get("max") for e in ev),
            "memory_oom_events": _sum(e.get("oom") for e in ev),
            "oom_kill": _sum(e.get("oom_kill") for e in ev)}


def _memory_v1(dirs: list[Path]) -> dict:
    if not dirs:
        return {"memory_limit_bytes": None, "memory_peak_bytes": None,
                "memory_current_bytes": None, "memory_max_events": None,
                "memory_oom_events": None, "oom_kill": None}
    b = _binding(dirs, "memory.limit_in_bytes", "memory.usage_in_bytes") or dirs[0]
    return {"memory_limit_bytes": _int(b / "memory.limit_in_bytes"),
            "memory_peak_bytes": _int(b / "memory.max_usage_in_bytes"),
            "memory_current_bytes": _int(b / "memory.usage_in_bytes"),
            "memory_max_events": _int(b / "memory.failcnt"),  # hits of the limit
            "memory_oom_events": None,  # v1 counts no OOM invocations
            "oom_kill": _sum(_keyed(d / "memory.oom_control").get("oom_kill") for d in dirs)}


def read_cgroup(cgroup_path: str | None, root: Path = CGROUP_ROOT) -> dict | None:
    """The pids and memory counters of one container's cgroup subtree, read on the host.

    Args:
        cgroup_path: the container's ``State.CgroupPath`` (as Podman reports it, e.g.
            ``/libpod_parent/libpod-<id>`` or ``/machine.slice/libpod-<id>.scope``).
        root: the cgroup mount (v1: one directory per controller below it; v2: unified).

    Returns: a dict of ints (None where a file is missing or says ``max``), or None when
    the cgroup is gone (the container stopped) or no path is known:

    * ``pids_current``, ``pids_max``: of the cgroup of the subtree with the least pids
      headroom (where the limit is set); ``pids_max_events``: the ``pids.events`` ``max``
      counters summed over the subtree;
    * ``memory_limit_bytes``, ``memory_peak_bytes``, ``memory_current_bytes``: likewise of
      the cgroup holding the memory limit (v2 ``memory.max`` / ``memory.peak`` /
      ``memory.current``; v1 ``memory.limit_in_bytes`` / ``memory.max_usage_in_bytes`` /
      ``memory.usage_in_bytes``);
    * ``memory_max_events``: times usage hit the limit (v2 ``memory.events`` ``max``
      summed over the subtree; v1 ``memory.failcnt``); ``memory_oom_events``: OOM
      invocations at a limit of the subtree (v2 ``oom``; None on v1); ``oom_kill``:
      processes of the subtree the OOM killer killed (v2 ``memory.events``, v1
      ``memory.oom_control``, summed);
    * ``cgroups_read``: how many cgroups of the subtree were read.

    Sources: Documentation/admin-guide/cgroup-v2.rst ("memory.events", "memory.peak",
    "PID"), Documentation/admin-guide/cgroup-v1/memory.rst (sections 2.5, 5, 10).
    Summing hierarchical counters over a subtree counts an event more than once; the rules
    compare a subtree's counters only with an earlier reading of the same subtree.
    """
    if not cgroup_path:
        return None
    rel = cgroup_path.lstrip("/")
    if (root / "pids" / rel).is_dir() or (root / "memory" / rel).is_dir():  # v1
        pids, mem = subtree(root / "pids" / rel), subtree(root / "memory" / rel)
        return {**_pids(pids), **_memory_v1(mem), "cgroups_read": max(len(pids), len(mem))}
    dirs = subtree(root / rel)
    if not dirs:
        return None
    return {**_pids(dirs), **_memory_v2(dirs), "cgroups_read": len(dirs)}


EXHAUSTION_COUNTERS = {"pids_max_events": "pids.events max",
                       "oom_kill": "oom_kill (v2 memory.events, v1 memory.oom_control)",
                       "memory_oom_events": "memory.events oom (v2 only)"}
"""The counters of :func:`read_cgroup` that only grow and record an exhaustion the moment it
happens (field → what the kernel calls it): the agent rule reads a limit hit from them."""


def exhaustion_evidence(counters: dict | None) -> dict[str, bool]:
    """Which of :data:`EXHAUSTION_COUNTERS` a :func:`read_cgroup` reading holds (True: the
    host's kernel keeps it for a container's cgroup); all False for no reading (pure)."""
    return {k: (counters or {}).get(k) is not None for k in EXHAUSTION_COUNTERS}


_OOM_MEMCG = re.compile(r"[,:]oom_memcg=([^,\s]*)")
_OLD_MEMCG = re.compile(r"killed as a result of limit of (\S+)")


def path_matches(printed: str, cgroup_path: str) -> bool:
    """Whether the cgroup path ``printed`` (as the kernel prints it: from the root of its
    cgroup hierarchy) is ``cgroup_path`` (as seen from a cgroup namespace that may sit
    lower: an LXC or Kubernetes node) or a cgroup below it (crun's ``container`` child).

    The reported path must be a run of whole components of ``printed``, after any prefix,
    followed only by deeper components: ``/lxc.payload.n1/machine.slice/libpod-a.scope/
    container`` matches ``/machine.slice/libpod-a.scope``; ``.../libpod-ab`` does not match
    ``.../libpod-a``, nor an ancestor's path (a limit above the container's own)."""
    want = [c for c in cgroup_path.split("/") if c]
    got = [c for c in printed.split("/") if c]
    if not want:
        return False
    return any(got[i:i + len(want)] == want for i in range(len(got) - len(want) + 1))


def _oom_line(line: str, cgroup_path: str) -> bool:
    m = _OOM_MEMCG.search(line)
    if "oom-kill:" in line and "constraint=CONSTRAINT_MEMCG" in line and m:
        return path_matches(m.group(1), cgroup_path)
    m = _OLD_MEMCG.search(line)  # kernels before 4.19: "Task in X killed as a result of limit of Y"
    return bool(m and line.lstrip().startswith("Task in ") and path_matches(m.group(1),
                                                                             cgroup_path))


def memcg_oom_record(cgroup_path: str | None,
                     kmsg: str = "/dev/kmsg") -> tuple[str | None, str | None]:
    """The kernel log's record of an OOM kill at the memory limit of the container whose
    cgroup is ``cgroup_path`` (or of a cgroup below it), and why the log could not be read.

    Args:
        cgroup_path: the service-reported ``CgroupPath`` (unique per container).
        kmsg: the kernel log device (a file of the same lines reads the same).

    Returns: ``(record, unreadable)``: ``record`` the matching line (≤ 500 chars) or None;
    ``unreadable`` None when the whole ring buffer was read, else one line saying why not
    (``"/dev/kmsg: PermissionError: ..."``: reading needs CAP_SYSLOG and is often denied
    inside containers). ``(None, None)`` when no path is known. Non-blocking (a few ms).

    Sources: the kernel's OOM report, ``oom-kill:constraint=CONSTRAINT_MEMCG,...,
    oom_memcg=<path>,task_memcg=...`` (mm/oom_kill.c ``dump_oom_summary``, kernel ≥ 4.19;
    before it mm/memcontrol.c printed ``Task in <task cgroup> killed as a result of limit
    of <cgroup>``); the path is printed from the hierarchy's root (``pr_cont_cgroup_path``),
    so in a cgroup namespace it carries a prefix (:func:`path_matches`); /dev/kmsg format:
    Documentation/ABI/testing/dev-kmsg.
    """
    if not cgroup_path:
        return None, None
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return None, f"{kmsg}: {type(exc).__name__}: {exc.strerror or exc}"
    try:
        while True:
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:
                return None, None
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # a record was overwritten while reading
                    continue
                return None, f"{kmsg}: {type(exc).__name__}: {exc.strerror or exc}"
            if not rec:
                return None, None
            # one record per read from /dev/kmsg ("prio,seq,usec,flags;text"); any file of
            # such lines reads the same
            for raw in rec.decode("utf-8", errors="replace").splitlines():
                line = raw.split(";", 1)[-1].strip()
                if _oom_line(line, cgroup_path):
                    return line[:500], None
    finally:
        os.close(fd)


def memcg_oom_logged(cgroup_path: str | None, kmsg: str = "/dev/kmsg") -> str | None:
    """The record of :func:`memcg_oom_record` alone: the matching kernel log line, or None
    (no such record, no path, or the log is unreadable)."""
    return memcg_oom_record(cgroup_path, kmsg)[0]


__all__ = ["CGROUP_ROOT", "EXHAUSTION_COUNTERS", "KEEPER_USER", "MAX_SUBTREE_CGROUPS",
           "exhaustion_evidence", "memcg_oom_logged",
           "memcg_oom_record", "path_matches", "read_cgroup", "subtree"]
