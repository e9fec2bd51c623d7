"""What every sandbox runtime offers: :class:`Runtime`, and the command-line flags that name one.

Three classes implement it: :class:`sandbox.runtimes.podman_runtime.PodmanRuntime` (Podman on
this machine), :class:`sandbox.runtimes.local_runtime.LocalRuntime` (host subprocesses, not
isolated) and :class:`sandbox.cluster.trials.RayRoutedRuntime` (trials and agent workspaces on
a Ray cluster's sandbox nodes; design page, "Scale-out"). Callers read ``kind`` and
``backend`` instead of testing a runtime's type, and a child process is handed
:meth:`Runtime.argv` to rebuild the same runtime (``sandbox.backend.SandboxOptions.from_args``).

The flag names live here (:data:`FLAGS`, :func:`runtime_flags`), below both the runtimes that
describe themselves with them and ``sandbox.backend``, which parses them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from sandbox.trials.trial import TrialResult, TrialSpec

KINDS = ("podman", "local")
"""What runs a trial's script: a fresh Podman container, or a host subprocess (not isolated)."""
BACKENDS = ("local", "ray")
"""Where verifier trials and agent sandboxes run: this machine's runtime, or a Ray cluster."""

FLAGS = {"kind": "--runtime", "backend": "--sandbox-backend", "ray_address": "--ray-address",
         "max_in_flight": "--sandbox-max-in-flight", "podman_url": "--ray-podman-url",
         "image_registry": "--ray-image-registry", "run_id": "--sandbox-run-id",
         "allow_unheld": "--sandbox-allow-unheld",
         "allow_unauthenticated": "--sandbox-allow-unauthenticated"}
"""``sandbox.backend.SandboxOptions`` field → its command-line flag (``eval.run``,
``eval.controls``, the pilot, the rollout subprocess)."""


def runtime_flags(kind: str, backend: str = "local", *, ray_address: str = "",
                  max_in_flight: int = 0, podman_url: str = "",
                  image_registry: str | None = None, run_id: str | None = None,
                  allow_unheld: bool = False,
                  allow_unauthenticated: bool = False) -> list[str]:
    """The :data:`FLAGS` that name a runtime: ``--runtime KIND`` alone on the local backend;
    on ``ray`` every Ray field (``--ray-podman-url`` even when empty, so a child never falls
    back to a default its parent did not use), ``--ray-image-registry`` when set, and
    ``--sandbox-run-id`` when given (the child joins that run's dispatcher: one cap, one
    cleanup), and ``--sandbox-allow-unheld`` / ``--sandbox-allow-unauthenticated`` when set."""
    argv = [FLAGS["kind"], kind]
    if backend == "local":
        return argv
    argv += [FLAGS["backend"], backend, FLAGS["ray_address"], ray_address,
             FLAGS["max_in_flight"], str(max_in_flight), FLAGS["podman_url"], podman_url]
    if image_registry:
        argv += [FLAGS["image_registry"], image_registry]
    if run_id:
        argv += [FLAGS["run_id"], run_id]
    if allow_unheld:
        argv += [FLAGS["allow_unheld"]]
    if allow_unauthenticated:
        argv += [FLAGS["allow_unauthenticated"]]
    return argv


@runtime_checkable
class Runtime(Protocol):
    """A sandbox runtime: verifier trials, rollout workspaces, image lookups, lifecycle.

    Attributes:
        kind: ``"podman"`` or ``"local"`` (:data:`KINDS`).
        backend: ``"local"`` (this machine) or ``"ray"`` (a cluster; :data:`BACKENDS`).
        run_id: the label of everything this runtime starts (containers, the Ray dispatcher).
    """

    kind: str
    backend: str
    run_id: str

    def run_trial(self, spec: TrialSpec) -> TrialResult:
        """Run one verifier trial; an infrastructure failure is a result
        (``exit_class="infra_error"``), never an exception. Thread-safe."""
        ...

    def open_workspace(self, task: Any, site: Any) -> Any:
        """One rollout's workspace of ``task`` with ``site``'s limits
        (``sandbox.workspace.rollout.WorkspaceSite``): built here by the site
        (``site.open_here``) on the local backend, on a sandbox node on ``ray``."""
        ...

    def image_ids(self, images: Iterable[str]) -> dict[str, str | None]:
        """image name → image id (``sha256:...``) in the storage trials use, None when absent
        (a local runtime uses no image: all None; on ``ray`` an absent image is pulled by the
        node that first needs it)."""
        ...

    def check_available(self, attempts: int = ..., backoff_s: float = ...,
                        timeout_s: float = ...) -> int:
        """Probe the runtime's services; the number of retries needed. Raises the runtime's
        own Unavailable error (a RuntimeError) naming what did not answer."""
        ...

    def close(self) -> None:
        """Stop what this runtime started and remove its containers; idempotent."""
        ...

    def argv(self) -> list[str]:
        """The command-line flags (:func:`runtime_flags`) that rebuild this runtime in a child
        process (on ``ray`` the child joins this run's dispatcher)."""
        ...
