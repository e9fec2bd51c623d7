"""Live probes of the agent-side rules: what a policy can do to its own container, done in a
real rollout workspace and judged as the trainer judges it (design page, "Threat model").

Each probe opens a workspace the way training does
(:meth:`sandbox.workspace.rollout.WorkspaceSite.open_here`: the same tree, container, limits
and disk budget), runs the attack through :meth:`~sandbox.workspace.rollout.RolloutWorkspace.run`,
and on the exec failure that follows gathers the session's evidence
(:meth:`~sandbox.workspace.rollout.RolloutWorkspace.diagnose`) and applies
:func:`eval.integrity.agent.classify_exec_failure` (through :mod:`eval.doctor.verdicts`). A probe *holds* when the class is the one
the rule promises (the policy's own failure, never excluded as infrastructure):

* ``pids``: a fork flood fills the pids limit of a running container → ``agent_pids``;
* ``fork_bomb``: a classic shell fork bomb bounded by ``timeout``, then the next call, a few
  times: every episode it ends is ``agent_pids`` (or the container survived), never
  infrastructure; ``exhaustion_evidence``: the counters that only grow this host's kernel
  keeps for a container (:data:`sandbox.workspace.health.EXHAUSTION_COUNTERS`); the pids
  rule needs ``pids.events`` and the memory rule ``oom_kill``, so a host without them cannot
  tell an agent's exhaustion from the infrastructure's;
* ``memory_running``: ``/tmp`` (memory-backed) filled to just under the memory limit, the
  next exec is OOM-killed while the container runs → ``agent_oom``; ``oom_record``: the
  kernel log holds the ``CONSTRAINT_MEMCG`` record of that container's cgroup, and it alone
  decides ``agent_oom``;
* ``memory_stopped``: ``/tmp`` filled past the limit between two calls, the OOM killer
  stops the container → ``agent_oom``;
* ``disk``: the tree grows past the rollout's disk budget → over budget, files removed
  (``agent_disk_budget``);
* ``history``: an image whose git history holds a marker: nothing the agent runs in its
  workspace prints it, while a plain container of the image does; ``overlay_opacity``: the
  image's own commits are not reachable through the workspace's ``.git``.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from eval.doctor.verdicts import disk_class, exec_class
from sandbox.doctor.facts import processes_cgroup
from sandbox.images import default_image
from sandbox.runtimes.podman_store import podman_env
from sandbox.snapshots.gitsafe import git_env
from sandbox.trials.trial import Limits
from sandbox.workspace.health import (
    EXHAUSTION_COUNTERS,
    exhaustion_evidence,
    memcg_oom_logged,
    read_cgroup,
)
from sandbox.workspace.rollout import WorkspaceSite
from sandbox.workspace.session import SandboxExecError

PROBE_LIMITS = Limits(memory="96m", pids=64, cpus=1.0)
"""Limits of the probes' containers: small, so that each limit is reached in a second."""
PROBE_BUDGET_BYTES = 1 * 2**20
"""Disk budget of a probe rollout (bytes); the disk probe writes twice as much."""
MARK = "ECREDIT-DOCTOR-" + "MARK"
"""The marker the history image holds in a commit its tree no longer has."""
# a fork flood of background sleeps from a process in its own session that takes every pid
# freed, so the limit stays full once the call returns
FLOOD = ("python3 -c \"import os, time\nos.setsid()\nn = 0\nwhile n < 5000:\n try:\n"
         "  if os.fork() == 0:\n   os.execvp('sleep', ['sleep', '1000'])\n  n += 1\n"
         " except OSError:\n  time.sleep(0.001)\" >/dev/null 2>&1 &\n"
         "g=/sys/fs/cgroup/pids; read max < $g/pids.max; read cur < $g/pids.current\n"
         "while [ $cur -lt $max ]; do read cur < $g/pids.current; done; echo full $cur")
FORK_BOMB = "timeout 5 bash -c ':(){ :|:& };:'; echo bomb-done"
"""The fork bomb of the ``fork_bomb`` probe (bounded: its processes outlive the call only
until their forks fail)."""
HISTORY_SH = f"""set -e
export GIT_AUTHOR_NAME=d GIT_AUTHOR_EMAIL=d@e GIT_COMMITTER_NAME=d GIT_COMMITTER_EMAIL=d@e
export GIT_CONFIG_NOSYSTEM=1 HOME=/tmp
mkdir -p /testbed && cd /testbed && git init -q -b main
echo base > a.txt && git add -A && git commit -qm base
echo {MARK} > a.txt && git commit -qam fix && git tag -a leak -m {MARK}
git branch fix && git revert --no-edit HEAD >/dev/null
"""
HUNT = ("git log --all -p; git reflog --all; git show-ref; git tag -l -n;"
        " git cat-file --batch-all-objects --batch; cat .git/packed-refs;"
        f" grep -rao {MARK[:8]}.{MARK[9:]} / --exclude-dir=proc --exclude-dir=sys"
        " --exclude-dir=dev --exclude-dir=usr; echo hunted")


