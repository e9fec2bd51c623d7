"""The ``ray`` sandbox backend for verifier trials: Ray tasks, Podman on every node.

:class:`~sandbox.cluster.trials.RayTrials` is a trial runtime (``run_trial(spec) -> TrialResult``)
that the :class:`~sandbox.trials.pool.VerifierPool` drives exactly as it drives a local
:class:`~sandbox.runtimes.podman_runtime.PodmanRuntime`; the pool's retry rule is the one retry rule
(an ``infra_error`` is retried up to ``verifier_retries`` times, a graded result never).
Each call:

1. takes a slot from the run's **dispatcher**, a named, detached Ray actor
   (``ecredit-dispatch-<run id>`` in namespace ``ecredit``) that every Accelerate rank of
   the run attaches to: one cluster-wide cap (``sandbox_max_in_flight``) on trials in flight,
   whatever the number of ranks. The wait for the slot and for Ray to start the task is the
   trial's ``queue_wait_s`` (the pool adds its own thread-queue wait);
2. picks a node (:func:`choose_node`): among live sandbox nodes that hold the image (a node →
   images index kept in the dispatcher, filled by listing each node's Podman and updated
   after every pull) the least loaded, as a *soft* ``NodeAffinitySchedulingStrategy`` (a
   dead or infeasible node falls back to any node); no holder: ``SPREAD``, and the chosen
   node pulls the image (:func:`sandbox.cluster.node.ensure_image`), counted in ``stats``;
3. runs :func:`sandbox.cluster.node.run_trial_here` as a Ray task (``max_retries=0``: a node
   death comes back here as an ``infra_error`` result naming the node, so the pool retries
   it with a fresh container and counts it in ``attempts`` / ``retried_errors``).

A killed trainer leaves nothing running on any node: the dispatcher watches the drivers
attached to it and reaps the run's containers on every node when they are all dead
(:mod:`sandbox.cluster.reaper`).

Trials need the custom resource :data:`SANDBOX_RESOURCE` (one unit each, ``num_cpus=0``:
the container does the work, under its own CPU limit), so only nodes started with
``--resources '{"ecredit_sandbox": N}'`` serve trials and N caps each node; GPU training
nodes simply do not offer it. ``RayTrials`` connects to an existing cluster
(``ray_address``) and never starts one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sandbox.cluster.auth import (
    AUTH_FIX,
    TOKEN,
    ClusterAuthError,
    gcs_address_of,
    gcs_auth_mode,
    require_token_auth,
)
from sandbox.cluster.node import doctor_here, gc_here, image_ids_here
from sandbox.cluster.reaper import REAP_GRACE_S, RunReaper
from sandbox.images.pull import canonical

SANDBOX_RESOURCE = "ecredit_sandbox"
"""Custom Ray resource a node offers per concurrent trial it may run."""
NAMESPACE = "ecredit"
NODES_TTL_S = 5.0
"""Seconds a read of the cluster's live nodes is reused before it is read again."""


class RayUnavailable(RuntimeError):
    """Ray is not installed, no cluster answers at ``ray_address``, or no node offers
    :data:`SANDBOX_RESOURCE`; the message says which and what to do."""


DEFAULT_ADDRESS = "auto"
"""``ray.init`` address used when none is given: the cluster this machine belongs to."""
DEFAULT_MAX_IN_FLIGHT = 24
"""Cluster-wide cap on one run's trials and agent sandboxes in flight, when none is given."""


@dataclass(frozen=True)
class RayOptions:
    """How verifier trials reach a Ray cluster (the Ray part of
    ``sandbox.backend.SandboxOptions``, whose ``validate`` checks these values and names the
    field; built by its ``ray_options``).

    Attributes:
        address: ``ray.init`` address of an existing cluster (``auto``, ``HOST:PORT``,
            ``ray://HOST:10001``).
        max_in_flight: cluster-wide cap on trials in flight for the run (all ranks).
        podman_url: each node's Podman API socket (``unix://...``); "" = a private service
            per Ray worker.
        registry: where a node pulls a missing image from (:func:`sandbox.images.pull.source_ref`);
            None = the image name's own registry.
        allow_unheld: a node whose doctor report has a rule not held serves anyway (its
            trials carry ``node_unheld``); False: it is refused (:mod:`sandbox.doctor.gate`).
        allow_unauthenticated: a cluster that does not enforce Ray token authentication is
            used anyway (a loopback-only test cluster); False: refused (:func:`connect`).
    """

    address: str = DEFAULT_ADDRESS
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    podman_url: str = ""
    registry: str | None = None
    allow_unheld: bool = False
    allow_unauthenticated: bool = False


