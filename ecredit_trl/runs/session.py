"""One training session's records (design page, "Run records"), step by step as ``train.py``
opens and closes it: rank agreement, where the run lives, sessions of the runs directory that
ended without a receipt, the checkpoint check of a resume, the manifest and the
start/resume receipt, and at the end the termination receipt with its summary.

Every function that decides something runs on the main process and hands its answer
(or its refusal) to every rank (:func:`on_main`).
"""

from __future__ import annotations

import os
import secrets
import sys
import time
import traceback
from pathlib import Path

from ecredit_trl.runs.binding import (
    ResumePoint,
    RunRefused,
    check_binding,
    supersede_records,
)
from ecredit_trl.runs.faults import SandboxUnavailable, signal_consequence
from ecredit_trl.runs.receipts import (
    CheckpointError,
    RunReceipts,
    detect_unterminated,
    live_sessions,
    read_sessions,
    sha256_file,
    verify_checkpoint,
)
from ecredit_trl.runs.records import write_json, write_jsonl_atomic
from ecredit_trl.runs.resume import resume_checkpoint
from sandbox.runtimes.podman_runtime import gc

# -- rank agreement ------------------------------------------------------------------------
_ERRORS = {"RunRefused": RunRefused}


def on_main(cfg, fn):
    """Run ``fn()`` on the main process and hand its value (or its refusal) to every rank.

    Raises on every rank what ``fn`` raised on the main one (RunRefused,
    CheckpointError; other errors as RuntimeError with the same message).
    """
    _ERRORS["CheckpointError"] = CheckpointError
    value, error = None, None
    if cfg.process_index == 0:
        try:
            value = fn()
        except (RunRefused, CheckpointError, FileNotFoundError, ValueError) as exc:
            error = (type(exc).__name__, str(exc))
            if cfg.world_size <= 1:
                raise
    if cfg.world_size > 1:
        from accelerate.utils import broadcast_object_list

        box = [(value, error)]
        broadcast_object_list(box, from_process=0)
        value, error = box[0]
    if error is not None:
        raise _ERRORS.get(error[0], RuntimeError)(error[1])
    return value


# -- opening -------------------------------------------------------------------------------
def run_location(cfg, resume: ResumePoint | None) -> tuple[Path, str]:
    """The run directory and run name, written into ``cfg.output_dir`` / ``cfg.run_name``.

    A resume continues the checkpoint's run; a new run is named
    ``<run_name_prefix>-<arm>-<time>-<4 hex>`` (the main process's name, on every rank)
    under ``cfg.runs_dir`` unless ``--output_dir`` names the directory.

    Raises: RunRefused when a new run's directory already holds a run.
    """
    if resume is not None:
        run_dir = resume.checkpoint.parent
        run_name = resume.manifest["run_name"]
    else:
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        run_name = on_main(cfg, lambda: f"{cfg.run_name_prefix}-{cfg.arm}-{stamp}")
        run_dir = (Path(cfg.runs_dir) / run_name if cfg.output_dir in ("runs/_pending", None)
                   else Path(cfg.output_dir))
    cfg.output_dir = str(run_dir)
    cfg.run_name = run_name

    def refuse_existing():
        if (run_dir / "manifest.json").exists() or (run_dir / "receipts").exists():
            raise RunRefused(
                f"{run_dir}: already holds a run; a restarted process is not a resumed run. "
                f"Resume it with --resume-from {run_dir}/checkpoint-<step>, or choose another "
                "--output_dir")

    if resume is None:
        on_main(cfg, refuse_existing)
    return run_dir, run_name


