"""A killed trainer leaves nothing running on any node (``sandbox_backend=ray``).

A dead driver's Ray tasks and non-detached actors die with it (Ray fate-shares them with
their owner), but a trial's container is Podman's, not a child of the Ray worker, so it
outlives the worker; and the run's dispatcher (:mod:`sandbox.cluster.dispatch`) is detached on
purpose, so that it outlives any one rank. :class:`RunReaper`, a base of the dispatcher
actor, closes that gap:

* every rank attaches with its Ray job id and its driver's node, and renews the run's
  lease every :data:`LEASE_RENEW_S` seconds while it lives; every :data:`REAP_POLL_S`
  seconds the dispatcher reads the cluster's job and node tables (:func:`jobs_alive`);
* a job is dead only with positive evidence: its row says ``IsDead``, or, absent from
  the job table (a head restarted with GCS fault tolerance loses old jobs), its driver's
  node is gone from the node table or its lease is older than :data:`LEASE_S`. A job
  merely missing from the table is alive: a live run's containers are never swept;
* once every attached job is dead without having detached, it removes the run's containers
  on every live sandbox node (:func:`sandbox.cluster.dispatch.reap_run`: :func:`sandbox.cluster.node.gc_here` pinned
  to each node, twice, :data:`REAP_GRACE_S` apart, for a worker that was still creating one)
  and ends itself;
* a new driver of the run attaching before that (a resume right after a crash) makes it
  reap first and start clean, so the dead session's slots are not held forever; while it
  ends, attaches are refused (cap 0) and the rank makes a new dispatcher;
* when only some ranks died (or the job table had not yet marked an old driver dead), the
  slots their trials held are freed at the next poll; their containers go with the run's
  last ``close``.

``python -m sandbox gc --ray-address`` remains for a dispatcher that died too (its node lost).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable

REAP_POLL_S = 2.0
"""Seconds between the dispatcher's reads of the job table (is a rank's driver alive?)."""
REAP_GRACE_S = 3.0
"""Seconds between the two container sweeps of a run whose drivers all died."""
LEASE_RENEW_S = 10.0
"""Seconds between a live rank's renewals of its lease with the dispatcher."""
LEASE_S = 60.0
"""Age (s) past which the lease of a job absent from the job table has expired: six missed
renewals, far beyond a driver busy in a long step (the renewal runs in a thread of its
own), short enough that a dead run's containers go within a minute or two."""


def jobs_alive(jobs: set[str], table: list[dict] | None = None, *,
               nodes: list[dict] | None = None, driver_node: dict[str, str] | None = None,
               renewed: dict[str, float] | None = None, now: float = 0.0,
               lease_s: float = LEASE_S) -> set[str]:
    """Those of ``jobs`` (Ray job ids, hex) not known dead (module docstring).

    Args:
        table: rows of ``ray._private.state.jobs()`` (``JobID``, ``IsDead``), read now when
            None. Ray has no public job-table call that works without the dashboard; this
            one has been stable since Ray 1.x.
        nodes: rows of ``ray.nodes()`` (``NodeID``, ``Alive``), read now when None and a
            job is missing from ``table``.
        driver_node: job → the node id (hex) its driver attached from.
        renewed: job → when its lease was last renewed; ``now`` on the same clock (s).

    A job whose row says ``IsDead`` is dead. A job absent from ``table`` is dead only when
    its driver's node is known and is not alive in ``nodes`` (absent from a non-empty node
    table, or ``Alive`` false), or its lease is known and older than ``lease_s``.
    """
    if table is None:
        from ray._private import state

        table = state.jobs()
    rows = {row["JobID"]: row for row in table if row["JobID"] in jobs}
    alive = {j for j, row in rows.items() if not row.get("IsDead")}
    missing = jobs - set(rows)
    if not missing:
        return alive
    driver_node, renewed = driver_node or {}, renewed or {}
    if nodes is None and any(driver_node.get(j) for j in missing):
        import ray

        nodes = ray.nodes()
    live_nodes = {n["NodeID"] for n in nodes or [] if n.get("Alive")}
    for j in missing:
        node = driver_node.get(j)
        node_gone = bool(node) and bool(nodes) and node not in live_nodes
        expired = j in renewed and now - renewed[j] > lease_s
        if not (node_gone or expired):
            alive.add(j)
    return alive


