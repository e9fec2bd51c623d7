"""Batched evaluation rollouts: many episodes in flight, one generation call per round.

:func:`run_batched` keeps up to ``batch_size`` slots (task, rollout index) in flight. Each
round it calls the engine once (``Policy.generate_batch``: one left-padded ``model.generate``
over every episode waiting for its next assistant turn; or vLLM, :mod:`.vllm_engine`), then
runs the parsed tool calls of every episode concurrently in a thread pool of
``agent_concurrency`` workers - one job per episode and turn, so an episode's own calls run in
order, and its environment's turn counter (its own :class:`~ecredit_trl.agent.env.AgentContext`
view) tags them with that episode's turn. Environment resets and the finished episode's records
(snapshots, artifact) run in the same pool; the tokenizer (prompts, parsing, tool suffixes) is
used on the calling thread only. A slot's row is handed to ``emit`` (append + flush)
the moment its episode's records are done, and a new slot takes its place.

Each episode follows :class:`~ecredit_trl.agent.episode.EpisodeTurns`, the rules the
one-at-a-time loop uses (budget, context, stop reasons, last turn not executed). Sampling uses
one ``torch.Generator`` per episode seeded with its ``sampling_seed`` (``Policy.row_sampler``),
which draws what ``torch.manual_seed(sampling_seed)`` + the one-row loop draws: seeded rows do
not depend on the batch they ran in. Greedy (``temperature=0``) rows equal the one-at-a-time
rows; a padded batch may round logits differently in the last bits, which could flip a near-tie
(not seen on the embedded policy; ``tests/test_batched_rollouts.py`` checks it).
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass

from ecredit_trl.agent.env import env_for, release
from ecredit_trl.agent.episode import (
    EpisodeTurns,
    rollout_row,
    run_tool_calls,
)
from ecredit_trl.agent.generation import GenerationSettings, Policy, rollout_seed
from ecredit_trl.agent.prompts import task_prompt

__all__ = ["MAX_GATHER_S", "episode_context", "run_batched"]

#: Upper bound of the adaptive gather window (seconds), see :func:`run_batched`.
MAX_GATHER_S = 5.0


def episode_context(ctx):
    """A view of the shared :class:`AgentContext` for one episode: same tasks, runtime, limits,
    work root and base-store lock, its own ``turn`` (episodes in flight are at different turns);
    never removes the shared work root."""
    view = copy.copy(ctx)
    view.turn = 0
    view._owns_workroot = False
    return view


@dataclass
class _Slot:
    """One episode in flight; ``phase``: ``setup`` / ``tools`` / ``finish`` while ``fut`` runs,
    ``generate`` while it waits for the engine."""

    task: object
    index: int
    env: object
    rseed: int
    t_start: float
    phase: str = "setup"
    fut: object = None
    turns: EpisodeTurns | None = None
    sampler: object = None
    limit: int = 0
    setup_s: float = 0.0


def _setup(slot: _Slot) -> None:
    """Reset the slot's environment (pool thread; the prompt is rendered on the main thread,
    which alone uses the tokenizer)."""
    slot.env.ctx.turn = 0
    slot.env.reset(instance_id=slot.task.instance_id)
    slot.setup_s = time.monotonic() - slot.t_start


def _tools(slot: _Slot, calls: list[dict]) -> list[dict]:
    t0 = time.monotonic()
    try:
        return run_tool_calls(calls, slot.turns.tool_fns)
    finally:
        slot.turns.ep.tools_s += time.monotonic() - t0


def run_batched(policy: Policy, slots: Sequence[tuple[object, int]], ctx, *, seed: int,
                settings: GenerationSettings, emit: Callable[[dict], None], batch_size: int = 8,
                agent_concurrency: int = 4, engine=None, gather_s: float | None = None) -> dict:
    """Run the episodes of ``slots`` with up to ``batch_size`` in flight (module docstring).

    Args:
        policy: renders prompts and tool suffixes, parses turns (:class:`Policy`).
        slots: ``(task, rollout_index)`` pairs, started in this order.
        ctx: the shared :class:`~ecredit_trl.agent.env.AgentContext` (not closed here).
        seed: the run's sampling seed (each slot's is :func:`rollout_seed`).
        emit: called with each finished row (from a pool thread, one at a time).
        batch_size: episodes in flight (>= 1); agent_concurrency: pool threads (>= 1).
        engine: what generates (``generate_batch`` + ``row_sampler``); default ``policy``.
        gather_s: seconds a round with rows ready waits for running jobs (tool calls,
            resets) to join it; None: as long as the last generation call took (at most
            :data:`MAX_GATHER_S`, which is also the first round's window, so the first resets
            fill the batch) - merging saves about one call, waiting costs at most one.

    Returns: ``{"generate_s", "generate_calls", "generated_rows"}`` (wall seconds of the
        engine calls, their number, episode-turns they generated).

    Raises: ValueError for a batch size or concurrency < 1; the first error of a reset
        (unknown task, no ``repo_dir``) or of the model, after every started job has ended and
        every environment is released.
    """
    if batch_size < 1 or agent_concurrency < 1:
        raise ValueError(f"batch_size / agent_concurrency: must be >= 1, got {batch_size} / "
                         f"{agent_concurrency}")
    b = _Batcher(policy, engine or policy, ctx, seed=seed, settings=settings, emit=emit,
                 batch_size=batch_size, agent_concurrency=agent_concurrency, gather_s=gather_s)
    return b.run(slots)


class _Batcher:
    """The loop of :func:`run_batched`: slots in flight, their jobs in a thread pool."""

    def __init__(self, policy: Policy, engine, ctx, *, seed: int, settings: GenerationSettings,
                 emit, batch_size: int, agent_concurrency: int, gather_s: float | None) -> None:
        self.policy, self.engine, self.ctx, self.seed = policy, engine, ctx, seed
        self.settings, self.emit, self.batch_size, self.gather_s = (settings, emit, batch_size,
                                                                    gather_s)
        self.concurrency = agent_concurrency
        self.stats = {"generate_s": 0.0, "generate_calls": 0, "generated_rows": 0,
                      "last_call_s": 0.0}
        self.lock = threading.Lock()
        self.live: list[_Slot] = []
        self.pool = None

    def run(self, slots) -> dict:
        queue = deque(slots)
        self.pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="agent")
        try:
            while queue or self.live:
                self._top_up(queue)
                if not self._ready():
                    running = [s.fut for s in self.live if s.fut is not None]
                    if running:
                        wait(running, return_when=FIRST_COMPLETED)
                    self._collect()
                    self._top_up(queue)
                joining = [s.fut for s in self.live if s.phase in ("setup", "tools")]
                if self._ready() and joining:  # let resets / tool calls join for a while
                    wait(joining, timeout=_window(self.gather_s, self.stats),
                         return_when=ALL_COMPLETED)
                    self._collect()
                if self._ready():
                    _generate_round(self.engine, self._ready(), self.settings, self.stats,
                                    self.pool, self._advance)
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
            for slot in self.live:
                release(slot.env)
        self.stats.pop("last_call_s")
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in self.stats.items()}

    def _ready(self) -> list[_Slot]:
        return [s for s in self.live if s.phase == "generate"]

    def _top_up(self, queue: deque) -> None:
        while queue and len(self.live) < self.batch_size:
            task, i = queue.popleft()
            slot = _Slot(task, i, env_for(self.ctx.scaffold, episode_context(self.ctx)),
                         rollout_seed(self.seed, task.instance_id, i), time.monotonic())
            slot.fut = self.pool.submit(_setup, slot)
            self.live.append(slot)

    def _collect(self) -> None:
        """Take the results of finished jobs (re-raising a job's error)."""
        for slot in [s for s in self.live if s.fut is not None and s.fut.done()]:
            out = slot.fut.result()
            if slot.phase == "finish":
                self.live.remove(slot)
                continue
            if slot.phase == "setup":
                sc = getattr(self.policy, "scaffold", None)
                ids = self.policy.render_prompt(sc.prompt(slot.task) if sc is not None
                                                else task_prompt(slot.task))
                slot.turns = EpisodeTurns(self.policy, slot.env, ids, self.settings)
                slot.sampler = self.engine.row_sampler(slot.rseed)
            else:
                slot.turns.after_tools(out)
            self._advance(slot)

    def _advance(self, slot: _Slot) -> None:
        limit = None if slot.turns.done else slot.turns.begin_turn()
        if limit is None:
            slot.phase, slot.fut = "finish", self.pool.submit(self._finish, slot)
        else:
            slot.phase, slot.fut, slot.limit = "generate", None, limit

    def _finish(self, slot: _Slot) -> None:
        try:
            row = rollout_row(slot.env, slot.task, slot.turns.ep, rollout_index=slot.index,
                              seed=self.seed, rseed=slot.rseed, setup_s=slot.setup_s,
                              t_start=slot.t_start)
        finally:
            release(slot.env)
        with self.lock:
            self.emit(row)


def _window(gather_s: float | None, stats: dict) -> float:
    """Seconds ready rows wait for running jobs: ``gather_s`` when given, else the last
    generation call's seconds (:data:`MAX_GATHER_S` before the first call), capped."""
    if gather_s is not None:
        return gather_s
    return min(stats["last_call_s"], MAX_GATHER_S) if stats["generate_calls"] else MAX_GATHER_S


def _generate_round(engine, batch: list[_Slot], settings: GenerationSettings, stats: dict,
                    pool: ThreadPoolExecutor, advance) -> None:
    """One engine call for ``batch``; each slot's share of its seconds goes to its
    ``generate_s``; parsed calls go to the pool, ended episodes to ``advance``."""
    t0 = time.monotonic()
    news = engine.generate_batch([s.turns.context() for s in batch], [s.limit for s in batch],
                                 settings, [s.sampler for s in batch])
    dt = time.monotonic() - t0
    stats["generate_s"] += dt
    stats["last_call_s"] = dt
    stats["generate_calls"] += 1
    stats["generated_rows"] += len(batch)
    for slot, new in zip(batch, news, strict=True):
        t1 = time.monotonic()
        calls = slot.turns.take(new)
        slot.turns.ep.gen_s += dt / len(batch) + (time.monotonic() - t1)
        if calls is None:
            advance(slot)
        else:
            slot.phase, slot.fut = "tools", pool.submit(_tools, slot, calls)
