"""The agent rule's evidence on the cgroup and kernel-log layouts of hosts other than this one
(design page, "Who caused a failure decides the reward"; "Threat model").

Each test lays out, in a temporary directory, the files a real host shows, and calls the
product's own readers (:mod:`sandbox.workspace.health`) and rule
(:func:`eval.integrity.agent.classify_exec_failure`) on them. The layouts and the file
formats come from:

* cgroup v2 without ``memory.peak`` (it exists from kernel 5.19; Ubuntu 22.04 runs 5.15):
  Documentation/admin-guide/cgroup-v2.rst, "memory.events" (``low high max oom oom_kill``;
  ``oom_group_kill`` from 5.17), "memory.peak", "PID" (``pids.events``);
* cgroup v1: Documentation/admin-guide/cgroup-v1/memory.rst (``memory.failcnt``,
  ``memory.max_usage_in_bytes``, ``memory.oom_control`` with ``oom_kill`` from 4.13) and
  cgroup-v1/pids.rst;
* crun's systemd cgroup driver: the container's processes run in the sub-cgroup
  ``run.oci.systemd.subgroup`` (default ``container`` on cgroup v2) below the
  ``libpod-<id>.scope`` that Podman reports as ``CgroupPath`` (crun.1.md, "systemd
  annotations"; src/libcrun/cgroup-systemd.c ``systemd_finalize``), the scope's limits set
  by systemd (``TasksMax``, ``MemoryMax``);
* the kernel change "cgroup/pids: Separate semantics of pids.events related to pids.max"
  (Linux 6.12; kernel/cgroup/pids.c): before it, ``pids.events`` ``max`` counted a refused
  fork in the cgroup of the *forking* process, not in the one whose limit refused it;
* the kernel's OOM report in /dev/kmsg (Documentation/ABI/testing/dev-kmsg;
  mm/oom_kill.c ``dump_oom_summary``: ``oom-kill:constraint=...,oom_memcg=<path>,...``,
  the path printed from the hierarchy's root by ``pr_cont_cgroup_path``, so a node that is
  itself an LXC container prints ``/lxc.payload.<name>/...`` before the path its Podman
  sees; kernels before 4.19: ``Task in <cgroup> killed as a result of limit of <cgroup>``);
* overlay opacity: Documentation/filesystems/overlayfs.rst ("Whiteouts and opaque
  directories": ``trusted.overlay.opaque``, or ``user.overlay.opaque`` on a ``userxattr``
  mount) and fuse-overlayfs (fuse-overlayfs.h: it also reads ``user.overlay.opaque`` and
  ``user.fuseoverlayfs.opaque``), both mounted for real here.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from eval.integrity.agent import classify_exec_failure, memory_exhausted, pids_exhausted
from sandbox.workspace.health import memcg_oom_logged, memcg_oom_record, read_cgroup
from sandbox.workspace.imagegit import opacity_leak, plan_upper, write_upper

CID = "3f1c9a7e5b2d4c6f8a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f"
MIB = 2**20


def _lay(d: Path, files: dict[str, str]) -> None:
    """Write cgroup interface files ``files`` (name -> content) into the cgroup dir ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text if text.endswith("\n") else text + "\n")


def _v2_515(*, current: int, limit: str, events: dict[str, int], pids: tuple[int, str, int],
            procs: str = "") -> dict[str, str]:
    """The files of one cgroup v2 cgroup on kernel 5.15 (memory and pids enabled): no
    ``memory.peak``, ``memory.events`` = ``low high max oom oom_kill``."""
    ev = {"low": 0, "high": 0, "max": 0, "oom": 0, "oom_kill": 0, **events}
    return {"cgroup.controllers": "memory pids", "cgroup.procs": procs,
            "cgroup.type": "domain", "memory.current": str(current), "memory.max": limit,
            "memory.high": "max", "memory.low": "0", "memory.min": "0",
            "memory.swap.current": "0", "memory.swap.max": "0",
            "memory.events": "".join(f"{k} {v}\n" for k, v in ev.items()),
            "memory.events.local": "".join(f"{k} {v}\n" for k, v in ev.items()),
            "pids.current": str(pids[0]), "pids.max": pids[1],
            "pids.events": f"max {pids[2]}\n"}


