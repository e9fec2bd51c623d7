"""Tool-loop bookkeeping of one rollout: format errors, calls never run, calls after submit.

Pure functions over the rollout's chat messages (TRL's completion: assistant messages
with ``tool_calls``, then one ``tool`` message per executed call) and the calls that
reached the environment (:class:`~ecredit_trl.agent.env.ToolCall`, each with its turn
and ``status``). Only the policy's own mistakes are format errors:

* a turn with no tool call before a submit;
* a call TRL ran that never reached the environment (unknown tool, bad arguments);
* a call the environment refused (``status == "error"``: the editor's errors).

Counted apart, never as format errors:

* ``calls_not_run``: well-formed calls of the last assistant message that TRL never
  executed (turn cap ``max_tool_calling_iterations`` or the completion length), before
  any submit;
* ``calls_after_submit``: calls made after the environment accepted ``submit`` (run
  or not);
* calls that failed in the sandbox (``status`` ``infra`` / ``ended``): an infra failure
  of the rollout, counted by the trainer as such.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CallCounts:
    """Per-rollout counts (integers >= 0); see the module docstring for each rule."""

    format_errors: int
    calls_not_run: int
    calls_after_submit: int
    submit_turn: int | None


def _clamp(turn: int, num_turns: int) -> int:
    return max(1, min(int(turn), num_turns))


def submit_turn(calls: Sequence, num_turns: int) -> int | None:
    """1-based turn of the first ``submit`` the environment accepted, clamped to
    ``1..num_turns``; None when the rollout never submitted."""
    for c in calls:
        if (c.name == "submit" or getattr(c, "submits", False)) and c.ok:
            return _clamp(c.turn, max(1, num_turns))
    return None


def count_calls(messages: Sequence[dict], calls: Sequence) -> CallCounts:
    """Classify every tool call of one rollout (module docstring).

    Args:
        messages: the completion's chat messages (dicts with ``role``, ``tool_calls``).
        calls: the calls that reached the environment, in order; ``turn`` is the
            1-based assistant message that made the call.

    Returns: :class:`CallCounts`.
    """
    assistant = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    n_turns = max(1, len(assistant))
    by_turn: dict[int, list] = {}
    for c in calls:
        by_turn.setdefault(_clamp(c.turn, n_turns), []).append(c)
    sub = submit_turn(calls, n_turns)
    errors = not_run = after = 0
    for k, i in enumerate(assistant, start=1):
        requested = len(messages[i].get("tool_calls") or [])
        submitted_before = sub is not None and sub < k
        if requested == 0:
            errors += 0 if submitted_before else 1
            continue
        reached = by_turn.get(k, [])
        # TRL drops the tool results of a row that became overlong, but the calls ran
        executed = bool(reached) or (i + 1 < len(messages)
                                     and messages[i + 1].get("role") == "tool")
        if not executed:
            if submitted_before:
                after += requested
            else:
                not_run += requested
            continue
        after += sum(1 for c in reached if c.status == "after_submit")
        errors += sum(1 for c in reached if c.status == "error")
        missing = max(0, requested - len(reached))  # TRL ran them; the env never saw them
        if submitted_before:
            after += missing
        else:
            errors += missing
    return CallCounts(errors, not_run, after, sub)
