"""The ``ray`` sandbox backend's trial runtime: :class:`RayTrials` and the
:class:`RayRoutedRuntime` that ``sandbox.backend.make_runtime`` returns for the ``ray`` backend
(design page, "Scale-out").

How a trial is dispatched (cap, placement, pulls, retries) is described in
:mod:`sandbox.cluster.dispatch`, which holds the cluster plumbing these classes use.
"""

from __future__ import annotations

import threading
import time
import uuid

from sandbox.cluster.dispatch import (
    NAMESPACE,
    NODES_TTL_S,
    SANDBOX_RESOURCE,
    RayOptions,
    RayUnavailable,
    _import_ray,
    choose_node,
    cluster_image_ids,
    connect,
    dispatcher_class,
    dispatcher_name,
    head_node,
    on_each_node,
    sandbox_nodes,
)
from sandbox.cluster.node import gate_here, gc_here, list_images, run_trial_here
from sandbox.cluster.reaper import LEASE_RENEW_S
from sandbox.cluster.workspace_proxy import RayWorkspaces
from sandbox.doctor.gate import DOCTOR_TIMEOUT_S, NODE_UNHELD, NodeVerdict
from sandbox.images.pull import canonical
from sandbox.runtimes.podman_runtime import PodmanRuntime
from sandbox.runtimes.protocol import runtime_flags
from sandbox.trials.trial import TrialResult, TrialSpec

ATTACH_TRIES = 60
"""Attempts (0.5 s apart) to attach to the run's dispatcher while one found is ending."""