def report_unterminated(cfg, run_dir: Path, run_name: str) -> list[dict]:
    """Sessions of the runs directory (and the run's parent) that ended without a receipt:
    each is reported on stderr, gets its receipt (``detect_unterminated``) and its leftover
    containers removed. Main process only.

    Returns: one dict per such session (run_dir, session, class, receipt,
    containers_removed), recorded in this session's start/resume receipt.
    """
    detected: list[dict] = []
    me = {"run": run_name, "pid": os.getpid(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for root in sorted({Path(cfg.runs_dir).resolve(), run_dir.resolve().parent}):
        for item in detect_unterminated(root, detected_by=me):
            print(item["message"], file=sys.stderr, flush=True)
            detected.append({k: item.get(k) for k in ("run_dir", "session", "class",
                                                      "receipt")})
            detected[-1]["containers_removed"] = remove_orphans(item, cfg.runtime)
    return detected


def verify_resume_checkpoint(cfg, run_dir: Path, checkpoint: Path) -> dict:
    """The checkpoint's receipt, after checking no session of the run is alive and every
    file of the checkpoint matches its receipt (before anything heavy is loaded).

    Raises: RunRefused (a live session), CheckpointError (naming the file).
    """
    def verify():
        live = live_sessions(run_dir)
        if live:
            s = live[0]
            raise RunRefused(f"{run_dir}: session {s.index} (pid "
                             f"{s.opened.get('process', {}).get('pid')}) may still be running; "
                             "stop it first (or wait for its termination receipt)")
        return verify_checkpoint(checkpoint, world_size=cfg.world_size)

    return on_main(cfg, verify)


def start_new_run(*, cfg, run_dir: Path, run_name: str, manifest: dict, config: dict,
                  task_ids, argv: list[str], detected: list[dict]) -> int:
    """Write a new run's ``manifest.json``, ``config.json`` and start receipt (session 0).

    Returns: the session index (0).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "manifest.json", manifest)
    write_json(run_dir / "config.json", {"ecredit": cfg.to_dict(),
                                         "model": config["model"],
                                         "tasks": sorted(task_ids)})
    rr = RunReceipts(run_dir, 0)
    rr.start(run_name=run_name, manifest=str(run_dir / "manifest.json"),
             config_sha256=manifest["config_sha256"],
             tasks_sha256=manifest["tasks"]["sha256"],
             code=manifest["code"], world_size=cfg.world_size, argv=argv,
             detected_unterminated=detected)
    return rr.session


def resume_run(*, cfg, run_dir: Path, run_name: str, manifest: dict, resume: ResumePoint,
               run_args, ck_receipt: dict, argv: list[str], run_argv: list[str],
               detected: list[dict], schedule: dict | None = None) -> int:
    """Bind a resumed session to its run: check the manifest binding, supersede the rows
    written after the checkpoint, write the resume receipt (with ``lr_schedule``: the
    change a new ``max_steps`` makes, :func:`~ecredit_trl.runs.binding.schedule_change`).

    Returns: the new session index.

    Raises: RunRefused (binding differences not allowed, records cut short).
    """
    import json

    binding = check_binding(resume.manifest, manifest, run_args.allow_changed, run_args.reason,
                            allowed_before=resume.allowed_before)
    session = RunReceipts.next_session(run_dir)
    state_name = "ecredit_state.json" if cfg.world_size <= 1 else "ecredit_state_0.json"
    state = json.loads((resume.checkpoint / state_name).read_text())
    moved = supersede_records(run_dir, state, session)
    previous = [{"session": s.index,
                 "class": (s.termination or {}).get("class"),
                 "detected": bool((s.termination or {}).get("detected")),
                 "receipt": (s.termination or {}).get("_file")}
                for s in read_sessions(run_dir)]
    rr = RunReceipts(run_dir, session)
    rr.resume(run_name=run_name, checkpoint=str(resume.checkpoint), step=ck_receipt.get("step"),
              checkpoint_receipt=ck_receipt.get("_file"),
              checkpoint_verified={"files": len(ck_receipt.get("files", {})),
                                   "weights_sha256": ck_receipt["weights"]["sha256"]},
              binding=binding, allowed_changes=run_args.allow_changed,
              reason=run_args.reason, previous_sessions=previous,
              superseded_rows=moved, counters={k: v for k, v in state.items()
                                               if k not in ("controls", "verified_trial_ids")},
              manifest_now={k: manifest[k] for k in ("config_sha256", "code", "packages",
                                                     "images", "world_size")},
              tasks_sha256=manifest["tasks"]["sha256"], argv=argv,
              effective_argv=run_argv, detected_unterminated=detected, lr_schedule=schedule)
    for p in previous:
        if p["detected"]:
            print(f"[ecredit] resuming {run_name}: session {p['session']} had terminated "
                  f"without receipt (recorded as {p['class']} at a later start)",
                  file=sys.stderr, flush=True)
    return session


def model_identity(model_path) -> dict:
    """Path of the policy and the sha256 of its weight files (local directories up to 2 GB)."""
    p = Path(str(model_path))
    out = {"path": str(model_path), "weights": None}
    if p.is_dir():
        files = sorted(x for x in p.iterdir()
                       if x.suffix in (".safetensors", ".bin") and x.is_file())
        if sum(f.stat().st_size for f in files) <= 2 << 30:
            out["weights"] = {f.name: sha256_file(f) for f in files}
        else:
            out["weights"] = {f.name: {"bytes": f.stat().st_size} for f in files}
    return out


def run_label(run_dir: Path) -> str:
    """The ``ecredit.run`` label value that the sessions of ``run_dir`` put on every
    container they made (agent, tree, checkout and verifier roles alike): the run's name as
    its ``manifest.json`` records it. A run written to ``--output_dir`` (every study unit)
    lives in a directory whose name is not its run name; the directory name is used only
    when the manifest is missing or unreadable (a session killed before writing it made no
    container)."""
    import json

    try:
        name = json.loads((run_dir / "manifest.json").read_text())["run_name"]
    except (OSError, ValueError, KeyError, TypeError):
        return run_dir.name
    return name if isinstance(name, str) and name else run_dir.name


def remove_orphans(item: dict, runtime: str) -> list[str]:
    """Containers a dead session left (its agent sandboxes keep ``sleep``-ing; its verifier
    trials and tree containers stay, running or exited, once its private Podman service is
    gone), removed by the run's label (:func:`run_label`, every role) when no session of
    that run is alive. Local Podman only.

    Returns: the names of the removed containers ([] when nothing was left, another session
    of the run is alive, or the podman CLI is missing: ``python -m sandbox gc`` then).
    """
    if runtime != "podman" or item.get("session") is None:
        return []
    run_dir = Path(item["run_dir"])
    if live_sessions(run_dir):
        return []
    try:
        names = gc(run_label(run_dir))
    except Exception:  # no podman CLI: leftovers stay for `python -m sandbox gc`
        return []
    if names:
        print(f"[ecredit] removed {len(names)} container(s) left by that session",
              file=sys.stderr, flush=True)
    return names


# -- closing -------------------------------------------------------------------------------
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


def resumable_checkpoint(exc, cls: str, stop, trainer, run_dir: Path) -> str | None:
    """The checkpoint a later ``--resume-from`` should name after this session ended.

    A lost sandbox service gets an emergency checkpoint now; a signal keeps the last one
    saved; any other ending that is not ``completed`` falls back to the newest checkpoint
    whose receipt says it is resumable (:func:`ecredit_trl.runs.resume.resume_checkpoint`).
    """
    resumable = None
    if isinstance(exc, SandboxUnavailable) and trainer is not None:
        try:
            resumable = trainer.emergency_checkpoint()
        except BaseException as e2:  # noqa: BLE001
            print(f"[ecredit] emergency checkpoint failed: {type(e2).__name__}: {e2}",
                  file=sys.stderr, flush=True)
    elif cls in ("sigterm", "sigint") and trainer is not None and trainer.checkpoints:
        resumable = trainer.checkpoints[-1]
    if resumable is None and cls != "completed":
        fallback = resume_checkpoint(run_dir)
        resumable = None if fallback is None else str(fallback)
    return resumable


def write_rank_summary(trainer, run_dir: Path) -> None:
    """``ranks/rank<i>.json`` (:func:`rank_summary`); a failure is reported, not raised."""
    try:
        write_json(run_dir / "ranks" / f"rank{trainer.accelerator.process_index}.json",
                   rank_summary(trainer))
    except BaseException as e3:  # noqa: BLE001
        print(f"[ecredit] rank summary not written: {e3}", file=sys.stderr, flush=True)


def close_session(*, cfg, receipts, run_dir: Path, run_name: str, session: int, trainer,
                  stop, exc, cls: str, resumable: str | None, final_dir: Path | None) -> None:
    """Main process: ``metrics.jsonl``, the termination receipt (class, step, counters,
    signal, error and traceback, the resume command) and the session's summary lines.

    After a signal, an exception that followed it is listed as the signal's
    ``consequence`` (its traceback still written), not as the receipt's ``error``
    (:func:`ecredit_trl.runs.faults.termination_class`).

    A receipt that cannot be written is reported on stderr (the next start reports the
    session as terminated without receipt); the original error is kept.
    """
    body = {"max_steps": cfg.max_steps, "resumable_checkpoint": resumable,
            "resume_command": (f"accelerate launch ecredit_trl/train.py --resume-from "
                               f"{resumable}" if resumable else None),
            "final_checkpoint": str(final_dir) if final_dir else None}
    step = None
    if trainer is not None:
        step = trainer.state.global_step
        body.update(ledger_rows_total=trainer.ledger_rows_total,
                    generation_round=trainer._generation_round,
                    sandbox_retries=trainer.sandbox_retries,
                    checkpoints_saved=trainer.checkpoints,
                    verifier_pool=dict(trainer.pool.stats))
    if stop.requested:
        body["signal"] = {"name": stop.signal_name, "received_at": stop.received_at,
                          "during_step": (stop.step or 0) + 1}
    tb = None
    if exc is not None:
        error = {"type": type(exc).__name__, "message": str(exc)[:4000]}
        if signal_consequence(exc, cls):  # the signal's, not the session's reason
            body["signal"]["consequence"] = error
        else:
            body["error"] = error
        if not isinstance(exc, KeyboardInterrupt):
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        if trainer is not None:
            write_jsonl_atomic(run_dir / "metrics.jsonl", trainer.state.log_history)
        path = receipts.termination(cls, step=step, traceback_text=tb, **body)
    except BaseException as e4:  # noqa: BLE001 - say so, keep the original error
        print(f"[ecredit] termination receipt NOT written ({type(e4).__name__}: {e4}); the "
              f"next start will report session {session} as terminated without receipt",
              file=sys.stderr, flush=True)
        path = None
    if trainer is not None:
        rows = trainer.ledger_rows
        cf = sum(r["trials_counterfactual"] for r in rows)
        reused = sum(r.get("counterfactual_from_control", 0) for r in rows)
        usable = sum(r["usable_contrasts"] for r in rows)
        print(f"[ecredit] run {run_name}: {cls} at step {step}; this session "
              f"{len(rows)} generation rounds, "
              f"{sum(r['trials_factual'] for r in rows)} factual and {cf} counterfactual "
              f"trials ({reused} empty ablations from the control), {usable} usable "
              f"contrasts; receipt {path}", flush=True)
    if resumable and cls != "completed":
        print(f"[ecredit] resume with: accelerate launch ecredit_trl/train.py --resume-from "
              f"{resumable}", flush=True)
