"""Podman runtime (podman-py): verifier trials in fresh containers.

The runtime talks to this machine's Podman: a ``unix://`` socket given to it, or else its
own ``podman system service`` on a private unix socket (configured by the
``containers.conf`` shipped beside this file: runc, explicit nofile/nproc
ulimits), stopped on :meth:`PodmanRuntime.close`. Agent sessions bind-mount a local tree and
so run on local (``unix://``) endpoints only (``agent_endpoints``,
:func:`check_agent_endpoints`). Trials on other hosts are the ``ray`` backend's
(:mod:`sandbox.cluster.dispatch`: a Ray task per trial, each node's own Podman); the remote
endpoint list that once spread trials round robin (``verifier_endpoints``, ``ssh://``) is
retired in its favour (one scheduler), and a remote URL is refused here naming
the Ray settings (:func:`check_trial_endpoints`).

Every container is labelled ``ecredit.run=<run id>``; the runtime removes its
containers on any exit path, and ``python -m sandbox gc`` removes leftovers of
killed processes.
"""

from __future__ import annotations

import atexit
import itertools
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

from sandbox.runtimes.podman_store import local_image_ids, podman_env
from sandbox.runtimes.protocol import runtime_flags
from sandbox.runtimes.tempdirs import mark_owner, socket_dir
from sandbox.trials.archive import (
    CONTROL_DIR,
    UNPACK_COMMAND,
    combined,
    control_volume,
    inputs_mount,
    write_inputs,
)
from sandbox.trials.trial import (
    SWEBENCH_LOG,
    Limits,
    TrialResult,
    TrialSpec,
    control_files,
    finish,
)
from sandbox.trials.watch import TrialWatch, file_size, log_cap, log_file, read_file, read_logs

RUN_LABEL = "ecredit.run"
TRIAL_LABEL = "ecredit.trial"
ROLE_LABEL = "ecredit.role"
WAIT_POLL = "100ms"
"""How often the Podman service looks whether a trial's container has exited. Its default,
250 ms, added 0.125 s on average to every trial; each look forks the OCI runtime (about 10 ms
of CPU with runc here), so shorter intervals trade CPU for latency. The deadline is kept by
the host's watch, not by this."""


class PodmanUnavailable(RuntimeError):
    """No Podman endpoint could be reached or started; the message says which."""


def _die_with_parent():
    """A ``preexec_fn`` asking the kernel to SIGTERM the child when its parent thread dies
    (``PR_SET_PDEATHSIG``), so a SIGKILLed trainer leaves no orphaned service; None
    where prctl is not available."""
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def set_pdeathsig() -> None:
        prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG

    return set_pdeathsig


class PodmanService:
    """A private ``podman system service`` on a unix socket, stopped on :meth:`stop`.

    It is started in its own session (terminal signals do not reach it) and gets
    SIGTERM from the kernel when the thread that started it dies, even by
    SIGKILL, so no orphaned service outlives a killed trainer. Start it from a
    thread that lives as long as the service should (the main thread).

    Raises:
        PodmanUnavailable: podman is missing or the socket did not come up in
            ``start_timeout_s`` seconds (the service's stderr is in the message).
    """

    def __init__(self, start_timeout_s: float = 20.0) -> None:
        if shutil.which("podman") is None:
            raise PodmanUnavailable("podman not found on PATH (apt-get install podman runc)")
        # owner-marked (`python -m sandbox gc` removes it after a SIGKILL); /tmp if TMPDIR is deep
        self._dir = socket_dir("ecredit-podman-", "podman.sock")
        self.socket = self._dir / "podman.sock"
        self.url = f"unix://{self.socket}"
        self._log = open(self._dir / "service.log", "wb")
        self.proc = subprocess.Popen(
            ["podman", "system", "service", "--time=0", self.url],
            stdout=self._log, stderr=subprocess.STDOUT, env=podman_env(),
            # conmon drops an "oom" marker file in the service's working directory
            # when a container is OOM-killed: keep it out of the caller's tree
            cwd=self._dir, start_new_session=True, preexec_fn=_die_with_parent())
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self.socket.exists() and self._ping():
                return
            time.sleep(0.05)
        log = (self._dir / "service.log").read_text(errors="replace")[-2000:]
        self.stop()
        raise PodmanUnavailable(f"podman system service did not start at {self.url}: {log}")

    def _ping(self) -> bool:
        from podman import PodmanClient

        try:
            with PodmanClient(base_url=self.url) as client:
                return bool(client.ping())
        except Exception:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def is_local_endpoint(url: str) -> bool:
    """True for a Podman API URL on this machine: ``unix://...`` (or empty: the private
    local service)."""
    return not url or url.startswith("unix://")