class RayTrials:
    """Verifier trials as Ray tasks on the cluster's sandbox nodes (see the module docstring).

    Args:
        run_id: the run (container label, dispatcher name); every rank passes the same.
        options: :class:`RayOptions`.

    Thread-safe: the pool calls :meth:`run_trial` from its worker threads.
    ``stats``: ``dispatched``, ``node_failures`` (Ray-level failures: node or worker death),
    ``pulls`` (images a node pulled for a trial), ``by_node`` (node id → trials served),
    ``refused`` (node id → why its gate refused it), ``unheld`` (node id → the rules that
    did not hold on a node that serves because ``options.allow_unheld``) and
    ``node_rule_unheld`` (trials such nodes served).

    **The gate** (design page, "Threat model"): before a sandbox node first serves this
    rank, :func:`sandbox.cluster.node.gate_here` runs on it (the doctor report cached for
    its host's facts, else a doctor run there; :mod:`sandbox.doctor.gate`). A refused node
    gets no trial and no workspace (placement is then pinned to the serving nodes).

    Raises:
        RayUnavailable: Ray missing, no cluster at ``options.address``, no sandbox node, or
            every sandbox node refused by its gate (the message names each node's reason).
        ValueError: ``options.max_in_flight`` differs from the cap the run's dispatcher
            already has (another rank started it with another value).
    """

    def __init__(self, run_id: str, options: RayOptions | None = None) -> None:
        self.ray = _import_ray()
        self.run_id = run_id
        self.options = options or RayOptions()
        self._own_init = connect(self.options.address, self.options.allow_unauthenticated)
        if not sandbox_nodes():
            self._shutdown()
            raise RayUnavailable(
                f"no live Ray node offers the {SANDBOX_RESOURCE!r} resource, so no node may "
                f"run sandboxes; start sandbox nodes with `ray start --address HEAD:PORT "
                f"--resources '{{\"{SANDBOX_RESOURCE}\": 24}}'`")
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # pinned (hard) to the head node, where Ray's own singletons live, never on a
        # sandbox node that may be lost: a soft preference was seen spilled to a sandbox node
        # here, and the driver's "own" node is ambiguous when nodes share an IP
        head = head_node()
        # the job id lets the dispatcher reap the run if this driver dies unannounced
        self._job = self.ray.get_runtime_context().get_job_id()
        for _ in range(ATTACH_TRIES):  # the one found may be ending (it reaped dead drivers)
            self.dispatcher = dispatcher_class().options(
                name=dispatcher_name(run_id), namespace=NAMESPACE, lifetime="detached",
                get_if_exists=True, scheduling_strategy=NodeAffinitySchedulingStrategy(
                    head, soft=False) if head else "DEFAULT").remote(self.options.max_in_flight)
            try:
                cap = self.ray.get(self.dispatcher.attach.remote(
                    self._job, self.ray.get_runtime_context().get_node_id()))
            except self.ray.exceptions.RayActorError:
                cap = 0
            if cap:
                break
            time.sleep(0.5)
        else:
            self._shutdown()
            raise RayUnavailable(f"run {run_id}'s dispatcher kept ending for "
                                 f"{ATTACH_TRIES * 0.5:.0f} s; try again")
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
        self.stats = {"dispatched": 0, "node_failures": 0, "pulls": 0, "by_node": {},
                      "refused": {}, "unheld": {}, NODE_UNHELD: 0}
        self._verdicts: dict[str, NodeVerdict] = {}

        self._task = self.ray.remote(run_trial_here)  # exported once, not per trial
        self._lease_stop = threading.Event()
        if not self.alive_nodes():
            refused = "; ".join(f"node {n[:12]}: {why}"
                                for n, why in sorted(self.stats["refused"].items()))
            self.close()
            raise RayUnavailable(f"every sandbox node was refused by its gate ({refused}); "
                                 "run `python -m sandbox doctor` on a node to see why, or "
                                 "pass --sandbox-allow-unheld to let such nodes serve")
        threading.Thread(target=self._renew_lease, name="ecredit-ray-lease", daemon=True).start()

    def _renew_lease(self) -> None:
        """Renew this rank's lease with the dispatcher every LEASE_RENEW_S seconds until
        :meth:`close` (the reaper's positive evidence of a live run: a job missing from the
        job table is dead only once its lease expired, sandbox.cluster.reaper)."""
        while not self._lease_stop.wait(LEASE_RENEW_S):
            try:
                self.ray.get(self.dispatcher.renew.remote(self._job), timeout=LEASE_RENEW_S)
            except Exception:  # noqa: BLE001 - a missed renewal; the next one may land
                continue

    # -- placement -------------------------------------------------------------
    def alive_nodes(self) -> list[str]:
        """Live sandbox nodes that passed their gate (a new node is gated first), re-read
        at most every :data:`NODES_TTL_S` seconds."""
        with self._lock:
            read_at, nodes = self._nodes
            if time.monotonic() - read_at < NODES_TTL_S:
                return nodes
        nodes = sandbox_nodes()
        self._gate([n for n in nodes if n not in self._verdicts])
        nodes = [n for n in nodes if self._verdicts[n].serve]
        with self._lock:
            self._nodes = (time.monotonic(), nodes)
        if set(nodes) - set(self._index):
            self._refresh_index(nodes)
        return nodes

    def _gate(self, nodes: list[str]) -> None:
        """Ask each of ``nodes`` for its gate (:func:`sandbox.cluster.node.gate_here`); a node
        that does not answer is refused."""
        if not nodes:
            return
        got = dict(on_each_node(gate_here, self.options.allow_unheld, nodes=nodes,
                                timeout_s=DOCTOR_TIMEOUT_S + 60))
        with self._lock:
            for node in nodes:
                v = got.get(node) or NodeVerdict(False, ["gate"], reason="the node's gate "
                                                 "did not answer")
                self._verdicts[node] = v
                if not v.serve:
                    self.stats["refused"][node] = v.reason
                elif v.unheld:
                    self.stats["unheld"][node] = list(v.unheld)

    def _refresh_index(self, nodes: list[str] | None = None) -> None:
        """Read the dispatcher's node → images index; list the nodes it lacks (each node's
        Podman, one pinned task per node) and store them there for the other ranks."""
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

    def _task_options(self, node: str | None, hard: bool = False) -> dict:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        strategy = (NodeAffinitySchedulingStrategy(node, soft=not hard) if node else "SPREAD")
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
            load = self.ray.get(self.dispatcher.acquire.remote(holder, self._job))
            slot_wait = time.monotonic() - t0
            node = self.choose(spec, load)
            hard = bool(self.stats["refused"])  # never spill onto a refused node
            if node is None and hard:
                alive = self.alive_nodes()
                node = min(alive, key=lambda n: load.get(n, 0)) if alive else None
            submitted = time.time()
            ref = self._task.options(**self._task_options(node, hard)).remote(
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
        with self._lock:
            self.stats["dispatched"] += 1
            verdict = self._verdicts.get(res.node)
            if verdict is not None and verdict.unheld:
                res.node_unheld = list(verdict.unheld)
                self.stats[NODE_UNHELD] += 1
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
        if getattr(self, "_lease_stop", None) is not None:
            self._lease_stop.set()
        if getattr(self, "_attached", False):
            try:
                if self.ray.get(self.dispatcher.detach.remote(self._job)) <= 0:
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
    """A :class:`~sandbox.runtimes.podman_runtime.PodmanRuntime` whose verifier trials go to the Ray
    cluster (:class:`RayTrials`, attribute ``trials``) and whose agent workspaces live on its
    sandbox nodes too (:meth:`open_workspace`, :mod:`sandbox.cluster.workspace_host`, attribute
    ``workspaces``); the local service remains for callers that open sessions directly. What
    ``make_runtime`` returns for ``SandboxOptions(backend="ray")``, so the trainer,
    ``eval.run``, ``eval.controls`` and the pilot keep one runtime object and one
    :class:`~sandbox.trials.pool.VerifierPool`.

    Implements :class:`sandbox.runtimes.protocol.Runtime` (``kind="podman"``,
    ``backend="ray"``).

    Raises: RayUnavailable, ValueError (see :class:`RayTrials`), PodmanUnavailable.
    """

    backend = "ray"

    def __init__(self, *, run_id: str, options: RayOptions | None = None,
                 agent_endpoints: list[str] | None = None) -> None:
        self.trials = RayTrials(run_id, options)
        self.workspaces = None  # sandbox.cluster.workspace_host.RayWorkspaces, made on first use
        self._ws_lock = threading.Lock()
        try:
            super().__init__(endpoints=None, run_id=run_id, agent_endpoints=agent_endpoints)
        except BaseException:
            self.trials.close()
            raise

    def run_trial(self, spec: TrialSpec) -> TrialResult:
        """Run ``spec`` on the cluster (:meth:`RayTrials.run_trial`)."""
        return self.trials.run_trial(spec)

    def argv(self) -> list[str]:
        """The Ray flags of this runtime and ``--sandbox-run-id``: the child joins this run's
        dispatcher, so parent and child share one cluster-wide cap and the child's sandboxes
        are reaped with the run."""
        o = self.trials.options
        return runtime_flags(self.kind, self.backend, ray_address=o.address,
                             max_in_flight=o.max_in_flight, podman_url=o.podman_url,
                             image_registry=o.registry, run_id=self.trials.run_id,
                             allow_unheld=o.allow_unheld,
                             allow_unauthenticated=o.allow_unauthenticated)

    def image_ids(self, images) -> dict[str, str | None]:
        """image → id in the sandbox nodes' storage (:func:`sandbox.cluster.dispatch.cluster_image_ids`):
        what :func:`eval.tasks.presence.require_task_images` checks and records on this backend."""
        return cluster_image_ids(images, run_id=self.trials.run_id,
                                 podman_url=self.trials.options.podman_url)

    def open_workspace(self, task, site):
        """A rollout's workspace on a sandbox node (:meth:`RayWorkspaces.open`; the agent
        context calls it instead of building the workspace here)."""
        with self._ws_lock:
            if self.workspaces is None:
                self.workspaces = RayWorkspaces(self.trials)
        return self.workspaces.open(task, site)

    def close(self) -> None:
        """Close the agent workspaces on the nodes, the Ray side (:meth:`RayTrials.close`),
        then the local service."""
        if self.workspaces is not None:
            self.workspaces.close()
        self.trials.close()
        super().close()
