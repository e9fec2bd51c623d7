"""SFT warm start of a tiny model of any chat-template family.

The embedded default policy (:mod:`.warmstart`) speaks TRL's ``qwen3`` template. To show that
a user's own family works end to end, the tiny model of that family (:mod:`.families`: its
architecture class, a BPE carrying its special and tag tokens, TRL's template byte for byte)
is taught the gold-patch demonstrations (:mod:`.demos`) rendered with *its own* template, so
that it emits tool calls in its family's format (``<tool_call>`` JSON for Qwen, a bare JSON
object after ``<|start_header_id|>assistant`` for Llama 3, the ``commentary`` channel with
``to=functions.NAME`` and ``<|call|>`` for gpt-oss).

Examples are token ids assembled as the rollout loop assembles an episode, with the loss on
generated ids only (:func:`ecredit_trl.policy.corpus.episode_example`): this works for every
family, also those TRL has no ``{% generation %}`` training template for (``llama3_2``).

The tokenizer is a family BPE trained on the rendered demonstrations (regex off, as the
embedded one, so episodes stay short), the model random weights of the family's class. The
result is cached under ``$ECREDIT_CACHE/family-policy/<template>-<key>``, ``key`` = sha256 of
the template name and text, the tasks (id, base commit, gold patch, problem statement), the
recipe and :data:`CODE_VERSION`; temp dir + rename, a file lock, training in a child process
without distributed variables (:func:`ecredit_trl.policy.sft.train_child`).

It memorises a handful of training tasks; it shows the plumbing, not learning.
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

from ecredit_trl.agent.generation import Policy
from ecredit_trl.agent.prompts import INSTRUCTION, policy_tools
from ecredit_trl.policy.corpus import call_messages, episode_example
from ecredit_trl.policy.demos import DemoVariants, demo_conversations
from ecredit_trl.policy.families import FAMILIES, build_family_model, build_family_tokenizer, family
from ecredit_trl.policy.sft import Prepared, cached_model_dir, job_trainer, run_sft_job
from ecredit_trl.policy.warmstart import cache_root
from eval.evaluation.templatecheck import trl_template
from eval.tasks.schema import save_tasks
from eval.tasks.sealed import check_not_sealed
from eval.tasks.splits import check_not_heldout, load_tasks
from sandbox.bounds import ArgumentParser, InDir, Int, OutFile

__all__ = ["CODE_VERSION", "DEFAULT_TASKS", "FAMILY_RECIPE", "default_tasks",
           "ensure_family_policy", "family_recipe", "train_family_dir"]

#: Bump whenever the examples or the training code change what a cache entry holds.
#: v2: MoE configs saved with ``output_router_logits`` off again.
CODE_VERSION = "family-warmstart-v2"

#: Default recipe, sized for CI on the 2-core reference CPU (shared, load 2-9). Measured with
#: ``benchmarks/family_e2e.py`` on :data:`DEFAULT_TASKS`, fresh cache: warm start 33 s
#: (gpt-oss, 406-token episodes), 60-74 s (qwen2.5: its tokenizer class splits words with
#: its own regex, so ~1500-token episodes), 38-81 s (llama3.2); final loss 0.0004-0.0025;
#: greedy and T = 1 rollouts then solve both tasks. 2 GRPO steps 17-37 s, eval.run 10-23 s.
FAMILY_RECIPE = {
    "vocab_size": 2000,
    "steps": 150,
    "batch_size": 2,
    "learning_rate": 5e-3,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 10,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    # shape overrides of the family model (families._SHAPE): wide enough to memorise
    "shape": {"hidden_size": 128, "intermediate_size": 256},
}


#: Two single-block training tasks of two projects (view -> str_replace -> submit -> closing
#: turn): the tasks ``python -m ecredit_trl.policy.family_warmstart build TEMPLATE`` and the
#: end-to-end test warm-start on.
DEFAULT_TASKS = ("bundled__toolz-1.2.0-0011", "bundled__cachetools-8.0.2-0010")


def default_tasks() -> list:
    """The :data:`DEFAULT_TASKS` rows of ``bundled:train`` (built on first use)."""
    by_id = {t.instance_id: t for t in load_tasks("bundled:train", purpose="train")}
    return [by_id[i] for i in DEFAULT_TASKS]


def family_recipe(template: str, steps: int | None = None, seed: int = 0, **overrides) -> dict:
    """The full recipe of ``template``'s warm start (hyperparameters, template text, tools).

    Raises: KeyError for an unknown template; ValueError naming an unknown override or a
    non-positive ``steps``.
    """
    fam = family(template)
    unknown = sorted(set(overrides) - set(FAMILY_RECIPE))
    if unknown:
        raise ValueError(f"family warm-start recipe: unknown field(s) {unknown}; known: "
                         f"{sorted(FAMILY_RECIPE)}")
    r = copy.deepcopy(dict(FAMILY_RECIPE, **overrides))
    if steps is not None:
        r["steps"] = steps
    if not isinstance(r["steps"], int) or r["steps"] < 1:
        raise ValueError(f"steps: expected a positive int, got {r['steps']!r}")
    r.update(seed=seed, template=template, family=repr(fam), instruction=INSTRUCTION,
             tools=policy_tools(), code_version=CODE_VERSION,
             template_sha=hashlib.sha256(trl_template(template).encode()).hexdigest())
    return r


def _key(tasks, recipe: dict) -> str:
    rows = sorted((t.instance_id, t.base_commit, t.patch, t.problem_statement) for t in tasks)
    blob = json.dumps({"tasks": rows, "recipe": recipe}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def ensure_family_policy(template: str, tasks, cache_dir: str | Path | None = None, *,
                         steps: int | None = None, seed: int = 0, log=print,
                         isolate: bool = True, **recipe) -> str:
    """Path of the warm-started tiny ``template`` model for ``tasks``; trained once, reused.

    Args:
        template: a TRL template name of :data:`ecredit_trl.policy.families.FAMILIES`.
        tasks: training tasks with a ``repo_dir`` (demonstrations are made in host
            repositories); no sealed holdout ids.
        cache_dir: cache root (default ``$ECREDIT_CACHE`` or ``~/.cache/ecredit-trl``).
        steps, seed, **recipe: overrides of :data:`FAMILY_RECIPE`.
        log: progress lines (None: silent). isolate: train in a child process (default).

    Returns: a model directory usable as ``--model`` (weights, tokenizer whose chat template
        is TRL's ``template`` byte for byte, ``warmstart.json``).

    Raises: KeyError (template), ValueError (no tasks, bad recipe, a demonstration the
        family's parser does not read back), DemoError, RuntimeError (training failed),
        eval.tasks.sealed.SealedTaskError.
    """
    log = log or (lambda *_: None)
    tasks = list(tasks)
    if not tasks:
        raise ValueError("tasks: no training tasks given")
    check_not_sealed([t.instance_id for t in tasks])
    check_not_heldout(tasks)
    r = family_recipe(template, steps, seed, **recipe)
    key = _key(tasks, r)

    def make_job():
        t0 = time.monotonic()
        demos = demo_conversations(tasks, log=log, variants=DemoVariants(0.0, 0.0, seed))
        return demos, {"key": key, "recipe": r, "tasks": [d["instance_id"] for d in demos],
                       "demo_s": round(time.monotonic() - t0, 2)}

    final = cache_root(cache_dir) / "family-policy" / f"{template}-{key[:16]}"
    return cached_model_dir(
        final, make_job, job_trainer(__name__, train_family_dir, log, isolate),
        log=log, what=f"{template} policy")


def _as_loaded(fam, texts: list[str], r: dict, seed: int):
    """(tokenizer, model) as ``AutoTokenizer`` / the model class load them from disk.

    transformers 5 loads a tokenizer through its model type's class, and some (Qwen2's)
    replace the saved pre-tokenizer with their own word-splitting regex: examples tokenised
    in memory would then differ from what rollouts see. So the BPE is saved with the model's
    config and loaded back; when the loaded pre-tokenizer is not the trained one
    (regex-free merges across spaces), it is retrained with GPT-2's regex, which the
    families' own regexes split alike.
    """
    from transformers import AutoTokenizer

    for use_regex in (False, True):
        built = build_family_tokenizer(fam, vocab_size=r["vocab_size"], corpus=texts,
                                       use_regex=use_regex)
        model = build_family_model(fam, built, seed=seed, shape=r["shape"])
        with tempfile.TemporaryDirectory() as d:
            model.config.save_pretrained(d)
            built.save_pretrained(d)
            loaded = AutoTokenizer.from_pretrained(d)
        same = (loaded.backend_tokenizer.pre_tokenizer.__getstate__()
                == built.backend_tokenizer.pre_tokenizer.__getstate__())
        if same or use_regex:
            return loaded, model
    raise AssertionError("unreachable")


def _examples(template: str, demos: list[dict], r: dict):
    """(tokenizer, model, SFT rows) of ``template`` for ``demos``: the BPE is trained on the
    demonstrations rendered with TRL's template, every row is checked by the family's parser
    (:func:`~ecredit_trl.policy.corpus.episode_example`)."""
    from types import SimpleNamespace

    fam = family(template)
    convs = [call_messages(d["messages"]) for d in demos]
    bare = build_family_tokenizer(fam)
    texts = [bare.apply_chat_template(c, tools=policy_tools(), tokenize=False) for c in convs]
    tokenizer, model = _as_loaded(fam, texts, r, r["seed"])
    # Policy adds TRL's response schema to the tokenizer it holds: give it a copy, so the
    # saved tokenizer is the plain one a user's model would have
    policy = Policy(model, copy.deepcopy(tokenizer), SimpleNamespace(model_dir=template))
    rows = [episode_example(policy, c) for c in convs]
    return tokenizer, model, rows


def train_family_dir(job: str | Path, log=print) -> Path:
    """Train on ``job/demos.jsonl`` with ``job/job.json``'s recipe; save ``job/model``.

    The shared SFT path (:func:`ecredit_trl.policy.sft.run_sft_job`) on pre-tokenised rows
    (``input_ids`` + ``completion_mask``, ``completion_only_loss=True``), fp32 CPU, no
    truncation, no checkpoints.

    Returns: ``job/model``. Raises: RuntimeError when an episode is longer than the model's
    positions.
    """
    return run_sft_job(job, _prepare, log=log)


def _prepare(meta: dict, demos: list[dict]) -> Prepared:
    """The family model, tokenizer and rows (:class:`~ecredit_trl.policy.sft.Prepared`) for
    :func:`~ecredit_trl.policy.sft.run_sft_job`."""
    r = meta["recipe"]
    tokenizer, model, rows = _examples(r["template"], demos, r)
    lengths = [len(x["input_ids"]) for x in rows]
    n_params = sum(p.numel() for p in model.parameters())
    return Prepared(
        model, tokenizer,
        [{"input_ids": x["input_ids"], "completion_mask": x["completion_mask"]} for x in rows],
        lengths, {"completion_only_loss": True}, unit="episode",
        describe=f"{r['template']} ({type(model).__name__}) tokenizer {len(tokenizer)} tokens, "
                 f"{n_params / 1e6:.2f}M params, episodes {min(lengths)}-{max(lengths)} tokens",
        info={"arch": type(model).__name__, "n_params": n_params, "vocab": len(tokenizer),
              "episode_tokens": lengths, "turn_tokens": [x["turn_lengths"] for x in rows],
              "chat_template_ok": tokenizer.chat_template == trl_template(r["template"])},
        before_save=_router_logits_off)


def _router_logits_off(model) -> None:
    """TRL's SFTTrainer turns ``output_router_logits`` on for the MoE auxiliary loss; saved
    so, transformers 5.24's gpt-oss then fails in padded batched generation
    (load_balancing_loss_func: "size of tensor a (2) must match ... b (324)"), and released
    checkpoints ship it off."""
    if getattr(model.config, "output_router_logits", False):
        model.config.output_router_logits = False


def main(argv: list[str] | None = None) -> int:
    """``build TEMPLATE [--write-tasks FILE]``: print the warm-started model directory of
    ``TEMPLATE`` on :data:`DEFAULT_TASKS` (trained once, then cached), and write those tasks
    as a task file for ``train.py --tasks`` / ``eval.run --split`` (the model knows only
    them); ``train JOB_DIR``: the training child
    of :func:`ensure_family_policy`. Returns the exit status (2: bad arguments)."""

    ap = ArgumentParser(
        prog="python -m ecredit_trl.policy.family_warmstart",
        description="A tiny model of a chat-template family, warm-started to emit tool calls "
                    "in its own format (usable as train.py --model / eval.run --model).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="print the model directory (built on first use)")
    b.add_argument("template", choices=list(FAMILIES), metavar="TEMPLATE",
                   help=f"TRL template name: {', '.join(FAMILIES)}")
    b.add_argument("--steps", type=Int(ge=1), default=None,
                   help=f"SFT steps (default {FAMILY_RECIPE['steps']})")
    b.add_argument("--write-tasks", type=OutFile(), metavar="FILE", default=None,
                   help="also write the tasks it was warm-started on (JSONL) to FILE: train "
                        "and evaluate on them (train.py --tasks FILE, eval.run --split FILE)")
    t = sub.add_parser("train", help="(internal) train one job directory")
    t.add_argument("job_dir", type=InDir())
    args = ap.parse_args(argv)
    if args.cmd == "train":
        train_family_dir(args.job_dir, log=print)
        return 0
    try:
        tasks = default_tasks()
        path = ensure_family_policy(args.template, tasks, steps=args.steps,
                                    log=lambda m: print(m, file=sys.stderr))
        if args.write_tasks:
            save_tasks(tasks, args.write_tasks)
    except (ValueError, OSError) as exc:
        print(f"family_warmstart: error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
