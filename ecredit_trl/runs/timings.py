"""Per-round stage timings of the training step: who was busy, who waited.

:class:`RoundClock` collects wall intervals (monotonic seconds) of one generation round
from any thread; :func:`stage_timings` turns them into the ledger's timing fields with
pure functions. Busy seconds are **unions** of intervals (time during which at least one
unit of the stage was running), so a stage that runs 4 things at once for 1 s is busy 1 s;
that is what a ratio ``wall / max(stage busy)`` needs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

TIMING_FIELDS = ("generation_busy_s", "tool_busy_s", "verifier_busy_s", "generation_wait_s",
                 "verifier_idle_s", "rollout_setup_s")
"""Ledger fields written by :func:`stage_timings` (seconds; ``wall_s`` stays where it was)."""


def union_seconds(intervals, lo: float | None = None, hi: float | None = None) -> float:
    """Length of the union of ``intervals`` (``(start, end)`` seconds), clipped to
    ``[lo, hi]`` when given. Empty or reversed intervals count 0."""
    spans = sorted((max(a, lo) if lo is not None else a, min(b, hi) if hi is not None else b)
                   for a, b in intervals)
    total, cur_a, cur_b = 0.0, None, None
    for a, b in spans:
        if b <= a:
            continue
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


def gaps_seconds(intervals) -> float:
    """Sum of the gaps between consecutive intervals (sorted by start; overlaps count 0)."""
    spans = sorted(intervals)
    return sum(max(0.0, b[0] - a[1]) for a, b in zip(spans, spans[1:], strict=False))


@dataclass
class RoundClock:
    """Wall intervals of one generation round, recorded from any thread.

    Attributes:
        start: when the round began (before the sandbox health check; the ledger's
            ``wall_s`` is measured from the same instant).
        generation: each generation call (TRL's ``_generate_single_turn``).
        tools: each tool call, or each rollout's batch of tool calls of one iteration
            (overlapped pipeline: its job on the agent pool).
        trials: each verifier trial's service interval (picked up by a worker → result),
            queue wait excluded, retries included.
    """

    start: float
    generation: list[tuple[float, float]] = field(default_factory=list)
    tools: list[tuple[float, float]] = field(default_factory=list)
    trials: list[tuple[float, float]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, stage: str, start: float, end: float) -> None:
        """Record ``(start, end)`` under ``stage`` (generation, tools or trials)."""
        with self._lock:
            getattr(self, stage).append((start, end))


def stage_timings(clock: RoundClock, end: float) -> dict[str, float]:
    """The round's timing fields (seconds, rounded to 0.1 ms), window ``[clock.start, end]``.

    * ``generation_busy_s``: union of the generation calls;
    * ``tool_busy_s``: union of the tool calls (concurrent calls count once);
    * ``verifier_busy_s``: union of the trials' service intervals (concurrency-aware: two
      trials at once for 1 s give 1 s; the summed service seconds stay in
      ``setup_s + verify_s + cleanup_s``);
    * ``generation_wait_s``: gaps between consecutive generation calls of the round, i.e.
      the time generation waited for the tool calls of the loop's iterations;
    * ``verifier_idle_s``: the round's wall time with no trial running;
    * ``rollout_setup_s``: round start → first generation (the sandbox health check, then
      the environment resets: working tree, snapshot store, container of every rollout;
      TRL makes them one after another, the overlapped pipeline concurrently).
    """
    lo, hi = clock.start, end
    with clock._lock:
        gen, tools, trials = list(clock.generation), list(clock.tools), list(clock.trials)
    verifier = union_seconds(trials, lo, hi)
    first_gen = min((a for a, _ in gen), default=hi)
    out = {"generation_busy_s": union_seconds(gen, lo, hi),
           "tool_busy_s": union_seconds(tools, lo, hi),
           "verifier_busy_s": verifier,
           "generation_wait_s": gaps_seconds(gen),
           "verifier_idle_s": max(0.0, (hi - lo) - verifier),
           "rollout_setup_s": max(0.0, first_gen - lo)}
    return {k: round(v, 4) for k, v in out.items()}


__all__ = ["TIMING_FIELDS", "RoundClock", "gaps_seconds", "stage_timings", "union_seconds"]
