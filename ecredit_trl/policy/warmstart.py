"""SFT warm start of the embedded default policy on gold-patch demonstrations.

A random tiny model never emits a valid tool call, so before GRPO the embedded default is
taught the shape of an episode on the *training* tasks: one gold-patch demonstration per task
(view → str_replace → submit → "Done.", with real tool outputs; one view + str_replace per
changed region; a seeded share with an extra D = 0 block or a corrected exploratory edit;
built by :mod:`ecredit_trl.policy.demos`).

The tokenizer (byte-level BPE, ``ecredit_trl.policy.tiny_model``) is trained on the rendered
demonstrations, a tiny Llama is initialised, and TRL's ``SFTTrainer`` trains it with
``assistant_only_loss=True`` (TRL swaps in ``qwen3_training.jinja``, the template GRPO uses
with tools too). The result is cached under ``$ECREDIT_CACHE/policy/<key>`` (default
``~/.cache/ecredit-trl``), ``key`` = sha256 of the task ids, base commits, gold patches and
problem statements, the recipe (hyperparameters, prompt, tool schemas) and
:data:`CODE_VERSION`. The key hashes these values, never module sources: moving code between
modules keeps every cache entry valid; a change to what an entry holds bumps
:data:`CODE_VERSION`. It is written under a temporary name and renamed when complete; a
file lock makes concurrent callers (e.g. several ranks) train once.

Training runs in a child process (``python -m ecredit_trl.policy.warmstart train DIR``) with the
distributed environment variables removed, so it never joins a launcher's process group.

This policy only memorises the training tasks (the bundled problem statements name the
failing tests, not the file or line): do not read generalisation into it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from ecredit_trl.agent.prompts import INSTRUCTION, policy_tools
from ecredit_trl.policy.corpus import render_corpus
from ecredit_trl.policy.demos import (
    CLOSING_MESSAGE,
    EXTRA_COMMENT,
    SUBMIT_OUTPUT,
    DemoVariants,
    demo_conversations,
)
from ecredit_trl.policy.harmful_sites import harmful_meta, recipe_harmful_edits
from ecredit_trl.policy.sft import Prepared, cached_model_dir, job_trainer, run_sft_job
from ecredit_trl.policy.site_demos import SiteCurriculum, site_demonstrations
from ecredit_trl.policy.tiny_model import MODEL_SHAPE, build_model, build_tokenizer, chat_template
from eval.tasks.sealed import check_not_sealed
from eval.tasks.splits import check_not_heldout, load_tasks

#: Bump whenever the demonstrations or the training code change what a cache entry holds.
#: v2: demonstration variants (extra D = 0 block, reverted exploratory edit).
CODE_VERSION = "warmstart-v2"

#: Default SFT recipe (measured on the 2-core reference CPU; the full table is in the README,
#: "Bundled tasks and the embedded policy"). warmstart-v1 (one edit block per demonstration,
#: 29 tasks): 320 steps, final loss 0.016, greedy 29/29, T=1 47 %. warmstart-v2 (builder 5:
#: 35 tasks, 14 pairs, demonstration variants; 315-863 tokens, up to 6 tool calls + the closing
#: turn, so rollouts need ``max_turns`` 7 and ~1024 completion tokens): with a 10-step warmup
#: the loss sits on a plateau whose length depends on the seed (480 steps at 5e-3: 0 % / 10 %
#: for seeds 0 / 1); a 40-step warmup at 3e-3 leaves it early for both: 400 steps -> final
#: loss 0.006 / 0.010, bundled:train at T = 1 68.6 % / 54.3 % (n = 2, max_turns 7); 800 steps
#: -> 91 % / 90 %, too strong for GRPO to have room. ~1.7 s/step, one thread.
DEFAULT_RECIPE = {
    "vocab_size": 4000,
    "steps": 400,
    "batch_size": 4,
    "learning_rate": 3e-3,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 40,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    # shares of demonstrations with a harmless extra edit block (D = 0) and
    # with an exploratory wrong edit corrected by the next turn (demos.DemoVariants)
    "extra_fraction": 0.25,
    "revert_fraction": 0.25,
}


#: Recipe fields that are in a recipe only when on (name -> the "off" value): a recipe
#: without them keeps the cache key it always had. ``harmful_fraction``: the positive
#: control's share; ``site_demos`` / ``site_max_shift``: the localized world's copy
#: curriculum (:mod:`ecredit_trl.policy.site_demos`).
OPTIONAL_RECIPE = {"harmful_fraction": 0, "site_demos": 0, "site_max_shift": None}

# ---------------------------------------------------------------------------
# cache
# ---------------------------------------------------------------------------

def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir`` or ``$ECREDIT_CACHE`` or ``~/.cache/ecredit-trl``."""
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ.get("ECREDIT_CACHE") or Path.home() / ".cache" / "ecredit-trl")


