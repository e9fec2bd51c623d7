"""Tool calls of TRL's tool loop in parallel across rollouts, with TRL's own results.

TRL 1.16's ``GRPOTrainer._tool_call_loop`` runs, in each iteration, the tool calls of
every rollout that asked for some, **one rollout after another** (one rollout's
``pytest`` blocks all others). :class:`ToolPrefetcher` keeps that loop and its
bookkeeping (overlong rollback, tool masks, failure counts) as TRL wrote it and only
replaces ``trainer._sync_tool_dicts`` for the duration of the loop:

* the first time TRL reads a rollout's tool dict in an iteration, the prefetcher works out
  the exact set of rollouts TRL will call tools for in this iteration (from the
  ``completions`` TRL mutates in place, with TRL's rules, below) and submits **one job per
  rollout** to a thread pool; a job runs that rollout's calls in order with TRL's
  semantics (``type == "function"``, name in the dict, ``fn(**arguments)``);
* TRL then calls proxies, which hand back the prefetched results in order (an exception
  the tool raised is re-raised, so TRL turns it into ``{"error": str(e)}`` and counts
  ``tool_failure_count`` exactly as before).

Which rollouts TRL calls in iteration k (read from TRL 1.16's loop):

* k = 0: rows whose ``completions[i][0]`` carries ``tool_calls``;
* k ≥ 1: rows called in iteration k-1 that were not rolled back as overlong (TRL deletes
  the tool messages it appended, so the row's length falls back), whose post-tool
  completion was not empty (an empty one is not appended) and whose last message, the
  post-tool completion, carries ``tool_calls``; TRL appends exactly one tool message per
  tool call, so a continuing row has grown by ``len(tool_calls) + 1`` messages;
* no iteration runs past ``max_tool_calling_iterations`` (TRL stops reading the dicts).

Every read of a tool dict is checked against that set (order included), every proxied
call against the prefetched call (name and arguments), and nothing prefetched may be left
when TRL generates or leaves the loop: a difference is a bug here, so it raises
:class:`PrefetchMismatch` (a ``BaseException``: TRL's ``except Exception`` around a tool
call would otherwise turn it into an ordinary tool error) instead of running anything else.

:func:`prefetch_resets` does the same for TRL's ``environment.reset`` calls, which TRL
also makes one after another (working tree, snapshot store and container of each rollout).

An episode ends when its rollout leaves the loop; ``on_episode_end(i)`` is called for it
as soon as that is known (before the generation that follows an overlong rollback, at the
start of the next iteration, or when the loop returns), in ascending row order within
one moment.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field


class PrefetchMismatch(BaseException):
    """TRL asked for something the prefetcher did not run (or left something it ran).

    A ``BaseException`` on purpose: TRL wraps every tool call in ``except Exception`` and
    would record this bug as the tool's error and go on."""


@dataclass
class PrefetchedCall:
    """One tool call run ahead of TRL: its name, arguments, result or exception, and its
    wall interval (monotonic seconds)."""

    name: str
    arguments: dict
    result: object = None
    error: BaseException | None = None
    started: float = 0.0
    ended: float = 0.0


@dataclass
class _RowJob:
    calls: list[PrefetchedCall]
    future: Future | None = None
    consumed: int = 0


@dataclass
class IterationTimes:
    """Wall intervals (monotonic seconds) the prefetcher saw: each job's ``(start, end)``
    and each tool phase (first read of an iteration's dicts → the generation after it)."""

    jobs: list[tuple[float, float]] = field(default_factory=list)
    phases: list[tuple[float, float]] = field(default_factory=list)


def expected_calls(tool_calls: list, tools: Mapping) -> list[tuple[str, dict]]:
    """The calls TRL 1.16 makes into ``tools`` for one rollout's ``tool_calls``, in order.

    TRL skips (records an error without calling anything) a call whose ``type`` is not
    ``"function"`` and a name it does not know; missing or non-mapping ``arguments`` fail
    (inside TRL's ``try``) before the function is entered. Raises KeyError where TRL's
    loop raises outside its ``try`` (a call without ``type``, a function without ``name``).
    """
    out = []
    for call in tool_calls:
        if call["type"] != "function":
            continue
        function = call["function"]
        name = function["name"]
        if name not in tools or "arguments" not in function:
            continue
        args = function["arguments"]
        if not isinstance(args, Mapping) or not all(isinstance(k, str) for k in args):
            continue
        out.append((name, dict(args)))
    return out


