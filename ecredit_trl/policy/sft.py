"""Helpers shared by the warm starts (:mod:`.warmstart`, the embedded default policy, and
:mod:`.family_warmstart`, a tiny model of each chat-template family): the isolated training
child, progress lines and saving (the CPU thread count is
:func:`ecredit_trl.agent.generation.torch_threads`).
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
from pathlib import Path

from eval.files import write_json

__all__ = ["DIST_ENV", "no_checkpointing", "progress_callback", "save_model", "train_child",
           "without_dist_env"]

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

    Shared by the embedded and the family warm starts: a file lock beside the entry, a second
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
