"""Agent sessions: one long-lived sandbox per rollout for the agent's ``bash`` tool.

The rollout's working tree lives on the host (so snapshots are cheap and the
editor tools are plain file operations) and is bind-mounted at ``/testbed`` in
the rollout's own container. Commands run through ``podman exec`` under
coreutils ``timeout``; output is truncated to a configured length.

Agent containers run an init (Podman's ``--init``, catatonit) as PID 1, so the
processes orphaned when a timed-out command's group is killed are reaped and
never pile up to the pids limit; files are capped at ``max_file_bytes`` by the
``fsize`` ulimit (a write past it fails with ``EFBIG`` / ``SIGXFSZ``). An exec the
runtime could not start (OCI error, pids exhausted, container gone) raises
:class:`SandboxExecError` instead of coming back as the command's output: it is an
infra failure unless the agent caused it: :meth:`PodmanSession.diagnose` gathers the
evidence (service ping, container state, the container's own pids/memory cgroup, read on
the host); who caused it is decided above the sandbox
(:func:`eval.integrity.agent.classify_exec_failure`: ``agent_pids``, ``agent_oom``, or None:
infrastructure). The container's init and main process run as a uid
of their own (:data:`~sandbox.workspace.health.KEEPER_USER`) so the agent's commands (the image's
user, no capabilities) cannot stop the container by signalling them.

:class:`PodmanSession` is isolated (no network, capabilities dropped, limits);
:class:`LocalSession` runs on the host and exists only for the explicitly chosen
local runtime.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

from sandbox.runtimes.local_runtime import LocalRuntime
from sandbox.runtimes.podman_runtime import ROLE_LABEL, RUN_LABEL, PodmanRuntime
from sandbox.trials.trial import Limits
from sandbox.workspace.health import KEEPER_USER, memcg_oom_record, read_cgroup
from sandbox.workspace.imagetree import TREE_ROLE, open_tree

TIMEOUT_EXIT = 124  # coreutils timeout's exit status
DEFAULT_MAX_FILE_BYTES = 100 * 2**20
"""Per-file size limit in agent containers (bytes): GitHub refuses files over 100 MiB, so no
file of a GitHub-hosted SWE-bench repository is larger."""


class SandboxExecError(RuntimeError):
    """The runtime could not start (or finish) an exec in the agent's container.

    Raised when the command's start marker never reached the output (OCI runtime error,
    pids limit exhausted, container gone, API error): the command did not run as the
    agent asked, so its "output" is not a tool result (design page, "Threat model",
    sandbox failure → reward). The message holds the exit status and what the runtime printed.
    """


class ExecOutputGarbled(SandboxExecError):
    """The exec's output came back garbled: no output at all with exit status 0 (the
    wrapper's start marker always prints first), or the raw bytes of the API's multiplexed
    stream frames instead of the demultiplexed text (podman-py, intermittently). Whether
    the command ran is unknown; :meth:`sandbox.workspace.rollout.RolloutWorkspace.run`
    re-runs it once only when the call left the tree unchanged (design page, "Who caused
    a failure decides the reward"); else it ends the episode as infrastructure
    (``exec_garbled``)."""


def is_garbled(exc: BaseException) -> bool:
    """Whether ``exc`` is :class:`ExecOutputGarbled`, also after crossing a Ray node (where a
    type that did not pickle arrives as a RuntimeError naming it)."""
    return isinstance(exc, ExecOutputGarbled) or str(exc).startswith("ExecOutputGarbled:")


def output_garbled(code: int | None, out: bytes, err: bytes) -> bool:
    """True when an exec's demultiplexed ``out``/``err`` (bytes) cannot be its output:
    both empty with exit status 0, or either beginning with a stream frame header (stream
    0/1/2, three zero bytes, a 4-byte length: the Docker/Podman attach framing)."""
    if code == 0 and not out and not err:
        return True
    return any(len(b) >= 8 and b[0] in (0, 1, 2) and b[1:4] == b"\0\0\0" for b in (out, err))


def truncate(text: str, limit: int) -> str:
    """Keep the head and tail of ``text`` within ``limit`` characters, saying what was cut."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n<... {cut} characters truncated ...>\n{text[-tail:]}"


def _format(exit_code: int, output: str, timeout_s: float, max_output_chars: int) -> str:
    output = truncate(output, max_output_chars)
    if exit_code == TIMEOUT_EXIT:
        return f"{output}\n<command timed out after {timeout_s:g} s>"
    if exit_code != 0:
        return f"{output}\n<exit code {exit_code}>"
    return output


class PodmanSession:
    """A container for one rollout, with ``host_dir`` mounted at ``workdir``.

    Beyond the runtime's lock-down (no network, no capabilities,
    no-new-privileges, limits) the image's root filesystem is mounted
    read-only: the only writable places are the rollout's working tree and a
    private tmpfs at ``/tmp`` (``tmp_size``, also ``HOME``). Nothing else of
    the host is visible.

    Args:
        runtime: a :class:`~sandbox.runtimes.podman_runtime.PodmanRuntime` (its endpoints and labels).
        image: fully-qualified image name.
        host_dir: the rollout's working tree on the host.
        limits: memory / pids / CPU limits.
        tmp_size: size of the ``/tmp`` tmpfs (podman size string, e.g. ``"256m"``).
        max_file_bytes: ``fsize`` ulimit of every process in the container (bytes, > 0).
        ro_mounts: ``(host dir, container path)`` pairs bind-mounted **read-only** (the
            base store's objects, which the clone's ``objects/info/alternates`` names, so
            ``git status``/``diff``/``stash`` work and the agent cannot write them).

        login_shell: run commands as ``bash -lc`` (image-held tasks: the login shell
            sources ``/etc/profile``, ``/etc/profile.d`` and ``~/.profile``/``~/.bashrc``,
            so SWE-bench images activate their ``testbed`` environment and ``which
            python`` resolves inside it, as mini-swe-agent's ``exec -w <cwd> <id> bash -lc
            <cmd>``); ``HOME`` is then the image's own (its rc files live there), not
            ``/tmp``. Default ``bash -c`` with ``HOME=/tmp``.

    The environment has ``PYTHONDONTWRITEBYTECODE=1`` (no ``__pycache__`` from test runs).

    Raises: RuntimeError (from podman-py) when the container cannot start; the
    caller counts it as an infra error of that rollout.
    """

    def __init__(self, runtime, image: str, host_dir: str | os.PathLike, *,
                 workdir: str = "/testbed", limits: Limits | None = None,
                 labels: dict[str, str] | None = None, tmp_size: str = "256m",
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                 ro_mounts: list[tuple[str, str]] | tuple = (),
                 login_shell: bool = False) -> None:
        if not (isinstance(max_file_bytes, int) and max_file_bytes > 0):
            raise ValueError(f"max_file_bytes: expected an int > 0, got {max_file_bytes!r}")

        self.runtime = runtime
        self.workdir = workdir
        self.login_shell = login_shell
        self.endpoint = runtime._pick_endpoint()
        self.name = f"ecredit-{runtime.run_id}-agent-{uuid.uuid4().hex[:8]}"
        args = runtime.container_args(image=image, name=self.name,
                                      labels={ROLE_LABEL: "agent", **(labels or {})},
                                      limits=limits or Limits(),
                                      command=["sleep", "infinity"])
        # Read-only image layers: the agent writes only its own working tree (bind mount)
        # and a private tmpfs at /tmp (HOME points there, for tools that want a writable home).
        args["mounts"] = [{"type": "bind", "source": str(Path(host_dir).resolve()),
                           "target": workdir, "read_only": False},
                          {"type": "tmpfs", "source": "tmpfs", "target": "/tmp",
                           "size": tmp_size, "options": ["rw", "nosuid", "nodev", "mode=1777"]}]
        for src, target in ro_mounts:
            args["mounts"].append({"type": "bind", "source": str(Path(src).resolve()),
                                   "target": target, "read_only": True})
        args["read_only"] = True
        # an init as PID 1 reaps what timed-out commands orphan (no zombie pile-up); it and
        # the main process run as KEEPER_USER, so the agent cannot stop the container
        args["init"] = True
        args["user"] = KEEPER_USER
        args["ulimits"] = [*args["ulimits"], {"Name": "fsize", "Soft": max_file_bytes,
                                              "Hard": max_file_bytes}]
        home = {} if login_shell else {"HOME": "/tmp"}
        args["environment"] = {**args["environment"], **home, "TMPDIR": "/tmp",
                               "PYTHONDONTWRITEBYTECODE": "1"}
        args["working_dir"] = workdir
        self._client = runtime.client(self.endpoint, timeout_s=3600)
        self.limits = limits or Limits()
        self.exec_user = _image_user(self._client, image)
        self.container = self._client.containers.create(**args)
        runtime._live[self.name] = self.endpoint
        self.container.start()
        self.container.reload()
        self.cgroup_path = (self.container.attrs.get("State") or {}).get("CgroupPath")
        # counters after each call that ran (the last two): a container the OOM killer
        # stopped has no cgroup left to read (sandbox.workspace.health)
        self._samples = [read_cgroup(self.cgroup_path)]
        self._at_failure: dict | None = None

    def run(self, command: str, *, timeout_s: float = 60.0, max_output_chars: int = 4000) -> str:
        """Run ``command`` with bash in the container; returns the (truncated) output.

        A non-zero exit status or a timeout is appended to the output, as a shell would show it.

        Raises:
            ExecOutputGarbled: the output came back garbled (:func:`output_garbled`).
            SandboxExecError: the exec did not start (no start marker in the output:
                OCI error, pids exhausted, container gone) or the API call failed.
        """
        # The wrapper prints a fresh marker before the agent's command runs: without it
        # the runtime never started the command, whatever the exit status says (an
        # agent's own `exit 125` still comes back as the command's status).
        marker = f"@@ecredit-start-{uuid.uuid4().hex}@@\n".encode()
        script = f"printf '%s\\n' '{marker.decode().strip()}'\nexec 2>&1\n{command}"
        shell = ["bash", "-lc"] if self.login_shell else ["bash", "-c"]
        t0 = time.monotonic()
        try:
            code, (out, err) = self.container.exec_run(
                ["timeout", "-s", "KILL", f"{timeout_s:g}", *shell, script],
                workdir=self.workdir, demux=True, user=self.exec_user)
        except Exception as exc:  # podman-py APIError, connection lost
            self._at_failure = read_cgroup(self.cgroup_path)
            raise SandboxExecError(f"exec failed in {self.name}: {type(exc).__name__}: "
                                   f"{exc}") from exc
        out, err = out or b"", err or b""
        if output_garbled(code, out, err):
            said = (out + err)[:200]
            raise ExecOutputGarbled(f"exec output garbled in {self.name} (exit status {code}, "
                                    f"{len(out)}+{len(err)} bytes): {said!r}")
        if self.login_shell and marker in out:  # what the image's profile printed goes
            out = out[out.index(marker):]
        if not out.startswith(marker):
            # the counters the moment the exec failed, before anything else: a stopped
            # container's die with its cgroup (sandbox.workspace.health)
            self._at_failure = read_cgroup(self.cgroup_path)
            said = (out + err).decode("utf-8", errors="replace").strip()[-1000:]
            raise SandboxExecError(f"exec did not start in {self.name} (exit status {code}): "
                                   f"{said or 'no output'}")
        self._samples = [*self._samples[-1:], read_cgroup(self.cgroup_path)]
        # stderr joins stdout inside the shell, so the agent sees them interleaved
        text = (out[len(marker):] + err).decode("utf-8", errors="replace")
        if code == 137 and time.monotonic() - t0 >= timeout_s * 0.99:
            code = TIMEOUT_EXIT  # timeout -s KILL reports 137 when the limit hit;
            # earlier, a 137 is some other SIGKILL (the OOM killer): shown as the exit code
        return _format(code, text, timeout_s, max_output_chars)

    def sample(self) -> dict | None:
        """The last counters of the container's cgroup (taken after the last call that ran;
        :func:`sandbox.workspace.health.read_cgroup`), None when unreadable."""
        return self._samples[-1]

    def diagnose(self, ping_timeout_s: float = 10.0) -> dict:
        """Evidence of who caused a failed exec (call it at once, before :meth:`close`).

        Returns: ``{"service_ok", "container": state or "missing", "exit_code", "cgroup"
        (counters now), "cgroup_at_failure" (read the moment the failed exec returned),
        "cgroup_last", "cgroup_prev", "limits": {"pids", "memory"},
        "endpoint"}`` and, for a stopped container, ``"memcg_oom"`` (and ``"kmsg_unreadable"``,
        why the kernel log could not be read, when it could not): facts only, judged by
        :func:`eval.integrity.agent.classify_exec_failure`. Never raises: what it could not
        read is None / False.
        """
        ev = {"endpoint": self.endpoint, "service_ok": False, "container": None,
              "exit_code": None, "cgroup": None, "cgroup_at_failure": self._at_failure,
              "cgroup_last": self._samples[-1],
              "cgroup_prev": self._samples[0] if len(self._samples) > 1 else None,
              "limits": {"pids": self.limits.pids, "memory": self.limits.memory}}
        try:
            with self.runtime.client(self.endpoint, timeout_s=ping_timeout_s) as client:
                ev["service_ok"] = bool(client.ping())
                try:
                    c = client.containers.get(self.name)
                    state = c.attrs.get("State") or {}
                    ev["container"], ev["exit_code"] = c.status, state.get("ExitCode")
                except Exception as exc:  # noqa: BLE001 - NotFound: removed from outside
                    from podman.errors import NotFound

                    ev["container"] = "missing" if isinstance(exc, NotFound) else None
        except Exception as exc:  # noqa: BLE001 - the service does not answer
            ev["service_error"] = f"{type(exc).__name__}: {exc}"
        if ev["container"] == "running":
            ev["cgroup"] = read_cgroup(self.cgroup_path)
        elif ev["container"] not in (None, "missing"):  # stopped: the kernel's OOM record
            ev["memcg_oom"], unreadable = memcg_oom_record(self.cgroup_path)
            if unreadable:  # a fact of its own: "no record" would be a silent miss
                ev["kmsg_unreadable"] = unreadable
        return ev

    def close(self) -> None:
        """Kill and remove the container (idempotent; never raises)."""
        # remove(force=True) alone sends SIGTERM and waits podman's 10 s stop timeout
        # before its SIGKILL, on every rollout. Kill first.
        try:
            self.container.kill(signal="SIGKILL")
        except Exception:
            pass
        self.runtime._force_remove(self.endpoint, self.name)
        try:
            self._client.close()
        except Exception:
            pass


def _image_user(client, image: str) -> str:
    """The user the image's commands run as (its ``Config.User``; root when it names none):
    the agent's execs keep it while the container's own processes run as KEEPER_USER."""
    try:
        attrs = client.images.get(image).attrs
    except Exception:  # noqa: BLE001 - the create that follows reports a missing image
        return "0"
    return (attrs.get("Config") or {}).get("User") or attrs.get("User") or "0"


class LocalSession:
    """Runs the agent's commands on the host in ``host_dir`` (not isolated)."""

    def __init__(self, runtime, image: str, host_dir: str | os.PathLike, **_) -> None:
        self.host_dir = Path(host_dir)

    def run(self, command: str, *, timeout_s: float = 60.0, max_output_chars: int = 4000) -> str:
        try:
            proc = subprocess.run(["bash", "-c", command], cwd=self.host_dir, capture_output=True,
                                  timeout=timeout_s)
            out = (proc.stdout + proc.stderr).decode("utf-8", errors="replace")
            code = proc.returncode
        except subprocess.TimeoutExpired as exc:
            out = ((exc.stdout or b"") + (exc.stderr or b"")).decode("utf-8", errors="replace")
            code = TIMEOUT_EXIT
        return _format(code, out, timeout_s, max_output_chars)

    def close(self) -> None:
        pass


def open_image_tree(runtime, image: str, workdir: str = "/testbed", *,
                    labels: dict[str, str] | None = None):
    """A copy-on-write tree of ``image``'s ``workdir`` for one rollout of an image-held
    task (:func:`sandbox.workspace.imagetree.open_tree`), owned by ``runtime``: labelled with its run
    id and registered with its live containers, so :meth:`PodmanRuntime.close` and
    ``python -m sandbox gc`` remove it (and its mount) whatever happens to the caller.

    Raises:
        ValueError: naming ``runtime`` when it is not a Podman runtime with a local
            (``unix://``) endpoint: the tree is mounted on this host.
        ImageTreeError: podman could not create or mount the tree container.
    """
    local = [e for e in getattr(runtime, "endpoints", []) if e.startswith("unix://")]
    if not isinstance(runtime, PodmanRuntime) or len(local) != len(runtime.endpoints):
        raise ValueError(f"runtime: image {image} holds the task's tree; its rollouts need the "
                         "Podman runtime on local (unix://) endpoints")
    tree = open_tree(image, workdir, labels={**(labels or {}), RUN_LABEL: runtime.run_id,
                                             ROLE_LABEL: TREE_ROLE})
    runtime._live[tree.name] = local[0]
    return tree


def close_image_tree(runtime, tree) -> None:
    """Unmount and remove ``tree`` (from :func:`open_image_tree`); never raises."""
    tree.close()
    getattr(runtime, "_live", {}).pop(tree.name, None)


def open_session(runtime, image: str, host_dir, **kw):
    """A :class:`PodmanSession` for a Podman runtime, a :class:`LocalSession` for a local one."""
    if isinstance(runtime, LocalRuntime):
        return LocalSession(runtime, image, host_dir, **kw)
    return PodmanSession(runtime, image, host_dir, **kw)