class ToolPrefetcher:
    """Stand-in for ``trainer._sync_tool_dicts`` during one ``_tool_call_loop``.

    Args:
        completions: TRL's per-row message lists (the very list TRL mutates).
        tool_dicts: the real per-row ``{name: callable}`` (TRL's ``_sync_tool_dicts``).
        executor: where the per-rollout jobs run (bounded by the trainer's
            ``agent_concurrency``).
        on_episode_end: called with the row index when its episode has ended (may be None).
        clock: monotonic seconds (tests may replace it).

    Use :attr:`dicts` in place of the real list, call :meth:`generation_started` before
    every generation inside the loop and :meth:`finish` when the loop returned.
    """

    def __init__(self, completions: list, tool_dicts: list, executor: Executor, *,
                 on_episode_end: Callable[[int], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.completions = completions
        self.real = tool_dicts
        self.executor = executor
        self.on_episode_end = on_episode_end
        self.clock = clock
        self.times = IterationTimes()
        self.iteration = -1  # the iteration whose dicts TRL is reading
        self._rows: list[int] = []  # rows TRL calls in this iteration, ascending
        self._pos = 0  # how many of them TRL has read
        self._base_len: dict[int, int] = {}  # len(completions[i]) at the iteration's start
        self._n_calls: dict[int, int] = {}  # tool calls row i asked for in this iteration
        self._jobs: dict[int, _RowJob] = {}
        self._live = set(range(len(completions)))  # rows whose episode has not ended
        self._phase_start: float | None = None
        self._lock = threading.Lock()
        self.dicts = _DictList(self)

    # -- the iteration's set -------------------------------------------------------
    def _next_rows(self) -> list[int]:
        if self.iteration < 0:
            return [i for i, c in enumerate(self.completions) if c[0].get("tool_calls")]
        rows = []
        for i in self._rows:
            c = self.completions[i]
            grown = len(c) == self._base_len[i] + self._n_calls[i] + 1
            if grown and c[-1].get("tool_calls"):
                rows.append(i)
        return rows

    def _start_iteration(self) -> None:
        self._check_consumed("a new tool-loop iteration")
        rows = self._next_rows()
        self.iteration += 1
        ended = self._live - set(rows)
        self._rows, self._pos = rows, 0
        self._phase_start = self.clock()
        self._jobs = {}
        for i in rows:
            calls = self.completions[i][-1]["tool_calls"]
            self._base_len[i] = len(self.completions[i])
            self._n_calls[i] = len(calls)
            job = _RowJob([PrefetchedCall(n, a) for n, a in expected_calls(calls, self.real[i])])
            if job.calls:
                job.future = self.executor.submit(self._run_row, i, job)
            self._jobs[i] = job
        self._end_episodes(ended)  # after the tool jobs: they are queued first

    def _run_row(self, i: int, job: _RowJob) -> None:
        start = self.clock()
        tools = self.real[i]
        for call in job.calls:
            call.started = self.clock()
            try:
                call.result = tools[call.name](**call.arguments)
            except Exception as exc:  # noqa: BLE001 - TRL's path: re-raised by the proxy
                call.error = exc
            call.ended = self.clock()
        with self._lock:
            self.times.jobs.append((start, self.clock()))

    def _end_episodes(self, rows) -> None:
        for i in sorted(rows):
            if i in self._live:
                self._live.discard(i)
                if self.on_episode_end is not None:
                    self.on_episode_end(i)

    def _check_consumed(self, where: str) -> None:
        left = {i: len(j.calls) - j.consumed for i, j in self._jobs.items()
                if j.consumed < len(j.calls)}
        if self._pos != len(self._rows) or left:
            raise PrefetchMismatch(
                f"tool prefetch, iteration {self.iteration}: at {where}, TRL read "
                f"{self._pos} of the tool dicts of rows {self._rows}; calls run ahead and not "
                f"asked for (row: count): {left}")

    # -- what TRL sees -------------------------------------------------------------------
    def row_dict(self, i: int) -> dict:
        """TRL reads row ``i``'s tool dict: the first read of an iteration prefetches it."""
        if self._pos >= len(self._rows):
            self._start_iteration()
        if self._pos >= len(self._rows) or self._rows[self._pos] != i:
            raise PrefetchMismatch(f"tool prefetch, iteration {self.iteration}: TRL read the "
                                   f"tool dict of row {i}, expected rows {self._rows} in order "
                                   f"(position {self._pos})")
        self._pos += 1
        job = self._jobs[i]
        return {name: _Proxy(self, i, job, name) for name in self.real[i]}

    def generation_started(self) -> None:
        """TRL is about to generate the post-tool turn: every prefetched call must have
        been handed out; rows rolled back as overlong have ended their episode."""
        if self.iteration < 0:
            return
        self._check_consumed("the generation")
        if self._phase_start is not None:
            self.times.phases.append((self._phase_start, self.clock()))
            self._phase_start = None
        self._end_episodes(i for i in self._rows
                           if len(self.completions[i]) == self._base_len[i])

    def finish(self) -> None:
        """The loop returned: check that nothing prefetched is left, end every remaining
        episode. Raises PrefetchMismatch when calls ran that TRL never asked for."""
        if self.iteration >= 0:
            self._check_consumed("the end of the tool loop")
        if self._phase_start is not None:  # the loop left without generating (all overlong)
            self.times.phases.append((self._phase_start, self.clock()))
            self._phase_start = None
        self._end_episodes(set(self._live))


class _ResetDone:
    """Stands in (as an instance attribute) for ``env.reset`` after a prefetched reset:
    TRL's own call returns what the real reset returned, once, if its row is the one
    that was used; then the class's ``reset`` is back."""

    def __init__(self, env, row: dict, result) -> None:
        self.env, self.row, self.result = env, row, result

    def __call__(self, **kwargs):
        del self.env.reset
        if kwargs != self.row:
            raise PrefetchMismatch(f"reset prefetch: TRL reset an environment with "
                                   f"{sorted(kwargs)} = {kwargs.get('instance_id')!r}, "
                                   f"prefetched {self.row.get('instance_id')!r}")
        return self.result


def prefetch_resets(envs: list, rows: list[dict], executor: Executor) -> None:
    """Reset ``envs[i]`` with ``rows[i]`` concurrently on ``executor``, before TRL resets
    them one after another; TRL's calls then only check the row and return the result.

    Raises what a reset raised (the first in row order; then no environment keeps a
    prefetched reset, and TRL's own calls reset them again)."""
    for env in envs:  # a prefetched reset TRL never asked for (a round that broke off)
        env.__dict__.pop("reset", None)
    futures = [executor.submit(lambda e=env, r=row: e.reset(**r))
               for env, row in zip(envs, rows, strict=True)]
    results = [f.result() for f in futures]
    for env, row, result in zip(envs, rows, results, strict=True):
        env.reset = _ResetDone(env, row, result)


def timed_tool_dicts(tool_dicts: list, record: Callable[[float, float], None],
                     clock: Callable[[], float] = time.monotonic) -> list[dict]:
    """The sequential path's tool dicts: same keys, each call run in place and its wall
    interval passed to ``record(start, end)`` (whatever it raised)."""
    def timed(fn):
        def call(**kwargs):
            start = clock()
            try:
                return fn(**kwargs)
            finally:
                record(start, clock())
        call.__name__ = getattr(fn, "__name__", "tool")
        return call
    return [{name: timed(fn) for name, fn in d.items()} for d in tool_dicts]


class _DictList:
    """The list TRL indexes as ``self._sync_tool_dicts[i]``."""

    def __init__(self, owner: ToolPrefetcher) -> None:
        self._owner = owner

    def __getitem__(self, i: int) -> dict:
        return self._owner.row_dict(i)

    def __len__(self) -> int:
        return len(self._owner.real)


class _Proxy:
    """One tool of one row: returns the next prefetched result of that row, checked."""

    def __init__(self, owner: ToolPrefetcher, row: int, job: _RowJob, name: str) -> None:
        self.owner, self.row, self.job, self.__name__ = owner, row, job, name

    def __call__(self, **kwargs):
        job = self.job
        if job.consumed >= len(job.calls):
            raise PrefetchMismatch(f"tool prefetch: row {self.row} called {self.__name__} "
                                   f"{kwargs!r}, but no prefetched call is left")
        call = job.calls[job.consumed]
        if call.name != self.__name__ or call.arguments != kwargs:
            raise PrefetchMismatch(f"tool prefetch: row {self.row} called {self.__name__} "
                                   f"{kwargs!r}, prefetched {call.name} {call.arguments!r}")
        job.consumed += 1
        job.future.result()  # the row's job: every call of the row in order
        if call.error is not None:
            raise call.error
        return call.result


__all__ = ["IterationTimes", "PrefetchMismatch", "PrefetchedCall", "ToolPrefetcher",
           "expected_calls", "prefetch_resets", "timed_tool_dicts"]
