"""Choosing where trials and agent sandboxes run: this machine (``local``) or a Ray cluster
(``ray``), and the command-line flags that name that choice.

The top of ``sandbox/``: it may import every subpackage below it; nothing in ``sandbox/``
imports it.
"""

import argparse
import uuid

from sandbox.cluster.dispatch import RayOptions, RayUnavailable
from sandbox.cluster.trials import RayRoutedRuntime
from sandbox.runtimes.local_runtime import LocalRuntime
from sandbox.runtimes.podman_runtime import PodmanRuntime, endpoints_retired

__all__ = ["BACKENDS", "check_backend", "make_runtime", "runtime_argv"]

BACKENDS = ("local", "ray")
"""Where verifier trials and agent sandboxes run: this machine's runtime, or a Ray cluster."""


def check_backend(backend: str, kind: str = "podman", endpoints=None,
                  field: str = "sandbox_backend") -> str:
    """``backend`` when it is one of :data:`BACKENDS` and fits ``kind`` / ``endpoints``.

    Raises: ValueError naming ``field``: an unknown backend; ``ray`` with the ``local``
    runtime (nodes run trials in Podman); and, naming ``verifier_endpoints``, any remote
    endpoint list (:func:`endpoints_retired`: Ray is the one scheduler of trials on other
    hosts).
    """
    if backend not in BACKENDS:
        raise ValueError(f"{field}: expected one of {BACKENDS}, got {backend!r}")
    if backend == "ray" and kind != "podman":
        raise ValueError(f"{field}: ray runs every trial in Podman on a cluster node; it "
                         f"needs runtime 'podman', got {kind!r}")
    if [e for e in (endpoints or []) if e]:
        raise ValueError(endpoints_retired())
    return backend


def make_runtime(kind: str = "podman", *, run_id: str | None = None,
                 agent_endpoints: list[str] | None = None, backend: str = "local", ray=None,
                 endpoints: list[str] | None = None):
    """Build a runtime by name: ``"podman"`` or ``"local"`` (never chosen implicitly).
    ``agent_endpoints`` (local ``unix://`` sockets) serve agent sessions and, on the local
    backend, verifier trials too (:class:`sandbox.runtimes.podman_runtime.PodmanRuntime`).

    ``backend``: ``"local"`` (the default: trials on this machine) or ``"ray"`` (trials as
    Ray tasks on an existing cluster, ``ray`` a :class:`sandbox.cluster.dispatch.RayOptions`;
    :class:`sandbox.cluster.trials.RayRoutedRuntime`), which needs ``kind="podman"``.
    ``endpoints`` (the retired verifier endpoint list) must be empty: a non-empty one is
    refused with the migration message (:func:`endpoints_retired`).

    Raises: ValueError for any other name, a remote agent endpoint, verifier endpoints or a
    refused combination; PodmanUnavailable when Podman cannot start; RayUnavailable when the
    cluster cannot be reached.
    """
    check_backend(backend, kind, endpoints)
    if backend == "ray":
        return RayRoutedRuntime(run_id=run_id or f"ray-{uuid.uuid4().hex[:8]}",
                                options=ray or RayOptions(), agent_endpoints=agent_endpoints)
    if kind == "podman":
        return PodmanRuntime(run_id=run_id, agent_endpoints=agent_endpoints)
    if kind == "local":
        return LocalRuntime(run_id=run_id or "local")
    raise ValueError(f"runtime: expected 'podman' or 'local', got {kind!r}")


def add_runtime_args(ap) -> None:
    """Add ``--runtime`` and the backend flags of :func:`runtime_from_args` to an argparse
    parser (the same names as the trainer's fields, with dashes)."""
    ap.add_argument("--runtime", choices=("podman", "local"), default="podman")
    ap.add_argument("--sandbox-backend", choices=BACKENDS, default="local",
                    help="where verifier trials and agent sandboxes run: local (this machine) "
                         "or ray (an existing Ray cluster's sandbox nodes; docs/scale-out.md)")
    ap.add_argument("--ray-address", default="auto",
                    help="ray: address of the running cluster (auto, HOST:PORT)")
    ap.add_argument("--sandbox-max-in-flight", type=int, default=24,
                    help="ray: cluster-wide cap on trials and agent sandboxes in flight")
    ap.add_argument("--ray-podman-url", default="",
                    help="ray: each node's Podman socket (default: a private service per worker)")
    ap.add_argument("--ray-image-registry", default=None,
                    help="ray: where a node pulls an image it lacks (mirror or docker-archive:DIR)")
    # internal: eval.run's rollout subprocess joins the evaluation's dispatcher (its cap and
    # its cleanup) instead of making a new one
    ap.add_argument("--sandbox-run-id", default=None, help=argparse.SUPPRESS)


def runtime_argv(runtime) -> list[str]:
    """The :func:`add_runtime_args` flags that rebuild ``runtime`` in a child process: a
    runtime name (``--runtime NAME``), a ``LocalRuntime`` / ``PodmanRuntime`` (``--runtime``
    only), or a :class:`sandbox.cluster.trials.RayRoutedRuntime`, whose child joins the same run's
    dispatcher (``--sandbox-run-id``), so parent and child share one cluster-wide cap and the
    child's sandboxes are reaped with the run."""
    if isinstance(runtime, str):
        return ["--runtime", runtime]
    if type(runtime).__name__ == "LocalRuntime":
        return ["--runtime", "local"]
    trials = getattr(runtime, "trials", None)
    if trials is None or not hasattr(trials, "options"):
        return ["--runtime", "podman"]
    o = trials.options
    argv = ["--runtime", "podman", "--sandbox-backend", "ray", "--ray-address", o.address,
            "--sandbox-max-in-flight", str(o.max_in_flight), "--ray-podman-url", o.podman_url,
            "--sandbox-run-id", trials.run_id]
    if o.registry:
        argv += ["--ray-image-registry", o.registry]
    return argv


def runtime_from_args(args, run_prefix: str):
    """The ``runtime`` argument for ``eval.run`` / ``eval.controls`` / the pilot from
    :func:`add_runtime_args` flags: ``args.runtime`` (a name: the callee makes and closes the
    runtime, today's behaviour) for the local backend; for ray a
    :class:`sandbox.cluster.trials.RayRoutedRuntime` (run id ``<run_prefix>-<pid>``), closed when
    the process exits (its ``atexit`` hook).

    Raises: ValueError naming the flag's field, or with the one-line
    :class:`sandbox.cluster.dispatch.RayUnavailable` message when no cluster answers (the CLIs
    print a ValueError as one ``error:`` line and exit 2).
    """
    import os

    check_backend(args.sandbox_backend, args.runtime)
    if args.sandbox_backend == "local":
        return args.runtime

    opts = RayOptions(address=args.ray_address, max_in_flight=args.sandbox_max_in_flight,
                      podman_url=args.ray_podman_url, registry=args.ray_image_registry)

    run_id = getattr(args, "sandbox_run_id", None) or f"{run_prefix}-{os.getpid()}"
    try:
        return make_runtime(args.runtime, backend="ray", ray=opts, run_id=run_id)
    except RayUnavailable as exc:
        raise ValueError(str(exc)) from exc
