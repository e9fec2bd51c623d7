"""A killed trainer leaves nothing running on any node (``sandbox_backend=ray``).

A dead driver's Ray tasks and non-detached actors die with it (Ray fate-shares them with
their owner), but a trial's container is Podman's, not a child of the Ray worker, so it
outlives the worker; and the run's dispatcher (:mod:`sandbox.cluster.dispatch`) is detached on
purpose, so that it outlives any one rank. :class:`RunReaper`, a base of the dispatcher
actor, closes that gap:

* every rank attaches with its Ray job id; every :data:`REAP_POLL_S` seconds the dispatcher
  reads the cluster's job table (:func:`jobs_alive`);
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
from collections.abc import Callable

REAP_POLL_S = 2.0
"""Seconds between the dispatcher's reads of the job table (is a rank's driver alive?)."""
REAP_GRACE_S = 3.0
"""Seconds between the two container sweeps of a run whose drivers all died."""


def jobs_alive(jobs: set[str], table: list[dict] | None = None) -> set[str]:
    """Those of ``jobs`` (Ray job ids, hex) whose driver is alive: in ``table`` (rows of
    ``ray._private.state.jobs()``, read now when None) and not ``IsDead``. A job missing
    from the table counts as dead. Ray has no public job-table call that works without the
    dashboard; this one has been stable since Ray 1.x."""
    if table is None:
        from ray._private import state

        table = state.jobs()
    return {row["JobID"] for row in table if row["JobID"] in jobs and not row.get("IsDead")}


class RunReaper:
    """Base of the dispatcher actor: the jobs attached, the job each slot holder belongs to,
    and the reaping described in the module docstring.

    The actor class calls :meth:`reaper_init` in its ``__init__``, :meth:`join` /
    :meth:`leave` when a rank attaches / detaches, records ``holder_job[holder] = job`` when
    a slot is taken, and has the attributes ``cap``, ``sem`` (asyncio.Semaphore of ``cap``),
    ``holders`` (holder → node), ``attached`` and ``release(holder)`` (frees one slot).
    """

    def reaper_init(self, name_prefix: str, sweep: Callable[[str], object]) -> None:
        """``name_prefix``: the actor's name before the run id; ``sweep(run_id)``: removes
        the run's containers on every node (:func:`sandbox.cluster.dispatch.reap_run`)."""
        self.name_prefix, self.sweep = name_prefix, sweep
        self.jobs: set[str] = set()  # Ray job ids (hex) of the ranks attached now
        self.holder_job: dict[str, str] = {}
        self.watcher = None
        self.reaping = asyncio.Lock()
        self.ending = False

    async def join(self, job: str) -> bool:
        """Register ``job`` (may be ""); False when this actor is ending (the caller makes a
        new one once the name is free)."""
        if self.ending:
            return False
        if job and self.jobs and job not in self.jobs:
            await self.reap_if_dead()  # a resume: the earlier drivers may be dead
        if self.ending:  # the watcher ended this actor while the join waited for it
            return False
        if job:
            self.jobs.add(job)
            if self.watcher is None:  # needs the actor's running loop: not in __init__
                self.watcher = asyncio.get_running_loop().create_task(self.watch())
        return True

    def leave(self, job: str) -> None:
        self.jobs.discard(job)

    async def reap_if_dead(self) -> bool:
        """Free the slots of dead jobs; when every attached job is dead, reap the run
        (``sweep``) and start clean: no holder, every slot free. Returns whether it reaped."""
        import ray

        loop = asyncio.get_running_loop()
        async with self.reaping:
            if not self.jobs:
                return False
            try:
                alive = await loop.run_in_executor(None, jobs_alive, set(self.jobs))
            except Exception:  # the job table could not be read now: ask again later
                return False
            if alive:
                for holder in [h for h, j in self.holder_job.items() if j not in alive]:
                    await self.release(holder)
                self.attached -= len(self.jobs - alive)
                self.jobs = alive
                return False
            run_id = ray.get_runtime_context().get_actor_name()[len(self.name_prefix):]
            await loop.run_in_executor(None, self.sweep, run_id)
            self.jobs, self.holder_job, self.holders, self.attached = set(), {}, {}, 0
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
