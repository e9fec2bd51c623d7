"""Main job: ``accelerate launch ecredit_trl/train.py --arm {O,B,M,E} [--config f.yaml] [--field value ...]``.

With only ``--arm`` it runs the embedded default: the bundled tasks (built from
real PyPI projects on first use, sealed holdout excluded), the tiny local
policy (built and SFT warm-started on first use, cached), Podman sandboxes,
two GRPO steps on CPU. Every ``ECreditConfig`` / ``GRPOConfig`` field can be
given on the command line (``--credit_lambda 0.3`` or ``--credit-lambda 0.3``)
or in a YAML file (``--config``; command-line values win).

Writes ``runs/<name>/``: ``config.json`` (resolved), ``ledger.jsonl``,
``trajectories.jsonl``, ``metrics.jsonl``, ``checkpoint-final/``.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# `accelerate launch ecredit_trl/train.py` puts ecredit_trl/ (not the repo root) on
# sys.path; make the sibling packages importable without an install too.
_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))


@dataclass
class ModelArguments:
    """Which policy to train and how (LoRA through peft)."""

    model: str | None = field(default=None, metadata={
        "help": "causal LM path or hub id; default: the embedded tiny policy (built locally)"})
    lora_r: int = field(default=0, metadata={"help": "LoRA rank; 0 trains all weights"})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha"})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout"})
    lora_target_modules: list[str] = field(default_factory=lambda: ["all-linear"], metadata={
        "help": "modules LoRA adapts (peft names, or all-linear)"})
    warmstart_steps: int | None = field(default=None, metadata={
        "help": "SFT steps of the embedded policy's warm start (default: its recipe)"})
    config: str | None = field(default=None, metadata={"help": "YAML file of config fields"})


def embedded_defaults(on_gpu: bool) -> dict:
    """Config values of the embedded default run (CPU, tiny model, short episodes)."""
    d = {
        "per_device_train_batch_size": 4, "num_generations": 4, "max_steps": 2,
        "learning_rate": 1e-4, "max_completion_length": 640, "temperature": 1.0,
        "logging_steps": 1, "save_strategy": "no", "report_to": "none",
        "max_turns": 3, "gradient_checkpointing": False, "seed": 0,
        "log_completions": False, "disable_tqdm": False,
    }
    if not on_gpu:
        d.update(use_cpu=True, bf16=False, fp16=False)
    return d


def parse_args(argv: list[str] | None = None):
    """Fill (ECreditConfig, ModelArguments) from defaults < YAML < command line.

    Raises: SystemExit (argparse) for unknown fields; ValueError naming a bad field.
    """
    import torch
    import yaml
    from transformers import HfArgumentParser

    from ecredit_trl.config import ECreditConfig

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = HfArgumentParser((ECreditConfig, ModelArguments))
    pre, _ = parser.parse_known_args(argv)
    values = embedded_defaults(torch.cuda.is_available())
    if pre.config:
        path = Path(pre.config)
        if not path.is_file():
            raise FileNotFoundError(f"--config: no such file {path}")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"--config: {path} must hold a mapping of field: value")
        values.update(loaded)
    merged: list[str] = []
    for key, value in values.items():
        if isinstance(value, list):
            merged += [f"--{key}", *map(str, value)]
        else:
            merged += [f"--{key}", str(value)]
    if "--output_dir" not in argv and "--output-dir" not in argv and "output_dir" not in values:
        merged += ["--output_dir", "runs/_pending"]
    cfg, margs = parser.parse_args_into_dataclasses(merged + argv)
    return cfg, margs


def rank_summary(trainer) -> dict:
    """This rank's view after training: world size, rollouts it verified, parameter hash.

    The parameter hash (sha256 over every trainable tensor, in name order) lets a
    test check that data-parallel ranks ended with identical weights.
    """
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    model = trainer.accelerator.unwrap_model(trainer.model)
    for name, p in sorted(model.named_parameters()):
        if p.requires_grad:
            h.update(name.encode())
            h.update(np.ascontiguousarray(p.detach().float().cpu().numpy()).tobytes())
    acc = trainer.accelerator
    return {"rank": acc.process_index, "world_size": acc.num_processes,
            "param_sha256": h.hexdigest(),
            "trial_ids": sorted(trainer.verified_trial_ids)}


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from datasets import Dataset
    from ecredit_trl.callbacks import ProgressLines
    from ecredit_trl.prompts import task_prompt
    from ecredit_trl.records import append_jsonl, write_json
    from ecredit_trl.trainer import ECreditGRPOTrainer
    from eval.tasks import load_tasks
    from sandbox import make_runtime

    cfg, margs = parse_args(argv)
    run_name = f"{cfg.run_name_prefix}-{cfg.arm}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(cfg.runs_dir) / run_name
    if cfg.output_dir in ("runs/_pending", None):
        cfg.output_dir = str(run_dir)
    else:
        run_dir = Path(cfg.output_dir)
    cfg.run_name = run_name

    all_tasks = load_tasks(cfg.tasks, purpose="train")
    if not all_tasks:
        raise ValueError(f"tasks: no training tasks in {cfg.tasks!r}")
    if margs.model is None:
        from ecredit_trl.warmstart import ensure_default_policy

        # warm-started on every training task, so --max_tasks reuses the cached policy
        kw = {"steps": margs.warmstart_steps} if margs.warmstart_steps else {}
        model_path = ensure_default_policy(all_tasks, **kw)
    else:
        model_path = margs.model
    tasks = all_tasks[: cfg.max_tasks] if cfg.max_tasks else all_tasks
    by_id = {t.instance_id: t for t in tasks}
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch.bfloat16 if cfg.bf16 else torch.float32)
    peft_config = None
    if margs.lora_r > 0:
        from peft import LoraConfig

        targets = margs.lora_target_modules
        peft_config = LoraConfig(r=margs.lora_r, lora_alpha=margs.lora_alpha,
                                 lora_dropout=margs.lora_dropout, task_type="CAUSAL_LM",
                                 target_modules=targets[0] if targets == ["all-linear"] else targets)

    rows = [{"prompt": task_prompt(t), "instance_id": t.instance_id} for t in tasks]
    dataset = Dataset.from_list(rows)
    runtime = make_runtime(cfg.runtime, endpoints=cfg.podman_endpoints or None, run_id=run_name)
    try:
        trainer = ECreditGRPOTrainer(model=model, args=cfg, tasks=by_id, train_dataset=dataset,
                                     runtime=runtime, run_dir=run_dir,
                                     processing_class=tokenizer, peft_config=peft_config,
                                     callbacks=[ProgressLines(run_dir)])
        if trainer.accelerator.is_main_process:
            run_dir.mkdir(parents=True, exist_ok=True)
            write_json(run_dir / "config.json", {"ecredit": cfg.to_dict(),
                                                 "model": vars(margs) | {"path": str(model_path)},
                                                 "tasks": sorted(by_id)})
        trainer.train()
        write_json(run_dir / "ranks" / f"rank{trainer.accelerator.process_index}.json",
                   rank_summary(trainer))
        final = run_dir / "checkpoint-final"
        trainer.save_model(str(final))
        if trainer.accelerator.is_main_process:
            tokenizer.save_pretrained(str(final))
            append_jsonl(run_dir / "metrics.jsonl",
                         [r for r in trainer.state.log_history])
            rows = trainer.ledger_rows
            cf = sum(r["trials_counterfactual"] for r in rows)
            usable = sum(r["usable_contrasts"] for r in rows)
            print(f"[ecredit] run {run_name}: {len(rows)} steps, "
                  f"{sum(r['trials_factual'] for r in rows)} factual and {cf} counterfactual "
                  f"trials, {usable} usable contrasts; records in {run_dir}")
    finally:
        runtime.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