def _running(now, last) -> dict:
    return {"service_ok": True, "container": "running", "cgroup": now, "cgroup_last": last}


# -- cgroup v2 before kernel 5.19: no memory.peak ---------------------------------------------
def test_memory_blowup_on_v2_without_memory_peak_is_the_agents(tmp_path):
    """Ubuntu 22.04 (5.15), Podman's cgroupfs manager: ``/libpod_parent/libpod-<id>``. The
    agent fills its 512 MiB limit; reclaim fails (``max`` 57 times), the cgroup goes OOM
    (``oom`` 1) and the killer kills its process (``oom_kill`` 1); afterwards the usage is
    back at 12 MiB and there is no peak file to say it ever was at the limit."""
    path = f"/libpod_parent/libpod-{CID}"
    d = tmp_path / path.lstrip("/")
    _lay(d, _v2_515(current=3 * MIB, limit=str(512 * MIB), events={}, pids=(4, "1024", 0)))
    before = read_cgroup(path, root=tmp_path)
    assert not (d / "memory.peak").exists() and before["memory_peak_bytes"] is None
    _lay(d, _v2_515(current=12 * MIB, limit=str(512 * MIB),
                    events={"max": 57, "oom": 1, "oom_kill": 1}, pids=(4, "1024", 0)))
    now = read_cgroup(path, root=tmp_path)
    assert (now["memory_max_events"], now["memory_oom_events"], now["oom_kill"]) == (57, 1, 1)
    assert memory_exhausted(now, before)
    assert classify_exec_failure(_running(now, before)) == "agent_oom"
    # stopped by the OOM killer during the call: judged on the sample after it
    assert classify_exec_failure({"service_ok": True, "container": "exited", "cgroup": None,
                                  "cgroup_last": now, "cgroup_prev": before}) == "agent_oom"
    # an OOM kill the agent already recovered from (the last sample saw it) says nothing now
    assert classify_exec_failure(_running(now, now)) is None


def test_host_wide_oom_kill_below_the_limit_stays_infrastructure_on_v2_5_15(tmp_path):
    """The host ran out of memory and killed the container's process (``oom_kill`` counts
    any OOM killer) while the container was far below its limit: no ``max``, no ``oom``."""
    path = f"/libpod_parent/libpod-{CID}"
    d = tmp_path / path.lstrip("/")
    _lay(d, _v2_515(current=3 * MIB, limit=str(512 * MIB), events={}, pids=(4, "1024", 0)))
    before = read_cgroup(path, root=tmp_path)
    _lay(d, _v2_515(current=40 * MIB, limit=str(512 * MIB), events={"oom_kill": 1},
                    pids=(4, "1024", 0)))
    now = read_cgroup(path, root=tmp_path)
    assert not memory_exhausted(now, before)
    assert classify_exec_failure(_running(now, before)) is None


