"""Resume binding of a run (design page, "Run records"): which checkpoint, which recorded
command line, whether the manifest still matches, and which ledger/trajectory rows the resumed
session supersedes.

Used by ``ecredit_trl/train.py`` before anything heavy is loaded; everything here
refuses with :class:`RunRefused` (a message that says why and what to do).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ecredit_trl.runs.manifest import (
    binding_differences,
    format_differences,
    informational_differences,
)
from ecredit_trl.runs.receipts import read_sessions
from ecredit_trl.runs.records import RecordWriteError, write_text_atomic
from eval.files import read_json_object


class RunRefused(ValueError):
    """The run was refused before it started; the message says why and what to do."""


@dataclass
class ResumePoint:
    """What ``--resume-from`` names: the checkpoint, its run's manifest, the run's command
    line as its last resume left it, and the changes earlier resumes accepted."""

    checkpoint: Path
    manifest: dict
    base_argv: list[str]
    allowed_before: list[str]


def resume_point(resume_from: str | None) -> ResumePoint | None:
    """Read the run a ``--resume-from`` checkpoint belongs to (None without one).

    The run's command line is the manifest's ``argv``, replaced by the
    ``effective_argv`` of each later resume receipt; the fields those resumes
    accepted (``allowed_changes``) stay accepted.

    Raises: RunRefused when the checkpoint's parent holds no readable manifest.
    """
    if not resume_from:
        return None
    resume_ck = Path(resume_from).resolve()
    if not (resume_ck.parent / "manifest.json").is_file():
        raise RunRefused(f"{resume_ck.parent / 'manifest.json'}: missing; --resume-from "
                         "must name a checkpoint inside a run directory")
    manifest_old = read_manifest(resume_ck.parent)
    # the run's command line (as its last resume left it) first, then what this
    # invocation adds; changes accepted by earlier resumes stay accepted
    base_argv = list(manifest_old.get("argv", []))
    allowed_before: list[str] = []
    for s in read_sessions(resume_ck.parent):
        if (s.opened or {}).get("kind") == "resume":
            base_argv = list(s.opened.get("effective_argv", base_argv))
            allowed_before += list(s.opened.get("allowed_changes", []))
    return ResumePoint(resume_ck, manifest_old, base_argv, allowed_before)


def read_manifest(run_dir: Path) -> dict:
    """``run_dir/manifest.json`` as a dict; RunRefused naming it when it cannot be read,
    parsed or is not an object (:func:`eval.files.read_json_object`)."""
    return read_json_object(run_dir / "manifest.json", RunRefused, what="run manifest")


def check_binding(old: dict, new: dict, allowed: list[str], reason: str | None, *,
                  allowed_before: list[str] | None = None) -> dict:
    """Compare a resumed run's manifest with the recorded one.

    Args:
        allowed: fields this resume accepts as changed (``--allow-changed``).
        reason: why (``--reason``), required with ``allowed``.
        allowed_before: fields earlier resumes of the run accepted (with their
            reasons, in their receipts); they stay accepted.

    Returns: ``{"differences": [...], "allowed": [...], "allowed_before": [...],
    "reason": ..., "informational": [...]}``.

    Raises:
        RunRefused: listing every bound field that differs and is not allowed, or
            when ``allowed`` is given without a ``reason``.
    """
    allowed_before = list(allowed_before or [])

    if allowed and not (reason and reason.strip()):
        raise RunRefused("--allow-changed needs --reason TEXT (it is recorded in the resume "
                         "receipt)")
    diffs = binding_differences(old, new)

    every = list(allowed) + allowed_before

    def is_allowed(name: str) -> bool:
        return name in every or name.removeprefix("model.") in every or any(
            name.startswith(a + ".") for a in every)

    refused = [d for d in diffs if not is_allowed(d["field"])]
    if refused:
        raise RunRefused(
            "resume refused: the checkpoint's run was made with different bound fields "
            f"(manifest {old.get('run_name')}):\n{format_differences(refused)}\n"
            "pass the original arguments, or accept each change explicitly with "
            "--allow-changed FIELD --reason TEXT")
    return {"differences": diffs, "allowed": allowed, "allowed_before": allowed_before,
            "reason": reason, "informational": informational_differences(old, new)}


def supersede_records(run_dir: Path, state: dict, session: int) -> dict:
    """Move ledger/trajectory rows written after the checkpoint out of the main files.

    The rows past ``state["ledger_rows_total"]`` / ``["trajectory_rows_total"]``
    belong to steps the resumed session redoes; they are appended (as written)
    to ``superseded/<file>.s<NN>.jsonl`` first, then the main file is rewritten
    atomically with the rows before them. A torn last line (a crash mid-write)
    goes with them. Nothing is deleted; files already consistent are not touched.

    Returns: {file name: number of lines moved}.

    Raises: RunRefused when a file holds fewer complete rows than the checkpoint
    counted (records lost: resuming would leave a gap).
    """
    moved = {}
    for name, keep in (("ledger.jsonl", int(state.get("ledger_rows_total", 0))),
                       ("trajectories.jsonl", int(state.get("trajectory_rows_total", 0)))):
        path = run_dir / name
        if not path.is_file():
            if keep:
                raise RunRefused(f"{path}: missing, the checkpoint counted {keep} rows")
            continue
        raw = path.read_bytes()
        lines = raw.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline, else a torn line
        lines = [x for x in lines if x.strip()]
        if len(lines) < keep:
            raise RunRefused(f"{path}: holds {len(lines)} complete rows, the checkpoint counted "
                             f"{keep}; the records were cut short, resume would leave a gap")
        extra = lines[keep:] + ([tail] if tail.strip() else [])
        if not extra:
            continue
        side = run_dir / "superseded" / f"{name[:-6]}.s{session:02d}.jsonl"
        try:
            side.parent.mkdir(parents=True, exist_ok=True)
            with open(side, "ab") as f:
                f.write(b"".join(x + b"\n" for x in extra))
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise RecordWriteError(exc.errno, f"cannot append to {side}: {exc.strerror}") from exc
        write_text_atomic(path, b"".join(x + b"\n" for x in lines[:keep]).decode("utf-8"))
        moved[name] = len(extra)
    return moved


def checkpoint_steps(checkpoint: Path) -> tuple[int, int]:
    """``(global_step, max_steps)`` from a checkpoint's ``trainer_state.json``.

    Raises: RunRefused naming the file when it is missing or unreadable.
    """
    path = Path(checkpoint) / "trainer_state.json"
    try:
        state = json.loads(path.read_text())
        return int(state["global_step"]), int(state["max_steps"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunRefused(f"{path}: unreadable trainer state ({exc})") from exc


def lr_at(cfg, *, step: int, max_steps: int, base_lrs: list[float]) -> list[float] | None:
    """The learning rates transformers' scheduler gives after ``step`` optimizer steps of a
    ``max_steps`` horizon (``cfg.lr_scheduler_type``, its warmup and kwargs, as
    ``Trainer.create_scheduler`` builds it), per param group of base LR ``base_lrs``.

    Returns: one LR per group, or None when the scheduler is not a ``LambdaLR`` (its value
    cannot be read off without stepping it, e.g. ``reduce_lr_on_plateau``).
    """
    import torch
    from transformers import get_scheduler

    params = [torch.nn.Parameter(torch.zeros(1)) for _ in base_lrs]
    opt = torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, base_lrs,
                                                                       strict=True)])
    sched = get_scheduler(cfg.lr_scheduler_type, opt,
                          num_warmup_steps=cfg.get_warmup_steps(max_steps),
                          num_training_steps=max_steps,
                          scheduler_specific_kwargs=cfg.lr_scheduler_kwargs or {})
    if not isinstance(sched, torch.optim.lr_scheduler.LambdaLR):
        return None
    return [float(b * f(step)) for b, f in zip(base_lrs, sched.lr_lambdas, strict=True)]


def schedule_change(checkpoint: Path, cfg) -> dict | None:
    """What a resume with a changed ``max_steps`` does to the LR schedule.

    transformers rebuilds the scheduler for the new horizon and then loads the
    checkpoint's scheduler and optimizer states, so the first resumed step runs at the
    LR the *old* horizon left in the optimizer (0 after a completed linear schedule), and
    only the steps after it follow the new one. The trainer sets the first step's LR to
    the new horizon's value at the resumed step (``lr_next``) when the scheduler is a
    ``LambdaLR`` (every warmup/decay schedule of transformers): the run continues on the
    schedule a run of ``new_max_steps`` would have at that step.

    Returns: None when ``cfg.max_steps`` equals the checkpoint's; else ``{"step",
    "old_max_steps", "new_max_steps", "lr_checkpoint" (the LR the old schedule left for
    the next step), "lr_next" (the LR the next step uses; None: not computable, then the
    next step uses ``lr_checkpoint``), "lr_next_per_group", "rebuilt" (bool)}``.

    Raises: RunRefused when ``trainer_state.json`` or ``scheduler.pt`` cannot be read.
    """
    import torch

    step, old_max = checkpoint_steps(checkpoint)
    new_max = int(cfg.max_steps)
    if new_max == old_max:
        return None
    path = Path(checkpoint) / "scheduler.pt"
    try:
        sched = torch.load(path, weights_only=True)
        base_lrs = [float(x) for x in sched["base_lrs"]]
        last = [float(x) for x in sched["_last_lr"]]
    except (OSError, RuntimeError, KeyError, TypeError, ValueError) as exc:
        raise RunRefused(f"{path}: unreadable scheduler state ({exc})") from exc
    lrs = lr_at(cfg, step=step, max_steps=new_max, base_lrs=base_lrs)
    return {"step": step, "old_max_steps": old_max, "new_max_steps": new_max,
            "lr_checkpoint": last[0], "lr_next": lrs[0] if lrs else last[0],
            "lr_next_per_group": lrs, "rebuilt": lrs is not None}


def schedule_warning(change: dict) -> str:
    """One line for people: the horizon change and the LR the next step will use."""
    how = ("the LR schedule is rebuilt for the new horizon" if change["rebuilt"] else
           "the scheduler cannot be rebuilt (not a LambdaLR): the old horizon's LR is kept "
           "for this step")
    return (f"[ecredit] WARNING: resume changes max_steps {change['old_max_steps']} -> "
            f"{change['new_max_steps']} at step {change['step']}; {how}; the next step uses "
            f"learning rate {change['lr_next']:.3e} (the checkpoint's schedule left "
            f"{change['lr_checkpoint']:.3e})")
