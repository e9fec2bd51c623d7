"""The ``ray`` sandbox backend for verifier trials (issue 25): Ray tasks, Podman on every node.

:class:`RayTrials` is a trial runtime (``run_trial(spec) -> TrialResult``) that the
:class:`~sandbox.pool.VerifierPool` drives exactly as it drives a local
:class:`~sandbox.podman_runtime.PodmanRuntime`; the pool's retry rule is the one retry rule
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
   node pulls the image (:func:`sandbox.ray_node.ensure_image`), counted in ``stats``;
3. runs :func:`sandbox.ray_node.run_trial_here` as a Ray task (``max_retries=0``: a node
   death comes back here as an ``infra_error`` result naming the node, so the pool retries
   it with a fresh container and counts it in ``attempts`` / ``retried_errors``).

Trials need the custom resource :data:`SANDBOX_RESOURCE` (one unit each, ``num_cpus=0``:
the container does the work, under its own CPU limit), so only nodes started with
``--resources '{"ecredit_sandbox": N}'`` serve trials and N caps each node; GPU training
nodes simply do not offer it. :class:`RayTrials` connects to an existing cluster
(``ray_address``) and never starts one.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from sandbox.podman_runtime import PodmanRuntime
from sandbox.trial import TrialResult, TrialSpec

SANDBOX_RESOURCE = "ecredit_sandbox"
"""Custom Ray resource a node offers per concurrent trial it may run."""
NAMESPACE = "ecredit"
NODES_TTL_S = 5.0
"""Seconds a read of the cluster's live nodes is reused before it is read again."""


class RayUnavailable(RuntimeError):
    """Ray is not installed, no cluster answers at ``ray_address``, or no node offers
    :data:`SANDBOX_RESOURCE`; the message says which and what to do."""


@dataclass(frozen=True)
class RayOptions:
    """How verifier trials reach a Ray cluster.

    Attributes:
        address: ``ray.init`` address of an existing cluster (``auto``, ``HOST:PORT``,
            ``ray://HOST:10001``).
        max_in_flight: cluster-wide cap on trials in flight for the run (all ranks).
        podman_url: each node's Podman API socket (``unix://...``); "" = a private service
            per Ray worker.
        registry: where a node pulls a missing image from (:func:`sandbox.images.pull.source_ref`);
            None = the image name's own registry.

    Raises: ValueError naming the field.
    """

    address: str = "auto"
    max_in_flight: int = 24
    podman_url: str = ""
    registry: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.address, str) or not self.address.strip():
            raise ValueError("ray_address: empty; give 'auto' or HOST:PORT of a running cluster")
        if not isinstance(self.max_in_flight, int) or self.max_in_flight < 1:
            raise ValueError(f"sandbox_max_in_flight: must be an integer >= 1, got "
                             f"{self.max_in_flight!r}")
        if self.podman_url and not self.podman_url.startswith("unix://"):
            raise ValueError(f"ray_podman_url: must be a node-local unix:// socket (each node "
                             f"runs its own trials), got {self.podman_url!r}")


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
    from sandbox.images.pull import canonical

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