def dispatcher_name(run_id: str) -> str:
    """Name of the run's dispatcher actor (namespace :data:`NAMESPACE`)."""
    return f"ecredit-dispatch-{run_id}"


def choose_node(image: str, alive: list[str], index: dict[str, Iterable[str]],
                load: dict[str, int], avoid: Iterable[str] = (), turn: int = 0) -> str | None:
    """The node a trial of ``image`` should prefer, or None (no live node holds it).

    Among ``alive`` nodes whose ``index`` entry holds ``image`` (canonical names), those not in
    ``avoid`` (nodes that already failed this trial) when any remain, the one with the
    fewest trials in flight (``load``); ties are broken by rotating with ``turn`` so equal
    nodes take turns. Pure: no I/O.
    """
    want = canonical(image)
    holders = [n for n in alive if want in set(index.get(n, ()))]
    avoid = set(avoid)
    pool = [n for n in holders if n not in avoid] or holders
    if not pool:
        return None
    return min(pool, key=lambda n: (load.get(n, 0), (pool.index(n) - turn) % len(pool)))


def _import_ray():
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailable("sandbox_backend=ray needs Ray: pip install 'ecredit-trl[ray]' "
                             "(ray==2.60.0)") from exc
    return ray


_DISPATCHER = None


class ImageIndex:
    """The dispatcher's node → images index (a base of its actor class, as
    :class:`~sandbox.cluster.reaper.RunReaper` is): canonical image names per node id, seeded by
    each rank's first listing of the nodes and grown as nodes pull. Async like every remote
    method of the actor, so all run on its one event loop."""

    index: dict[str, list[str]]

    async def get_index(self) -> dict[str, list[str]]:
        return self.index

    async def set_images(self, node: str, images: list[str]) -> None:
        self.index[node] = sorted(images)

    async def add_image(self, node: str, image: str) -> None:
        self.index[node] = sorted({*self.index.get(node, []), image})


def dispatcher_class():
    """The dispatcher actor class (defined on first use, so ``sandbox`` imports without Ray).

    Its state: the cap, an asyncio semaphore of that size, the holders in flight (holder →
    node once the task said where it started), the peak in flight, the ranks attached (now
    and ever), the node → images index and the reaper's state (:class:`~sandbox.cluster.reaper.
    RunReaper`). All remote methods are async so they share one event loop.
    """
    global _DISPATCHER
    if _DISPATCHER is not None:
        return _DISPATCHER
    ray = _import_ray()
    import asyncio

    @ray.remote(num_cpus=0, max_restarts=0)
    class Dispatcher(RunReaper, ImageIndex):
        def __init__(self, cap: int) -> None:
            self.cap = cap
            self.sem = asyncio.Semaphore(cap)
            self.holders: dict[str, str] = {}
            self.peak = 0
            self.attached = 0
            self.attaches = 0
            self.index = {}
            self.reaper_init(dispatcher_name(""), reap_run)

        async def attach(self, job: str = "", node: str = "") -> int:
            """This rank's cap; 0 when this actor is ending (RunReaper.join: ``node`` is
            the driver's node id, its lease starts)."""
            if not await self.join(job, node):
                return 0
            self.attached += 1
            self.attaches += 1
            return self.cap

        async def detach(self, job: str = "") -> int:
            self.attached -= 1
            self.leave(job)
            return self.attached

        async def acquire(self, holder: str, job: str = "") -> dict[str, int]:
            await self.sem.acquire()
            self.holders[holder] = ""
            if job:
                self.holder_job[holder] = job
            self.peak = max(self.peak, len(self.holders))
            return await self.load()

        async def acquire_within(self, holder: str, timeout_s: float) -> dict | None:
            """:meth:`acquire`, giving up after ``timeout_s`` seconds (None): an agent
            sandbox's wait, so a grant never arrives after its waiter left."""
            try:
                await asyncio.wait_for(self.sem.acquire(), timeout_s)
            except asyncio.TimeoutError:
                return None
            self.holders[holder] = ""
            self.peak = max(self.peak, len(self.holders))
            return await self.load()

        async def started(self, holder: str, node: str) -> None:
            if holder in self.holders:
                self.holders[holder] = node

        async def where(self, holder: str) -> str:
            return self.holders.get(holder, "")

        async def release(self, holder: str) -> None:
            self.holder_job.pop(holder, None)
            if self.holders.pop(holder, None) is not None:
                self.sem.release()

        async def load(self) -> dict[str, int]:
            out: dict[str, int] = {}
            for node in self.holders.values():
                if node:
                    out[node] = out.get(node, 0) + 1
            return out

        async def stats(self) -> dict:
            return {"cap": self.cap, "in_flight": len(self.holders), "peak": self.peak,
                    "attached": self.attached, "attaches": self.attaches}

    _DISPATCHER = Dispatcher
    return Dispatcher