def recipe_for(steps: int | None = None, seed: int = 0, **overrides) -> dict:
    """The full recipe (hyperparameters + everything else that shapes the model).

    Raises: ValueError naming an unknown override or a non-positive ``steps``.
    """
    known = {*DEFAULT_RECIPE, *OPTIONAL_RECIPE}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"warm-start recipe: unknown field(s) {unknown}; known: {sorted(known)}")
    r = dict(DEFAULT_RECIPE, **{k: v for k, v in overrides.items()
                                if k not in OPTIONAL_RECIPE or v != OPTIONAL_RECIPE[k]})
    if steps is not None:
        r["steps"] = steps
    if not isinstance(r["steps"], int) or r["steps"] < 1:
        raise ValueError(f"steps: expected a positive int, got {r['steps']!r}")
    DemoVariants(r["extra_fraction"], r["revert_fraction"], seed,
                 r.get("harmful_fraction", 0.0))  # validates the shares
    r.update(seed=seed, model_shape=MODEL_SHAPE, instruction=INSTRUCTION,
             closing=CLOSING_MESSAGE, submit_output=SUBMIT_OUTPUT, extra_comment=EXTRA_COMMENT,
             tools=policy_tools(), chat_template_sha=hashlib.sha256(
                 chat_template().encode()).hexdigest(), code_version=CODE_VERSION)
    if "site_max_shift" in r and not r.get("site_demos"):
        raise ValueError("site_max_shift: given without site_demos")
    if r.get("site_demos"):
        r["site_max_shift"] = site_curriculum(r).max_shift  # validates both
    return r


def site_curriculum(recipe: dict) -> SiteCurriculum:
    """The recipe's site demonstrations (``site_demos`` per site, shifted up to
    ``site_max_shift`` lines; none when absent). Raises: ValueError for bad values."""
    kw = {"max_shift": recipe["site_max_shift"]} if "site_max_shift" in recipe else {}
    return SiteCurriculum(recipe.get("site_demos", 0), seed=recipe["seed"], **kw)


def policy_key(tasks, recipe: dict) -> str:
    """sha256 hex of the tasks (id, base commit, gold patch, problem statement) and recipe."""
    h = hashlib.sha256()
    rows = sorted((t.instance_id, t.base_commit, t.patch, t.problem_statement) for t in tasks)
    h.update(json.dumps({"tasks": rows, "recipe": recipe}, sort_keys=True).encode())
    return h.hexdigest()


#: Image-held task sets with host-repository twins (same ids, problem statements and gold
#: patches): their default policy is the twin's (``bundled-image`` is made from
#: the bundled projects). Source name -> twin source name; the split suffix is kept.
DEMO_TWINS = {"bundled-image": "bundled"}


def default_policy_tasks(source: str, tasks) -> list:
    """The tasks the embedded default policy of a training run on ``source`` is warm-started on.

    Its demonstrations are made in a host repository (:mod:`ecredit_trl.policy.demos`), so:

    * every task has a ``repo_dir``: ``tasks`` themselves;
    * ``source`` is ``bundled-image[:train|:holdout]`` (:data:`DEMO_TWINS`): the bundled
      twin split (``bundled[:...]``, loaded with ``purpose="train"``), so the policy cache
      key is the bundled run's and a cached policy is reused, never retrained;
    * otherwise (image-held tasks without a twin) no default can be made.

    Args:
        source: the ``--tasks`` value (an ``eval.tasks.splits.load_tasks`` source).
        tasks: the tasks it loaded (``eval.tasks.schema.Task``-like).

    Returns: the warm-start tasks (a new list).
    Raises:
        ValueError: naming ``--model`` when some task has no ``repo_dir`` and ``source``
            has no twin, or when an image task's problem statement, gold patch or bundled
            base commit (``extra["bundled_base_commit"]``) differs from its twin's.
    """
    tasks = list(tasks)
    no_repo = [t.instance_id for t in tasks if not getattr(t, "repo_dir", None)]
    if not no_repo:
        return tasks
    name, sep, split = source.partition(":")
    twin = DEMO_TWINS.get(name)
    if twin is None:
        raise ValueError(
            f"--model: {len(no_repo)} training task(s) of {source!r} are held in images (no "
            f"repo_dir, e.g. {no_repo[:3]}); the embedded default policy is warm-started on "
            "demonstrations made in a host repository, so give a policy with --model "
            "(a local model directory or a hub id)")

    twins = load_tasks(f"{twin}{sep}{split}", purpose="train")
    by_id = {t.instance_id: t for t in twins}
    bad = [t.instance_id for t in tasks if t.instance_id not in by_id
           or not _same_task(t, by_id[t.instance_id])]
    if bad:
        raise ValueError(
            f"--model: task(s) {bad[:5]} of {source!r} have no identical twin in "
            f"{twin}{sep}{split} (id, problem statement, gold patch, bundled base commit); "
            "rebuild the image tasks (python -m eval.build_tasks --image-tasks) or give --model")
    return twins