class RunReaper:
    """Base of the dispatcher actor: the jobs attached, the job each slot holder belongs to,
    and the reaping described in the module docstring.

    The actor class calls :meth:`reaper_init` in its ``__init__``, :meth:`join` /
    :meth:`leave` when a rank attaches / detaches, records ``holder_job[holder] = job`` when
    a slot is taken, and has the attributes ``cap``, ``sem`` (asyncio.Semaphore of ``cap``),
    ``holders`` (holder → node), ``attached`` and ``release(holder)`` (frees one slot).
    """

    def reaper_init(self, name_prefix: str, sweep: Callable[[str], object],
                    alive: Callable[..., set[str]] = jobs_alive) -> None:
        """``name_prefix``: the actor's name before the run id; ``sweep(run_id)``: removes
        the run's containers on every node (:func:`sandbox.cluster.dispatch.reap_run`);
        ``alive``: the rule reading the tables (:func:`jobs_alive`, its keyword arguments)."""
        self.name_prefix, self.sweep, self.alive_rule = name_prefix, sweep, alive
        self.jobs: set[str] = set()  # Ray job ids (hex) of the ranks attached now
        self.driver_node: dict[str, str] = {}  # job → the node its driver attached from
        self.renewed: dict[str, float] = {}  # job → time.monotonic() of its last renewal
        self.holder_job: dict[str, str] = {}
        self.watcher = None
        self.reaping = asyncio.Lock()
        self.ending = False

    async def join(self, job: str, node: str = "") -> bool:
        """Register ``job`` (may be "") attached from ``node`` (its driver's node id, hex;
        "" unknown) and start its lease; False when this actor is ending (the caller makes a
        new one once the name is free)."""
        if self.ending:
            return False
        if job and self.jobs and job not in self.jobs:
            await self.reap_if_dead()  # a resume: the earlier drivers may be dead
        if self.ending:  # the watcher ended this actor while the join waited for it
            return False
        if job:
            self.jobs.add(job)
            self.renewed[job] = time.monotonic()
            if node:
                self.driver_node[job] = node
            if self.watcher is None:  # needs the actor's running loop: not in __init__
                self.watcher = asyncio.get_running_loop().create_task(self.watch())
        return True

    def leave(self, job: str) -> None:
        self.jobs.discard(job)

    async def renew(self, job: str) -> bool:
        """Renew ``job``'s lease (every :data:`LEASE_RENEW_S` s from a live rank); False when
        the job is not attached (reaped, or never joined)."""
        if job not in self.jobs:
            return False
        self.renewed[job] = time.monotonic()
        return True

    def run_id(self) -> str:
        """The run this actor serves (its Ray actor name after ``name_prefix``)."""
        import ray

        return ray.get_runtime_context().get_actor_name()[len(self.name_prefix):]

    async def reap_if_dead(self) -> bool:
        """Free the slots of dead jobs; when every attached job is dead, reap the run
        (``sweep``) and start clean: no holder, every slot free. Returns whether it reaped."""
        loop = asyncio.get_running_loop()
        async with self.reaping:
            if not self.jobs:
                return False
            rule = functools.partial(self.alive_rule, set(self.jobs),
                                     driver_node=dict(self.driver_node),
                                     renewed=dict(self.renewed), now=time.monotonic())
            try:
                alive = await loop.run_in_executor(None, rule)
            except Exception:  # the tables could not be read now: ask again later
                return False
            if alive:
                for holder in [h for h, j in self.holder_job.items() if j not in alive]:
                    await self.release(holder)
                self.attached -= len(self.jobs - alive)
                self.jobs = alive
                return False
            await loop.run_in_executor(None, self.sweep, self.run_id())
            self.jobs, self.holder_job, self.holders, self.attached = set(), {}, {}, 0
            self.driver_node, self.renewed = {}, {}
            # dead callers still waiting on the old semaphore are never woken: harmless
            self.sem = asyncio.Semaphore(self.cap)
            return True

    async def watch(self) -> None:
        """Every :data:`REAP_POLL_S` s: :meth:`reap_if_dead`; after a reap with nobody
        attached meanwhile, end this actor."""
        import ray

        while True:
            await asyncio.sleep(REAP_POLL_S)
            if await self.reap_if_dead() and not self.jobs:
                self.ending = True  # ray.kill is asynchronous: refuse joins meanwhile
                ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
                return
