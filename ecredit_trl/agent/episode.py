"""One episode of a policy in the agent environment (:mod:`ecredit_trl.agent.rollouts`
describes the row it becomes): environment reset + prompt, the turn rules of TRL's tool loop
(:class:`EpisodeTurns`, shared by the one-at-a-time loop here and the batched one in
:mod:`ecredit_trl.agent.batched`), tool execution, and the finished row (per-turn writes,
artifact, counts, timings).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

from ecredit_trl.agent.generation import GenerationSettings, Policy, rollout_seed
from ecredit_trl.agent.prompts import task_prompt
from ecredit_trl.credit.trajectory import turn_writes
from sandbox.snapshots.snapshot import artifact

__all__ = ["EpisodeTurns", "rollout_row", "run_rollout", "run_tool_calls", "start_episode"]


def _format_errors(turns: list[dict], calls) -> int:
    """Format errors as the trainer counts them: assistant turns with no parseable tool call
    before a submit, requested calls that never reached the environment, refused calls."""
    errors = 0
    submitted = False
    requested = 0
    for k, t in enumerate(turns, start=1):
        names = [c.get("name") for c in t["tool_calls"]]
        if not names and not submitted:
            errors += 1
        requested += len(t["tool_calls"])  # calls of an unexecuted last turn count, as in training
        if "submit" in names or any(getattr(c, "submits", False) and c.turn == k
                                    for c in calls):
            submitted = True
    errors += max(0, requested - len(calls))
    errors += sum(1 for c in calls if not c.ok)
    return errors


def run_rollout(policy: Policy, env, task, *, rollout_index: int, seed: int,
                settings: GenerationSettings) -> dict:
    """One episode of ``policy`` on ``task`` in ``env`` (a :class:`SWEAgentEnv`, released
    by the caller). Returns the JSON row described in the module docstring (without
    ``model_sha256`` / ``binding``).

    Raises: KeyError / ValueError from ``env.reset`` (unknown task, no ``repo_dir``); errors
        of the model. Tool errors never raise: they become ``{"error": ...}`` results, as in TRL.
    """
    t_start = time.monotonic()
    prompt_ids = start_episode(policy, env, task)
    setup_s = time.monotonic() - t_start
    rseed = rollout_seed(seed, task.instance_id, rollout_index)
    ep = _episode(policy, env, prompt_ids, settings, rseed)
    return rollout_row(env, task, ep, rollout_index=rollout_index, seed=seed, rseed=rseed,
                       setup_s=setup_s, t_start=t_start)


def start_episode(policy: Policy, env, task) -> list[int]:
    """Reset ``env`` on ``task`` (turn 0) and return the rendered prompt ids.

    Raises: KeyError / ValueError from ``env.reset`` (unknown task, no ``repo_dir``).
    """
    env.ctx.turn = 0
    env.reset(instance_id=task.instance_id)
    sc = getattr(policy, "scaffold", None)
    return policy.render_prompt(sc.prompt(task) if sc is not None else task_prompt(task))


def rollout_row(env, task, ep: _Episode, *, rollout_index: int, seed: int, rseed: int,
                setup_s: float, t_start: float) -> dict:
    """The JSON row of a finished episode (module docstring; without ``model_sha256`` /
    ``binding``): per-turn writes from the environment's snapshots, the artifact (``git
    diff`` from base), counts and timings (seconds; ``t_start`` is ``time.monotonic()`` at
    the episode's start)."""
    t0 = time.monotonic()
    failure = list(env.failure) if env.failure else None
    if failure and failure[0] == "disk_budget":  # its files (and snapshots) are removed
        env_calls, snaps, patch = list(env.calls), [], ""
        if not ep.turns:  # keep K >= 1 for the replay format
            ep.turns.append({"generated_tokens": 0, "text": "", "tool_calls": [],
                             "executed": False, "stop": ep.stop})
        for t in ep.turns:
            t["writes"] = {}
    else:
        env_calls, snaps = _record_turn_writes(env, ep.turns, ep.stop)
        patch = artifact(env.snapshot_repo, env.base_tree, env.final_tree)
    artifact_s = time.monotonic() - t0
    turns = ep.turns
    return {
        "task_id": task.instance_id, "rollout_index": rollout_index,
        "format_error": env.valid_calls == 0, "turns": turns,
        "artifact": patch,
        "artifact_sha256": hashlib.sha256(patch.encode("utf-8", "surrogateescape")).hexdigest(),
        "generated_tokens": sum(t["generated_tokens"] for t in turns),
        "completion_tokens": len(ep.completion),
        "tool_calls": [{"turn": c.turn, "name": c.name, "arguments": c.arguments, "ok": c.ok,
                        "status": c.status, "seconds": round(c.seconds, 4), "error": c.error}
                       for c in env_calls],
        "format_errors": _format_errors(turns, env_calls),
        "stop_reason": ep.stop, "submitted": env.submitted, "setup_error": env.setup_error,
        "failure": failure, "failure_class": getattr(env, "failure_class", None),
        "failure_evidence": getattr(env, "failure_evidence", None),
        "snapshots": snaps, "seed": seed, "sampling_seed": rseed,
        "timings": {"setup_s": round(setup_s, 4), "generate_s": round(ep.gen_s, 4),
                    "tools_s": round(ep.tools_s, 4), "artifact_s": round(artifact_s, 4),
                    "total_s": round(time.monotonic() - t_start, 4)},
    }




@dataclass
class _Episode:
    """What the turn loop produced: completion ids (generated + tool-result suffixes), one
    dict per assistant turn, the stop reason, seconds spent generating and in tools."""

    completion: list[int] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    stop: str = "max_turns"
    gen_s: float = 0.0
    tools_s: float = 0.0


class EpisodeTurns:
    """The turn rules of one episode, as TRL's tool loop, shared by the one-at-a-time loop
    (:func:`_episode`) and the batched one (:mod:`ecredit_trl.agent.batched`) so both stop
    and count exactly alike.

    Use: ``limit = begin_turn()`` (None: the episode has ended); generate at most ``limit``
    tokens after :meth:`context`; ``calls = take(new_ids)`` (None: ended); run ``calls`` with
    :func:`_run_tool_calls`; ``after_tools(tool_messages)``; repeat. :attr:`ep` holds the
    result; :attr:`done` tells whether it ended.

    Args:
        policy: renders tool suffixes, parses turns, gives EOS ids and the context size.
        env: the episode's environment; ``env.ctx.turn`` is set to each turn's number.
        prompt_ids: the rendered prompt (tokens).
    """

    def __init__(self, policy: Policy, env, prompt_ids: list[int],
                 settings: GenerationSettings) -> None:
        self.policy, self.env, self.prompt_ids, self.settings = policy, env, prompt_ids, settings
        self.tool_fns = {name: getattr(env, name) for name in
                         sorted(t["function"]["name"] for t in policy.tools)}
        self.ep = _Episode()
        self.k = 0
        self.done = False
        self._budget = self._room = self._limit = 0

    def context(self) -> list[int]:
        """Prompt + completion so far (the next generation's input ids)."""
        return self.prompt_ids + self.ep.completion

    def _end(self, stop: str) -> None:
        self.ep.stop = stop
        self.done = True
        if self.ep.turns:
            self.ep.turns[-1]["stop"] = stop

    def begin_turn(self) -> int | None:
        """Start the next assistant turn: its token limit (episode budget and context room),
        or None when either is spent (the episode ends: ``token_budget`` / ``context_limit``)."""
        self.k += 1
        self.env.ctx.turn = self.k
        s, completion = self.settings, self.ep.completion
        self._budget = s.max_new_tokens - len(completion)
        self._room = self.policy.max_model_len - len(self.prompt_ids) - len(completion)
        if self._budget <= 0:
            self._end("token_budget")
            return None
        if self._room <= 0:
            self._end("context_limit")
            return None
        self._limit = min(self._budget, self._room)
        return self._limit

    def take(self, new: list[int]) -> list[dict] | None:
        """Record the generated ids ``new`` of this turn; returns its parsed tool calls to
        run, or None when the episode ends here (no tool call: ``no_tool_call`` or, for a turn
        cut by the limit, ``token_budget`` / ``context_limit``; the last allowed turn:
        ``max_turns``, its calls not executed as in TRL)."""
        policy, context = self.policy, self.context()
        cut = len(new) >= self._limit and (not new or new[-1] not in policy.eos_token_ids)
        parsed = policy.parse(new, context) if new else {"role": "assistant", "content": ""}
        self.ep.completion += new
        calls = list(parsed.get("tool_calls") or [])
        self.ep.turns.append({
            "generated_tokens": len(new), "writes": {},
            "text": policy.tokenizer.decode(new, skip_special_tokens=False),
            "tool_calls": [{"name": (c.get("function") or c).get("name"),
                            "arguments": (c.get("function") or c).get("arguments")}
                           for c in calls],
            "executed": False, "stop": None})
        if not calls:  # a turn cut by the budget / context parses as plain text
            self._end(("token_budget" if self._budget <= self._room else "context_limit")
                      if cut else "no_tool_call")
            return None
        if self.k == self.settings.max_turns:  # TRL: the last allowed turn's calls are not run
            self._end("max_turns")
            return None
        return calls

    def after_tools(self, tool_messages: list[dict]) -> None:
        """Append the tool results of this turn (ends the episode after ``submit`` or when
        the suffix would pass the budget / context)."""
        self.ep.turns[-1]["executed"] = True
        if self.env.submitted:
            self._end("submit")
            return
        suffix = self.policy.tool_suffix_ids(tool_messages)
        n = len(self.ep.completion) + len(suffix)
        if n > self.settings.max_new_tokens:
            self._end("token_budget")
            return
        if len(self.prompt_ids) + n >= self.policy.max_model_len:
            self._end("context_limit")
            return
        self.ep.completion += suffix


def _episode(policy: Policy, env, prompt_ids: list[int], settings: GenerationSettings,
             rseed: int) -> _Episode:
    """The one-at-a-time turn loop (:class:`EpisodeTurns`): sample a turn within the episode
    budget and the model's context, parse its tool calls, run them (not on the last allowed
    turn), append the tool-result suffix; stop on no tool call, ``submit``, budget or context.
    Sampling reseeds torch with ``rseed`` at the first turn and continues after."""
    turns = EpisodeTurns(policy, env, prompt_ids, settings)
    ep = turns.ep
    while True:
        limit = turns.begin_turn()
        if limit is None:
            break
        t0 = time.monotonic()
        new = policy.generate(turns.context(), limit, settings, rseed if turns.k == 1 else None)
        calls = turns.take(new)
        ep.gen_s += time.monotonic() - t0
        if calls is None:
            break
        t0 = time.monotonic()
        tool_messages = run_tool_calls(calls, turns.tool_fns)
        ep.tools_s += time.monotonic() - t0
        turns.after_tools(tool_messages)
        if turns.done:
            break
    return ep


def run_tool_calls(calls: list[dict], tool_fns: dict) -> list[dict]:
    """Run one turn's parsed tool calls in order; returns the tool messages (one
    ``{"role": "tool", "name", "content"}`` dict per call). An unknown tool, a non-function
    call or a raising tool becomes ``{"error": ...}`` (as TRL's tool loop)."""
    tool_messages = []
    for c in calls:
        fn = c.get("function") if c.get("type") == "function" else None
        if fn is None:
            name = c.get("name", "unknown")
            result = {"error": f"Unsupported tool call type: {c.get('type')}"}
        else:
            name = fn["name"]
            try:
                if name not in tool_fns:
                    raise ValueError(f"Tool {name} not found.")
                result = tool_fns[name](**(fn.get("arguments") or {}))
            except Exception as exc:  # as TRL: the error goes back to the model
                result = {"error": str(exc)}
        content = result if isinstance(result, list) else str(result)
        tool_messages.append({"role": "tool", "name": name, "content": content})
    return tool_messages


def _record_turn_writes(env, turns: list[dict], stop: str) -> tuple[list, list[str]]:
    """Per-turn snapshots from the environment's recorded calls; each turn gets its writes
    (a turn-less episode gets one empty turn, so the replay format keeps K >= 1).

    Returns: (the environment's calls, snapshots S_0..S_K).
    """
    from ecredit_trl.credit.planning import turn_snapshots  # start-up: torch; rollouts --help light

    n_turns = max(1, len(turns))
    env_calls = list(env.calls)
    snaps = turn_snapshots(env.base_tree, [min(c.turn, n_turns) for c in env_calls],
                           [c.tree for c in env_calls], n_turns)
    writes = turn_writes(env.snapshot_repo, snaps)
    for t, w in zip(turns, writes, strict=False):
        t["writes"] = w
    if not turns:  # keep K >= 1 so the replay format has S_0..S_K
        turns.append({"generated_tokens": 0, "writes": writes[0] if writes else {},
                      "text": "", "tool_calls": [], "executed": False, "stop": stop})
    return env_calls, snaps