def _same_task(image_task, twin) -> bool:
    """Same problem statement and gold patch, and the image task was made from the twin's
    base commit (``extra["bundled_base_commit"]``; the image repository has its own commits,
    :mod:`eval.tasks.bundled.imagetasks`)."""
    return (image_task.problem_statement == twin.problem_statement
            and image_task.patch == twin.patch
            and (image_task.extra or {}).get("bundled_base_commit") == twin.base_commit)


def ensure_default_policy(tasks, cache_dir: str | Path | None = None, *, steps: int | None = None,
                          seed: int = 0, log=print, isolate: bool = True, **recipe) -> str:
    """Path of the warm-started default policy for ``tasks``; trains it once, then reuses it.

    Args:
        tasks: the training tasks (``eval.tasks.schema.Task``-like; must not include sealed
            holdout ids: use ``load_tasks("bundled:train", purpose="train")``).
        cache_dir: cache root (default ``$ECREDIT_CACHE`` or ``~/.cache/ecredit-trl``); the
            policy lands in ``<root>/policy/<key>``.
        steps: SFT optimizer steps (default :data:`DEFAULT_RECIPE` ``["steps"]``).
        seed: seeds the model initialisation and the data order.
        log: progress lines (``None`` = silent).
        isolate: train in a child process without distributed env vars (default). ``False``
            trains in this process (tests; never inside a launched multi-process job).
        **recipe: overrides of :data:`DEFAULT_RECIPE` (``batch_size``, ``learning_rate``...).

    Returns:
        A directory with ``config.json``, the weights, the tokenizer (chat template = the
        qwen3 template) and ``warmstart.json`` (key, recipe, tasks, timings, final loss) —
        usable as ``--model``.

    Raises:
        DemoError: no task yields a demonstration.
        RuntimeError: training failed (with the child's last output lines).
        ValueError: bad recipe values, no tasks.
        eval.tasks.sealed.SealedTaskError: a task is in a sealed holdout manifest, or is a
            held-out instance of a world (:func:`eval.tasks.splits.check_not_heldout`).
    """
    log = log or (lambda *_: None)
    tasks = list(tasks)
    if not tasks:
        raise ValueError("tasks: no training tasks given")
    check_not_sealed([t.instance_id for t in tasks])
    check_not_heldout(tasks)
    r = recipe_for(steps, seed, **recipe)
    harmful = recipe_harmful_edits(tasks, r, log, cache_root(cache_dir))  # sites enter r, the key
    key = policy_key(tasks, r)

    def make_job():
        t0 = time.monotonic()
        demos = demo_conversations(tasks, log=log, variants=DemoVariants(
            r["extra_fraction"], r["revert_fraction"], r["seed"], r.get("harmful_fraction", 0.0)),
            harmful=harmful)
        demos += site_demonstrations(tasks, site_curriculum(r), log=log)
        t_demo = time.monotonic() - t0
        log(f"warmstart: {len(demos)} demonstrations from {len(tasks)} tasks "
            f"({t_demo:.1f} s); SFT {r['steps']} steps")
        return demos, {"key": key, "recipe": r, "tasks": [d["instance_id"] for d in demos],
                       "variants": {d["instance_id"]: d["variant"] for d in demos},
                       "skipped": sorted({t.instance_id for t in tasks}
                                         - {d["instance_id"] for d in demos}),
                       "demo_s": round(t_demo, 2), **harmful_meta(demos, harmful)}

    return cached_model_dir(cache_root(cache_dir) / "policy" / key, make_job,
                            job_trainer(__name__, train_dir, log, isolate), log=log)