# -- cgroup v1 ------------------------------------------------------------------------------
def _v1(root: Path, path: str, *, usage: int, max_usage: int, limit: int, failcnt: int,
        oom_kill: int, pids: tuple[int, str, int]) -> None:
    rel = path.lstrip("/")
    _lay(root / "memory" / rel, {
        "cgroup.procs": "", "memory.usage_in_bytes": str(usage),
        "memory.max_usage_in_bytes": str(max_usage), "memory.limit_in_bytes": str(limit),
        "memory.failcnt": str(failcnt), "memory.memsw.limit_in_bytes": str(limit),
        "memory.oom_control": f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kill}\n"})
    _lay(root / "pids" / rel, {"cgroup.procs": "", "pids.current": str(pids[0]),
                               "pids.max": pids[1], "pids.events": f"max {pids[2]}\n"})
    for ctl in ("cpu", "cpuacct", "blkio", "devices", "freezer"):
        _lay(root / ctl / rel, {"cgroup.procs": "", "tasks": ""})


def test_v1_memory_and_pids_at_their_limits_are_the_agents(tmp_path):
    """cgroup v1 (this machine's kind, RHEL 7/8, Debian before 11): one directory per
    controller. The memory limit's ``failcnt`` and ``oom_control`` ``oom_kill`` say the
    cgroup hit its limit and the killer acted in it; ``pids.events`` ``max`` the fork."""
    path = f"/libpod_parent/libpod-{CID}"
    _v1(tmp_path, path, usage=2 * MIB, max_usage=2 * MIB, limit=256 * MIB, failcnt=0,
        oom_kill=0, pids=(3, "1024", 0))
    before = read_cgroup(path, root=tmp_path)
    _v1(tmp_path, path, usage=5 * MIB, max_usage=256 * MIB - 8192, limit=256 * MIB,
        failcnt=9120, oom_kill=1, pids=(3, "1024", 0))
    now = read_cgroup(path, root=tmp_path)
    assert (now["memory_max_events"], now["oom_kill"], now["memory_oom_events"]) == (9120, 1,
                                                                                     None)
    assert classify_exec_failure(_running(now, before)) == "agent_oom"
    _v1(tmp_path, path, usage=5 * MIB, max_usage=6 * MIB, limit=256 * MIB, failcnt=0,
        oom_kill=0, pids=(1022, "1024", 311))
    assert classify_exec_failure(_running(read_cgroup(path, root=tmp_path),
                                          before)) == "agent_pids"
    # host-wide OOM on v1: a kill, the limit never hit
    _v1(tmp_path, path, usage=5 * MIB, max_usage=9 * MIB, limit=256 * MIB, failcnt=0,
        oom_kill=1, pids=(3, "1024", 0))
    assert classify_exec_failure(_running(read_cgroup(path, root=tmp_path), before)) is None


# -- crun + systemd: the processes live in <scope>/container ----------------------------------
def _crun_systemd(root: Path, *, scope_events: int, child_events: int, pids_now: int,
                  mem: dict[str, int] | None = None, child_mem: dict[str, int] | None = None):
    """``/machine.slice/libpod-<id>.scope`` (limits from systemd: ``TasksMax=1024``,
    ``MemoryMax=512M``) with crun's ``container`` child holding every process; v2, 5.15,
    ``memory_localevents`` (each cgroup counts its own events)."""
    scope = root / "machine.slice" / f"libpod-{CID}.scope"
    _lay(scope, {**_v2_515(current=20 * MIB, limit=str(512 * MIB), events=mem or {},
                           pids=(pids_now, "1024", scope_events)),
                 "cgroup.subtree_control": "memory pids"})
    _lay(scope / "container", _v2_515(current=20 * MIB, limit="max", events=child_mem or {},
                                      pids=(pids_now, "max", child_events), procs="1\n7\n"))
    return f"/machine.slice/libpod-{CID}.scope"


def test_fork_flood_counted_in_crun_container_child_is_the_agents(tmp_path):
    """Before the pids.events change the refused forks are counted in ``container`` (the
    forking processes' cgroup) while the limit that refused them is the scope's: the
    scope's own ``pids.events`` says ``max 0``."""
    path = _crun_systemd(tmp_path, scope_events=0, child_events=0, pids_now=5)
    before = read_cgroup(path, root=tmp_path)
    path = _crun_systemd(tmp_path, scope_events=0, child_events=4876, pids_now=1024)
    now = read_cgroup(path, root=tmp_path)
    assert (now["pids_current"], now["pids_max"], now["pids_max_events"]) == (1024, 1024, 4876)
    assert now["cgroups_read"] == 2 and pids_exhausted(now)
    assert classify_exec_failure(_running(now, before)) == "agent_pids"


def test_fork_flood_after_the_pids_events_change_is_the_agents_too(tmp_path):
    """From Linux 6.12 ``pids.events`` is hierarchical and counts at the limiting cgroup
    (the scope), its descendants' files stay 0."""
    path = _crun_systemd(tmp_path, scope_events=4876, child_events=0, pids_now=1024)
    assert classify_exec_failure(_running(read_cgroup(path, root=tmp_path), None)) == \
        "agent_pids"


def test_memory_blowup_in_crun_container_child_is_the_agents(tmp_path):
    """Local events: the scope (whose ``MemoryMax`` was hit) counts ``max`` / ``oom``, the
    child (where the killed process lived) ``oom_kill``; no ``memory.peak`` (5.15)."""
    path = _crun_systemd(tmp_path, scope_events=0, child_events=0, pids_now=5)
    before = read_cgroup(path, root=tmp_path)
    path = _crun_systemd(tmp_path, scope_events=0, child_events=0, pids_now=5,
                         mem={"max": 311, "oom": 2}, child_mem={"oom_kill": 2})
    now = read_cgroup(path, root=tmp_path)
    assert (now["memory_limit_bytes"], now["oom_kill"], now["memory_oom_events"]) == \
        (512 * MIB, 2, 2)
    assert classify_exec_failure(_running(now, before)) == "agent_oom"


# -- the kernel's OOM record from another cgroup namespace ------------------------------------
def _kmsg(tmp_path: Path, oom_memcg: str, task_memcg: str, name: str = "kmsg") -> str:
    """A /dev/kmsg excerpt of one memcg OOM kill, as the kernel writes it (prio,seq,usec,-;)."""
    lines = [
        "4,8812,91234567,-;python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, "
        "oom_score_adj=0",
        "6,8813,91234601,-;memory: usage 524288kB, limit 524288kB, failcnt 311",
        "6,8814,91234790,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),"
        f"cpuset=libpod-{CID}.scope,mems_allowed=0,oom_memcg={oom_memcg},"
        f"task_memcg={task_memcg},task=python3,pid=48213,uid=0",
        "3,8815,91234802,-;Memory cgroup out of memory: Killed process 48213 (python3) "
        "total-vm:560132kB, anon-rss:523904kB, file-rss:4kB, shmem-rss:0kB, UID:0 "
        "pgtables:1080kB oom_score_adj:0",
    ]
    path = tmp_path / name
    path.write_text("".join(x + "\n" for x in lines))
    return str(path)


SCOPE = f"/machine.slice/libpod-{CID}.scope"


@pytest.mark.parametrize("oom_memcg", [
    f"/lxc.payload.n1{SCOPE}",  # an LXC node: the host's path of the node's cgroup first
    f"/lxc.payload.n1{SCOPE}/container",  # crun wrote the limit into its child as well
    f"/kubepods.slice/kubepods-burstable.slice/kubepods-pod1.slice/cri-containerd-9a.scope{SCOPE}",
    SCOPE,  # no namespace: the path as reported
])
def test_oom_record_from_another_cgroup_namespace_names_this_container(tmp_path, oom_memcg):
    """Podman inside the node reports ``CgroupPath`` = the scope's path in the node's own
    cgroup namespace; the kernel prints it from the host's root."""
    log = _kmsg(tmp_path, oom_memcg, f"{oom_memcg.removesuffix('/container')}/container")
    rec, unreadable = memcg_oom_record(SCOPE, log)
    assert unreadable is None and rec is not None and f"oom_memcg={oom_memcg}," in rec
    assert memcg_oom_logged(SCOPE, log) == rec
    assert classify_exec_failure({"service_ok": True, "container": "exited", "cgroup": None,
                                  "cgroup_last": None, "memcg_oom": rec}) == "agent_oom"


@pytest.mark.parametrize("oom_memcg", [
    "/lxc.payload.n1/machine.slice",  # a limit above the container's own: not its limit
    f"/lxc.payload.n1/machine.slice/libpod-{CID[:-1]}.scope",  # another container
    f"/lxc.payload.n1/machine.slice/libpod-{CID}.scope-x",  # a name that only starts alike
])
def test_oom_record_of_another_cgroup_is_not_this_containers(tmp_path, oom_memcg):
    log = _kmsg(tmp_path, oom_memcg, f"/lxc.payload.n1{SCOPE}/container")
    assert memcg_oom_record(SCOPE, log) == (None, None)


def test_oom_record_before_kernel_4_19_names_the_limit_too(tmp_path):
    """Kernels before 4.19 (RHEL 7's 3.10, cgroup v1) print ``Task in <task cgroup> killed
    as a result of limit of <limit cgroup>`` instead of the ``oom-kill:`` summary."""
    path = f"/libpod_parent/libpod-{CID}"
    log = tmp_path / "kmsg"
    log.write_text(f"6,311,5512,-;Task in /lxc/n1{path} killed as a result of limit of "
                   f"/lxc/n1{path}\n6,312,5513,-;memory: usage 262144kB, limit 262144kB, "
                   "failcnt 88\n")
    assert memcg_oom_logged(path, str(log)).startswith("Task in /lxc/n1")
    assert memcg_oom_logged(f"/libpod_parent/libpod-{CID[:-1]}", str(log)) is None


def test_unreadable_kernel_log_is_a_fact_not_a_miss(tmp_path):
    """Inside a container /dev/kmsg is often absent or denied (CAP_SYSLOG): the reader says
    so instead of reporting "no OOM record"."""
    rec, unreadable = memcg_oom_record(SCOPE, str(tmp_path / "kmsg"))
    assert rec is None and unreadable.startswith(f"{tmp_path / 'kmsg'}: FileNotFoundError")
    denied = tmp_path / "denied"
    denied.mkdir()  # reading a directory fails (EISDIR) after it opened: also unreadable
    rec, unreadable = memcg_oom_record(SCOPE, str(denied))
    assert rec is None and "IsADirectoryError" in unreadable
    assert memcg_oom_record(None, str(denied)) == (None, None)


# -- overlay opacity, read on the merged view after the remount -------------------------------
def _overlay(tmp_path: Path, kind: str):
    """A lower layer holding an image repository's history (``packed-refs``, a tag, a pack,
    a nested clone's ``.git``), an empty upper layer, and mount / unmount functions for
    ``kind``: ``overlay`` (the kernel's, as Podman's native driver mounts it) or
    ``fuse-overlayfs`` (Podman's ``mount_program``; rootless and nested nodes)."""
    low, up, work, merged = (tmp_path / n for n in ("lower", "upper", "work", "merged"))
    for d in (up, work, merged):
        d.mkdir()
    repo = low / "testbed"
    for rel, text in {".git/HEAD": "ref: refs/heads/main\n", ".git/packed-refs": "abc fix\n",
                      ".git/refs/tags/fixed": "abc\n", ".git/objects/pack/p.pack": "PACK",
                      ".git/refs/heads/main": "abc\n", "sub/.git/HEAD": "x\n",
                      "calc.py": "def add(a, b):\n    return a - b\n"}.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    opts = f"lowerdir={low},upperdir={up},workdir={work}"
    cmd = (["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)] if kind == "overlay"
           else ["fuse-overlayfs", "-o", opts, str(merged)])

    def mount():
        subprocess.run(cmd, check=True, capture_output=True)

    def umount():
        subprocess.run(["umount", str(merged)], check=True, capture_output=True)
    return up, merged, mount, umount


def _agent_git(git: Path, owner) -> None:
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "refs" / "heads" / "main").write_text("s0\n")


@pytest.mark.parametrize("kind", ["overlay", "fuse-overlayfs"])
def test_opaque_git_hides_the_images_history_on_the_merged_view(tmp_path, kind):
    """The rollout's upper layer is edited unmounted (an opaque ``.git``, a whiteout for the
    nested clone), mounted again, and the merged view shows only what was written."""
    up, merged, mount, umount = _overlay(tmp_path, kind)
    mount()
    try:
        plan = plan_upper(merged, "/testbed", ["sub/.git"])
        assert plan.fstype == ("overlay" if kind == "overlay" else "fuse.fuse-overlayfs")
        assert opacity_leak(merged / "testbed", up / "testbed", ["sub/.git"]) == "sub/.git"
    finally:
        umount()
    write_upper(up, "/testbed", plan, ["sub/.git"], _agent_git)
    mount()
    try:
        assert opacity_leak(merged / "testbed", up / "testbed", ["sub/.git"]) is None
        assert sorted(p.name for p in (merged / "testbed" / ".git").rglob("*")) == \
            ["HEAD", "heads", "main", "refs"]
    finally:
        umount()


def test_an_opaque_mark_the_kernel_ignores_is_caught_on_the_merged_view(tmp_path):
    """The kernel's overlay reads one xattr namespace: a ``user.`` mark on a mount without
    ``userxattr`` hides nothing, and the check on the merged view says where it shows."""
    up, merged, mount, umount = _overlay(tmp_path, "overlay")
    mount()
    try:
        plan = plan_upper(merged, "/testbed", [])
    finally:
        umount()
    wrong = dataclasses.replace(plan, xattr="user", fstype="overlay")
    write_upper(up, "/testbed", wrong, [], _agent_git)
    mount()
    try:
        assert opacity_leak(merged / "testbed", up / "testbed") in (
            ".git/packed-refs", ".git/objects", ".git/refs/tags")
    finally:
        umount()
