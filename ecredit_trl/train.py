"""Main job: ``accelerate launch ecredit_trl/train.py --arm {O,B,M,E} [--config f.yaml] [--field value ...]``.

With only ``--arm`` it runs the embedded default: the bundled tasks (built from
real PyPI projects on first use, sealed holdout excluded), the tiny local
policy (built and SFT warm-started on first use, cached), Podman sandboxes,
two GRPO steps on CPU. Every ``ECreditConfig`` / ``GRPOConfig`` field can be
given on the command line (``--credit_lambda 0.3`` or ``--credit-lambda 0.3``)
or in a YAML file (``--config``; command-line values win).

Writes ``runs/<name>/`` (design page, "Run records"): ``manifest.json`` (config / task-list /
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
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# libgomp's default wait policy spins idle OpenMP threads for a while after every parallel
# region; on a few CPU cores shared with verifier trials and agent containers those spinning
# threads take whole cores from them (measured: generation busy 44 s vs 8 s over 3 steps of
# benchmarks/step_pipeline.py on 2 cores). PASSIVE makes them sleep; a user's value wins. Read
# by libgomp when torch loads, so it must be set before the first `import torch`.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# `accelerate launch ecredit_trl/train.py` puts ecredit_trl/ (not the repo root) first on
# sys.path. Its subpackages (agent, credit, policy, runs) would then shadow any top-level
# module of those names, so that entry is replaced by the repo root, which also makes the
# sibling packages importable without an install.
_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

# every first-party import after the sys.path fix above (and torch after OMP_WAIT_POLICY)
import torch  # noqa: E402
import yaml  # noqa: E402
from transformers import AutoTokenizer, HfArgumentParser  # noqa: E402

from datasets import Dataset  # noqa: E402
from ecredit_trl.agent.scaffolds import get_scaffold  # noqa: E402
from ecredit_trl.config import (  # noqa: E402
    ECreditConfig,
    ModelArguments,
    RunArguments,
    check_resume_sizes,
)
from ecredit_trl.policy.lora_defaults import resolve_lora  # noqa: E402
from ecredit_trl.policy.run_inputs import load_policy, tasks_and_policy  # noqa: E402
from ecredit_trl.policy.vllm_checks import (  # noqa: E402
    VLLMRefused,
    check_vllm_model,
    longest_prompt_tokens,
)
from ecredit_trl.runs.binding import (  # noqa: E402
    RunRefused,
    check_binding,
    checkpoint_steps,
    resume_point,
    schedule_change,
    schedule_warning,
    supersede_records,
)
from ecredit_trl.runs.callbacks import ProgressLines  # noqa: E402
from ecredit_trl.runs.faults import (  # noqa: E402
    GracefulStop,
    SandboxUnavailable,
    exit_code,
    follow_launcher_signals,
    launcher_kills_on_stop,
    signal_consequence,
    termination_class,
)
from ecredit_trl.runs.manifest import build_manifest  # noqa: E402
from ecredit_trl.runs.receipts import CheckpointError, RunReceipts  # noqa: E402
from ecredit_trl.runs.session import (  # noqa: E402
    close_session,
    model_identity,
    on_main,
    report_unterminated,
    resumable_checkpoint,
    resume_run,
    run_location,
    start_new_run,
    verify_resume_checkpoint,
    write_rank_summary,
)
from ecredit_trl.trainer import ECreditGRPOTrainer  # noqa: E402
from eval.console import quiet_upstream_warnings  # noqa: E402 - after the sys.path fix above
from eval.evaluation.templatecheck import TemplateRefused, resolve_template_option  # noqa: E402
from sandbox.backend import make_runtime  # noqa: E402
from sandbox.bounds import (  # noqa: E402
    BoundError,
    use_bounds,
)
from sandbox.cluster.dispatch import RayUnavailable, cluster_image_ids, connect  # noqa: E402

__all__ = ["RunRefused", "check_binding", "supersede_records", "main", "cli"]


def embedded_defaults(on_gpu: bool) -> dict:
    """Config values of the embedded default run (CPU, tiny model, short episodes).

    Checkpoints: every 50 steps and at the last step (``save_strategy="steps"``),
    the two newest kept.

    The learning recipe (rate 1e-3 held constant after 3 warmup steps, a KL anchor
    ``beta`` 0.05 to the starting policy, negative advantages weighted 0) is the one the
    learning sanity benchmark showed to raise success on the tasks it trains on, for every
    arm, when each step's batch holds every trained task's group; with TRL's symmetric
    advantages and no anchor the policy spread out and success fell, and at 5e-4 it rose
    less in the same steps (docs: "Does it learn?").
    """
    d = {
        "per_device_train_batch_size": 4, "num_generations": 4, "max_steps": 2,
        "learning_rate": 1e-3, "lr_scheduler_type": "constant_with_warmup",
        "warmup_steps": 3, "beta": 0.05, "negative_advantage_weight": 0.0,
        "max_completion_length": 640, "temperature": 1.0,
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


def build_parser() -> HfArgumentParser:
    """The parser of the run's fields (ECreditConfig, ModelArguments, RunArguments), each
    field's declared bounds as its argparse type (:func:`sandbox.bounds.use_bounds`)."""
    parser = HfArgumentParser((ECreditConfig, ModelArguments, RunArguments), prog="train.py")
    # argparse prints the whole usage (hundreds of fields) before an error: keep only the
    # one line that names the field (`--help` still lists them all)
    parser.print_usage = lambda file=None: None
    use_bounds(parser, (ECreditConfig, ModelArguments, RunArguments))
    return parser