@dataclass
class ProbeResult:
    """One probe's verdict: ``name``, ``held`` and, when not held, ``reason``; ``detail``
    holds the evidence and classes it was judged on (JSON-ready)."""

    name: str
    held: bool
    reason: str = ""
    detail: dict = field(default_factory=dict)

    def line(self) -> str:
        """``<name>: held`` or ``<name>: FAILED <reason>``."""
        return f"{self.name}: held" if self.held else f"{self.name}: FAILED {self.reason}"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=git_env()).stdout.strip()


def probe_task(root: Path) -> SimpleNamespace:
    """A one-file ``repo_dir`` task in the sandbox image (what the agent probes open)."""
    repo = root / "origin"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("base\n")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=d", "-c", "user.email=d@e", "commit", "-qm", "base")
    return SimpleNamespace(instance_id="doctor-probe", repo_dir=str(repo),
                           base_commit=_git(repo, "rev-parse", "HEAD"), image=default_image(),
                           workdir="/testbed", checkout_base=False)


def _break_and_judge(site, task, attack: str) -> tuple[dict | None, str | None, str]:
    """Open a workspace, run ``attack``, then ``echo``: the evidence of the failed exec
    (``cgroup_path`` and, for a running container, the kernel's ``memcg_oom`` record added),
    its class and the output of the attack (evidence None when the exec did not fail)."""
    ws = site.open_here(task)
    try:
        if ws.setup_error:
            return None, None, f"the workspace did not open: {ws.setup_error}"
        out = ws.run(attack, timeout_s=60, max_output_chars=2000)
        try:
            ws.run("echo alive", timeout_s=30, max_output_chars=200)
        except SandboxExecError as exc:
            ev = ws.diagnose() or {}
            cls = exec_class(ev)
            path = ws.session.cgroup_path
            ev = {**ev, "error": str(exc)[:300], "cgroup_path": path}
            if "memcg_oom" not in ev:
                ev["memcg_oom"] = memcg_oom_logged(path)
            return ev, cls, out
        return None, None, out
    finally:
        ws.release()


def probe_pids(site, task) -> ProbeResult:
    """The fork flood (module docstring)."""
    ws = site.open_here(task)
    try:
        if ws.setup_error:
            return ProbeResult("pids", False, f"the workspace did not open: {ws.setup_error}")
        state = ws.session.container.attrs.get("State") or {}
        where = processes_cgroup(state.get("Pid"), ws.session.cgroup_path)
        out = ws.run(FLOOD, timeout_s=60, max_output_chars=2000)
        try:
            ws.run("echo alive", timeout_s=30, max_output_chars=200)
            return ProbeResult("pids", False, "the next exec started after the flood "
                               f"({out.strip()[-80:]!r}): the pids limit did not hold",
                               {"processes_cgroup": where})
        except SandboxExecError:
            ev = ws.diagnose() or {}
    finally:
        ws.release()
    cls = exec_class(ev)
    detail = {"class": cls, "evidence": ev, "processes_cgroup": where}
    if cls != "agent_pids":
        return ProbeResult("pids", False, f"classified {cls or 'infrastructure'} (pids "
                           f"counters {(ev.get('cgroup') or {})}, processes in {where})", detail)
    return ProbeResult("pids", True, detail=detail)


def probe_fork_bomb(site, task, attempts: int = 3) -> list[ProbeResult]:
    """The bounded fork bomb, then ``echo``, ``attempts`` times (module docstring): the
    ``fork_bomb`` probe holds when no episode it ended was charged to the infrastructure and
    at least one shows the limit hit; ``exhaustion_evidence`` when the container's cgroup has
    ``pids.events`` and ``oom_kill`` counters (detail: every counter, True when kept)."""
    runs, have = [], None
    for _ in range(attempts):
        ws = site.open_here(task)
        try:
            if ws.setup_error:
                fail = f"the workspace did not open: {ws.setup_error}"
                return [ProbeResult("fork_bomb", False, fail),
                        ProbeResult("exhaustion_evidence", False, fail)]
            if have is None:
                have = exhaustion_evidence(read_cgroup(ws.session.cgroup_path))
            run = {"class": None, "failed": False}
            try:
                ws.run(FORK_BOMB, timeout_s=60, max_output_chars=200)
                ws.run("echo alive", timeout_s=30, max_output_chars=200)
            except SandboxExecError as exc:
                ev = ws.diagnose() or {}
                run = {"class": exec_class(ev), "failed": True, "error": str(exc)[:200],
                       "evidence": ev}
            run["counters"] = read_cgroup(ws.session.cgroup_path)
            runs.append(run)
        finally:
            ws.release()
    return fork_bomb_verdicts(runs, have)


