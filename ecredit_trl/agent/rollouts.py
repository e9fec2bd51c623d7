"""Policy rollouts without updates, in the training agent environment.

``python -m ecredit_trl.agent.rollouts --model PATH_OR_RUN_DIR --tasks SOURCE --n N --out FILE.jsonl
[--seed S --runtime podman|local --max-turns K --max-new-tokens T --temperature X
 --task-id ID ... --binding HEX --batch-size B --agent-concurrency C --use-vllm]``

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
  seeded per rollout from ``sha256(f"{seed}:{task_id}:{rollout_index}")``; ``--temperature 0``
  decodes greedily.

Batching (``--batch-size B``, default 8): up to B episodes in flight, one batched
``model.generate`` per round over the episodes waiting for a turn, their tool calls run
concurrently (``--agent-concurrency`` threads; each episode's own calls in order), each row
written when its episode ends (:mod:`ecredit_trl.agent.batched`). Every episode keeps its own
sampling generator (seeded with its ``sampling_seed``), so a row does not depend on the batch it
ran in; seeded rows equal ``--batch-size 1`` rows (the one-at-a-time loop), greedy and sampled
(checked in ``tests/test_batched_rollouts.py``). ``--use-vllm`` generates through ``vllm.LLM``
instead (:mod:`ecredit_trl.agent.vllm_engine`; its samples come from vLLM's per-request seeds,
not torch's, so they differ from the transformers rows).

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
     "format_errors", "stop_reason", "submitted", "setup_error", "failure", "failure_class",
     "failure_evidence", "timings": {...},
     "seed", "model_sha256", "binding", "settings": {...}, "engine": {"name", "batch_size"}}

``stop_reason``: ``submit``, ``no_tool_call``, ``max_turns``, ``token_budget``,
``context_limit``. ``failure``: ``[reason, detail]`` when the episode ended on a sandbox
failure or the disk budget (:attr:`SWEAgentEnv.failure`; after ``disk_budget`` the files
are gone: empty artifact, no writes), else null; ``failure_class`` who caused it
(``agent_disk_budget`` / ``agent_pids`` / ``agent_oom``: the policy, scored by ``eval.run``
as a failure with the failure value, :mod:`eval.integrity.agent`; null: the infrastructure,
an unknown slot) with its ``failure_evidence``. Timings are seconds: ``setup_s`` (working tree + container), ``generate_s`` (in a
batch: the episode's share of each batched call, wall / rows, + its parsing),
``tools_s``, ``artifact_s``, ``total_s``.

Resumable: rows already in ``--out`` with the same binding are kept and their slots skipped;
a file holding rows of another binding is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ecredit_trl.agent.batched import run_batched
from ecredit_trl.agent.env import AgentContext, env_for, release
from ecredit_trl.agent.episode import run_rollout
from ecredit_trl.agent.generation import (
    TRL_SAMPLING_DEFAULTS,
    GenerationSettings,
    Policy,
    load_rollout_policy,
    rollout_seed,
)
from ecredit_trl.agent.scaffolds import SCAFFOLDS, get_scaffold
from ecredit_trl.agent.vllm_engine import VLLMEngine, require_vllm
from ecredit_trl.credit.trajectory import turn_writes
from ecredit_trl.runs.records import append_jsonl, read_jsonl
from eval.evaluation.templatecheck import CHAT_TEMPLATE_HELP
from eval.tasks.splits import load_tasks
from sandbox.backend import SandboxOptions, make_runtime
from sandbox.bounds import ArgumentParser, Float, InFile, Int, ModelRef, OutFile, Source, Text
from sandbox.cluster.dispatch import RayUnavailable

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
# many rollouts
# ---------------------------------------------------------------------------


def _existing(out: Path, binding: str) -> set[tuple[str, int]]:
    """Slots already in ``out`` under ``binding``.

    Raises: ValueError naming ``out`` when it holds rows of another binding.
    """
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
                 log=None, batch_size: int = 1, agent_concurrency: int = 4,
                 engine=None) -> dict:
    """Run ``n`` rollouts per task and append each row to ``out`` (flushed + fsync-ed) the
    moment its episode ends.

    Args:
        policy: from :func:`load_rollout_policy`.
        tasks: ``eval.tasks.schema.Task`` list (each needs ``repo_dir``).
        out: JSONL file; slots already there under ``binding`` are skipped.
        n: rollouts per task (>= 1); rollout indices are ``0..n-1``.
        runtime: sandbox runtime for the agent's containers (not closed here).
        binding: tag of every row (default :func:`rollouts_binding`).
        batch_size: episodes in flight. 1 without ``engine``: one episode at a time, the
            original loop; else :func:`ecredit_trl.agent.batched.run_batched` (rows may come
            in another order; seeded rows are the same, see that module).
        agent_concurrency: threads running tool calls / resets / records (batched path).
        engine: a generation engine for the batched path (vLLM: :mod:`.vllm_engine`);
            default the policy's ``model.generate``.

    Returns: ``{"binding", "written", "skipped", "wall_s", "generate_s", "batch_size",
        "engine"}`` (``generate_s``: wall seconds of generation calls; the batched path adds
        ``generate_calls`` and ``generated_rows``).

    Raises: ValueError for ``n < 1``, a batch size or concurrency < 1, or a foreign binding
        in ``out``.
    """
    say = log or (lambda m: print(m, file=sys.stderr, flush=True))
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n: must be an int >= 1, got {n!r}")
    if batch_size < 1 or agent_concurrency < 1:
        raise ValueError(f"batch_size / agent_concurrency: must be >= 1, got {batch_size} / "
                         f"{agent_concurrency}")
    out = Path(out)
    binding = binding or rollouts_binding(policy.ref.sha256, [t.instance_id for t in tasks],
                                          seed, n, settings)
    done = _existing(out, binding)
    slots = [(t, i) for t in tasks for i in range(n) if (t.instance_id, i) not in done]
    engine_tag = {"name": getattr(engine, "name", "transformers"), "batch_size": batch_size}
    counts = {"written": 0, "generate_s": 0.0}
    sc = getattr(policy, "scaffold", None)
    scaffold_record = sc.record() if sc is not None else {"name": "ecredit"}

    def emit(row: dict) -> None:
        row.update(model_sha256=policy.ref.sha256, binding=binding, scaffold=scaffold_record,
                   settings=settings.to_json(), engine=engine_tag)
        append_jsonl(out, [row])
        counts["written"] += 1
        counts["generate_s"] += row["timings"]["generate_s"]
        say(f"rollouts: {row['task_id']} #{row['rollout_index']}: {row['stop_reason']}, "
            f"{row['generated_tokens']} tokens, {len(row['tool_calls'])} calls, "
            f"artifact {len(row['artifact'])} B, {row['timings']['total_s']:.1f} s")

    ctx = AgentContext(tasks={t.instance_id: t for t in tasks}, runtime=runtime,
                       bash_timeout_s=settings.bash_timeout_s,
                       scaffold=getattr(policy, "scaffold", None))
    t0 = time.monotonic()
    extra = {}
    try:
        if batch_size == 1 and engine is None:
            env = env_for(ctx.scaffold, ctx)
            for task, i in slots:
                try:
                    row = run_rollout(policy, env, task, rollout_index=i, seed=seed,
                                      settings=settings)
                finally:
                    release(env)
                emit(row)
        else:
            extra = run_batched(policy, slots, ctx, seed=seed, settings=settings, emit=emit,
                                batch_size=batch_size, agent_concurrency=agent_concurrency,
                                engine=engine)
    finally:
        import shutil

        shutil.rmtree(ctx.workroot, ignore_errors=True)
    return {"binding": binding, "written": counts["written"],
            "skipped": n * len(tasks) - len(slots), "wall_s": round(time.monotonic() - t0, 3),
            "generate_s": round(counts["generate_s"], 3), "engine": engine_tag, **extra}


def settings_for(ref, args) -> GenerationSettings:
    """Settings from (in rising priority) TRL defaults, the run's config, the CLI."""
    d = {"max_turns": 4, "max_new_tokens": 640, "bash_timeout_s": 30.0, **TRL_SAMPLING_DEFAULTS}
    d.update(ref.generation_defaults())
    for name in ("max_turns", "max_new_tokens", "temperature", "top_p", "top_k"):
        v = getattr(args, name, None)
        if v is not None:
            d[name] = v
    return GenerationSettings(**d)


