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
     "tool_calls": [{"turn", "name", "arguments", "ok", "seconds", "error"}],
     "format_errors", "stop_reason", "submitted", "setup_error", "timings": {...},
     "seed", "model_sha256", "binding", "settings": {...}}

``stop_reason``: ``submit``, ``no_tool_call``, ``max_turns``, ``token_budget``,
``context_limit``. Timings are seconds: ``setup_s`` (working tree + container), ``generate_s``,
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
from dataclasses import dataclass
from pathlib import Path

from ecredit_trl.credit.trajectory import turn_writes

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

__all__ = ["GenerationSettings", "Policy", "load_rollout_policy", "main", "rollout_seed",
           "run_rollout", "run_rollouts", "rollouts_binding", "turn_writes"]

STOP_REASONS = ("submit", "no_tool_call", "max_turns", "token_budget", "context_limit")

#: GRPOConfig's sampling defaults (TRL 1.16), used when a bare model dir is given.
TRL_SAMPLING_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": None,
                         "repetition_penalty": 1.0}


@dataclass
class GenerationSettings:
    """Episode and sampling settings of a rollout.

    Attributes:
        max_turns: assistant turns per episode (>= 1); TRL's ``max_tool_calling_iterations``
            is ``max_turns - 1``.
        max_new_tokens: completion budget of the whole episode in tokens (TRL's
            ``max_completion_length``), generated and tool-result tokens together.
        temperature, top_p, top_k, min_p, repetition_penalty: sampling (GRPOConfig meaning;
            ``top_k=0`` disables top-k).
        bash_timeout_s: wall-clock limit of one ``bash`` tool call, seconds.
    """

    max_turns: int = 4
    max_new_tokens: int = 640
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    bash_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_turns, int) or self.max_turns < 1:
            raise ValueError(f"max_turns: must be an int >= 1, got {self.max_turns!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: must be an int >= 1, got {self.max_new_tokens!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature: must be > 0 (sampling), got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p!r}")
        if self.bash_timeout_s <= 0:
            raise ValueError(f"bash_timeout_s: must be > 0, got {self.bash_timeout_s!r}")

    def to_json(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def rollout_seed(seed: int, task_id: str, rollout_index: int) -> int:
    """The sampling seed of one rollout: first 8 bytes of ``sha256(f"{seed}:{task_id}:{i}")``
    as an int below 2**63 (independent of the order rollouts run in)."""
    d = hashlib.sha256(f"{seed}:{task_id}:{rollout_index}".encode()).digest()
    return int.from_bytes(d[:8], "big") & ((1 << 63) - 1)


def rollouts_binding(model_sha256: str, task_ids: Sequence[str], seed: int, n: int,
                     settings: GenerationSettings) -> str:
    """Default binding of a rollout file: sha256 over model, task ids, seed, n and settings."""
    blob = json.dumps({"model": model_sha256, "tasks": sorted(task_ids), "seed": seed, "n": n,
                       "settings": settings.to_json()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


# ---------------------------------------------------------------------------
# policy
# ---------------------------------------------------------------------------


class Policy:
    """A causal LM + tokenizer ready for TRL-style multi-turn tool calling.

    Attributes:
        model: the LM in eval mode (peft adapters merged).
        tokenizer: with a response template/schema (TRL's ``add_response_schema``).
        chat_template: ``None`` (the tokenizer's own) or TRL's training template, chosen as
            ``GRPOTrainer`` does (``is_chat_template_prefix_preserving``).
        tools: tool schemas in TRL's order (:func:`ecredit_trl.agent.prompts.policy_tools`).
        eos_token_ids: token ids that end an assistant turn.
        max_model_len: the model's context (``max_position_embeddings``), tokens.
        ref: the :class:`eval.modelref.ModelRef` it came from.
    """

    def __init__(self, model, tokenizer, ref) -> None:
        from trl.chat_template_utils import (
            add_response_schema,
            get_training_chat_template,
            is_chat_template_prefix_preserving,
        )

        from ecredit_trl.agent.prompts import policy_tools

        self.model = model
        self.tokenizer = tokenizer
        self.ref = ref
        self.tools = policy_tools()
        if getattr(tokenizer, "response_template", None) is None and getattr(
                tokenizer, "response_schema", None) is None:
            try:
                add_response_schema(tokenizer)
            except ValueError as exc:
                raise ValueError(f"model {ref.model_dir}: tokenizer chat template: {exc}") from None
        self.chat_template = (None if is_chat_template_prefix_preserving(tokenizer)
                              else get_training_chat_template(tokenizer))
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_token_ids = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in self.eos_token_ids:
            self.eos_token_ids.append(tokenizer.eos_token_id)
        self.max_model_len = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.device = next(model.parameters()).device

    def render_prompt(self, messages: list[dict]) -> list[int]:
        """Token ids of ``messages`` with the tool schemas and the generation prompt (as
        ``GRPOTrainer._tokenize_prompts`` renders an ``environment_factory`` prompt)."""
        out = self.tokenizer.apply_chat_template(
            conversation=[messages], tools=self.tools or None, chat_template=self.chat_template,
            add_generation_prompt=True, tokenize=True, return_dict=True)
        return list(out["input_ids"][0])

    def tool_suffix_ids(self, tool_messages: list[dict]) -> list[int]:
        """Token ids appended after an assistant turn for ``tool_messages`` (tool results +
        the next generation prompt): ``GRPOTrainer._get_tool_suffix_ids``'s construction.

        Raises: ValueError when the template does not render the dummy prefix as a prefix.
        """
        dummy_calls = [{"type": "function",
                        "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
        dummy = [{"role": "user", "content": "dummy"},
                 {"role": "assistant", "content": "", "tool_calls": dummy_calls}]
        kw = dict(tokenize=True, chat_template=self.chat_template, return_dict=False)
        prefix = list(self.tokenizer.apply_chat_template(dummy, add_generation_prompt=False, **kw))
        full = list(self.tokenizer.apply_chat_template(dummy + tool_messages,
                                                       add_generation_prompt=True, **kw))
        eos_pos = [i for i, t in enumerate(prefix) if t == self.tokenizer.eos_token_id]
        if eos_pos:
            prefix = prefix[: eos_pos[-1] + 1]
        if full[: len(prefix)] != prefix:
            raise ValueError("chat template: the EOS-trimmed prefix ids are not a prefix of the "
                             "full ids (template not prefix-preserving)")
        return full[len(prefix):]

    def parse(self, ids: list[int], prefix: list[int]) -> dict:
        """TRL's ``parse_response`` of one assistant turn (falls back to plain text)."""
        from trl.chat_template_utils import parse_response

        return parse_response(self.tokenizer, ids, prefix=prefix, tools=self.tools)

    def generate(self, input_ids: list[int], max_new_tokens: int, settings: GenerationSettings,
                 seed: int | None) -> list[int]:
        """Sample one assistant turn; returns the new ids up to and including the first EOS
        (GRPOTrainer keeps exactly those). ``seed`` reseeds torch first (None: continue)."""
        import torch
        from transformers import GenerationConfig

        if seed is not None:
            torch.manual_seed(seed)
        gc = GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=True,
            pad_token_id=self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
            else self.eos_token_ids[0],
            bos_token_id=self.tokenizer.bos_token_id, eos_token_id=self.eos_token_ids,
            temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
            min_p=settings.min_p, repetition_penalty=settings.repetition_penalty,
            disable_compile=True)
        ids = torch.tensor([input_ids], dtype=torch.long, device=self.device)
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      generation_config=gc)
        new = out[0, len(input_ids):].tolist()
        for i, t in enumerate(new):
            if t in self.eos_token_ids:
                return new[: i + 1]
        return new


def cpu_threads() -> int:
    """Intra-op torch threads for CPU generation: ``$ECREDIT_ROLLOUT_THREADS``, else
    ``cpu_count - round(1-minute load)`` (at least 1). On the 2-core reference machine, two
    threads competing with other work generated ~3 tokens/s, one thread ~350 tokens/s."""
    from ecredit_trl.policy.warmstart import torch_threads

    return torch_threads("ECREDIT_ROLLOUT_THREADS")


def load_rollout_policy(model: str | Path, *, device: str | None = None,
                        dtype: str = "auto") -> Policy:
    """Load a model dir or run dir (see :func:`eval.modelref.resolve_model`) for rollouts.

    A peft adapter (``adapter_config.json``) is loaded on its base model with
    ``peft.PeftModel.from_pretrained`` and merged. The tokenizer comes from the model dir
    (``train.py`` saves it in ``checkpoint-final``), else from the adapter's base.

    Args:
        device: ``"cpu"``, ``"cuda"``, ... (default: cuda when available).
        dtype: ``"auto"`` (float32 on CPU, bfloat16 on CUDA), ``"float32"``, ``"bfloat16"``,
            ``"float16"``.

    Raises: FileNotFoundError / ValueError naming the path (see ``resolve_model``), ValueError
        for an unknown ``dtype``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eval.modelref import resolve_model

    ref = resolve_model(model)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(cpu_threads())
    if dtype == "auto":
        torch_dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    elif dtype in ("float32", "bfloat16", "float16"):
        torch_dtype = getattr(torch, dtype)
    else:
        raise ValueError(f"dtype: expected auto, float32, bfloat16 or float16, got {dtype!r}")
    tok_dir = ref.model_dir
    if ref.adapter and not (Path(ref.model_dir) / "tokenizer_config.json").is_file():
        tok_dir = ref.base_model
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    if ref.adapter:
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(ref.base_model, dtype=torch_dtype)
        lm = PeftModel.from_pretrained(base, ref.model_dir).merge_and_unload()
    else:
        lm = AutoModelForCausalLM.from_pretrained(ref.model_dir, dtype=torch_dtype)
    lm.to(device)
    lm.eval()
    return Policy(lm, tokenizer, ref)


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
    from ecredit_trl.credit.planning import turn_snapshots
    from sandbox.snapshot import artifact

    t_start = time.monotonic()
    env.ctx.turn = 0
    env.reset(instance_id=task.instance_id)
    setup_s = time.monotonic() - t_start
    tool_fns = {name: getattr(env, name) for name in
                sorted(t["function"]["name"] for t in policy.tools)}
    prompt_ids = policy.render_prompt(task_prompt(task))
    completion: list[int] = []
    turns: list[dict] = []
    gen_s = tools_s = 0.0
    stop = "max_turns"
    rseed = rollout_seed(seed, task.instance_id, rollout_index)
    for k in range(1, settings.max_turns + 1):
        env.ctx.turn = k
        budget = settings.max_new_tokens - len(completion)
        room = policy.max_model_len - len(prompt_ids) - len(completion)
        if budget <= 0:
            stop = "token_budget"
            break
        if room <= 0:
            stop = "context_limit"
            break
        t0 = time.monotonic()
        context = prompt_ids + completion
        limit = min(budget, room)
        new = policy.generate(context, limit, settings, rseed if k == 1 else None)
        cut = len(new) >= limit and (not new or new[-1] not in policy.eos_token_ids)
        parsed = policy.parse(new, context) if new else {"role": "assistant", "content": ""}
        gen_s += time.monotonic() - t0
        completion += new
        calls = [c for c in (parsed.get("tool_calls") or [])]
        turn = {"generated_tokens": len(new), "writes": {},
                "text": policy.tokenizer.decode(new, skip_special_tokens=False),
                "tool_calls": [{"name": (c.get("function") or c).get("name"),
                                "arguments": (c.get("function") or c).get("arguments")}
                               for c in calls],
                "executed": False, "stop": None}
        turns.append(turn)
        if not calls:  # a turn cut by the budget / context parses as plain text
            stop = ("token_budget" if budget <= room else "context_limit") if cut else "no_tool_call"
            break
        if k == settings.max_turns:  # TRL: the last allowed turn's calls are not executed
            stop = "max_turns"
            break
        t0 = time.monotonic()
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
        tools_s += time.monotonic() - t0
        turn["executed"] = True
        if env.submitted:
            stop = "submit"
            break
        suffix = policy.tool_suffix_ids(tool_messages)
        if len(completion) + len(suffix) > settings.max_new_tokens:
            stop = "token_budget"
            break
        if len(prompt_ids) + len(completion) + len(suffix) >= policy.max_model_len:
            stop = "context_limit"
            break
        completion += suffix
    if turns:
        turns[-1]["stop"] = stop

    t0 = time.monotonic()
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
    patch = artifact(env.snapshot_repo, env.base_tree, env.final_tree)
    artifact_s = time.monotonic() - t0
    return {
        "task_id": task.instance_id, "rollout_index": rollout_index,
        "format_error": env.valid_calls == 0, "turns": turns,
        "artifact": patch,
        "artifact_sha256": hashlib.sha256(patch.encode("utf-8", "surrogateescape")).hexdigest(),
        "generated_tokens": sum(t["generated_tokens"] for t in turns),
        "completion_tokens": len(completion),
        "tool_calls": [{"turn": c.turn, "name": c.name, "arguments": c.arguments, "ok": c.ok,
                        "seconds": round(c.seconds, 4), "error": c.error} for c in env_calls],
        "format_errors": _format_errors(turns, env_calls),
        "stop_reason": stop, "submitted": env.submitted, "setup_error": env.setup_error,
        "snapshots": snaps, "seed": seed, "sampling_seed": rseed,
        "timings": {"setup_s": round(setup_s, 4), "generate_s": round(gen_s, 4),
                    "tools_s": round(tools_s, 4), "artifact_s": round(artifact_s, 4),
                    "total_s": round(time.monotonic() - t_start, 4)},
    }


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