def fork_bomb_verdicts(runs: list[dict], have: dict | None) -> list[ProbeResult]:
    """The ``fork_bomb`` and ``exhaustion_evidence`` verdicts (pure) of the bomb's ``runs``
    (``{"failed": bool, "class": str | None, "evidence": dict, "counters": dict | None}``
    each) and of ``have`` (:func:`sandbox.workspace.health.exhaustion_evidence` of the probe
    container; None: unread)."""
    masked = [r for r in runs if r["failed"] and r["class"] != "agent_pids"]
    hit = [r for r in runs if r["failed"] or ((r["counters"] or {}).get("pids_max_events") or 0)]
    if masked:
        bomb = ProbeResult("fork_bomb", False, f"{len(masked)} of {len(runs)} fork bombs "
                           f"classified {masked[0]['class'] or 'infrastructure'} (counters "
                           f"{(masked[0]['evidence'].get('cgroup') or {})})", {"runs": runs})
    elif not hit:
        bomb = ProbeResult("fork_bomb", False, f"no fork bomb of {len(runs)} hit the pids "
                           "limit (no refused fork counted)", {"runs": runs})
    else:
        bomb = ProbeResult("fork_bomb", True, detail={"runs": runs})
    missing = [EXHAUSTION_COUNTERS[k] for k in ("pids_max_events", "oom_kill")
               if not (have or {}).get(k)]
    if missing:
        ev = ProbeResult("exhaustion_evidence", False, "this host keeps no "
                         + " / ".join(missing) + " counter for a container's cgroup: an "
                         "exhaustion the agent causes cannot be told from the "
                         "infrastructure's",
                         {"counters": have})
    else:
        ev = ProbeResult("exhaustion_evidence", True, detail={"counters": have})
    return [bomb, ev]


def probe_memory_running(site, task, attempts: int = 3) -> list[ProbeResult]:
    """/tmp filled to 2 MiB under the limit: the next exec is OOM-killed while the container
    runs (``memory_running``); the kernel log names the container's cgroup in a
    ``CONSTRAINT_MEMCG`` record, and that record alone (the counters of a stopped container
    are gone) decides the class (``oom_record``). The OOM killer picks its victim itself: a
    container it stopped instead is tried afresh, up to ``attempts`` times."""
    fill = _limit_bytes(site.limits.memory) - 2 * 2**20
    ev = cls = None
    out = ""
    for _ in range(attempts):
        ev, cls, out = _break_and_judge(site, task, f"head -c {fill} /dev/zero > /tmp/fill")
        if ev is not None and ev.get("container") == "running":
            break
    detail = {"class": cls, "evidence": ev, "attack_output": out[-200:]}
    if ev is None:
        fail = "the next exec started with the memory limit full: no failure to judge"
        return [ProbeResult("memory_running", False, fail, detail),
                ProbeResult("oom_record", False, fail)]
    if ev.get("container") != "running":
        first = ProbeResult("memory_running", False, "the container was stopped "
                            f"({ev.get('container')}) in every attempt", detail)
    elif cls != "agent_oom":
        first = ProbeResult("memory_running", False, f"classified {cls or 'infrastructure'} "
                            f"(memory counters {ev.get('cgroup')})", detail)
    else:
        first = ProbeResult("memory_running", True, detail=detail)
    record = ev.get("memcg_oom")
    alone = {**ev, "container": "exited", "cgroup": None, "cgroup_last": None,
             "cgroup_prev": None}
    alone_cls = exec_class(alone)
    rdetail = {"record": record, "class_on_record_alone": alone_cls,
               "cgroup_path": ev.get("cgroup_path")}
    if not record:
        second = ProbeResult("oom_record", False, "the kernel log (/dev/kmsg) holds no "
                             "CONSTRAINT_MEMCG record naming the container's cgroup "
                             f"{ev.get('cgroup_path')}", rdetail)
    elif alone_cls != "agent_oom":
        second = ProbeResult("oom_record", False, f"the record alone classified {alone_cls}",
                             rdetail)
    else:
        second = ProbeResult("oom_record", True, detail=rdetail)
    return [first, second]