def scaffold_for(ref, args) -> tuple[str, str | None]:
    """(scaffold name, config file or None) of the rollouts: the CLI's ``--scaffold`` /
    ``--scaffold-config``, else the training run's (:meth:`ModelRef.scaffold_defaults`, as
    :func:`settings_for` reuses its rollout settings), else ``ecredit``. The run's config file
    goes with its scaffold only: ``--scaffold`` naming another scaffold drops it."""
    run = ref.scaffold_defaults()
    name = args.scaffold or run.get("scaffold") or "ecredit"
    config = args.scaffold_config
    if config is None and name == run.get("scaffold"):
        config = run.get("scaffold_config")
    return name, config


def main(argv: Sequence[str] | None = None) -> int:
    """CLI (see the module docstring). Exit 0 on success, 2 on bad input."""
    ap = ArgumentParser(prog="python -m ecredit_trl.agent.rollouts",
                                 description="Policy rollouts (no updates) in the training "
                                             "agent environment.")
    ap.add_argument("--model", type=ModelRef(), required=True, help="model dir or training run dir")
    ap.add_argument("--tasks", type=Source(), required=True, help="task source (eval.tasks.splits.load_tasks)")
    ap.add_argument("--n", type=Int(ge=1), required=True, help="rollouts per task")
    ap.add_argument("--out", type=OutFile(), required=True, help="output JSONL (appended; resumable)")
    ap.add_argument("--seed", type=Int(ge=0, le=2**32 - 1, why="32-bit seeds"), default=0, help="sampling seed (per-rollout derived)")
    SandboxOptions.add_args(ap)  # --runtime and the backend flags (eval.run passes its own)
    ap.add_argument("--max-turns", dest="max_turns", type=Int(ge=1), default=None)
    ap.add_argument("--max-new-tokens", dest="max_new_tokens", type=Int(ge=1), default=None,
                    help="completion budget of a whole episode, tokens")
    ap.add_argument("--temperature", type=Float(ge=0, why="0 = greedy decoding"), default=None)
    ap.add_argument("--top-p", dest="top_p", type=Float(gt=0, le=1, why="a probability mass"), default=None)
    ap.add_argument("--top-k", dest="top_k", type=Int(ge=0, why="0 disables top-k"), default=None)
    ap.add_argument("--task-id", type=Text(), dest="task_ids", action="append", default=None,
                    help="only these task ids (repeatable)")
    ap.add_argument("--binding", type=Text(), default=None, help="tag written on every row (eval.run sets "
                    "it); default: hash of model, tasks, seed, n, settings")
    ap.add_argument("--device", type=Text(), default=None)
    ap.add_argument("--dtype", type=Text(), default="auto")
    ap.add_argument("--batch-size", dest="batch_size", type=Int(ge=1), default=8,
                    help="episodes in flight, one batched generate call per round "
                    "(1: one episode at a time)")
    ap.add_argument("--agent-concurrency", dest="agent_concurrency", type=Int(ge=1), default=4,
                    help="threads running the episodes' tool calls (batched path)")
    ap.add_argument("--chat-template", "--chat_template", type=Text(), dest="chat_template", default=None,
                    metavar="NAME", help=CHAT_TEMPLATE_HELP)
    ap.add_argument("--scaffold", default=None, choices=SCAFFOLDS,
                    help="tool surface and prompt (docs/scaffolds.md; default: the training "
                    "run's, else ecredit)")
    ap.add_argument("--scaffold-config", "--scaffold_config", dest="scaffold_config",
                    type=InFile("yaml"), default=None, help="mini-swe-agent: its config YAML "
                    "(default: the training run's when it used that scaffold, else its shipped "
                    "SWE-bench config)")
    ap.add_argument("--use-vllm", dest="use_vllm", action="store_true",
                    help="generate through vllm.LLM (colocated, from the model path)")
    args = ap.parse_args(argv)

    try:
        tasks = load_tasks(args.tasks, purpose="eval")
        if args.task_ids:
            by_id = {t.instance_id: t for t in tasks}
            unknown = [i for i in args.task_ids if i not in by_id]
            if unknown:
                raise ValueError(f"--task-id: not in {args.tasks}: {unknown[:10]}")
            wanted = set(args.task_ids)
            tasks = [t for t in tasks if t.instance_id in wanted]
        if args.batch_size < 1 or args.agent_concurrency < 1:
            raise ValueError(f"--batch-size / --agent-concurrency: must be >= 1, got "
                             f"{args.batch_size} / {args.agent_concurrency}")
        engine = None
        if args.use_vllm:
            require_vllm()
        policy = load_rollout_policy(args.model, device="cpu" if args.use_vllm else args.device,
                                     dtype=args.dtype, chat_template=args.chat_template)
        name, config = scaffold_for(policy.ref, args)
        if name != "ecredit" or config:
            policy.use_scaffold(get_scaffold(name, config))
        settings = settings_for(policy.ref, args)
        if args.use_vllm:
            engine = VLLMEngine.from_policy(policy, dtype=args.dtype)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:  # on ray, --sandbox-run-id joins the evaluation's dispatcher (one cap, one cleanup)
        runtime = make_runtime(SandboxOptions.from_args(args), run_id=f"rollouts-{os.getpid()}")
    except (ValueError, RayUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        summary = run_rollouts(policy, tasks, args.out, n=args.n, seed=args.seed,
                               settings=settings, runtime=runtime, binding=args.binding,
                               batch_size=args.batch_size,
                               agent_concurrency=args.agent_concurrency, engine=engine)
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
