"""Policy rollouts without updates, in the training agent environment.

``python -m ecredit_trl.agent.rollouts --model PATH_OR_RUN_DIR --tasks SOURCE --n N --out FILE.jsonl
[--seed S --runtime podman|local --max-turns K --max-new-tokens T --temperature X
 --task-id ID ... --binding HEX]``

Runs ``n`` rollouts per task with what GRPO training uses (``ecredit_trl.train``):

* environment: :class:`ecredit_trl.agent.env.SWEAgentEnv` (same tools, same per-rollout working
  tree and Podman container, same per-call snapshots and turn numbers);
* prompt: :func:`ecredit_trl.agent.prompts.task_prompt`, rendered by the tokenizer's chat template
  with ``tools=policy_tools()`` — or, like ``GRPOTrainer.__init__``, TRL's training template
  (``get_training_chat_template``) when the tokenizer's own one is not prefix-preserving;
* parsing: TRL's ``add_response_schema`` + ``parse_response`` (the function GRPOTrainer's
  tool loop calls), tool results appended with the token suffix GRPOTrainer's
  ``_get_tool_suffix_ids`` computes;
* sampling: ``model.generate`` with ``do_sample=True`` and GRPO's sampling settings
  (temperature, top_p, top_k, min_p, repetition penalty; defaults from the run's config),
  seeded per rollout from ``sha256(f"{seed}:{task_id}:{rollout_index}")``.

Episode limits, as TRL's tool loop (``GRPOTrainer._tool_call_loop``) with
``max_tool_calling_iterations = max_turns - 1``: at most ``max_turns`` assistant turns; the
tool calls of the last allowed turn are not executed; ``max_new_tokens`` bounds the whole
episode's completion (generated + tool-result tokens), and a tool result that would pass it
(or the model's context) ends the episode. One addition: the episode ends after a
``submit`` call (the environment refuses every later edit, so the artifact is final).

Each rollout is one JSON line, a superset of the replay format of
:mod:`ecredit_trl.credit.trajectory` (``load_trajectories`` reads it)::

    {"task_id", "rollout_index", "format_error", "turns": [{"generated_tokens", "writes",
      "text", "tool_calls", "stop"}], "artifact", "artifact_sha256", "generated_tokens",
     "tool_calls": [{"turn", "name", "arguments", "ok", "status", "seconds", "error"}],
     "format_errors", "stop_reason", "submitted", "setup_error", "failure", "timings": {...},
     "seed", "model_sha256", "binding", "settings": {...}}

``stop_reason``: ``submit``, ``no_tool_call``, ``max_turns``, ``token_budget``,
``context_limit``. ``failure``: ``[reason, detail]`` when the episode ended on an infra
failure or the disk budget (:attr:`SWEAgentEnv.failure`; after ``disk_budget`` the files
are gone: empty artifact, no writes), else null. Timings are seconds: ``setup_s`` (working tree + container), ``generate_s``,
``tools_s``, ``artifact_s``, ``total_s``.

Resumable: rows already in ``--out`` with the same binding are kept and their slots skipped;
a file holding rows of another binding is refused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ecredit_trl.agent.generation import (
    TRL_SAMPLING_DEFAULTS,
    GenerationSettings,
    Policy,
    load_rollout_policy,
    rollout_seed,
)
from ecredit_trl.credit.trajectory import turn_writes

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

__all__ = ["GenerationSettings", "Policy", "load_rollout_policy", "main", "rollout_seed",
           "run_rollout", "run_rollouts", "rollouts_binding", "turn_writes"]

STOP_REASONS = ("submit", "no_tool_call", "max_turns", "token_budget", "context_limit")

def rollouts_binding(model_sha256: str, task_ids: Sequence[str], seed: int, n: int,
                     settings: GenerationSettings) -> str:
    """Default binding of a rollout file: sha256 over model, task ids, seed, n and settings."""
    blob = json.dumps({"model": model_sha256, "tasks": sorted(task_ids), "seed": seed, "n": n,
                       "settings": settings.to_json()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


# ---------------------------------------------------------------------------
# one rollout
# ---------------------------------------------------------------------------


def _format_errors(turns: list[dict], calls) -> int:
    """Format errors as the trainer counts them: assistant turns with no parseable tool call
    before a submit, requested calls that never reached the environment, refused calls."""
    errors = 0
    submitted = False
    requested = 0
    for t in turns:
        names = [c.get("name") for c in t["tool_calls"]]
        if not names and not submitted:
            errors += 1
        requested += len(t["tool_calls"])  # calls of an unexecuted last turn count, as in training
        if "submit" in names:
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
    from ecredit_trl.agent.prompts import task_prompt
    from sandbox.snapshot import artifact

    t_start = time.monotonic()
    env.ctx.turn = 0
    env.reset(instance_id=task.instance_id)
    setup_s = time.monotonic() - t_start
    prompt_ids = policy.render_prompt(task_prompt(task))
    rseed = rollout_seed(seed, task.instance_id, rollout_index)
    ep = _episode(policy, env, prompt_ids, settings, rseed)

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
        "failure": failure,
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


def _episode(policy: Policy, env, prompt_ids: list[int], settings: GenerationSettings,
             rseed: int) -> _Episode:
    """The turn loop, as TRL's tool loop: sample a turn within the episode budget and the
    model's context, parse its tool calls, run them (not on the last allowed turn), append
    the tool-result suffix; stop on no tool call, ``submit``, budget or context."""
    tool_fns = {name: getattr(env, name) for name in
                sorted(t["function"]["name"] for t in policy.tools)}
    ep = _Episode()
    completion = ep.completion
    for k in range(1, settings.max_turns + 1):
        env.ctx.turn = k
        budget = settings.max_new_tokens - len(completion)
        room = policy.max_model_len - len(prompt_ids) - len(completion)
        if budget <= 0:
            ep.stop = "token_budget"
            break
        if room <= 0:
            ep.stop = "context_limit"
            break
        t0 = time.monotonic()
        context = prompt_ids + completion
        limit = min(budget, room)
        new = policy.generate(context, limit, settings, rseed if k == 1 else None)
        cut = len(new) >= limit and (not new or new[-1] not in policy.eos_token_ids)
        parsed = policy.parse(new, context) if new else {"role": "assistant", "content": ""}
        ep.gen_s += time.monotonic() - t0
        completion += new
        calls = [c for c in (parsed.get("tool_calls") or [])]
        turn = {"generated_tokens": len(new), "writes": {},
                "text": policy.tokenizer.decode(new, skip_special_tokens=False),
                "tool_calls": [{"name": (c.get("function") or c).get("name"),
                                "arguments": (c.get("function") or c).get("arguments")}
                               for c in calls],
                "executed": False, "stop": None}
        ep.turns.append(turn)
        if not calls:  # a turn cut by the budget / context parses as plain text
            ep.stop = (("token_budget" if budget <= room else "context_limit") if cut
                       else "no_tool_call")
            break
        if k == settings.max_turns:  # TRL: the last allowed turn's calls are not executed
            ep.stop = "max_turns"
            break
        t0 = time.monotonic()
        tool_messages = _run_tool_calls(calls, tool_fns)
        ep.tools_s += time.monotonic() - t0
        turn["executed"] = True
        if env.submitted:
            ep.stop = "submit"
            break
        suffix = policy.tool_suffix_ids(tool_messages)
        if len(completion) + len(suffix) > settings.max_new_tokens:
            ep.stop = "token_budget"
            break
        if len(prompt_ids) + len(completion) + len(suffix) >= policy.max_model_len:
            ep.stop = "context_limit"
            break
        completion += suffix
    if ep.turns:
        ep.turns[-1]["stop"] = ep.stop
    return ep


def _run_tool_calls(calls: list[dict], tool_fns: dict) -> list[dict]:
    """Run one turn's parsed tool calls in order; returns the tool messages. An unknown
    tool, a non-function call or a raising tool becomes ``{"error": ...}`` (as TRL)."""
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
    from ecredit_trl.credit.planning import turn_snapshots

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


# ---------------------------------------------------------------------------
# many rollouts
# ---------------------------------------------------------------------------


def _existing(out: Path, binding: str) -> set[tuple[str, int]]:
    """Slots already in ``out`` under ``binding``.

    Raises: ValueError naming ``out`` when it holds rows of another binding.
    """
    from ecredit_trl.runs.records import read_jsonl

    if not out.exists():
        return set()
    done = set()
    for i, row in enumerate(read_jsonl(out), 1):
        if row.get("binding") != binding:
            raise ValueError(f"--out {out}: row {i} ({row.get('task_id')!r} #"
                             f"{row.get('rollout_index')}) belongs to binding "
                             f"{str(row.get('binding'))[:12]}, not {binding[:12]}: another "
                             "model/split/seed/n wrote this file; choose another --out")
        done.add((row["task_id"], int(row["rollout_index"])))
    return done


def run_rollouts(policy: Policy, tasks: Sequence, out: str | Path, *, n: int, seed: int,
                 settings: GenerationSettings, runtime, binding: str | None = None,
                 log=None) -> dict:
    """Run ``n`` rollouts per task and append each row to ``out`` (flushed + fsync-ed).

    Args:
        policy: from :func:`load_rollout_policy`.
        tasks: ``eval.tasks.Task`` list (each needs ``repo_dir``).
        out: JSONL file; slots already there under ``binding`` are skipped.
        n: rollouts per task (>= 1); rollout indices are ``0..n-1``.
        runtime: sandbox runtime for the agent's containers (not closed here).
        binding: tag of every row (default :func:`rollouts_binding`).

    Returns: ``{"binding", "written", "skipped", "wall_s"}``.

    Raises: ValueError for ``n < 1`` or a foreign binding in ``out``.
    """
    from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release
    from ecredit_trl.runs.records import append_jsonl

    say = log or (lambda m: print(m, file=sys.stderr, flush=True))
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n: must be an int >= 1, got {n!r}")
    out = Path(out)
    binding = binding or rollouts_binding(policy.ref.sha256, [t.instance_id for t in tasks],
                                          seed, n, settings)
    done = _existing(out, binding)
    ctx = AgentContext(tasks={t.instance_id: t for t in tasks}, runtime=runtime,
                       bash_timeout_s=settings.bash_timeout_s)
    env = SWEAgentEnv(ctx)
    t0 = time.monotonic()
    written = skipped = 0
    try:
        for task in tasks:
            for i in range(n):
                if (task.instance_id, i) in done:
                    skipped += 1
                    continue
                try:
                    row = run_rollout(policy, env, task, rollout_index=i, seed=seed,
                                      settings=settings)
                finally:
                    release(env)
                row.update(model_sha256=policy.ref.sha256, binding=binding,
                           settings=settings.to_json())
                append_jsonl(out, [row])
                written += 1
                say(f"rollouts: {task.instance_id} #{i}: {row['stop_reason']}, "
                    f"{row['generated_tokens']} tokens, {len(row['tool_calls'])} calls, "
                    f"artifact {len(row['artifact'])} B, {row['timings']['total_s']:.1f} s")
    finally:
        release(env)
        import shutil

        shutil.rmtree(ctx.workroot, ignore_errors=True)
    return {"binding": binding, "written": written, "skipped": skipped,
            "wall_s": round(time.monotonic() - t0, 3)}


def settings_for(ref, args) -> GenerationSettings:
    """Settings from (in rising priority) TRL defaults, the run's config, the CLI."""
    d = {"max_turns": 4, "max_new_tokens": 640, "bash_timeout_s": 30.0, **TRL_SAMPLING_DEFAULTS}
    d.update(ref.generation_defaults())
    for name in ("max_turns", "max_new_tokens", "temperature", "top_p", "top_k"):
        v = getattr(args, name, None)
        if v is not None:
            d[name] = v
    return GenerationSettings(**d)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI (see the module docstring). Exit 0 on success, 2 on bad input."""
    ap = argparse.ArgumentParser(prog="python -m ecredit_trl.agent.rollouts",
                                 description="Policy rollouts (no updates) in the training "
                                             "agent environment.")
    ap.add_argument("--model", required=True, help="model dir or training run dir")
    ap.add_argument("--tasks", required=True, help="task source (eval.splits.load_tasks)")
    ap.add_argument("--n", type=int, required=True, help="rollouts per task")
    ap.add_argument("--out", required=True, help="output JSONL (appended; resumable)")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (per-rollout derived)")
    ap.add_argument("--runtime", choices=("podman", "local"), default="podman")
    ap.add_argument("--max-turns", dest="max_turns", type=int, default=None)
    ap.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=None,
                    help="completion budget of a whole episode, tokens")
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--top-p", dest="top_p", type=float, default=None)
    ap.add_argument("--top-k", dest="top_k", type=int, default=None)
    ap.add_argument("--task-id", dest="task_ids", action="append", default=None,
                    help="only these task ids (repeatable)")
    ap.add_argument("--binding", default=None, help="tag written on every row (eval.run sets "
                    "it); default: hash of model, tasks, seed, n, settings")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args(argv)

    from eval.splits import load_tasks
    from sandbox import make_runtime

    try:
        tasks = load_tasks(args.tasks, purpose="eval")
        if args.task_ids:
            by_id = {t.instance_id: t for t in tasks}
            unknown = [i for i in args.task_ids if i not in by_id]
            if unknown:
                raise ValueError(f"--task-id: not in {args.tasks}: {unknown[:10]}")
            wanted = set(args.task_ids)
            tasks = [t for t in tasks if t.instance_id in wanted]
        policy = load_rollout_policy(args.model, device=args.device, dtype=args.dtype)
        settings = settings_for(policy.ref, args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    runtime = make_runtime(args.runtime, run_id=f"rollouts-{os.getpid()}")
    try:
        summary = run_rollouts(policy, tasks, args.out, n=args.n, seed=args.seed,
                               settings=settings, runtime=runtime, binding=args.binding)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        runtime.close()
    print(json.dumps({**summary, "model_sha256": policy.ref.sha256, "out": str(args.out),
                      "settings": settings.to_json()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