# ---------------------------------------------------------------------------
# training (in the child process)
# ---------------------------------------------------------------------------

def train_dir(job: str | Path, log=print) -> Path:
    """Train on ``job/demos.jsonl`` with the recipe of ``job/job.json``; save ``job/model``.

    A tokenizer (:func:`~ecredit_trl.policy.tiny_model.build_tokenizer`) on the rendered
    demonstrations and a model (:func:`~ecredit_trl.policy.tiny_model.build_model`), trained by
    the shared SFT path (:func:`ecredit_trl.policy.sft.run_sft_job`: fp32 CPU,
    ``assistant_only_loss=True``, no truncation, no checkpoints).

    Returns: ``job/model`` (weights, tokenizer, ``warmstart.json``).
    Raises: RuntimeError when TRL does not see the tokenizer as tool-calling capable or a
    demonstration is longer than the model's positions.
    """
    return run_sft_job(job, _prepare, log=log)


def _prepare(meta: dict, demos: list[dict]) -> Prepared:
    """The embedded policy's model, tokenizer and rows (:class:`~ecredit_trl.policy.sft.Prepared`)
    for :func:`~ecredit_trl.policy.sft.run_sft_job`."""
    import torch

    r = meta["recipe"]
    t0 = time.monotonic()
    tokenizer, model, lengths = _tokenizer_and_model(demos, r)
    n_params = sum(p.numel() for p in model.parameters())
    mean = sum(lengths) / len(lengths)
    return Prepared(
        model, tokenizer, [{"messages": d["messages"], "tools": d["tools"]} for d in demos],
        lengths, {"assistant_only_loss": True},
        describe=f"tokenizer {len(tokenizer)} tokens, model {n_params / 1e6:.2f}M params, "
                 f"demonstrations {min(lengths)}-{max(lengths)} tokens (mean {mean:.0f})",
        info={"n_params": n_params, "vocab": len(tokenizer), "max_tokens": max(lengths),
              "mean_tokens": round(mean, 1), "tokenizer_s": round(time.monotonic() - t0, 2),
              "chat_template_ok": chat_template() == tokenizer.chat_template,
              "torch": torch.__version__})


def _tokenizer_and_model(demos: list[dict], r: dict):
    """(tokenizer trained on the rendered demonstrations, fresh model, token length of each
    demonstration).

    Raises: RuntimeError when TRL rejects the tokenizer's chat template for tool calling.
    """
    from trl.chat_template_utils import supports_tool_calling

    tokenizer = build_tokenizer(render_corpus(demos), vocab_size=r["vocab_size"])
    if not supports_tool_calling(tokenizer):
        raise RuntimeError("tokenizer: TRL's supports_tool_calling() rejects the chat template")
    model = build_model(tokenizer, seed=r["seed"])
    return tokenizer, model, demo_lengths(tokenizer, demos)


def demo_lengths(tokenizer, demos: list[dict]) -> list[int]:
    """Token length of each demonstration (``messages`` + ``tools``) in ``tokenizer``'s chat
    template."""
    return [len(tokenizer.apply_chat_template(d["messages"], tools=json.loads(d["tools"]),
                                              tokenize=True, return_dict=False))
            for d in demos]


def load_policy(path: str | Path):
    """``(model, tokenizer)`` of a saved policy directory (fp32, eval mode).

    Raises: ValueError when the saved tokenizer's chat template is not the qwen3 template
    byte for byte (TRL would then not recognise it for tool calling).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.chat_template != chat_template():
        raise ValueError(f"{path}: the tokenizer's chat template is not TRL's qwen3.jinja")
    model = AutoModelForCausalLM.from_pretrained(path, dtype="float32")
    model.eval()
    return model, tok


def _main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "train":
        train_dir(argv[1], log=print)
        return 0
    print("usage: python -m ecredit_trl.policy.warmstart train JOB_DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))


__all__ = ["CODE_VERSION", "DEFAULT_RECIPE", "DEMO_TWINS", "OPTIONAL_RECIPE",
           "default_policy_tasks",
           "demo_lengths", "ensure_default_policy", "load_policy",
           "policy_key", "recipe_for", "site_curriculum", "train_dir"]
