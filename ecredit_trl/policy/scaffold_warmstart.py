"""Warm start of the embedded default policy for another scaffold (design page, "Generation engines and scaffolds").

The embedded policy (:mod:`ecredit_trl.policy.warmstart`) knows the built-in tools only. For
``--scaffold mini-swe-agent`` it gets a short SFT continuing from that cached policy (same
tokenizer, same weights to start from) on the same gold-patch demonstrations rendered in the
scaffold's format (:mod:`ecredit_trl.policy.scaffold_demos`). The result is cached apart, under
``$ECREDIT_CACHE/policy-scaffold/<key>``, ``key`` = sha256 of the base policy's key (its
directory name), the scaffold's name and config hash (not the config's path), the recipe and
:data:`SCAFFOLD_CODE_VERSION`; the base policy's own cache entry is unchanged.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from ecredit_trl.agent.scaffolds import get_scaffold
from ecredit_trl.policy.demos import DemoVariants
from ecredit_trl.policy.scaffold_demos import SCAFFOLD_DEMO_VERSION, mini_swe_agent_demos
from ecredit_trl.policy.sft import Prepared, cached_model_dir, job_trainer, run_sft_job
from ecredit_trl.policy.warmstart import cache_root, demo_lengths, load_policy

__all__ = ["SCAFFOLD_RECIPE", "ensure_scaffold_policy", "scaffold_policy", "train_dir"]

SCAFFOLD_CODE_VERSION = "scaffold-warmstart-v1"

#: The continuation SFT. With the compact config the embedded policy gets
#: (:func:`ecredit_trl.agent.scaffolds.default_scaffold_config`) the demonstrations are
#: 0.7k-1.5k tokens in the embedded tokenizer (0.3k-0.9k in the built-in format; 2.7k-3.5k
#: with mini-swe-agent's SWE-bench templates). Measured on the shared 2-core machine (one torch
#: thread, 1.2-1.6 s a step): 150 steps ended at loss 0.10, 240 at 0.026, 400 at 0.0034; only
#: the last made edit calls when sampled at the run's temperature 1.0 (3 of 8 rollouts; 0 of 8
#: after 240 steps, though 8 of 8 greedy). Figures of a build: its ``warmstart.json``
#: (``train_s``, ``s_per_step``, ``final_loss``) and the ``warmstart: step N/M loss L`` lines.
SCAFFOLD_RECIPE = {"steps": 400, "batch_size": 2, "learning_rate": 3e-3,
                   "lr_scheduler_type": "cosine", "warmup_steps": 5, "weight_decay": 0.0,
                   "max_grad_norm": 1.0}


def ensure_scaffold_policy(base_dir: str | Path, tasks, scaffold, *, cache_dir=None,
                           steps: int | None = None, log=print, isolate: bool = True) -> str:
    """The embedded policy of ``scaffold``: ``base_dir`` (the built-in warm start of
    ``tasks``) after a short SFT on ``tasks``' demonstrations in ``scaffold``'s format;
    trained once, then reused. The ``ecredit`` scaffold returns ``base_dir`` itself.

    Args:
        base_dir: the cached built-in policy (:func:`ecredit_trl.policy.warmstart.ensure_default_policy`).
        tasks: the training tasks it was warm-started on.
        scaffold: a :class:`~ecredit_trl.agent.scaffolds.base.Scaffold`.
        steps: SFT steps (default :data:`SCAFFOLD_RECIPE` ``["steps"]``).
        isolate: train in a child process (default); False: in this process.

    Returns: the policy directory (weights, the base's tokenizer, ``warmstart.json``).
    Raises: DemoError (no demonstration), RuntimeError (training failed), ValueError (a
    scaffold without a demonstration renderer, ``steps`` < 1).
    """
    if scaffold.name == "ecredit":
        return str(base_dir)
    if scaffold.name != "mini-swe-agent":
        raise ValueError(f"scaffold: no embedded warm start for {scaffold.name!r}; give --model")
    base = json.loads((Path(base_dir) / "warmstart.json").read_text())
    r = dict(SCAFFOLD_RECIPE, **({"steps": steps} if steps else {}))
    if not isinstance(r["steps"], int) or r["steps"] < 1:
        raise ValueError(f"steps: expected a positive int, got {r['steps']!r}")
    r.update(seed=base["recipe"]["seed"], base_key=Path(base_dir).name,
             # the config's name and hash, not its path: the same config in another checkout
             # (or installed) is the same policy
             scaffold={"name": scaffold.name, "config_hash": scaffold.config_hash},
             demos=SCAFFOLD_DEMO_VERSION,
             code_version=SCAFFOLD_CODE_VERSION)
    key = hashlib.sha256(json.dumps(r, sort_keys=True).encode()).hexdigest()

    def make_job():
        t0 = time.monotonic()
        br = base["recipe"]
        demos = mini_swe_agent_demos(tasks, scaffold, log=log, variants=DemoVariants(
            br["extra_fraction"], br["revert_fraction"], br["seed"]))
        log(f"warmstart: {len(demos)} {scaffold.name} demonstrations "
            f"({time.monotonic() - t0:.1f} s); SFT {r['steps']} steps from {base_dir}")
        return demos, {"key": key, "recipe": r, "base_dir": str(base_dir),
                       "scaffold_config": scaffold.source,
                       "tasks": [d["instance_id"] for d in demos],
                       "demo_s": round(time.monotonic() - t0, 2)}

    return cached_model_dir(cache_root(cache_dir) / "policy-scaffold" / key, make_job,
                            job_trainer(__name__, train_dir, log, isolate), log=log,
                            what=f"{scaffold.name} policy")


def scaffold_policy(model_path, tasks, cfg) -> str:
    """``model_path`` (the embedded built-in policy) for ``cfg.scaffold`` (its warm start,
    :func:`ensure_scaffold_policy`)."""
    return ensure_scaffold_policy(model_path, tasks,
                                  get_scaffold(cfg.scaffold, cfg.scaffold_config))


def train_dir(job: str | Path, log=print) -> Path:
    """Continue the base policy of ``job/job.json`` on ``job/demos.jsonl``; save ``job/model``
    (the shared SFT path, :func:`ecredit_trl.policy.sft.run_sft_job`: fp32 CPU,
    assistant-only loss). Returns ``job/model``. Raises: RuntimeError when a demonstration is
    longer than the model's positions."""
    return run_sft_job(job, _prepare, log=log)


def _prepare(meta: dict, demos: list[dict]) -> Prepared:
    """The base policy (weights and tokenizer) and the scaffold demonstrations
    (:class:`~ecredit_trl.policy.sft.Prepared`) for :func:`~ecredit_trl.policy.sft.run_sft_job`."""
    model, tokenizer = load_policy(meta["base_dir"])
    model.train()
    lengths = demo_lengths(tokenizer, demos)
    return Prepared(model, tokenizer,
                    [{"messages": d["messages"], "tools": d["tools"]} for d in demos],
                    lengths, {"assistant_only_loss": True},
                    describe=f"demonstrations {min(lengths)}-{max(lengths)} tokens",
                    info={"max_tokens": max(lengths)})


def _main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "train":
        train_dir(argv[1], log=print)
        return 0
    print("usage: python -m ecredit_trl.policy.scaffold_warmstart train JOB_DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