def probe_memory_stopped(site, task, attempts: int = 3, wait_s: float = 20.0) -> ProbeResult:
    """/tmp filled past the limit by three background ``yes`` writers that start once the
    call has returned: the OOM killer then picks the largest process of the container, its
    own ``sleep`` (coreutils ``yes`` maps fewer pages), which stops it. The next exec fails
    and is judged as a stopped container is: on the last call's sample, else the kernel's
    ``CONSTRAINT_MEMCG`` record of its cgroup. A container the OOM killer left running is
    tried afresh, up to ``attempts`` times."""
    attack = ("for i in 1 2 3; do setsid bash -c 'sleep 2; exec yes' > /tmp/fill$i "
              "2>/dev/null & done; echo started")
    ev = cls = None
    tries = 0
    while tries < attempts:
        tries += 1
        ws = site.open_here(task)
        try:
            if ws.setup_error:
                return ProbeResult("memory_stopped", False,
                                   f"the workspace did not open: {ws.setup_error}")
            ws.run(attack, timeout_s=60, max_output_chars=200)
            _wait_stopped(ws.session.container, wait_s)
            try:
                ws.run("echo alive", timeout_s=30, max_output_chars=200)
                ev = None
            except SandboxExecError as exc:
                ev = {**(ws.diagnose() or {}), "error": str(exc)[:300],
                      "cgroup_path": ws.session.cgroup_path}
                cls = exec_class(ev)
        finally:
            ws.release()
        if ev is not None and ev.get("container") not in ("running", None, "missing"):
            break
    detail = {"class": cls, "evidence": ev, "attempts": tries}
    if ev is None:
        return ProbeResult("memory_stopped", False, "the next exec started after /tmp "
                           "outgrew the memory limit", detail)
    if ev.get("container") in ("running", None, "missing"):
        return ProbeResult("memory_stopped", False, f"the container is {ev.get('container')}, "
                           f"not stopped by the OOM killer, in {tries} attempts", detail)
    if cls != "agent_oom":
        return ProbeResult("memory_stopped", False, f"classified {cls or 'infrastructure'} "
                           f"(last sample {ev.get('cgroup_last')}, kernel record "
                           f"{ev.get('memcg_oom')!r})", detail)
    return ProbeResult("memory_stopped", True, detail=detail)