def reap_run(run_id: str) -> list[tuple[str, list[str]]]:
    """Remove ``run_id``'s containers on every live sandbox node, from an already connected
    process (the dispatcher, :mod:`sandbox.cluster.reaper`), twice
    :data:`~sandbox.cluster.reaper.REAP_GRACE_S` seconds apart: a worker of a dead driver may
    still have been creating one at the first sweep. Returns ``[(node id, names removed)]``."""
    import time

    out = on_each_node(gc_here, run_id)
    time.sleep(REAP_GRACE_S)
    return out + on_each_node(gc_here, run_id)


def _reachable(address: str, timeout_s: float = 5.0) -> None:
    """Refuse a ``HOST:PORT`` / ``ray://HOST:PORT`` address nothing listens on, in one line:
    ``ray.init`` itself retries such an address for minutes (Ray's GCS client backs off and
    tries again), which reads as a hang. ``auto`` is left to ``ray.init``, which fails fast.

    Raises: RayUnavailable naming ``ray_address``.
    """
    import socket

    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if address == "auto" or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise RayUnavailable(
            f"ray_address={address!r}: nothing answers at {host}:{port} ({exc.strerror or exc}); "
            f"start the cluster first (`ray start --head --port {port}` on the head node; "
            "docs/scale-out.md) or correct the address") from exc


def connect(address: str, allow_unauthenticated: bool = False):
    """``ray.init`` against an existing cluster (never starts one) that enforces token
    authentication (:mod:`sandbox.cluster.auth`; ``allow_unauthenticated``: one that does not
    is accepted too). Returns True when this call initialised Ray (so the caller shuts it
    down), False when it already was (the check ran on that first connection).

    Raises: RayUnavailable naming ``ray_address`` and how to start a cluster, or, before
    ``ray.init`` (``ray://``: right after it, then disconnected), the one-line
    :class:`~sandbox.cluster.auth.ClusterAuthError` message naming the token fix.
    """
    ray = _import_ray()
    if ray.is_initialized():
        return False
    _reachable(address)
    gcs = gcs_address_of(address)
    try:
        if gcs is not None:
            require_token_auth(address, gcs, allow_unauthenticated)
    except ClusterAuthError as exc:
        raise RayUnavailable(str(exc)) from None
    except ConnectionError as exc:
        raise RayUnavailable(f"ray_address={address!r}: {exc}") from None
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
                 logging_level="warning", configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayUnavailable(
            f"ray_address={address!r}: no Ray cluster to connect to ({type(exc).__name__}: "
            f"{exc}); start one first (`ray start --head` on one node, `ray start --address "
            f"HEAD:6379 --resources '{{\"{SANDBOX_RESOURCE}\": 24}}'` on sandbox nodes; "
            "docs/scale-out.md)") from exc
    if gcs is None and address.startswith("ray://"):
        # a Ray client address hides the GCS: a node of the cluster asks it instead
        mode = ray.get(ray.remote(_gcs_auth_mode_here).options(num_cpus=0).remote())
        if mode != TOKEN and not allow_unauthenticated:
            ray.shutdown()
            raise RayUnavailable(f"ray_address={address!r}: the Ray cluster does not enforce "
                                 "token authentication; refused; " + AUTH_FIX)
    return True


def _gcs_auth_mode_here() -> str:
    """The authentication mode of the GCS of the cluster this Ray worker belongs to."""
    ray = _import_ray()
    return gcs_auth_mode(ray.get_runtime_context().gcs_address)


def cluster_auth_mode(address: str) -> str:
    """The authentication mode (``token`` / ``disabled``) of the cluster at ``address``, asked
    of its GCS without a token (:func:`sandbox.cluster.auth.gcs_auth_mode`); ``ray://``: of a
    node of the already connected cluster.

    Raises: RayUnavailable when no cluster answers.
    """
    _reachable(address)
    gcs = gcs_address_of(address)
    try:
        if gcs is not None:
            return gcs_auth_mode(gcs)
    except ConnectionError as exc:
        raise RayUnavailable(f"ray_address={address!r}: {exc}") from None
    ray = _import_ray()
    if not ray.is_initialized():
        raise RayUnavailable(f"ray_address={address!r}: no Ray cluster found")
    return ray.get(ray.remote(_gcs_auth_mode_here).options(num_cpus=0).remote())