def dispatcher_class():
    """The dispatcher actor class (defined on first use, so ``sandbox`` imports without Ray).

    Its state: the cap, an asyncio semaphore of that size, the holders in flight (holder →
    node once the task said where it started), the peak in flight, the ranks attached (now
    and ever) and the node → images index. All methods are async so they share one event loop.
    """
    global _DISPATCHER
    if _DISPATCHER is not None:
        return _DISPATCHER
    ray = _import_ray()
    import asyncio

    @ray.remote(num_cpus=0, max_restarts=0)
    class Dispatcher:
        def __init__(self, cap: int) -> None:
            self.cap = cap
            self.sem = asyncio.Semaphore(cap)
            self.holders: dict[str, str] = {}
            self.peak = 0
            self.attached = 0
            self.attaches = 0
            self.index: dict[str, list[str]] = {}

        async def attach(self) -> int:
            self.attached += 1
            self.attaches += 1
            return self.cap

        async def detach(self) -> int:
            self.attached -= 1
            return self.attached

        async def acquire(self, holder: str) -> dict[str, int]:
            await self.sem.acquire()
            self.holders[holder] = ""
            self.peak = max(self.peak, len(self.holders))
            return await self.load()

        async def started(self, holder: str, node: str) -> None:
            if holder in self.holders:
                self.holders[holder] = node

        async def where(self, holder: str) -> str:
            return self.holders.get(holder, "")

        async def release(self, holder: str) -> None:
            if self.holders.pop(holder, None) is not None:
                self.sem.release()

        async def load(self) -> dict[str, int]:
            out: dict[str, int] = {}
            for node in self.holders.values():
                if node:
                    out[node] = out.get(node, 0) + 1
            return out

        async def get_index(self) -> dict[str, list[str]]:
            return self.index

        async def set_images(self, node: str, images: list[str]) -> None:
            self.index[node] = sorted(images)

        async def add_image(self, node: str, image: str) -> None:
            self.index[node] = sorted({*self.index.get(node, []), image})

        async def stats(self) -> dict:
            return {"cap": self.cap, "in_flight": len(self.holders), "peak": self.peak,
                    "attached": self.attached, "attaches": self.attaches}

    _DISPATCHER = Dispatcher
    return Dispatcher


def connect(address: str):
    """``ray.init`` against an existing cluster (never starts one). Returns True when this
    call initialised Ray (so the caller shuts it down), False when it already was.

    Raises: RayUnavailable naming ``ray_address`` and how to start a cluster.
    """
    ray = _import_ray()
    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
                 logging_level="warning", configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayUnavailable(
            f"ray_address={address!r}: no Ray cluster to connect to ({type(exc).__name__}: "
            f"{exc}); start one first (`ray start --head` on one node, `ray start --address "
            f"HEAD:6379 --resources '{{\"{SANDBOX_RESOURCE}\": 24}}'` on sandbox nodes; "
            "docs/scale-out.md)") from exc
    return True


def sandbox_nodes() -> list[str]:
    """Ids (hex) of the live nodes that offer :data:`SANDBOX_RESOURCE`, sorted."""
    ray = _import_ray()
    return sorted(n["NodeID"] for n in ray.nodes()
                  if n.get("Alive") and n.get("Resources", {}).get(SANDBOX_RESOURCE, 0) > 0)


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


