"""The one SFT path of the warm starts (:mod:`.warmstart`, the embedded default policy;
:mod:`.family_warmstart`, a tiny model of each chat-template family; :mod:`.scaffold_warmstart`,
the embedded policy in another scaffold's format).

Each warm start keeps only what differs (its demonstrations, recipe, cache key, and how the
job's demonstrations become a model, a tokenizer and training rows: :class:`Prepared`); the
rest is here: the cache entry built once (:func:`cached_model_dir`), the isolated training
child (:func:`train_child`), and :func:`run_sft_job` (job folder -> model folder: the position
check, TRL's ``SFTConfig``/``SFTTrainer`` with the recipe, the torch thread count
(:func:`ecredit_trl.agent.generation.torch_threads`) set and restored, saving, the
``warmstart.json`` record and the log lines). ``tests/test_layout_sft.py`` checks that no other
module builds an ``SFTConfig`` or sets torch's thread count around training.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ecredit_trl.agent.generation import torch_threads
from eval.files import write_json

__all__ = ["DIST_ENV", "Prepared", "cached_model_dir", "no_checkpointing", "progress_callback",
           "job_trainer", "read_job", "run_sft_job", "save_model", "train_child", "without_dist_env"]

#: Removed from a training child's environment: it must never join a launcher's group.
DIST_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
             "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "ACCELERATE_USE_CPU",
             "ACCELERATE_MIXED_PRECISION", "ACCELERATE_CONFIG_DS_FIELDS",
             "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP")


def without_dist_env(environ=None) -> dict:
    """A copy of ``environ`` (default ``os.environ``) without :data:`DIST_ENV`: the
    environment of a child that must start its own rendezvous, not join (or rebind) one."""
    return {k: v for k, v in (os.environ if environ is None else environ).items()
            if k not in DIST_ENV}


def cached_model_dir(final: Path, make_job, train, *, log, what: str = "policy") -> str:
    """The cache entry ``final`` (a model directory with ``warmstart.json``), built once.

    Shared by the three warm starts: a file lock beside the entry, a second
    look once it is held, leftovers of a killed build removed, then the job built and trained
    in a temporary directory that is renamed into place (a reader never sees half an entry).

    Args:
        final: the entry's path (its parent is the cache root).
        make_job: ``() -> (demos, meta)``, run under the lock: the demonstrations (written to
            ``demos.jsonl``) and the job record (``job.json``) the trainer reads.
        train: ``(job_dir) -> None``, leaves the trained model in ``job_dir/model``.
        log: progress lines. what: the entry's name in them.

    Returns: ``str(final)``.

    Raises: whatever ``make_job`` / ``train`` raise; the cache is left as it was.
    """
    if (final / "warmstart.json").is_file():
        log(f"warmstart: reusing cached {what} {final}")
        return str(final)
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    prefix = f".{final.name}-tmp-"
    with open(root / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "warmstart.json").is_file():
            log(f"warmstart: reusing cached {what} {final}")
            return str(final)
        for stale in root.glob(f"{prefix}*"):  # left by a killed run (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        t0 = time.monotonic()
        demos, meta = make_job()
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        try:
            with open(tmp / "demos.jsonl", "w", encoding="utf-8") as fh:
                for d in demos:
                    fh.write(json.dumps(d, ensure_ascii=False) + "\n")
            write_json(tmp / "job.json", meta)
            train(tmp)
            model_dir = tmp / "model"
            m = json.loads((model_dir / "warmstart.json").read_text())
            m["total_s"] = round(time.monotonic() - t0, 2)
            write_json(model_dir / "warmstart.json", m)
            os.rename(model_dir, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log(f"warmstart: {what} saved to {final} ({time.monotonic() - t0:.0f} s)")
        return str(final)


def job_trainer(module: str, train_dir: Callable, log, isolate: bool = True) -> Callable:
    """The ``train`` argument of :func:`cached_model_dir`: ``train_dir(job, log=log)`` in a
    child process (``python -m <module> train JOB``, :func:`train_child`) when ``isolate``,
    else in this process (tests; never inside a launched multi-process job)."""
    if isolate:
        return lambda job: train_child(job, log, module=module)
    return lambda job: train_dir(job, log=log)


def train_child(job: Path, log, module: str = "ecredit_trl.policy.warmstart") -> None:
    """Run ``python -m <module> train JOB`` without the distributed environment variables
    (so it never joins a launcher's process group); its ``warmstart:`` lines go to ``log``.

    Raises: RuntimeError with the child's last 30 output lines when it exits non-zero.
    """
    env = without_dist_env()
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen([sys.executable, "-m", module, "train", str(job)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=str(Path(__file__).resolve().parents[2]))
    tail: list[str] = []
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail = (tail + [line])[-30:]
        if line.startswith("warmstart:"):
            log(line)
    if proc.wait() != 0:
        raise RuntimeError(f"warm start failed (exit {proc.returncode}); last output:\n"
                           + "\n".join(tail))


def progress_callback(steps: int, log):
    """A TrainerCallback that logs the loss every logging step and keeps the last one
    (``.loss``)."""
    from transformers import TrainerCallback

    class _Progress(TrainerCallback):
        def __init__(self):
            self.t = time.monotonic()
            self.loss = None

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                self.loss = float(logs["loss"])
                log(f"warmstart: step {state.global_step}/{steps} loss {self.loss:.4f} "
                    f"({time.monotonic() - self.t:.0f} s)")

    return _Progress()


def save_model(job: Path, trainer, tokenizer) -> Path:
    """Save the trained model (with its KV cache on) and tokenizer to ``job/model``; drop the
    trainer's scratch folder."""
    out = job / "model"
    model = trainer.model
    model.config.use_cache = True
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    with contextlib.suppress(OSError):
        shutil.rmtree(job / "trainer")
    return out


def no_checkpointing(config_cls) -> dict:
    """Activation checkpointing off, under its transformers >= 5.x name when it exists."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(config_cls)}
    key = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    return {key: False}


@dataclass
class Prepared:
    """What a warm start makes of its job before the shared SFT run (:func:`run_sft_job`).

    Attributes:
        model: the ``transformers`` model to train (fp32, CPU).
        tokenizer: its tokenizer (saved with it).
        rows: the training rows, one dict per example, as TRL's ``SFTTrainer`` takes them
            (``messages`` + ``tools`` with ``assistant_only_loss``; ``input_ids`` +
            ``completion_mask`` with ``completion_only_loss``).
        lengths: each example's length in tokens (the longest sets ``max_length`` + 8: no
            truncation).
        loss: the ``SFTConfig`` loss switch, ``{"assistant_only_loss": True}`` or
            ``{"completion_only_loss": True}``.
        unit: what an example is called in the position error (``demonstration``, ``episode``).
        describe: the start of the log line before training (the thread count is appended).
        info: fields of ``warmstart.json`` besides the job record and the training figures.
        before_save: called with the trained model before it is saved (None: nothing).
    """

    model: object
    tokenizer: object
    rows: list[dict]
    lengths: list[int]
    loss: dict
    unit: str = "demonstration"
    describe: str = ""
    info: dict = field(default_factory=dict)
    before_save: Callable | None = None


def read_job(job: str | Path) -> tuple[dict, list[dict]]:
    """``(job.json, the rows of demos.jsonl)`` of a job folder written by
    :func:`cached_model_dir`."""
    job = Path(job)
    meta = json.loads((job / "job.json").read_text(encoding="utf-8"))
    # rows end at "\n" alone: they are written with ensure_ascii=False, so a demonstration
    # quoting a file may hold a raw U+2028 or U+0085, where str.splitlines would cut the row
    text = (job / "demos.jsonl").read_text(encoding="utf-8")
    demos = [json.loads(x) for x in text.split("\n") if x]
    return meta, demos


def run_sft_job(job: str | Path, prepare: Callable[[dict, list[dict]], Prepared],
                log=print) -> Path:
    """Train a warm start's job folder into ``job/model``: the one SFT path of the warm starts.

    ``prepare(meta, demos)`` (``job.json``, the rows of ``demos.jsonl``) gives the model,
    tokenizer and rows (:class:`Prepared`); then: no example may be longer than the model's
    positions; TRL ``SFTTrainer`` with ``meta["recipe"]`` (``steps``, ``batch_size``,
    ``learning_rate``, ``lr_scheduler_type``, ``warmup_steps``, ``weight_decay``,
    ``max_grad_norm``, ``seed``), fp32 CPU, no packing, no truncation, no checkpoints, a loss
    line every tenth of the steps, :func:`~ecredit_trl.agent.generation.torch_threads` torch
    threads during training: the CPUs idle when training starts (the thread count does not
    change the trained bits), restored after, also on error; saved by :func:`save_model`
    with ``warmstart.json`` = the job record + ``info`` + ``train_loss``, ``final_loss``,
    ``train_s``, ``s_per_step`` (seconds), ``threads``.

    Returns: ``job/model``.
    Raises: RuntimeError when an example is longer than the model's positions; whatever
    ``prepare`` or training raise.
    """
    import torch
    from trl import SFTConfig, SFTTrainer

    from datasets import Dataset

    log = log or (lambda *_: None)
    job = Path(job)
    meta, demos = read_job(job)
    r = meta["recipe"]
    p = prepare(meta, demos)
    max_len, positions = max(p.lengths), p.model.config.max_position_embeddings
    if max_len > positions:
        article = "an" if p.unit[:1] in "aeiou" else "a"
        raise RuntimeError(f"{article} {p.unit} has {max_len} tokens, more than the model's "
                           f"{positions} positions")
    threads = torch_threads(now=True)  # a warm start runs alone: what is busy now counts
    log(f"warmstart: {p.describe + ', ' if p.describe else ''}{threads} torch thread(s)")
    steps = r["steps"]
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(r["seed"])
        progress = progress_callback(steps, log)
        args = SFTConfig(
            output_dir=str(job / "trainer"), max_steps=steps,
            per_device_train_batch_size=r["batch_size"], gradient_accumulation_steps=1,
            learning_rate=r["learning_rate"], lr_scheduler_type=r["lr_scheduler_type"],
            warmup_steps=r["warmup_steps"], weight_decay=r["weight_decay"],
            max_grad_norm=r["max_grad_norm"], seed=r["seed"], data_seed=r["seed"],
            use_cpu=True, bf16=False, fp16=False, **no_checkpointing(SFTConfig),
            report_to="none", save_strategy="no", logging_steps=max(1, steps // 10),
            disable_tqdm=True, max_length=max_len + 8, packing=False,
            dataloader_num_workers=0, dataset_num_proc=None, **p.loss)
        trainer = SFTTrainer(model=p.model, args=args, train_dataset=Dataset.from_list(p.rows),
                             processing_class=p.tokenizer, callbacks=[progress])
        t1 = time.monotonic()
        result = trainer.train()
        t_train = time.monotonic() - t1
    finally:
        torch.set_num_threads(prev)
    if p.before_save is not None:
        p.before_save(trainer.model)
    out = save_model(job, trainer, p.tokenizer)
    write_json(out / "warmstart.json", dict(
        meta, **p.info, train_loss=round(float(result.training_loss), 5),
        final_loss=progress.loss, train_s=round(t_train, 2),
        s_per_step=round(t_train / steps, 3), threads=threads))
    log(f"warmstart: trained {steps} steps in {t_train:.0f} s "
        f"({t_train / steps:.2f} s/step), final loss {progress.loss}")
    return out
