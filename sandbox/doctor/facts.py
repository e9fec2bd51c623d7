"""What this host is, as far as the reward-integrity rules care (design page, "Threat model").

Facts only, read without starting a container: the kernel, the cgroup version and the
manager Podman uses, the OCI runtime, the storage driver and its mount program, whether a
container's memory cgroup has a peak counter, and whether the kernel log is readable. The
live probes (``python -m sandbox doctor``) check on top of these that every rule holds;
:func:`facts_key` names the host's layout, so a node's probe result can be reused while the
layout is the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

from sandbox.runtimes.podman_store import podman_env

CGROUP_ROOT = Path("/sys/fs/cgroup")
KMSG = "/dev/kmsg"
KEY_FIELDS = ("kernel", "cgroup_version", "cgroup_manager", "oci_runtime", "storage_driver",
              "mount_program", "podman_version", "memory_peak_file", "kmsg_readable")
"""The facts that name a host's layout (:func:`facts_key`)."""


def cgroup_version(root: Path = CGROUP_ROOT) -> str:
    """``"v2"`` (unified hierarchy mounted at ``root``), ``"v1"`` (one directory per
    controller; ``"v1+unified"`` when a v2 hierarchy is mounted beside them, the hybrid
    layout) or ``"none"``. Source: cgroups(7), "Cgroups version 1 and version 2"."""
    if (root / "cgroup.controllers").exists():
        return "v2"
    if (root / "memory").is_dir() or (root / "pids").is_dir():
        return "v1+unified" if (root / "unified").is_dir() else "v1"
    return "none"


def memory_peak_file(version: str, root: Path = CGROUP_ROOT) -> str | None:
    """The memory cgroup file that holds a cgroup's peak usage on this host, or None when
    the kernel has none (cgroup v2 before Linux 5.19 has no ``memory.peak``; v1 keeps
    ``memory.max_usage_in_bytes``). Looked up in the cgroup of this process (the root
    cgroup of v2 has no such file)."""
    if version.startswith("v1"):
        name = "memory.max_usage_in_bytes"
        return name if (root / "memory" / name).exists() else None
    if version != "v2":
        return None
    rel = ""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                rel = line[3:].strip().lstrip("/")
    except OSError:
        return None
    d = root / rel
    while True:
        if (d / "memory.peak").exists():
            return "memory.peak"
        if d == root or root not in d.parents:
            return None
        d = d.parent


def kmsg_readable(kmsg: str = KMSG) -> bool:
    """Whether the kernel log can be read here (it needs root on the host; inside a
    container it is often absent or refused): the kernel's OOM records are read from it."""
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        os.read(fd, 8192)
        return True
    except BlockingIOError:  # readable, nothing in the ring buffer
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def podman_facts(timeout_s: float = 60.0) -> dict:
    """``{"cgroup_manager", "oci_runtime", "storage_driver", "mount_program",
    "podman_version"}`` from ``podman info`` under our containers.conf (None each when it
    cannot be read; ``podman_error`` then says why)."""
    out = {"cgroup_manager": None, "oci_runtime": None, "storage_driver": None,
           "mount_program": None, "podman_version": None}
    try:
        proc = subprocess.run(["podman", "info", "--format", "json"], capture_output=True,
                              text=True, timeout=timeout_s, env=podman_env())
        info = json.loads(proc.stdout) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        return {**out, "podman_error": f"{type(exc).__name__}: {exc}"}
    if info is None:
        return {**out, "podman_error": proc.stderr.strip()[-300:] or f"exit {proc.returncode}"}
    host, store = info.get("host") or {}, info.get("store") or {}
    opts = store.get("graphOptions") or {}
    return {"cgroup_manager": host.get("cgroupManager"),
            "oci_runtime": (host.get("ociRuntime") or {}).get("name"),
            "storage_driver": store.get("graphDriverName"),
            "mount_program": (opts.get("overlay.mount_program") or {}).get("Executable")
            or "native",
            "podman_version": (info.get("version") or {}).get("Version")}


def host_facts(root: Path = CGROUP_ROOT, kmsg: str = KMSG) -> dict:
    """The host's facts: ``kernel`` (release), ``cgroup_version``, ``memory_peak_file``,
    ``kmsg_readable`` and :func:`podman_facts`. Never raises."""
    version = cgroup_version(root)
    return {"kernel": os.uname().release, "cgroup_version": version,
            "memory_peak_file": memory_peak_file(version, root),
            "kmsg_readable": kmsg_readable(kmsg), **podman_facts()}


def facts_key(facts: dict) -> str:
    """A short hash (16 hex) of the facts in :data:`KEY_FIELDS`: two hosts (or one host at two
    times) with the same key lay out cgroups, storage and the kernel log alike."""
    blob = json.dumps({k: facts.get(k) for k in KEY_FIELDS}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def processes_cgroup(pid: int | None, cgroup_path: str | None) -> str | None:
    """Where a container's processes are counted, relative to its ``CgroupPath``: ``"."``
    (in that cgroup), ``"child <name>"`` (a sub-cgroup, as crun with the systemd manager
    makes), ``"elsewhere <path>"``, or None when unreadable. ``pid`` is the container's main
    process on the host (``State.Pid``); read from ``/proc/<pid>/cgroup``."""
    if not pid or not cgroup_path:
        return None
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    want = cgroup_path.rstrip("/")
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers not in ("", "pids") and "pids" not in controllers.split(","):
            continue
        path = path.rstrip("/")
        if path == want:
            return "."
        if path.startswith(want + "/"):
            return "child " + path[len(want) + 1:]
        return "elsewhere " + path
    return None


__all__ = ["CGROUP_ROOT", "KEY_FIELDS", "KMSG", "cgroup_version", "facts_key", "host_facts",
           "kmsg_readable", "memory_peak_file", "podman_facts", "processes_cgroup"]
