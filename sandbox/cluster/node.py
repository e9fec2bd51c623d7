"""What runs *on* a Ray node for the ``ray`` sandbox backend: trials, image listing, gc.

The functions here execute inside Ray worker processes on sandbox nodes and talk to that
node's own Podman, never to another machine's:

* ``podman_url`` set (``unix:///run/podman/podman.sock``, the node's system service):
  podman-py at that socket.
* ``podman_url`` empty: a private ``podman system service`` per worker process
  (:class:`sandbox.runtimes.podman_runtime.PodmanRuntime` with no endpoints), started on first use
  and kept for the worker's life, so the service start (~0.5 s) is paid once per worker, not
  per trial; it dies with the worker (``PR_SET_PDEATHSIG``).

A trial here is exactly a local trial (:meth:`PodmanRuntime.run_trial`: fresh container,
same script, same :class:`~sandbox.trials.trial.TrialResult`), plus the node that served it and
whether its image had to be pulled first (:func:`ensure_image`, the pull logic of
:mod:`sandbox.images.pull`). Ray itself is imported lazily: ``sandbox`` does not need it.
"""

from __future__ import annotations

import threading
import time

from sandbox.doctor.gate import NodeVerdict, node_verdict, run_report
from sandbox.images.pull import ImagePullError, PullOutcome, canonical, pull_one, source_ref
from sandbox.runtimes.podman_runtime import PodmanRuntime, gc
from sandbox.trials.trial import TrialResult, TrialSpec

_RUNTIMES: dict[tuple[str, str], object] = {}
_LOCK = threading.Lock()


def node_runtime(run_id: str, podman_url: str = ""):
    """This worker's :class:`~sandbox.runtimes.podman_runtime.PodmanRuntime` for ``run_id`` (cached;
    remade when its private service has exited). Raises PodmanUnavailable."""
    key = (run_id, podman_url)
    with _LOCK:
        rt = _RUNTIMES.get(key)
        service = getattr(rt, "_service", None)
        if rt is None or (service is not None and service.proc.poll() is not None):
            rt = PodmanRuntime(endpoints=[podman_url] if podman_url else None, run_id=run_id)
            _RUNTIMES[key] = rt
        return rt


def ensure_image(rt, image: str, registry: str | None = None, attempts: int = 2) -> str:
    """Make ``image`` present in this node's Podman storage.

    Returns ``"present"`` (already there) or ``"pulled"`` (pulled now with
    :func:`sandbox.images.pull.pull_one` from :func:`~sandbox.images.pull.source_ref`
    ``(image, registry)``: the image's own registry, a mirror host or a local
    ``docker-archive:DIR``/``oci-archive:DIR`` mirror).

    Raises: ImagePullError naming the image, the source and the last error.
    """
    with rt.client(timeout_s=3600) as client:
        if client.images.exists(image):
            return "present"
        item = PullOutcome(image=image, source=source_ref(image, registry), status="todo")
        pull_one(client, item, attempts=attempts, backoff_s=2.0)
    if item.status != "pulled":
        raise ImagePullError(f"pull of {image} from {item.source} failed after "
                             f"{item.attempts} attempt(s): {item.error}")
    return "pulled"


def run_trial_here(spec: TrialSpec, run_id: str, podman_url: str, registry: str | None,
                   dispatcher=None, holder: str = "") -> tuple[TrialResult, float]:
    """Run one verifier trial on this node (the body of the Ray task).

    Tells ``dispatcher`` (the run's :class:`~sandbox.cluster.dispatch` actor, may be None) that
    ``holder`` started here, so a death of this node can be named. A pull failure or a
    Podman that cannot start is an ``infra_error`` result (retried by the pool like any
    infra error), never an exception that Ray would swallow into a task error.

    Returns: ``(result, started)`` with ``started`` the epoch seconds this task began (the
    caller's scheduling wait is ``started - submitted``; clocks of different nodes may differ).
    """
    import ray

    started = time.time()
    node = ray.get_runtime_context().get_node_id()
    if dispatcher is not None:
        dispatcher.started.remote(holder, node)
    try:
        rt = node_runtime(run_id, podman_url)
        pulled = ensure_image(rt, spec.image, registry)
    except Exception as exc:  # PodmanUnavailable, ImagePullError: no trial ran
        res = TrialResult(trial_id=spec.trial_id, exit_class="infra_error", node=node,
                          error=f"node {node[:12]}: {type(exc).__name__}: {exc}")
        return res, started
    res = rt.run_trial(spec)
    res.node = node
    res.image_pull = pulled
    return res, started


def list_images(run_id: str, podman_url: str = "") -> tuple[str, list[str]]:
    """``(node id, canonical names of every tagged image in this node's Podman)``."""
    import ray

    rt = node_runtime(run_id, podman_url)
    with rt.client() as client:
        names = {canonical(tag) for img in client.images.list() for tag in (img.tags or [])
                 if "<none>" not in tag}
    return ray.get_runtime_context().get_node_id(), sorted(names)


def image_ids_here(run_id: str, podman_url: str, images: list[str]) -> tuple[str, dict]:
    """``(node id, {image: id ("sha256:...") or None})`` for ``images`` in this node's Podman
    (names compared in canonical form), for the run's recorded digests."""
    import ray

    rt = node_runtime(run_id, podman_url)
    with rt.client() as client:
        ids = {canonical(tag): "sha256:" + img.id.removeprefix("sha256:")
               for img in client.images.list() for tag in (img.tags or []) if "<none>" not in tag}
    return (ray.get_runtime_context().get_node_id(),
            {i: ids.get(canonical(i)) for i in sorted(set(images))})


def gate_here(allow_unheld: bool = False) -> tuple[str, NodeVerdict]:
    """``(node id, this node's gate)``: :func:`sandbox.doctor.gate.node_verdict` (the report
    cached for this host's facts, else a doctor run now) — what the backend asks a sandbox
    node before it first serves."""
    import ray

    return ray.get_runtime_context().get_node_id(), node_verdict(allow_unheld)


def doctor_here(extra: list[str]) -> tuple[str, dict]:
    """``(node id, a fresh doctor report of this node)`` (``python -m sandbox doctor
    --ray-address``)."""
    import ray

    return ray.get_runtime_context().get_node_id(), run_report(extra=extra)


def gc_here(run_id: str | None) -> tuple[str, list[str]]:
    """``(node id, names removed)``: :func:`sandbox.runtimes.podman_runtime.gc` on this node."""
    import ray

    return ray.get_runtime_context().get_node_id(), gc(run_id)