def check_agent_endpoints(urls, field: str = "agent_endpoints") -> list[str]:
    """Agent endpoints must be local: an agent session bind-mounts the rollout's working
    tree from this machine, which a remote (``ssh://``, ``tcp://``) service cannot see (the
    container would start without the tree). Empty entries are dropped.

    Returns: the local URLs. Raises: ValueError naming ``field`` and the remote URL.
    """
    if isinstance(urls, str):
        raise ValueError(f"{field}: expected a list of Podman API URLs, got a string")
    urls = list(urls or [])
    remote = [u for u in urls if not is_local_endpoint(u)]
    if remote:
        raise ValueError(
            f"{field}: {remote[0]} is not local; agent sessions bind-mount the rollout's "
            "working tree from this machine, so they run only on unix:// endpoints (or "
            "none: a private local service); trials on other hosts: sandbox_backend=ray")
    return [u for u in urls if u]


def endpoints_retired(field: str = "verifier_endpoints") -> str:
    """The one-line refusal of a remote Podman endpoint list, naming ``field`` and the Ray
    settings that replace it (one scheduler, Ray's; docs/scale-out.md, migrating
    from verifier_endpoints)."""
    return (f"{field}: retired: verifier trials on other hosts run on a Ray cluster with Podman "
            "on every node, not on a list of Podman endpoints; pass --sandbox_backend ray "
            "--ray_address HEAD:PORT (--sandbox_max_in_flight, --ray_podman_url, "
            "--ray_image_registry as needed) and join each Podman host with "
            f"`ray start --address HEAD:PORT --num-gpus 0 --resources "
            f"'{{\"ecredit_sandbox\": 24}}'` (docs/scale-out.md#migrate-endpoints)")


def check_trial_endpoints(urls, field: str = "verifier_endpoints") -> list[str]:
    """The Podman socket verifier trials use on this machine: none (``[]``) or one local
    ``unix://`` URL (a Ray node's own socket, :mod:`sandbox.cluster.node`). Empty entries are
    dropped.

    Raises: ValueError naming ``field``: a remote URL (the retired endpoint list:
    :func:`sandbox.runtimes.podman_runtime.endpoints_retired`), or more than one socket (a rotation over several
    Podman services is what the Ray backend replaces).
    """
    if isinstance(urls, str):
        raise ValueError(f"{field}: expected a list of Podman API URLs, got a string")
    urls = [u for u in (urls or []) if u]
    if [u for u in urls if not is_local_endpoint(u)] or len(urls) > 1:
        raise ValueError(endpoints_retired(field))
    return urls


