"""Main job: ``accelerate launch ecredit_trl/train.py --arm {O,B,M,E} [--config f.yaml] [--field value ...]``.

With only ``--arm`` it runs the embedded default: the bundled tasks (built from
real PyPI projects on first use, sealed holdout excluded), the tiny local
policy (built and SFT warm-started on first use, cached), Podman sandboxes,
two GRPO steps on CPU. Every ``ECreditConfig`` / ``GRPOConfig`` field can be
given on the command line (``--credit_lambda 0.3`` or ``--credit-lambda 0.3``)
or in a YAML file (``--config``; command-line values win).

Writes ``runs/<name>/`` (DESIGN.md §5): ``manifest.json`` (config / task-list /
code hashes, package versions, image digests, sealed holdouts, world size),
``config.json`` (resolved), ``receipts/`` (start, every checkpoint,
termination, resume), ``ledger.jsonl``, ``trajectories.jsonl``,
``metrics.jsonl``, ``checkpoint-<step>/`` (resumable) and ``checkpoint-final/``.

Resume: ``train.py --resume-from runs/<name>/checkpoint-<step>`` re-uses the
run's recorded command line (later arguments win), verifies the checkpoint
against its receipt, binds it to the manifest (config, task list, code and
world size must match; ``--allow-changed FIELD --reason TEXT`` records an
explicit exception) and continues exactly: same data order, RNG states,
block-selection seeds (generation round) and ledger numbering.

Exit status: 0 completed, 143 SIGTERM / 130 SIGINT (checkpoint saved), 75
sandbox service unavailable (emergency checkpoint saved), 1 other errors.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# `accelerate launch ecredit_trl/train.py` puts ecredit_trl/ (not the repo root) first on
# sys.path. Its subpackages (agent, credit, policy, runs) would then shadow any top-level
# module of those names, so that entry is replaced by the repo root, which also makes the
# sibling packages importable without an install.
_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
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


@dataclass
class RunArguments:
    """Session control (never part of the run's config or its hashes)."""

    resume_from: str | None = field(default=None, metadata={
        "help": "checkpoint directory (runs/<name>/checkpoint-<step>) to resume exactly"})
    allow_changed: list[str] = field(default_factory=list, metadata={
        "help": "bound field allowed to differ from the manifest on resume (repeatable, or "
                "comma-separated: a config field, model.<field>, tasks, code, world_size)"})
    reason: str | None = field(default=None, metadata={
        "help": "why the --allow-changed fields changed (recorded in the resume receipt)"})


class RunRefused(ValueError):
    """The run was refused before it started; the message says why and what to do."""


def embedded_defaults(on_gpu: bool) -> dict:
    """Config values of the embedded default run (CPU, tiny model, short episodes).

    Checkpoints: every 50 steps and at the last step (``save_strategy="steps"``),
    the two newest kept.
    """
    d = {
        "per_device_train_batch_size": 4, "num_generations": 4, "max_steps": 2,
        "learning_rate": 1e-4, "max_completion_length": 640, "temperature": 1.0,
        "logging_steps": 1, "save_strategy": "steps", "save_steps": 50,
        "save_total_limit": 2, "report_to": "none",
        "max_turns": 3, "gradient_checkpointing": False, "seed": 0,
        "log_completions": False, "disable_tqdm": False,
    }
    if not on_gpu:
        d.update(use_cpu=True, bf16=False, fp16=False)
    return d


def split_run_arguments(argv: list[str]) -> tuple[RunArguments, list[str]]:
    """Take ``--resume-from``, ``--allow-changed`` (repeatable), ``--reason`` out of ``argv``.

    Returns: (RunArguments, the remaining arguments, which describe the run).
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--resume-from", "--resume_from", dest="resume_from", default=None)
    pre.add_argument("--allow-changed", "--allow_changed", dest="allow_changed",
                     action="append", nargs="+", default=[])
    pre.add_argument("--reason", default=None)
    ns, rest = pre.parse_known_args(argv)
    allowed = [x.strip() for group in ns.allow_changed for item in group
               for x in item.split(",") if x.strip()]
    return RunArguments(ns.resume_from, allowed, ns.reason), rest


def parse_args(argv: list[str] | None = None):
    """Fill (ECreditConfig, ModelArguments) from defaults < YAML < command line.

    ``argv`` must not hold the session arguments (:func:`split_run_arguments`).

    Raises: SystemExit (argparse) for unknown fields; ValueError naming a bad field.
    """
    import torch
    import yaml
    from transformers import HfArgumentParser

    from ecredit_trl.config import ECreditConfig

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = HfArgumentParser((ECreditConfig, ModelArguments, RunArguments))
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
    cfg, margs, _ = parser.parse_args_into_dataclasses(merged + argv)
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


# -- rank agreement ------------------------------------------------------------------------
_ERRORS = {"RunRefused": RunRefused}


def _on_main(cfg, fn):
    """Run ``fn()`` on the main process and hand its value (or its refusal) to every rank.

    Raises on every rank what ``fn`` raised on the main one (RunRefused,
    CheckpointError; other errors as RuntimeError with the same message).
    """
    from ecredit_trl.runs.receipts import CheckpointError

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


# -- resume helpers --------------------------------------------------------------------------
def _read_manifest(run_dir: Path) -> dict:
    import json

    path = run_dir / "manifest.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RunRefused(f"{path}: unreadable manifest ({exc})") from exc


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
    from ecredit_trl.runs.manifest import (
        binding_differences,
        format_differences,
        informational_differences,
    )

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
    from ecredit_trl.runs.records import RecordWriteError, write_text_atomic

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


# -- main -----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """Run (or resume) one training session; returns the process exit status.

    Order: session arguments → config → run directory (a new one, or the
    checkpoint's) → report sessions of the runs directory that ended without
    receipt → verify the checkpoint → tasks and policy → manifest (new run) or
    manifest binding + superseding of later rows (resume) → start/resume receipt
    → train under :class:`~ecredit_trl.runs.faults.GracefulStop` → termination receipt.

    Raises (before any receipt is written): RunRefused (existing run directory
    without ``--resume-from``, binding differences, a live session),
    CheckpointError (naming the file), ValueError/FileNotFoundError for bad
    config. After the start receipt every way out writes a termination receipt;
    exceptions other than SandboxUnavailable / KeyboardInterrupt are re-raised.
    """
    import torch

    from ecredit_trl.runs.faults import (
        GracefulStop,
        SandboxUnavailable,
        exit_code,
        follow_launcher_signals,
        termination_class,
    )
    from ecredit_trl.runs.receipts import (
        RunReceipts,
        detect_unterminated,
        live_sessions,
        read_sessions,
        verify_checkpoint,
    )
    from ecredit_trl.runs.records import write_json, write_jsonl_atomic

    argv = list(sys.argv[1:] if argv is None else argv)
    run_args, run_argv = split_run_arguments(argv)
    resume_ck = Path(run_args.resume_from).resolve() if run_args.resume_from else None
    manifest_old = None
    if resume_ck is not None:
        if not (resume_ck.parent / "manifest.json").is_file():
            raise RunRefused(f"{resume_ck.parent / 'manifest.json'}: missing; --resume-from "
                             "must name a checkpoint inside a run directory")
        manifest_old = _read_manifest(resume_ck.parent)
        # the run's command line (as its last resume left it) first, then what this
        # invocation adds; changes accepted by earlier resumes stay accepted
        base_argv = list(manifest_old.get("argv", []))
        allowed_before: list[str] = []
        for s in read_sessions(resume_ck.parent):
            if (s.opened or {}).get("kind") == "resume":
                base_argv = list(s.opened.get("effective_argv", base_argv))
                allowed_before += list(s.opened.get("allowed_changes", []))
        run_argv = base_argv + run_argv
    cfg, margs = parse_args(run_argv)
    is_main = cfg.process_index == 0

    # -- where the run lives ---------------------------------------------------------
    if resume_ck is not None:
        run_dir = resume_ck.parent
        run_name = manifest_old["run_name"]
    else:
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        run_name = _on_main(cfg, lambda: f"{cfg.run_name_prefix}-{cfg.arm}-{stamp}")
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

    if resume_ck is None:
        _on_main(cfg, refuse_existing)

    # -- sessions that ended without a receipt (this runs directory) -------------------
    detected: list[dict] = []
    if is_main:
        me = {"run": run_name, "pid": os.getpid(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        for root in sorted({Path(cfg.runs_dir).resolve(), run_dir.resolve().parent}):
            for item in detect_unterminated(root, detected_by=me):
                print(item["message"], file=sys.stderr, flush=True)
                detected.append({k: item.get(k) for k in ("run_dir", "session", "class",
                                                          "receipt")})
                detected[-1]["containers_removed"] = _remove_orphans(item, cfg.runtime)

    # -- checkpoint verification (before anything heavy) ----------------------------------
    ck_receipt = None
    if resume_ck is not None:
        def verify():
            live = live_sessions(run_dir)
            if live:
                s = live[0]
                raise RunRefused(f"{run_dir}: session {s.index} (pid "
                                 f"{s.opened.get('process', {}).get('pid')}) may still be running; "
                                 "stop it first (or wait for its termination receipt)")
            return verify_checkpoint(resume_ck, world_size=cfg.world_size)
        ck_receipt = _on_main(cfg, verify)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from datasets import Dataset
    from ecredit_trl.agent.prompts import task_prompt
    from ecredit_trl.runs.callbacks import ProgressLines
    from ecredit_trl.runs.manifest import build_manifest
    from ecredit_trl.trainer import ECreditGRPOTrainer
    from eval.splits import load_tasks
    from sandbox import make_runtime

    all_tasks = load_tasks(cfg.tasks, purpose="train")
    if not all_tasks:
        raise ValueError(f"tasks: no training tasks in {cfg.tasks!r}")
    if margs.model is None:
        from ecredit_trl.policy.warmstart import ensure_default_policy

        # warm-started on every training task, so --max_tasks reuses the cached policy
        kw = {"steps": margs.warmstart_steps} if margs.warmstart_steps else {}
        model_path = ensure_default_policy(all_tasks, **kw)
    else:
        model_path = margs.model
        looks_local = model_path.startswith(("/", ".", "~")) or Path(model_path).exists()
        if looks_local and not Path(model_path).expanduser().is_dir():
            raise FileNotFoundError(f"--model: no such model directory {model_path}")
    tasks = all_tasks[: cfg.max_tasks] if cfg.max_tasks else all_tasks
    by_id = {t.instance_id: t for t in tasks}
    config = {"ecredit": cfg.to_dict(), "model": vars(margs) | {"path": str(model_path)}}

    # -- manifest, binding, start/resume receipt -------------------------------------------
    def open_session():
        manifest = build_manifest(
            run_name=run_name, argv=run_argv if resume_ck is None else manifest_old["argv"],
            config=config, tasks=tasks, task_source=cfg.tasks,
            images={t.image for t in tasks}, world_size=cfg.world_size,
            model=_model_identity(model_path), runtime=cfg.runtime)
        if resume_ck is None:
            run_dir.mkdir(parents=True, exist_ok=True)
            write_json(run_dir / "manifest.json", manifest)
            write_json(run_dir / "config.json", {"ecredit": cfg.to_dict(),
                                                 "model": config["model"],
                                                 "tasks": sorted(by_id)})
            rr = RunReceipts(run_dir, 0)
            rr.start(run_name=run_name, manifest=str(run_dir / "manifest.json"),
                     config_sha256=manifest["config_sha256"],
                     tasks_sha256=manifest["tasks"]["sha256"],
                     code=manifest["code"], world_size=cfg.world_size, argv=argv,
                     detected_unterminated=detected)
            return rr.session
        binding = check_binding(manifest_old, manifest, run_args.allow_changed, run_args.reason,
                                allowed_before=allowed_before)
        session = RunReceipts.next_session(run_dir)
        state_name = "ecredit_state.json" if cfg.world_size <= 1 else "ecredit_state_0.json"
        import json

        state = json.loads((resume_ck / state_name).read_text())
        moved = supersede_records(run_dir, state, session)
        previous = [{"session": s.index,
                     "class": (s.termination or {}).get("class"),
                     "detected": bool((s.termination or {}).get("detected")),
                     "receipt": (s.termination or {}).get("_file")}
                    for s in read_sessions(run_dir)]
        rr = RunReceipts(run_dir, session)
        rr.resume(run_name=run_name, checkpoint=str(resume_ck), step=ck_receipt.get("step"),
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
                  effective_argv=run_argv, detected_unterminated=detected)
        for p in previous:
            if p["detected"]:
                print(f"[ecredit] resuming {run_name}: session {p['session']} had terminated "
                      f"without receipt (recorded as {p['class']} at a later start)",
                      file=sys.stderr, flush=True)
        return session

    session = _on_main(cfg, open_session)
    receipts = RunReceipts(run_dir, session) if is_main else None
    if is_main:
        what = (f"resumed from {resume_ck.name} (session {session})" if resume_ck else "started")
        print(f"[ecredit] run {run_name} {what}; records in {run_dir}", flush=True)

    stop = GracefulStop()
    stop.install()
    follow_launcher_signals()
    runtime = None
    trainer = None
    exc: BaseException | None = None
    final_dir = None
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=torch.bfloat16 if cfg.bf16 else torch.float32)
        peft_config = None
        if margs.lora_r > 0:
            from peft import LoraConfig

            targets = margs.lora_target_modules
            peft_config = LoraConfig(r=margs.lora_r, lora_alpha=margs.lora_alpha,
                                     lora_dropout=margs.lora_dropout, task_type="CAUSAL_LM",
                                     target_modules=targets[0] if targets == ["all-linear"]
                                     else targets)
        rows = [{"prompt": task_prompt(t), "instance_id": t.instance_id} for t in tasks]
        dataset = Dataset.from_list(rows)
        runtime = make_runtime(cfg.runtime, endpoints=cfg.podman_endpoints or None,
                               run_id=run_name)
        trainer = ECreditGRPOTrainer(model=model, args=cfg, tasks=by_id, train_dataset=dataset,
                                     runtime=runtime, run_dir=run_dir,
                                     processing_class=tokenizer, peft_config=peft_config,
                                     callbacks=[ProgressLines(run_dir)])
        trainer.receipts = receipts
        trainer.stop = stop
        stop._step_fn = lambda: trainer.state.global_step
        if resume_ck is not None:
            trainer.restore_state(resume_ck)
        if not stop.requested:
            trainer.train(resume_from_checkpoint=str(resume_ck) if resume_ck else None)
        if not stop.requested:
            final_dir = run_dir / "checkpoint-final"
            trainer.save_model(str(final_dir))
            if is_main:
                tokenizer.save_pretrained(str(final_dir))
                receipts.checkpoint(final_dir, step=trainer.state.global_step, reason="final")
    except BaseException as e:  # noqa: BLE001 - every way out gets a receipt
        exc = e
    stop.restore()

    # -- termination -----------------------------------------------------------------------
    cls = termination_class(exc, stop)
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
        resumable = _last_resumable(run_dir)
    if runtime is not None:
        runtime.close()
    if trainer is not None:
        try:
            write_json(run_dir / "ranks" / f"rank{trainer.accelerator.process_index}.json",
                       rank_summary(trainer))
        except BaseException as e3:  # noqa: BLE001
            print(f"[ecredit] rank summary not written: {e3}", file=sys.stderr, flush=True)
    if is_main:
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
            body["error"] = {"type": type(exc).__name__, "message": str(exc)[:4000]}
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
            usable = sum(r["usable_contrasts"] for r in rows)
            print(f"[ecredit] run {run_name}: {cls} at step {step}; this session "
                  f"{len(rows)} generation rounds, "
                  f"{sum(r['trials_factual'] for r in rows)} factual and {cf} counterfactual "
                  f"trials, {usable} usable contrasts; receipt {path}", flush=True)
        if resumable and cls != "completed":
            print(f"[ecredit] resume with: accelerate launch ecredit_trl/train.py --resume-from "
                  f"{resumable}", flush=True)
    if isinstance(exc, SandboxUnavailable):
        print(f"[ecredit] stopped: {exc}", file=sys.stderr, flush=True)
        return exit_code(cls, exc)
    if exc is not None and not isinstance(exc, KeyboardInterrupt):
        raise exc
    return exit_code(cls, exc)


def _remove_orphans(item: dict, runtime: str) -> list[str]:
    """Containers a dead session left running (its agent sandboxes keep ``sleep``-ing),
    removed by run label when no session of that run is alive. Local Podman only."""
    from ecredit_trl.runs.receipts import live_sessions

    if runtime != "podman" or item.get("session") is None:
        return []
    run_dir = Path(item["run_dir"])
    if live_sessions(run_dir):
        return []
    try:
        from sandbox.podman_runtime import gc

        names = gc(run_dir.name)  # the runtime's run id is the run name
    except Exception:  # no podman CLI: leftovers stay for `python -m sandbox gc`
        return []
    if names:
        print(f"[ecredit] removed {len(names)} container(s) left by that session",
              file=sys.stderr, flush=True)
    return names


def _last_resumable(run_dir: Path) -> str | None:
    """The newest checkpoint of the run whose receipt says it can be resumed, or None."""
    from ecredit_trl.runs.receipts import read_sessions

    best = None
    try:
        for s in read_sessions(run_dir):
            for rec in s.checkpoints:
                present = rec.get("state_present", {})
                if present.get("optimizer") and Path(rec.get("path", "")).is_dir():
                    if best is None or rec.get("step", 0) >= best.get("step", 0):
                        best = rec
    except ValueError:
        return None
    return best["path"] if best else None


def _model_identity(model_path) -> dict:
    """Path of the policy and the sha256 of its weight files (local directories up to 2 GB)."""
    from ecredit_trl.runs.receipts import sha256_file

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


def cli(argv: list[str] | None = None) -> int:
    """``main`` for people: a bad argument, file or config value is one line on stderr
    (exit 2), not a traceback. Errors after training started keep their traceback."""
    from ecredit_trl.runs.receipts import CheckpointError

    try:
        return main(argv)
    except (RunRefused, CheckpointError, FileNotFoundError) as exc:
        print(f"train.py: error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        if getattr(exc, "__traceback__", None) is not None and _raised_during_setup(exc):
            print(f"train.py: error: {exc}", file=sys.stderr)
            return 2
        raise


def _raised_during_setup(exc: BaseException) -> bool:
    """True when ``exc`` came from argument/config parsing or validation, not training."""
    tb = exc.__traceback__
    names = set()
    while tb is not None:
        names.add(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return bool(names & {"parse_args", "__post_init__", "parse_args_into_dataclasses",
                         "load_tasks", "_guard", "check_not_sealed"}) and "train" not in names


if __name__ == "__main__":
    sys.exit(cli())