def sandbox_nodes() -> list[str]:
    """Ids (hex) of the live nodes that offer :data:`SANDBOX_RESOURCE`, sorted."""
    ray = _import_ray()
    return sorted(n["NodeID"] for n in ray.nodes()
                  if n.get("Alive") and n.get("Resources", {}).get(SANDBOX_RESOURCE, 0) > 0)


def head_node() -> str | None:
    """Id (hex) of the cluster's live head node (resource ``node:__internal_head__``), or None."""
    ray = _import_ray()
    for n in ray.nodes():
        if n.get("Alive") and "node:__internal_head__" in n.get("Resources", {}):
            return n["NodeID"]
    return None


def on_each_node(fn, *args, nodes: list[str] | None = None, timeout_s: float = 120.0) -> list:
    """Run ``fn(*args)`` once on each of ``nodes`` (default: every sandbox node), pinned
    there (hard node affinity, ``num_cpus=0``). Returns the results of the nodes that
    answered within ``timeout_s``; a node that died meanwhile is left out."""
    ray = _import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(fn)
    refs = [task.options(num_cpus=0, max_retries=0, scheduling_strategy=(
        NodeAffinitySchedulingStrategy(node, soft=False))).remote(*args)
        for node in (sandbox_nodes() if nodes is None else nodes)]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    out = []
    for ref in ready:
        try:
            out.append(ray.get(ref))
        except ray.exceptions.RayError:
            pass
    return out


def cluster_image_ids(images, *, run_id: str, podman_url: str = "") -> dict[str, str | None]:
    """image → id over every live sandbox node (:func:`sandbox.cluster.node.image_ids_here`), None
    for an image no node holds (a node pulls it on first use, and the pull is counted). Needs
    a connected Ray (``ray.init``).

    Raises: ValueError naming the image and the ids when two nodes hold different images under
    one name (their trials would test different environments).
    """
    seen: dict[str, dict[str, str]] = {}
    for node, ids in on_each_node(image_ids_here, run_id, podman_url, sorted(set(images))):
        for image, image_id in ids.items():
            if image_id is not None:
                seen.setdefault(image, {})[image_id] = node
    for image, by_id in seen.items():
        if len(by_id) > 1:
            raise ValueError(f"image {image}: sandbox nodes hold different images under this "
                             f"name ({', '.join(f'{i[:19]} on node {n[:8]}' for i, n in sorted(by_id.items()))}); "
                             f"pull the same image on every node")
    return {i: next(iter(seen[i])) if i in seen else None for i in sorted(set(images))}


def gc_cluster(address: str, run_id: str | None = None,
               allow_unauthenticated: bool = False) -> list[tuple[str, list[str]]]:
    """Remove leftover ecredit containers (one run's, or all) on every live sandbox node of
    the cluster at ``address`` (:func:`sandbox.cluster.node.gc_here` pinned to each node), and
    kill the run's dispatcher actor if one is left (a killed trainer leaves it).
    ``allow_unauthenticated``: as :func:`connect`.

    Returns: ``[(node id, names removed)]``. Raises: RayUnavailable.
    """
    ray = _import_ray()
    own = connect(address, allow_unauthenticated)
    try:
        out = on_each_node(gc_here, run_id)
        if run_id:
            try:
                ray.kill(ray.get_actor(dispatcher_name(run_id), namespace=NAMESPACE))
            except ValueError:  # no such actor: nothing to kill
                pass
        return out
    finally:
        if own:
            ray.shutdown()



def doctor_cluster(address: str, extra: list[str] = (), allow_unauthenticated: bool = False,
                   timeout_s: float = 900.0) -> dict:
    """The cluster's authentication mode (:func:`cluster_auth_mode`, asked before connecting)
    and a fresh doctor report of every live sandbox node of the cluster at ``address``
    (:func:`sandbox.cluster.node.doctor_here` pinned to each node; a full run refreshes the
    node's cached report). A cluster without token authentication is reported, not refused,
    but its nodes are probed only when ``allow_unauthenticated`` (nothing runs on it
    otherwise). Returns ``{"auth_mode": "token" | "disabled", "nodes": {node id: report}}``.
    Raises: RayUnavailable (as :func:`connect`: no cluster, or this process lacks the
    token of a token cluster)."""
    ray = _import_ray()
    mode = None if address.startswith("ray://") else cluster_auth_mode(address)
    if mode is not None and mode != TOKEN and not allow_unauthenticated:
        return {"auth_mode": mode, "nodes": {}}
    own = connect(address, allow_unauthenticated=allow_unauthenticated)
    try:
        mode = mode or cluster_auth_mode(address)
        return {"auth_mode": mode,
                "nodes": dict(on_each_node(doctor_here, list(extra), timeout_s=timeout_s))}
    finally:
        if own:
            ray.shutdown()