class RayTrials:
    """Verifier trials as Ray tasks on the cluster's sandbox nodes (see the module docstring).

    Args:
        run_id: the run (container label, dispatcher name); every rank passes the same.
        options: :class:`RayOptions`.

    Thread-safe: the pool calls :meth:`run_trial` from its worker threads.
    ``stats``: ``dispatched``, ``node_failures`` (Ray-level failures: node or worker death),
    ``pulls`` (images a node pulled for a trial), ``by_node`` (node id → trials served).

    Raises:
        RayUnavailable: Ray missing, no cluster at ``options.address``, or no sandbox node.
        ValueError: ``options.max_in_flight`` differs from the cap the run's dispatcher
            already has (another rank started it with another value).
    """

    def __init__(self, run_id: str, options: RayOptions | None = None) -> None:
        self.ray = _import_ray()
        self.run_id = run_id
        self.options = options or RayOptions()
        self._own_init = connect(self.options.address)
        if not sandbox_nodes():
            self._shutdown()
            raise RayUnavailable(
                f"no live Ray node offers the {SANDBOX_RESOURCE!r} resource, so no node may "
                f"run sandboxes; start sandbox nodes with `ray start --address HEAD:PORT "
                f"--resources '{{\"{SANDBOX_RESOURCE}\": 24}}'`")
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # on the trainer's own node, so that losing a sandbox node never takes the cap with it
        here = self.ray.get_runtime_context().get_node_id()
        self.dispatcher = dispatcher_class().options(
            name=dispatcher_name(run_id), namespace=NAMESPACE, lifetime="detached",
            get_if_exists=True, scheduling_strategy=NodeAffinitySchedulingStrategy(
                here, soft=True)).remote(self.options.max_in_flight)
        cap = self.ray.get(self.dispatcher.attach.remote())
        self._attached = True
        if cap != self.options.max_in_flight:
            self.close()
            raise ValueError(f"sandbox_max_in_flight: {self.options.max_in_flight} here, but "
                             f"run {run_id}'s dispatcher caps at {cap} (every rank must agree)")
        self._lock = threading.Lock()
        self._nodes: tuple[float, list[str]] = (0.0, [])
        self._index: dict[str, list[str]] = {}
        self._failed: dict[str, set[str]] = {}
        self._turn = 0
        self._closed = False
        self.stats = {"dispatched": 0, "node_failures": 0, "pulls": 0, "by_node": {}}
        from sandbox.ray_node import run_trial_here

        self._task = self.ray.remote(run_trial_here)  # exported once, not per trial
        self._refresh_index()

    # -- placement -------------------------------------------------------------
    def alive_nodes(self) -> list[str]:
        """Live sandbox nodes, re-read at most every :data:`NODES_TTL_S` seconds."""
        with self._lock:
            read_at, nodes = self._nodes
            if time.monotonic() - read_at < NODES_TTL_S:
                return nodes
        nodes = sandbox_nodes()
        with self._lock:
            self._nodes = (time.monotonic(), nodes)
        if set(nodes) - set(self._index):
            self._refresh_index(nodes)
        return nodes

    def _refresh_index(self, nodes: list[str] | None = None) -> None:
        """Read the dispatcher's node → images index; list the nodes it lacks (each node's
        Podman, one pinned task per node) and store them there for the other ranks."""
        from sandbox.ray_node import list_images

        index = self.ray.get(self.dispatcher.get_index.remote())
        nodes = sandbox_nodes() if nodes is None else nodes
        todo = [n for n in nodes if n not in index]
        for node, images in on_each_node(list_images, self.run_id, self.options.podman_url,
                                         nodes=todo):
            index[node] = images
            self.dispatcher.set_images.remote(node, images)
        with self._lock:
            self._index = index

    def choose(self, spec: TrialSpec, load: dict[str, int]) -> str | None:
        """The preferred node for ``spec`` (:func:`choose_node` over this rank's index)."""
        with self._lock:
            self._turn += 1
            turn, index = self._turn, dict(self._index)
            avoid = set(self._failed.get(spec.trial_id, ()))
        return choose_node(spec.image, self.alive_nodes(), index, load, avoid, turn)

    def _task_options(self, node: str | None) -> dict:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        strategy = (NodeAffinitySchedulingStrategy(node, soft=True) if node else "SPREAD")
        return {"num_cpus": 0, "resources": {SANDBOX_RESOURCE: 1}, "max_retries": 0,
                "scheduling_strategy": strategy}

    # -- trials ----------------------------------------------------------------
    def run_trial(self, spec: TrialSpec) -> TrialResult:
        """Run one trial on a sandbox node; same result classes as a local runtime.

        A Ray-level failure (node died, worker crashed, task could not run) comes back as
        ``infra_error`` with an error naming the node where the attempt had started, and
        that node is avoided if the pool retries this trial. Never raises for a trial.
        """
        holder = f"{spec.trial_id}-{uuid.uuid4().hex[:8]}"
        t0 = time.monotonic()
        node = None
        try:
            load = self.ray.get(self.dispatcher.acquire.remote(holder))
            slot_wait = time.monotonic() - t0
            node = self.choose(spec, load)
            submitted = time.time()
            ref = self._task.options(**self._task_options(node)).remote(
                spec, self.run_id, self.options.podman_url, self.options.registry,
                self.dispatcher, holder)
            res, started = self.ray.get(ref)
            res.queue_wait_s = slot_wait + max(0.0, started - submitted)
        except self.ray.exceptions.RayError as exc:
            res = self._ray_failure(spec, holder, exc, preferred=node)
        finally:
            try:
                self.dispatcher.release.remote(holder)
            except self.ray.exceptions.RayError:
                pass
        self._account(spec, res)
        return res

    def _ray_failure(self, spec: TrialSpec, holder: str, exc: Exception,
                     preferred: str | None) -> TrialResult:
        """The ``infra_error`` result of an attempt Ray could not finish."""
        try:
            where = self.ray.get(self.dispatcher.where.remote(holder), timeout=30)
        except self.ray.exceptions.RayError:  # the dispatcher itself is gone
            where = ""
        where = where or preferred or ""
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        with self._lock:
            self.stats["node_failures"] += 1
            if where:
                self._failed.setdefault(spec.trial_id, set()).add(where)
            self._nodes = (0.0, [])  # re-read the live nodes before the next choice
        return TrialResult(trial_id=spec.trial_id, exit_class="infra_error", node=where,
                           error=f"ray: attempt on node {where[:12] or '?'} lost: "
                                 f"{type(exc).__name__}: {first}")

    def _account(self, spec: TrialSpec, res: TrialResult) -> None:
        from sandbox.images.pull import canonical

        with self._lock:
            self.stats["dispatched"] += 1
            if res.node:
                by_node = self.stats["by_node"]
                by_node[res.node] = by_node.get(res.node, 0) + 1
            if res.image_pull == "pulled":
                self.stats["pulls"] += 1
            if res.image_pull and res.node:
                img = canonical(spec.image)
                if img not in self._index.get(res.node, ()):
                    self._index[res.node] = sorted({*self._index.get(res.node, ()), img})
                    self.dispatcher.add_image.remote(res.node, img)

    # -- lifecycle -------------------------------------------------------------
    def dispatcher_stats(self) -> dict:
        """The dispatcher's ``{"cap", "in_flight", "peak", "attached", "attaches"}`` (ranks
        attached now / ever)."""
        return self.ray.get(self.dispatcher.stats.remote())

    def close(self) -> None:
        """Detach from the dispatcher; the last rank to detach removes the run's leftover
        containers on every live sandbox node (attempts of a lost worker leave theirs) and
        kills the dispatcher. Shuts Ray down when this object connected it."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        if getattr(self, "_attached", False):
            from sandbox.ray_node import gc_here

            try:
                if self.ray.get(self.dispatcher.detach.remote()) <= 0:
                    on_each_node(gc_here, self.run_id)
                    self.ray.kill(self.dispatcher)
            except self.ray.exceptions.RayError:
                pass
        self._shutdown()

    def _shutdown(self) -> None:
        if self._own_init and self.ray.is_initialized():
            self.ray.shutdown()

    def __enter__(self) -> RayTrials:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RayRoutedRuntime(PodmanRuntime):
    """A :class:`~sandbox.podman_runtime.PodmanRuntime` whose agent sessions stay on this
    machine (a private local service, or ``agent_endpoints``) and whose verifier trials go to
    the Ray cluster (:class:`RayTrials`, attribute ``trials``). What ``make_runtime(...,
    backend="ray")`` returns, so the trainer, ``eval.run``, ``eval.controls`` and the pilot
    keep one runtime object and one :class:`~sandbox.pool.VerifierPool`.

    Raises: RayUnavailable, ValueError (see :class:`RayTrials`), PodmanUnavailable.
    """

    def __init__(self, *, run_id: str, options: RayOptions | None = None,
                 agent_endpoints: list[str] | None = None) -> None:
        self.trials = RayTrials(run_id, options)
        try:
            super().__init__(endpoints=None, run_id=run_id, agent_endpoints=agent_endpoints)
        except BaseException:
            self.trials.close()
            raise

    def run_trial(self, spec: TrialSpec) -> TrialResult:
        """Run ``spec`` on the cluster (:meth:`RayTrials.run_trial`)."""
        return self.trials.run_trial(spec)

    def close(self) -> None:
        """Close the Ray side (:meth:`RayTrials.close`), then the local service."""
        self.trials.close()
        super().close()
