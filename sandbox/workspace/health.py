"""Who broke an agent container: the policy's own processes, or the infrastructure.

An exec that the runtime could not start (:class:`sandbox.workspace.session.SandboxExecError`) used to
be an infra failure of the rollout, always: the reward became unavailable and TRL masked
the row. A policy can cause that itself (5,000 background ``sleep`` s fill its pids limit;
a process that holds the memory limit gets the next exec killed), so masking every such
failure pays a failing policy for breaking its own sandbox. The rule here
(design page, "Who caused a failure decides the reward"):

An exec failure is the **agent's** (``agent_pids`` / ``agent_oom``) only when all hold:

1. **the service is healthy**: the Podman endpoint answers a ping (a dead service or a
   lost node is infrastructure);
2. **the container is the one we started and was not stopped from outside**: it still
   exists (a container removed from outside is infrastructure) and, for ``agent_pids``,
   it is still running. The agent cannot stop it itself: its init and main process run
   as a uid of their own (:data:`KEEPER_USER`), and the agent, root without
   ``CAP_KILL``, gets ``EPERM`` signalling them. So a container that exited without
   memory evidence was stopped by someone else;
3. **the container hit its own limit**, read on the host from its own cgroup (the agent
   cannot write cgroup files: they are read-only inside, and the host reads the
   service-reported ``CgroupPath``):

   * pids: ``pids.current`` within :data:`PIDS_SLACK` of ``pids.max`` and the
     ``pids.events`` "max" counter above zero (a fork was refused at the limit);
   * memory: the OOM killer acted in the container's cgroup (``oom_kill`` > 0) **and** its
     peak usage reached its limit (within :data:`MEMORY_SLACK_BYTES`). The peak rules out a
     host-wide OOM kill (which also counts in ``oom_kill``) of a container below its
     limit. The counters die with the cgroup, so a container that the OOM killer stopped
     is judged on the last sample taken after a call (:meth:`PodmanSession.sample`), or,
     when the kill came during the failing call itself (the sample after it found no
     cgroup left: a race lost under load), on the kernel's own record of it: an
     ``oom-kill:constraint=CONSTRAINT_MEMCG,...,oom_memcg=<the container's cgroup>`` line in
     the kernel log (:func:`memcg_oom_logged`; ``CONSTRAINT_MEMCG`` = the cgroup's own limit,
     not host-wide pressure; the agent cannot write the kernel log).

Anything else stays an infra failure (``None``): unavailable, excluded, counted by reason.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

AGENT_EXEC_CLASSES = ("agent_pids", "agent_oom")
"""Failure classes of an exec failure charged to the agent (:func:`classify_exec_failure`)."""
KEEPER_USER = "65534:65534"
"""uid:gid of an agent container's init and main process (``nobody``): the agent's commands
run as the image's user (root for SWE-bench images) with every capability dropped, so they
cannot signal (and so stop) the container (kill(2) needs CAP_KILL across uids)."""
PIDS_SLACK = 4
"""An exec needs a few pids of its own (runc init, bash, timeout): a cgroup within this many
of its limit cannot start one."""
MEMORY_SLACK_BYTES = 4 * 2**20
"""Peak usage within this many bytes of the limit counts as having reached it (the kernel
reclaims and kills a little below the exact limit)."""
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


def pids_exhausted(c: dict | None) -> bool:
    """The container's pids cgroup is at its limit and refused a fork (rule 3, pids)."""
    if not c or c.get("pids_current") is None or c.get("pids_max") is None:
        return False
    return (c["pids_current"] >= c["pids_max"] - PIDS_SLACK
            and (c.get("pids_max_events") or 0) > 0)


def memory_exhausted(c: dict | None, before: dict | None = None) -> bool:
    """The OOM killer acted in the container's cgroup at its own limit (rule 3, memory):
    ``oom_kill`` grew since ``before`` (an earlier sample; None: since the start, when the
    fresh cgroup's counter was 0) and the peak usage reached the limit."""
    if not c or not c.get("oom_kill") or c.get("memory_limit_bytes") is None:
        return False
    if c["oom_kill"] <= ((before or {}).get("oom_kill") or 0):
        return False  # an old OOM kill the agent recovered from says nothing of this failure
    peak = c.get("memory_peak_bytes") or 0
    return peak >= c["memory_limit_bytes"] - MEMORY_SLACK_BYTES


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


def classify_exec_failure(evidence: dict) -> str | None:
    """Apply the module's rule to the evidence of one failed exec (pure).

    Args:
        evidence: ``service_ok`` (bool: the endpoint answered a ping), ``container``
            (``"running"``, ``"exited"``, ... or ``"missing"``), ``cgroup`` (counters now,
            :func:`read_cgroup`, None when gone), ``cgroup_last`` (the sample taken right
            after the last call that returned, None if unreadable) and ``cgroup_prev`` (the
            sample before that one: after the call before, or at start), and optionally
            ``memcg_oom`` (:func:`memcg_oom_logged` for the container's cgroup).

    Returns: ``"agent_pids"``, ``"agent_oom"``, or None (infrastructure: unavailable).
    A running container is judged on its counters now (an OOM kill since the last call);
    a stopped one on the last call's sample (an OOM kill during that call), since its
    counters died with the cgroup.
    """
    if not evidence.get("service_ok"):
        return None
    state = evidence.get("container")
    if state == "running":
        now = evidence.get("cgroup")
        if pids_exhausted(now):
            return "agent_pids"
        if memory_exhausted(now, evidence.get("cgroup_last")):
            return "agent_oom"
        return None
    if state in (None, "missing"):
        return None
    # stopped: from inside only the OOM killer of its own limit can have done that
    # (KEEPER_USER); the counters are gone with the cgroup, so read the last sample
    last, prev = evidence.get("cgroup_last"), evidence.get("cgroup_prev")
    return "agent_oom" if memory_exhausted(last, prev) or evidence.get("memcg_oom") else None


__all__ = ["AGENT_EXEC_CLASSES", "KEEPER_USER", "classify_exec_failure", "memcg_oom_logged",
           "memory_exhausted",
           "pids_exhausted", "read_cgroup"]