class PodmanRuntime:
    """Runs :class:`~sandbox.trials.trial.TrialSpec` s in fresh Podman containers.

    Args:
        endpoints: the local socket verifier trials use, at most one ``unix://`` URL
            (:func:`check_trial_endpoints`). Empty: the first of ``agent_endpoints``, else a
            private local service started for the lifetime of this object.
        run_id: label value put on every container (default: random).
        agent_endpoints: where agent sessions (:class:`~sandbox.workspace.session.PodmanSession`)
            run, local only (:func:`check_agent_endpoints`), round robin. Empty: the trial
            socket.

    Containers run with no network, all capabilities dropped, no-new-privileges,
    and the memory / pids / CPU limits of the spec. Thread-safe: one
    :meth:`run_trial` call per worker thread.

    Implements :class:`sandbox.runtimes.protocol.Runtime` (``kind="podman"``,
    ``backend="local"``).

    Raises:
        ValueError: a remote agent endpoint, a remote or second trial endpoint (before
            anything starts).
        PodmanUnavailable: no endpoint and the local service cannot start.
    """

    kind = "podman"
    backend = "local"

    def __init__(self, endpoints: list[str] | None = None, run_id: str | None = None,
                 agent_endpoints: list[str] | None = None) -> None:
        agents = check_agent_endpoints(agent_endpoints)
        trials = check_trial_endpoints(endpoints)
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self._service: PodmanService | None = None
        # one Podman on this machine serves both kinds of container unless told otherwise
        url = (trials or agents or [""])[0]
        if not url:
            self._service = PodmanService()
            url = self._service.url
        self.endpoints = [url]
        self.agent_endpoints = agents or [url]
        self._next_agent = itertools.cycle(range(len(self.agent_endpoints)))
        self._lock = threading.Lock()
        self._live: dict[str, str] = {}  # container name -> endpoint
        self._closed = False
        self._inputs: Path | None = None  # trial archives, one file per live trial
        atexit.register(self.close)

    # -- lifecycle -----------------------------------------------------------
    def close(self) -> None:
        """Remove this runtime's containers still alive and stop its own service.

        When the API cannot remove them (the service is gone), local containers
        are removed with the podman CLI by run label (:func:`gc`).
        """
        if self._closed:
            return
        self._closed = True
        failed = [name for name, endpoint in list(self._live.items())
                  if not self._force_remove(endpoint, name, volume=control_volume(name))]
        if failed:  # every endpoint is on this machine: the CLI reaches its containers
            try:
                gc(self.run_id)
            except Exception:
                pass
        if self._service is not None:
            self._service.stop()
        if self._inputs is not None:
            shutil.rmtree(self._inputs, ignore_errors=True)

    def _inputs_dir(self) -> Path:
        """This runtime's directory of trial archives (made on first use, owner-marked so
        ``python -m sandbox gc`` removes it after a killed run)."""
        with self._lock:
            if self._inputs is None:
                self._inputs = Path(tempfile.mkdtemp(prefix="ecredit-trial-inputs-"))
                self._inputs.chmod(0o755)
                mark_owner(self._inputs)
            return self._inputs

    def check_available(self, attempts: int = 4, backoff_s: float = 2.0,
                        timeout_s: float = 10.0) -> int:
        """Ping every endpoint; a failing one is retried with exponential backoff.

        Args:
            attempts: tries per endpoint (>= 1).
            backoff_s: sleep before retry ``i`` is ``backoff_s * 2**(i-1)`` seconds, so
                the longest wait is ``backoff_s * (2**(attempts-1) - 1)`` seconds.
            timeout_s: bound of one ping, seconds.

        Returns: the number of retries that were needed (0 when all answered at once).

        Raises:
            PodmanUnavailable: naming the endpoint, the attempts, the seconds waited
                and the last error (for the private service also whether its process
                exited).
        """
        from podman import PodmanClient

        retries = 0
        for url in self.all_endpoints():
            waited = 0.0
            error = "no answer"
            for attempt in range(1, max(1, attempts) + 1):
                try:
                    with PodmanClient(base_url=url, timeout=timeout_s) as client:
                        if client.ping():
                            break
                except Exception as exc:  # connection refused, socket gone, timeout
                    error = f"{type(exc).__name__}: {exc}"
                if attempt == max(1, attempts):
                    if self._service is not None and url == self._service.url \
                            and self._service.proc.poll() is not None:
                        error += (f"; the private podman system service (pid "
                                  f"{self._service.proc.pid}) exited with code "
                                  f"{self._service.proc.returncode}")
                    raise PodmanUnavailable(
                        f"Podman endpoint {url} unreachable after {attempts} attempts over "
                        f"{waited:.1f} s: {error}")
                pause = backoff_s * 2 ** (attempt - 1)
                time.sleep(pause)
                waited += pause
                retries += 1
        return retries

    def __enter__(self) -> PodmanRuntime:
        return self

    def argv(self) -> list[str]:
        """``--runtime podman``: a child process makes its own runtime on this machine."""
        return runtime_flags(self.kind, self.backend)

    def image_ids(self, images) -> dict[str, str | None]:
        """image → id in this machine's Podman storage, None when absent
        (:func:`sandbox.runtimes.podman_store.local_image_ids`; raises ImagePullError when podman
        cannot list its images)."""
        return local_image_ids(images)

    def open_workspace(self, task, site):
        """A rollout's workspace, built on this machine by ``site``
        (``sandbox.workspace.rollout.WorkspaceSite.open_here``; its sessions use this
        runtime's agent endpoints)."""
        return site.open_here(task)

    def __exit__(self, *exc) -> None:
        self.close()

    def client(self, endpoint: str | None = None, timeout_s: float = 60.0):
        """A podman-py client for ``endpoint``; ``timeout_s`` bounds each API call."""
        from podman import PodmanClient

        return PodmanClient(base_url=endpoint or self.endpoints[0], timeout=timeout_s)

    def all_endpoints(self) -> list[str]:
        """Verifier and agent endpoints, each once, in that order."""
        return list(dict.fromkeys(self.endpoints + self.agent_endpoints))

    def _pick_endpoint(self) -> str:
        """The next **agent** endpoint (round robin over :attr:`agent_endpoints`, all local);
        :class:`~sandbox.workspace.session.PodmanSession` calls it."""
        with self._lock:
            return self.agent_endpoints[next(self._next_agent)]

    def _force_remove(self, endpoint: str, name: str, volume: str | None = None) -> bool:
        """Kill and remove container ``name`` (then ``volume``, when given and there); False
        when the API could not (service gone)."""
        ok = True
        try:
            with self.client(endpoint) as client:
                container = client.containers.get(name)
                if container.status == "running":
                    # a force remove first sends SIGTERM and waits podman's 10 s stop
                    # timeout; `sleep` as PID 1 ignores SIGTERM, so kill outright
                    try:
                        container.kill(signal="SIGKILL")
                    except Exception:
                        pass
                container.remove(force=True, v=True)
        except Exception as exc:
            from podman.errors import NotFound

            ok = isinstance(exc, NotFound)  # already gone is fine
        if volume is not None and ok:
            try:
                with self.client(endpoint) as client:
                    client.volumes.remove(volume, force=True)
            except Exception as exc:
                from podman.errors import NotFound

                ok = isinstance(exc, NotFound)
        self._live.pop(name, None)
        return ok

    def container_args(self, *, image: str, name: str, labels: dict[str, str],
                       limits: Limits, command: list[str]) -> dict:
        """podman-py ``containers.create`` keyword arguments for a locked-down sandbox.

        No network, all capabilities dropped, no-new-privileges, memory (no extra
        swap) / pids / CPU limits, nofile/nproc ulimits. Agent sessions add a
        read-only root filesystem (:class:`~sandbox.workspace.session.PodmanSession`).
        Verifier trials keep a writable root filesystem on purpose: SWE-bench
        images hold the repository *and* its environment inside the image
        (``/testbed``, ``/opt/miniconda3``), eval scripts check out test files and
        some reinstall the package in place, and the repository is copied in
        before start; each trial container is fresh from the image and removed
        after the trial, so no write outlives it.
        """
        return dict(
            image=image, name=name, command=command,
            labels={RUN_LABEL: self.run_id, **labels},
            network_mode="none",
            cap_drop=["ALL"],
            no_new_privileges=True,
            mem_limit=limits.memory,
            memswap_limit=limits.memory,
            pids_limit=limits.pids,
            nano_cpus=int(limits.cpus * 1e9),
            ulimits=[{"Name": "nofile", "Soft": 1024, "Hard": 1024},
                     {"Name": "nproc", "Soft": 4096, "Hard": 4096}],
            environment={"ECREDIT_DIR": CONTROL_DIR, "ECREDIT_WORKDIR": "/testbed"},
        )

    # -- trials --------------------------------------------------------------
    def run_trial(self, spec: TrialSpec) -> TrialResult:
        """Run one verifier trial in a new container; never reuses one.

        Returns a :class:`TrialResult`; infra problems (service lost, container
        killed, create failed) come back as ``exit_class="infra_error"`` with the
        error text, never as a test outcome. Cleanup always runs.
        """
        endpoint = self.endpoints[0]
        name = f"ecredit-{self.run_id}-{spec.trial_id}-{uuid.uuid4().hex[:6]}"
        res = TrialResult(trial_id=spec.trial_id, exit_class="infra_error", endpoint=endpoint)
        t0 = time.monotonic()
        timed_out = oom = flooded = False
        exit_code: int | None = None
        inputs: Path | None = None
        log = ""
        try:
            with self.client(endpoint, timeout_s=spec.timeout_s + 120) as client:
                args = self.container_args(
                    image=spec.image, name=name,
                    labels={TRIAL_LABEL: spec.trial_id, ROLE_LABEL: "verifier", **spec.labels},
                    limits=spec.limits, command=UNPACK_COMMAND)
                args["environment"]["ECREDIT_WORKDIR"] = spec.workdir
                res.protected = list(spec.protected)
                # the inputs go in through a read-only bind mount, not a copy through the
                # engine (sandbox.trials.archive)
                inputs = write_inputs(self._inputs_dir(), name, combined(
                    spec.workdir, spec.repo_archive, control_files(spec)))
                args["mounts"] = [inputs_mount(inputs)]
                # the control files' directory: a volume of its own (an image's root may not be
                # writable without capabilities), on disk like the container's own files
                args["volumes"] = {control_volume(name): {"bind": CONTROL_DIR, "mode": "rw"}}
                container = client.containers.create(**args)
                self._live[name] = endpoint
                log_path = log_file(container)
                cap = log_cap(spec.max_output_bytes)
                container.start()
                t_started = time.monotonic()
                res.setup_s = t_started - t0
                # deadline and host-side log size (sandbox.trials.watch: a flood that
                # bypasses the script's own output cap is killed, never read whole)
                watch = TrialWatch(container, spec.timeout_s, log_path, cap)
                try:
                    exit_code = container.wait(condition=["exited", "stopped"],
                                               interval=WAIT_POLL)
                    if isinstance(exit_code, dict):  # error payload
                        exit_code = exit_code.get("StatusCode")
                finally:
                    watch.stop()
                timed_out = watch.timed_out.is_set()
                flooded = watch.flooded.is_set() or file_size(log_path) > cap
                t_done = time.monotonic()
                try:
                    log = read_logs(container, cap if flooded else None)
                except Exception:
                    log = ""
                container.reload()
                state = container.attrs.get("State", {})
                # OOMKilled covers the container's main process only (and stays false under
                # cgroup v1 here); kills of any other process come from the cgroup counter
                # the trial script reports (sandbox.trials.trial.finish).
                oom = bool(state.get("OOMKilled"))
                if exit_code is None and not timed_out:
                    exit_code = state.get("ExitCode")
                finish(res, log, run_s=t_done - t_started, exit_code=exit_code,
                       timed_out=timed_out, oom=oom, output_over=flooded)
                if spec.swebench_pass and res.protected_touched and res.exit_class == "ok":
                    res.log_swebench = read_file(container, f"{CONTROL_DIR}/{SWEBENCH_LOG}")
        except Exception as exc:
            res.exit_class = "infra_error"
            res.error = f"{type(exc).__name__}: {exc}"
        finally:
            t_clean = time.monotonic()
            self._force_remove(endpoint, name, volume=control_volume(name))
            if inputs is not None:
                inputs.unlink(missing_ok=True)
            res.cleanup_s = time.monotonic() - t_clean
        return res


def gc(run_id: str | None = None) -> list[str]:
    """Remove leftover ecredit containers (all, or one run's) with the podman CLI.

    Returns the removed container names. Needs no API service.
    """
    label = f"{RUN_LABEL}={run_id}" if run_id else RUN_LABEL
    out = subprocess.run(["podman", "ps", "-a", "--filter", f"label={label}",
                          "--format", "{{.Names}}"], capture_output=True, text=True,
                         env=podman_env())
    names = [n for n in out.stdout.split() if n]
    if names:
        subprocess.run(["podman", "rm", "-f", "-v", *names], capture_output=True,
                       env=podman_env())
    # the control volumes of trials whose containers are gone (a volume in use stays)
    out = subprocess.run(["podman", "volume", "ls", "--format", "{{.Name}}"],
                         capture_output=True, text=True, env=podman_env())
    prefix, suffix = (f"ecredit-{run_id}-" if run_id else "ecredit-"), control_volume("")
    volumes = [v for v in out.stdout.split() if v.startswith(prefix) and v.endswith(suffix)]
    if volumes:
        subprocess.run(["podman", "volume", "rm", *volumes], capture_output=True,
                       env=podman_env())
    return names