def parse_args(argv: list[str] | None = None):
    """Fill (ECreditConfig, ModelArguments) from defaults < YAML < command line.

    ``argv`` must not hold the session arguments (:func:`split_run_arguments`).

    Raises: SystemExit (argparse) for unknown fields; ValueError naming a bad field.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
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


# -- the session, step by step ---------------------------------------------------------------
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
    quiet_upstream_warnings()
    argv = list(sys.argv[1:] if argv is None else argv)
    run_args, run_argv = split_run_arguments(argv)
    resume = resume_point(run_args.resume_from)
    if resume is not None:
        run_argv = resume.base_argv + run_argv
    cfg, margs = parse_args(run_argv)
    if resume is not None:  # before any record or container: a resize is refused first
        check_resume_sizes(resume.manifest, cfg, run_args.allow_changed + resume.allowed_before)
    is_main = cfg.process_index == 0
    run_dir, run_name = run_location(cfg, resume)
    detected = report_unterminated(cfg, run_dir, run_name) if is_main else []
    ck_receipt = (verify_resume_checkpoint(cfg, run_dir, resume.checkpoint)
                  if resume is not None else None)
    schedule = schedule_change(resume.checkpoint, cfg) if resume is not None else None
    tasks, model_path = tasks_and_policy(cfg, margs)
    if cfg.use_vllm:  # a model or context vLLM cannot take: one line before any rollout
        check_vllm_model(cfg, model_path, _prompt_tokens(cfg, model_path, tasks))
    session = _open_session(cfg, margs, run_args=run_args, argv=argv, run_argv=run_argv,
                            resume=resume, run_dir=run_dir, run_name=run_name, tasks=tasks,
                            model_path=model_path, ck_receipt=ck_receipt, detected=detected,
                            schedule=schedule)
    receipts = RunReceipts(run_dir, session) if is_main else None
    if is_main:
        what = (f"resumed from {resume.checkpoint.name} (session {session})" if resume
                else "started")
        print(f"[ecredit] run {run_name} {what}; records in {run_dir}", flush=True)
    if resume is not None:
        done = _already_at_max_steps(cfg, resume.checkpoint, receipts, run_dir, run_name)
        if done is not None:
            return done
        if schedule is not None and is_main:
            print(schedule_warning(schedule), flush=True)

    stop = GracefulStop()
    stop.install()
    # world size 1: the single-process launcher (several processes run under torchrun's agent)
    if follow_launcher_signals() and cfg.world_size == 1 and launcher_kills_on_stop():
        print("[ecredit] warning: this accelerate's launcher SIGKILLs the training process 5 s "
              "after a SIGTERM or Ctrl-C, before the step can finish: a stop leaves no "
              "checkpoint of it and no termination receipt (install accelerate<1.16, as the "
              "project pins)", file=sys.stderr, flush=True)
    runtime = None
    trainer = None
    exc: BaseException | None = None
    final_dir = None
    try:
        tokenizer, model, peft_config = load_policy(cfg, margs, model_path)
        runtime = _make_runtime(cfg, run_name)
        trainer = _make_trainer(cfg, tasks, model, tokenizer, peft_config, runtime, run_dir)
        trainer.receipts = receipts
        trainer.resume_schedule = schedule
        trainer.stop = stop
        stop._step_fn = lambda: trainer.state.global_step
        final_dir = _run_training(trainer, tokenizer, stop, receipts, resume, run_dir, is_main)
    except BaseException as e:  # noqa: BLE001 - every way out gets a receipt
        exc = e
    try:
        return _end_session(cfg, exc=exc, stop=stop, trainer=trainer, runtime=runtime,
                            receipts=receipts, run_dir=run_dir, run_name=run_name,
                            session=session, final_dir=final_dir)
    finally:
        # only once the receipt is written: a SIGTERM that comes while the session closes
        # (the launcher's death signal that trails the group's, a scheduler that repeats
        # its signal) is still a request, where the default action would kill the process
        # before its checkpoint and receipt
        stop.restore()


def _prompt_tokens(cfg, model_path, tasks) -> int:
    """Tokens of the longest task prompt as the trainer renders it (tools, the template)."""
    tok = AutoTokenizer.from_pretrained(model_path)
    _, template = resolve_template_option(cfg.chat_template, tok.chat_template, str(model_path))
    scaffold = get_scaffold(cfg.scaffold, cfg.scaffold_config)
    return longest_prompt_tokens(tok, [scaffold.prompt(t) for t in tasks], scaffold.tools(),
                                 template)


def _end_session(cfg, *, exc, stop, trainer, runtime, receipts, run_dir, run_name, session,
                 final_dir) -> int:
    """Classify how the session ended, find the checkpoint to resume from, close the
    runtime, write the rank summary and (main process) the termination receipt.

    Returns the exit status; re-raises ``exc`` unless it is SandboxUnavailable,
    KeyboardInterrupt or the consequence of a signal (the signal's exit status).
    """
    cls = termination_class(exc, stop)
    resumable = resumable_checkpoint(exc, cls, stop, trainer, run_dir)
    if trainer is not None:
        trainer.release_environments()  # containers, working trees, the run's temp root
    if runtime is not None:
        runtime.close()
    if trainer is not None:
        write_rank_summary(trainer, run_dir)
    if cfg.process_index == 0:
        close_session(cfg=cfg, receipts=receipts, run_dir=run_dir, run_name=run_name,
                      session=session, trainer=trainer, stop=stop, exc=exc, cls=cls,
                      resumable=resumable, final_dir=final_dir)
    if isinstance(exc, SandboxUnavailable):
        print(f"[ecredit] stopped: {exc}", file=sys.stderr, flush=True)
        return exit_code(cls, exc)
    if signal_consequence(exc, cls):
        print(f"[ecredit] stopped by {stop.signal_name}; {type(exc).__name__} that followed "
              f"it is recorded as its consequence: {str(exc)[:300]}", file=sys.stderr, flush=True)
        return exit_code(cls, exc)
    if exc is not None and not isinstance(exc, KeyboardInterrupt):
        raise exc
    return exit_code(cls, exc)


def _already_at_max_steps(cfg, checkpoint: Path, receipts, run_dir: Path,
                          run_name: str) -> int | None:
    """A resume whose checkpoint is at (or past) ``max_steps`` trains nothing (transformers'
    loop would run one more step, "step 3/2", before it checks the horizon): one line, a
    ``completed`` termination receipt with ``already_at_max_steps``, exit 0. Raise
    ``max_steps`` with ``--allow-changed max_steps --reason ...`` to train on.

    A run stopped after its last numbered checkpoint but before ``checkpoint-final`` gets
    it now: the checkpoint's weights, config and tokenizer (its resume state left out),
    with its ``final`` receipt.

    Returns: 0 when there is nothing to train, else None.
    """
    step, _ = checkpoint_steps(checkpoint)
    if step < cfg.max_steps:
        return None
    if receipts is not None:
        final = run_dir / "checkpoint-final"
        if not final.is_dir():
            tmp = run_dir / "checkpoint-final.partial"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(checkpoint, tmp, ignore=shutil.ignore_patterns(
                "optimizer*", "scheduler*", "scaler*", "rng_state*", "trainer_state.json",
                "ecredit_state*", "global_step*"))
            tmp.rename(final)
            receipts.checkpoint(final, step=step, reason="final")
        receipts.termination("completed", step=step, already_at_max_steps=True,
                             max_steps=cfg.max_steps, trained_steps=0,
                             final_checkpoint=str(final) if final.is_dir() else None)
        print(f"[ecredit] run {run_name}: already at max_steps ({step} of {cfg.max_steps}); "
              "nothing to train (raise it with --max_steps N --allow-changed max_steps "
              "--reason TEXT)", flush=True)
    return 0


def _open_session(cfg, margs, *, run_args, argv, run_argv, resume, run_dir, run_name, tasks,
                  model_path, ck_receipt, detected, schedule=None) -> int:
    """Build the manifest and write the start receipt (new run) or bind the resume and
    write its receipt (main process, agreed on every rank). Returns the session index."""
    task_ids = [t.instance_id for t in tasks]
    lora = resolve_lora(model_path, margs.lora_r, margs.lora_alpha, margs.lora_target_modules)
    config = {"ecredit": cfg.to_dict(),
              "model": vars(margs) | {"path": str(model_path), "lora": lora}}

    def open_session():
        manifest = build_manifest(
            run_name=run_name, argv=run_argv if resume is None else resume.manifest["argv"],
            config=config, tasks=tasks, task_source=cfg.tasks,
            images={t.image for t in tasks}, world_size=cfg.world_size,
            model=model_identity(model_path), runtime=cfg.runtime,
            image_ids=_node_image_ids(cfg, run_name),
            scaffold=get_scaffold(cfg.scaffold, cfg.scaffold_config).record())
        if resume is None:
            return start_new_run(cfg=cfg, run_dir=run_dir, run_name=run_name,
                                 manifest=manifest, config=config, task_ids=task_ids,
                                 argv=argv, detected=detected)
        return resume_run(cfg=cfg, run_dir=run_dir, run_name=run_name, manifest=manifest,
                          resume=resume, run_args=run_args, ck_receipt=ck_receipt, argv=argv,
                          run_argv=run_argv, detected=detected, schedule=schedule)

    return on_main(cfg, open_session)


def _node_image_ids(cfg, run_name: str):
    """The manifest's image → id lookup on the Ray backend: the sandbox nodes' storage
    (:func:`sandbox.cluster.dispatch.cluster_image_ids`), which is where trials and sandboxes run;
    None (this machine's Podman) on the local backend."""
    if cfg.sandbox_backend != "ray":
        return None

    def lookup(images):
        # the runtime made next reuses this connection
        connect(cfg.ray_address, cfg.sandbox_allow_unauthenticated)
        return cluster_image_ids(images, run_id=run_name, podman_url=cfg.ray_podman_url)
    return lookup


def _make_runtime(cfg, run_name: str):
    """The sandbox runtime of this session (its run id is the run name), made from the
    config's sandbox fields (``cfg.sandbox_options()``). With ``sandbox_backend=ray`` both its
    verifier trials and its agent workspaces run on the Ray cluster's sandbox nodes (every rank
    attaches to the run's one dispatcher, named by the run name; design page, "Scale-out")."""
    return make_runtime(cfg.sandbox_options(), run_id=run_name)


def _make_trainer(cfg, tasks, model, tokenizer, peft_config, runtime, run_dir: Path):
    """The GRPO trainer over one prompt row per task."""
    scaffold = get_scaffold(cfg.scaffold, cfg.scaffold_config)
    rows = [{"prompt": scaffold.prompt(t), "instance_id": t.instance_id} for t in tasks]
    dataset = Dataset.from_list(rows)
    return ECreditGRPOTrainer(model=model, args=cfg, tasks={t.instance_id: t for t in tasks},
                              train_dataset=dataset, runtime=runtime, run_dir=run_dir,
                              processing_class=tokenizer, peft_config=peft_config,
                              callbacks=[ProgressLines(run_dir)])


def _run_training(trainer, tokenizer, stop, receipts, resume, run_dir: Path,
                  is_main: bool) -> Path | None:
    """Restore a resumed state, train unless a stop was requested, save
    ``checkpoint-final`` (with its receipt). Returns the final checkpoint, or None."""
    resume_ck = resume.checkpoint if resume is not None else None
    if resume_ck is not None:
        trainer.restore_state(resume_ck)
    if not stop.requested:
        trainer.train(resume_from_checkpoint=str(resume_ck) if resume_ck else None)
    if stop.requested:
        return None
    final_dir = run_dir / "checkpoint-final"
    trainer.save_model(str(final_dir))
    if is_main:
        tokenizer.save_pretrained(str(final_dir))
        receipts.checkpoint(final_dir, step=trainer.state.global_step, reason="final")
    return final_dir


def cli(argv: list[str] | None = None) -> int:
    """``main`` for people: a bad argument, file or config value is one line on stderr
    (exit 2), not a traceback. Errors after training started keep their traceback."""
    try:
        return main(argv)
    except (RunRefused, CheckpointError, FileNotFoundError, TemplateRefused,
            RayUnavailable, BoundError, VLLMRefused) as exc:
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
                         "load_tasks", "_guard", "check_not_sealed",
                         "require_task_images"}) and "train" not in names


if __name__ == "__main__":
    sys.exit(cli())