def _wait_stopped(container, wait_s: float) -> None:
    """Wait up to ``wait_s`` seconds for ``container`` (podman-py) to leave ``running``."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            container.reload()
            if container.status != "running":
                return
        except Exception:  # noqa: BLE001 - gone: the next exec says so
            return
        time.sleep(0.2)


def probe_disk(site, task) -> ProbeResult:
    """The tree grows past the disk budget: the measurement after the call says so and the
    rollout's files are gone (``agent_disk_budget``, always the policy's)."""
    ws = site.open_here(task)
    try:
        if ws.setup_error:
            return ProbeResult("disk", False, f"the workspace did not open: {ws.setup_error}")
        workdir = ws.workdir
        ws.run(f"head -c {2 * site.tree_budget_bytes} /dev/zero > big.bin", timeout_s=60,
               max_output_chars=200)
        after = ws.after_call()
    finally:
        ws.release()
    if after.over_budget is None:
        return ProbeResult("disk", False, "a tree grown by twice its budget was not over "
                           "budget", {"snapshot_error": after.snapshot_error})
    detail, ev = after.over_budget
    ev = {**ev, "failure_class": disk_class()}
    if ev["grown_bytes"] < 2 * site.tree_budget_bytes or Path(workdir).exists():
        return ProbeResult("disk", False, f"measured {ev['grown_bytes']} bytes or the files "
                           "were kept", {"evidence": ev})
    return ProbeResult("disk", True, detail={"evidence": ev, "detail": detail})


def _podman(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True,
                          env=podman_env(), timeout=timeout_s)


def history_image() -> str:
    """The probe's task image (FROM the offline sandbox image; built once per host, the tag
    hashes what it is made of): ``/testbed`` whose ``HEAD~1``, tag ``leak`` and branch
    ``fix`` hold :data:`MARK`, its tree not. Raises: RuntimeError when the build fails."""
    base = default_image()
    tag = hashlib.sha256(f"{base}\n{HISTORY_SH}".encode()).hexdigest()[:12]
    name = f"localhost/ecredit-doctor-history:{tag}"
    if _podman("image", "exists", name).returncode == 0:
        return name
    with tempfile.TemporaryDirectory(prefix="ecredit-doctor-") as ctx:
        (Path(ctx) / "setup.sh").write_text(HISTORY_SH)
        (Path(ctx) / "Containerfile").write_text(
            f"FROM {base}\nCOPY setup.sh /ctx/setup.sh\nRUN bash /ctx/setup.sh && rm -rf /ctx\n"
            "WORKDIR /testbed\n")
        proc = _podman("build", "-q", "--pull=never", "--network=none", "--ulimit",
                       "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "-t", name, ctx)
    if proc.returncode != 0:
        raise RuntimeError(f"podman build of {name} failed: {proc.stderr.strip()[-500:]}")
    return name


def probe_history(site) -> list[ProbeResult]:
    """The history boundary (``history``) and the opaque ``.git`` of the rollout's upper
    layer (``overlay_opacity``), in an image-held task's workspace (module docstring)."""
    try:
        image = history_image()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        fail = f"the probe image could not be built: {exc}"
        return [ProbeResult("history", False, fail), ProbeResult("overlay_opacity", False, fail)]
    plain = _podman("run", "--rm", "--network=none", image, "bash", "-c",
                    "git -C /testbed log --all -p; git -C /testbed rev-parse fix")
    leak = plain.stdout.strip().splitlines()[-1:] or [""]
    task = SimpleNamespace(instance_id="doctor-history", repo_dir=None, image=image,
                           workdir="/testbed", base_commit="", checkout_base=False)
    ws = site.open_here(task)
    try:
        if ws.setup_error:
            fail = f"the workspace did not open: {ws.setup_error}"
            return [ProbeResult("history", False, fail),
                    ProbeResult("overlay_opacity", False, fail)]
        seen = ws.run(HUNT, timeout_s=120, max_output_chars=10**6)
        reach = ws.run(f"git cat-file -t {leak[0]} && echo REACHABLE", timeout_s=60,
                       max_output_chars=2000)
        merged = (Path(ws.workdir) / ".git" / "refs" / "tags" / "leak").exists()
    finally:
        ws.release()
    detail = {"image": image, "image_history_has_marker": MARK in plain.stdout}
    if MARK not in plain.stdout:
        hist = ProbeResult("history", False, "the probe image's own history lacks the marker "
                           f"(podman run: {plain.stderr.strip()[-200:]})", detail)
    elif MARK in seen or "hunted" not in seen:
        hist = ProbeResult("history", False, "the agent read the image's history: "
                           + next((ln for ln in seen.splitlines() if MARK in ln),
                                  seen[-200:]).strip()[:200], detail)
    else:
        hist = ProbeResult("history", True, detail=detail)
    odetail = {"commit": leak[0], "agent_view": reach.strip()[-200:], "merged_tag": merged}
    if "REACHABLE" in reach or merged:
        opa = ProbeResult("overlay_opacity", False, "the image's .git shows through the "
                          f"rollout's .git (commit {leak[0][:12]} or tag leak)", odetail)
    else:
        opa = ProbeResult("overlay_opacity", True, detail=odetail)
    return [hist, opa]


def _limit_bytes(memory: str) -> int:
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    m = memory.strip().lower()
    return int(float(m[:-1]) * units[m[-1]]) if m[-1] in units else int(m)


def agent_probes(runtime, root: Path) -> list[ProbeResult]:
    """Every agent-side probe on ``runtime`` (a Podman runtime), workspaces under ``root``."""
    site = WorkspaceSite(runtime=runtime, workroot=str(root), limits=PROBE_LIMITS,
                         tree_budget_bytes=PROBE_BUDGET_BYTES)
    task = probe_task(root / "task")
    out = []
    for fn in (probe_pids, probe_fork_bomb, probe_memory_running, probe_memory_stopped,
               probe_disk):
        t0 = time.monotonic()
        got = fn(site, task)
        for r in got if isinstance(got, list) else [got]:
            r.detail["seconds"] = round(time.monotonic() - t0, 2)
            out.append(r)
    out.extend(probe_history(site))
    return out


__all__ = ["FLOOD", "FORK_BOMB", "MARK", "PROBE_BUDGET_BYTES", "PROBE_LIMITS", "ProbeResult",
           "agent_probes", "fork_bomb_verdicts", "history_image", "probe_disk",
           "probe_fork_bomb", "probe_history",
           "probe_memory_running", "probe_memory_stopped", "probe_pids", "probe_task"]
