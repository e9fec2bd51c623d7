"""Policy evaluation: per-rollout success on a split with a fixed denominator.

``python -m eval.run --model PATH_OR_RUN_DIR --split official500|holdout100|bundled|
bundled:holdout|bundled-image[:holdout]|FILE --n N --out DIR [--runtime podman|local --concurrency C --seed S
--rollouts FILE --admission MANIFEST --max-turns K --max-new-tokens T --temperature X
--batch-size B --agent-concurrency A --use-vllm]``

``python -m eval.run --replay RESULTS [--out DIR --sample K]``

Per slot (task, rollout index 0..n-1), DESIGN.md §4 and issue 6:

1. **Rollout** — produced by ``python -m ecredit_trl.agent.rollouts`` run as a *subprocess* (the
   process boundary keeps ``eval`` free of TRL / peft imports), written to
   ``DIR/rollouts.jsonl``; or read from ``--rollouts FILE``. The subprocess keeps
   ``--batch-size`` episodes in flight (default 8, 1 = one at a time; ``--use-vllm``: vLLM) and
   writes each row as its episode ends, so trials start while others generate. Seeded rows do
   not depend on the batch size (not part of the binding).
2. **One factual trial** of the rollout's final artifact in a fresh sandbox
   (:class:`sandbox.VerifierPool`). An empty artifact is answered by the task's empty-patch
   control trial (the identical trial; ``trial_source: "empty_control"``).
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
sha256, eval seed, n, generation overrides, rollouts source). A rerun with another binding
is refused; slot rows of another binding are ignored; graded slots are skipped (slots whose
trial hit an infra error are retried).

Outputs (each written atomically): ``run.json``, ``rollouts.jsonl``, ``slots.jsonl``,
``controls/``, ``logs/``, ``artifacts/<sha256>.patch``, ``results.json``, ``report.md``,
``success_per_repo.png``, ``task_success_hist.png``; replay: ``replay.json``, ``replay.md``.

This module is the CLI and the orchestration; the stages live in :mod:`eval.evaluation`
(``generation``, ``verification``, ``report``; slot rows in ``slots``).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from eval.console import quiet_upstream_warnings
from eval.evaluation.generation import (
    RolloutTail,
    rollout_origin,
    rollouts_command,
    start_rollouts,
)
from eval.evaluation.modelref import ModelRef, resolve_model
from eval.evaluation.replay import replay
from eval.evaluation.report import (
    render_report,
    summarize,
    write_plots,
)
from eval.evaluation.slots import RETRY_REASONS, SCHEMA, EvalInputError, read_rows
from eval.evaluation.templatecheck import CHAT_TEMPLATE_HELP, check_policy_template
from eval.evaluation.verification import SlotVerifier
from eval.files import atomic_write_text, write_json
from eval.grading.flaky import flaky_slot_counts
from eval.tasks.presence import require_task_images

__all__ = [
    "FIXED_DENOMINATORS",
    "EvalInputError",
    "evaluate",
    "main",
    "replay",
    "run_binding",
    "split_denominator",
]

#: Fixed task denominators of the named splits (DESIGN.md §4).
FIXED_DENOMINATORS = {"official500": 500, "holdout100": 100}


def _ids_sha256(ids: Iterable[str]) -> str:
    from eval.tasks.sealed import ids_sha256

    return ids_sha256(list(ids))


def split_denominator(split: str, n_loaded: int) -> int:
    """The fixed task denominator of ``split`` (500 / 100 / the source's own size).

    Raises: EvalInputError when a named split loaded another number of tasks.
    """
    fixed = FIXED_DENOMINATORS.get(split.split(":", 1)[0])
    if fixed is not None and n_loaded != fixed:
        raise EvalInputError(f"split {split!r}: the fixed denominator is {fixed} tasks but "
                             f"{n_loaded} were loaded")
    return fixed if fixed is not None else n_loaded


def run_binding(*, model_sha256: str, split: str, tasks_sha256: str, seed: int, n: int,
                overrides: dict, rollouts_source: str) -> str:
    """sha256 (hex) binding an output directory to one evaluation.

    Args:
        model_sha256: :func:`eval.evaluation.modelref.dir_fingerprint` of the policy.
        split: the split name as given; tasks_sha256: sha256 of its task ids.
        seed: eval sampling seed; n: rollouts per task.
        overrides: generation settings given on the command line (None = run default).
        rollouts_source: ``"subprocess"`` or ``"file:<sha256 of the rollout rows>"``.
    """
    blob = json.dumps({"model": model_sha256, "split": split, "tasks": tasks_sha256,
                       "seed": seed, "n": n, "overrides": overrides,
                       "rollouts": rollouts_source}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


# ---------------------------------------------------------------------------
# evaluate: steps
# ---------------------------------------------------------------------------


def _check_args(n, concurrency: int, model, rollouts, batch_size: int = 1,
                agent_concurrency: int = 1, use_vllm: bool = False) -> None:
    if not isinstance(n, int) or n < 1:
        raise EvalInputError(f"--n: must be an int >= 1, got {n!r}")
    for flag, v in (("--concurrency", concurrency), ("--batch-size", batch_size),
                    ("--agent-concurrency", agent_concurrency)):
        if v < 1:
            raise EvalInputError(f"{flag}: must be >= 1, got {v}")
    if model is None and rollouts is None:
        raise EvalInputError("--model is required unless --rollouts is given")
    if use_vllm and rollouts is None and importlib.util.find_spec("vllm") is None:
        # refused before anything is written (not as unknown slots after the subprocess died)
        raise EvalInputError("--use-vllm: vllm is not installed in this environment "
                             "(pip install vllm on a CUDA host; or drop --use-vllm)")


def _bind_out(out: Path, run_cfg: dict) -> None:
    """Write ``run.json`` into a new ``out``, or refuse an ``out`` bound to another
    evaluation; create ``logs/``, ``controls/``, ``artifacts/``."""
    binding = run_cfg["binding"]
    run_json = out / "run.json"
    if run_json.exists():
        old = json.loads(run_json.read_text())
        if old.get("binding") != binding:
            diff = [k for k in ("model_sha256", "split", "tasks_sha256", "seed", "n",
                                "overrides", "rollouts_source") if old.get(k) != run_cfg[k]]
            raise EvalInputError(
                f"--out {out}: bound to another evaluation (binding {str(old.get('binding'))[:12]}"
                f" != {binding[:12]}; differs in: {', '.join(diff) or 'binding'}); results from "
                "another model or run are never reused: choose another --out")
    else:
        out.mkdir(parents=True, exist_ok=True)
        write_json(run_json, {**run_cfg, "created_at": time.time()})
    for sub in ("logs", "controls", "artifacts"):
        (out / sub).mkdir(parents=True, exist_ok=True)


def _resume_state(slots_path: Path, binding: str, say) -> tuple[dict, int]:
    """Graded slot rows of this binding by slot (retryable unknowns dropped) and the number
    of rows of another binding (ignored)."""
    prior = read_rows(slots_path)
    foreign = sum(1 for r in prior if r.get("binding") != binding)
    final: dict[tuple[str, int], dict] = {}
    for r in prior:
        if r.get("binding") != binding:
            continue
        key = (r["task_id"], int(r["rollout_index"]))
        if r.get("unknown_reason") in RETRY_REASONS:
            final.pop(key, None)
        else:
            final[key] = r
    if foreign:
        say(f"eval: ignoring {foreign} slot row(s) of another binding in {slots_path}")
    return final, foreign


def _verify_all(ver: SlotVerifier, rt, proc, tail: RolloutTail, stderr_path: Path, *,
                concurrency: int, max_retries: int, say) -> int | None:
    """Feed rollout rows to ``ver`` while the subprocess (if any) runs, then wait for every
    trial. Returns the subprocess's exit code (None without one)."""
    from sandbox.trials.pool import VerifierPool
    rollout_rc = None
    with VerifierPool(rt, max_concurrency=concurrency, max_retries=max_retries) as pool:
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


def _cost(out: Path, binding: str, stats, generated_tokens: int) -> dict:
    """Trial counts and service seconds, added to those of earlier calls of this binding."""
    prev = {}
    if (out / "results.json").exists():
        try:
            prev = json.loads((out / "results.json").read_text())
        except json.JSONDecodeError:
            prev = {}
    cost_prev = prev.get("cost") if prev.get("binding") == binding else None
    cost = dict(cost_prev or {})
    for k in ("trials_factual", "trials_control", "slots_from_empty_control", "retries",
              "failure_retries", "slots_from_reused_verdict", "controls_from_reused_verdict"):
        cost[k] = int(cost.get(k, 0)) + int(stats[k])
    cost["service_s"] = float(cost.get("service_s", 0.0)) + float(stats["service_s"])
    cost["generated_tokens"] = generated_tokens
    return cost


def _settings(seen_rollouts: dict, rpath: Path):
    """The generation settings recorded on the rollout rows (None when none say)."""
    settings = None
    for r in seen_rollouts.values():
        settings = r.get("settings") or settings
    if settings is None and rpath.exists():
        for r in read_rows(rpath)[:1]:
            settings = r.get("settings")
    return settings


# ---------------------------------------------------------------------------
# evaluate
# ---------------------------------------------------------------------------


def _policy_ref(model: str | None, rollouts, chat_template: str | None) -> ModelRef | None:
    """The resolved policy (None without ``model``). Issue 23 §3: a policy to generate with
    whose chat template TRL has no tool-call parser for is refused here, in one line, before
    any task is loaded, output written or rollout started (TemplateRefused)."""
    ref = resolve_model(model) if model is not None else None
    if ref is not None and rollouts is None:
        check_policy_template(ref, chat_template)
    return ref


def _admitted(admission, tasks: list, runtime) -> tuple[dict | None, list]:
    """The admission record (None without a manifest) and the tasks with the PASS_TO_PASS
    tests it found flaky dropped (issue 12 §3)."""
    if admission is None:
        return None, tasks
    from eval.controls import check_admission
    from eval.grading.flaky import drop_flaky_p2p

    rec = check_admission(admission, tasks, runtime=runtime)
    return rec, drop_flaky_p2p(tasks, rec["p2p_dropped"])


def evaluate(*, model: str | None, split: str, n: int, out: str | Path, runtime="podman",
             concurrency: int = 2, seed: int = 0, rollouts: str | Path | None = None,
             admission: str | Path | None = None, overrides: dict | None = None,
             timeout_s: float | None = None, max_retries: int = 1, device: str | None = None,
             python: str | None = None, log: Callable[[str], None] | None = None,
             batch_size: int = 8, agent_concurrency: int = 4, use_vllm: bool = False,
             reuse_verdicts: str | Path | None = None) -> dict:
    """Evaluate a policy on ``split`` and write the outputs into ``out`` (see module doc).

    Args:
        model: model dir or run dir (:func:`eval.evaluation.modelref.resolve_model`); may be None with
            ``rollouts`` (then the rows' ``model_sha256`` identifies the policy).
        split: task source of :func:`eval.tasks.splits.load_tasks`.
        n: rollouts per task (>= 1).
        out: output folder (created; resumable).
        runtime: ``"podman"``, ``"local"`` or a runtime object (not closed here).
        concurrency: verifier trials at once (>= 1).
        seed: eval sampling seed (passed to the rollout subprocess).
        rollouts: read rollouts from this JSONL file instead of generating them.
        admission: admission manifest (:mod:`eval.controls`) to run under; refused when
            the task list or an image digest changed.
        overrides: rollout settings (``max_turns``, ``max_new_tokens``, ``temperature``,
            ``chat_template``: a TRL template name); None values mean "run default".
        timeout_s: limit of one verifier trial, seconds (None: eval.tasks.trialspec.trial_limits).
        max_retries: infra retries per trial (counted).
        device, python: torch device and interpreter (default ``sys.executable``) of the
            rollout subprocess; batch_size, agent_concurrency, use_vllm: its flags of the same name.
        reuse_verdicts: opt-in verdict store folder (:mod:`eval.evaluation.verdicts`).

    Returns: the ``results.json`` dict.

    Raises:
        EvalInputError: a count < 1 (``n``, a concurrency, ``batch_size``), ``out`` bound to
            another evaluation, rollout rows of another model, a changed admission manifest.
        FileNotFoundError: a missing model, rollouts file or manifest. (+ :func:`_policy_ref`)
    """
    from eval.tasks.splits import load_tasks

    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    _check_args(n, concurrency, model, rollouts, batch_size, agent_concurrency, use_vllm)
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    t_start = time.time()
    out = Path(out)
    ref = _policy_ref(model, rollouts, overrides.get("chat_template"))
    tasks = load_tasks(split, purpose="eval")
    images = require_task_images(tasks, split, runtime)  # issue 13 §2: digests recorded
    denominator = split_denominator(split, len(tasks))
    by_id = {t.instance_id: t for t in tasks}
    tasks_sha = _ids_sha256(by_id)

    admission_rec, tasks = _admitted(admission, tasks, runtime)
    by_id = {t.instance_id: t for t in tasks}
    rpath, source, model_sha = rollout_origin(rollouts, ref, out)
    binding = run_binding(model_sha256=model_sha, split=split, tasks_sha256=tasks_sha,
                          seed=seed, n=n, overrides=overrides, rollouts_source=source)
    _bind_out(out, {"schema": SCHEMA, "binding": binding, "model_sha256": model_sha,
                    "split": split, "tasks_sha256": tasks_sha, "seed": seed, "n": n,
                    "overrides": overrides, "rollouts_source": source,
                    "model": ref.to_json() if ref else None})
    final, foreign = _resume_state(out / "slots.jsonl", binding, say)
    wanted = {(t, i) for t in by_id for i in range(n)}
    todo = wanted - set(final)
    say(f"eval: {len(tasks)} tasks x {n} = {len(wanted)} slots; {len(wanted) - len(todo)} "
        f"already graded, {len(todo)} to do")
    store = _verdict_store(reuse_verdicts, out, binding, say, images)
    ver = SlotVerifier(out=out, by_id=by_id, binding=binding, source=source, todo=todo,
                       final=final, timeout_s=timeout_s, store=store)
    rollout_rc = _generate_and_verify(
        ver, out=out, rpath=rpath, run_subprocess=rollouts is None and bool(todo),
        cmd_args=dict(python=python, model=ref.given if ref else None, split=split, n=n,
                      rpath=rpath, seed=seed, runtime=runtime, binding=binding,
                      overrides=overrides, device=device, batch_size=batch_size,
                      todo_tasks=sorted({t for t, _ in todo}), n_tasks=len(by_id),
                      agent_concurrency=agent_concurrency, use_vllm=use_vllm),
        runtime=runtime, concurrency=concurrency, max_retries=max_retries, say=say)

    results = _results(
        ver, tasks, n, denominator, t_start=t_start, out=out, rpath=rpath, binding=binding,
        split=split, seed=seed, tasks_sha=tasks_sha, ref=ref, model_sha=model_sha,
        overrides=overrides, source=source, admission_rec=admission_rec,
        rollout_rc=rollout_rc, foreign=foreign)
    results["images"] = images
    results["verdict_store"] = _store_record(store, ver, results["slots"])
    _write_report(out, results, say)
    return results


def _verdict_store(root, out: Path, binding: str, say, images: dict):
    """The opt-in :class:`eval.evaluation.verdicts.VerdictStore` at ``root`` (None: off)."""
    if root is None:
        return None
    from eval.evaluation.verdicts import VerdictStore

    return VerdictStore(root, eval_dir=out.resolve(), binding=binding, say=say, images=images)


def _store_record(store, ver: SlotVerifier, slots: list[dict]) -> dict | None:
    """``results.json``'s ``verdict_store``: path, slots graded from a reused verdict (all
    and this call's), controls reused this call, untrusted entries ignored; None: off."""
    if store is None:
        return None
    return {**store.to_json(),
            "slots_reused": sum(1 for r in slots if r.get("verdict_reused_from")),
            "slots_reused_this_call": ver.stats["slots_from_reused_verdict"],
            "controls_reused_this_call": ver.stats["controls_from_reused_verdict"]}


def _write_report(out: Path, results: dict, say) -> None:
    """``results.json``, the figures and ``report.md`` into ``out``."""
    summary = results["summary"]
    write_json(out / "results.json", results)
    write_plots(results, out)
    atomic_write_text(out / "report.md", render_report(results))
    say(f"eval: success {summary['resolved']}/{summary['denominator']['slots']} = "
        f"{summary['success']:.3f}, unknown {summary['unknown']}; report {out / 'report.md'}")


def _results(ver: SlotVerifier, tasks, n: int, denominator: int, *, t_start: float, out: Path,
             rpath: Path, binding: str, split: str, seed: int, tasks_sha: str,
             ref: ModelRef | None, model_sha: str, overrides: dict, source: str,
             admission_rec, rollout_rc, foreign: int) -> dict:
    """The ``results.json`` dict: binding, model, settings, summary, cost, slot rows."""
    slot_rows = [ver.final[k] for k in sorted(ver.final)]
    summary = summarize(slot_rows, [(t.instance_id, t.repo) for t in tasks], n, denominator)
    results = {
        "schema": SCHEMA, "binding": binding, "split": split, "n": n, "seed": seed,
        "tasks_sha256": tasks_sha, "model": ref.to_json() if ref else {"sha256": model_sha},
        "arm": ref.arm if ref else None, "train_seed": ref.seed if ref else None,
        "run_dir": ref.run_dir if ref else None,
        "settings": _settings(ver.seen_rollouts, rpath),
        "overrides": overrides, "rollouts_source": source,
        "admission": admission_rec, "summary": summary,
        "flaky": flaky_slot_counts([r["task_id"] for r in slot_rows], admission_rec),
        "cost": _cost(out, binding, ver.stats, summary["generated_tokens"]["total"]),
        "rollouts_exit_code": rollout_rc, "foreign_rows_ignored": foreign,
        "slots": [{k: v for k, v in r.items() if k not in ("f2p", "p2p", "missing")}
                  for r in slot_rows],
        "graded_this_call": len(ver.new_rows), "wall_s": round(time.time() - t_start, 3),
        "updated_at": time.time(),
    }
    return results


def _generate_and_verify(ver: SlotVerifier, *, out: Path, rpath: Path, run_subprocess: bool,
                         cmd_args: dict, runtime, concurrency: int, max_retries: int,
                         say) -> int | None:
    """Generation + verification: start the rollout subprocess when needed, verify its rows
    as they arrive, and always stop the subprocess and close an own runtime. Returns the
    subprocess's exit code (None without one)."""
    from sandbox.backend import make_runtime
    proc = None
    errf = None
    stderr_path = out / "rollouts.stderr.log"
    if run_subprocess:
        proc, errf = start_rollouts(rollouts_command(**cmd_args), stderr_path, say)
    tail = RolloutTail(rpath)
    own_rt = isinstance(runtime, str)
    rt = (make_runtime(runtime, run_id=f"eval-{ver.binding[:8]}-{os.getpid()}") if own_rt
          else runtime)
    try:
        return _verify_all(ver, rt, proc, tail, stderr_path, concurrency=concurrency,
                           max_retries=max_retries, say=say)
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        if errf is not None:
            errf.close()
        if own_rt:
            rt.close()


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point. Exit 0 when done, 1 when the rollout subprocess failed (the report is
    still written), 2 on bad input (the message names the flag, field or path)."""
    quiet_upstream_warnings()
    from sandbox.backend import add_runtime_args, runtime_from_args
    ap = argparse.ArgumentParser(prog="python -m eval.run", description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model dir or training run dir (runs/<name>)")
    ap.add_argument("--split", help="official500 | holdout100 | bundled[:train|:holdout] | "
                    "bundled-image[:train|:holdout] (the image-held stand-ins: python -m "
                    "eval.build_tasks --image-tasks) | swegym:PATH | swesmith:PATH | FILE "
                    "(eval.tasks.splits.load_tasks)")
    ap.add_argument("--n", type=int, help="rollouts per task")
    ap.add_argument("--out", help="output folder (resumable)")
    add_runtime_args(ap)  # --runtime and the sandbox backend flags (issue 25)
    ap.add_argument("--concurrency", type=int, default=2, help="verifier trials at once")
    ap.add_argument("--seed", type=int, default=0, help="eval sampling seed")
    ap.add_argument("--rollouts", help="read rollouts from this JSONL instead of generating")
    ap.add_argument("--admission", help="admission manifest (python -m eval.controls)")
    ap.add_argument("--max-turns", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--timeout-s", type=float, default=None,
                    help="per-trial limit, seconds (default: from the task, eval.trial"
                         "spec.trial_limits: 1800 for SWE-bench-format image tasks, 600 for bundled)")
    ap.add_argument("--max-retries", type=int, default=1, help="infra retries per trial")
    ap.add_argument("--device", default=None, help="torch device of the rollout subprocess")
    ap.add_argument("--batch-size", type=int, default=8, help="episodes in flight, one batched "
                    "generate call per round (1: one at a time)")
    ap.add_argument("--agent-concurrency", type=int, default=4,
                    help="threads running the episodes' tool calls")
    ap.add_argument("--use-vllm", action="store_true",
                    help="generate through vLLM (colocated; needs vllm installed)")
    ap.add_argument("--chat-template", "--chat_template", dest="chat_template", default=None,
                    metavar="NAME", help=CHAT_TEMPLATE_HELP)
    ap.add_argument("--reuse-verdicts", metavar="DIR", default=None,
                    help="opt-in verdict store shared across evaluations: a slot repeating a "
                         "clean (task, artifact) trial stored there is graded from it "
                         "(default: every slot runs its own trial)")
    ap.add_argument("--replay", help="results.json (or its folder) to re-verify")
    ap.add_argument("--sample", type=int, default=None, help="replay: only this many slots")
    args = ap.parse_args(argv)
    try:
        if args.replay:
            replay(args.replay, args.out, runtime=runtime_from_args(args, "eval"), concurrency=args.concurrency,
                   sample=args.sample, seed=args.seed, timeout_s=args.timeout_s,
                   max_retries=args.max_retries)
            return 0
        missing = [f"--{k}" for k in ("split", "n", "out") if getattr(args, k) is None]
        if missing:
            raise EvalInputError(f"missing {', '.join(missing)} (or use --replay RESULTS)")
        res = evaluate(model=args.model, split=args.split, n=args.n, out=args.out,
                       runtime=runtime_from_args(args, "eval"), concurrency=args.concurrency, seed=args.seed,
                       rollouts=args.rollouts, admission=args.admission,
                       overrides={"max_turns": args.max_turns,
                                  "max_new_tokens": args.max_new_tokens,
                                  "temperature": args.temperature,
                                  "chat_template": args.chat_template},
                       timeout_s=args.timeout_s, max_retries=args.max_retries,
                       device=args.device, batch_size=args.batch_size,
                       agent_concurrency=args.agent_concurrency, use_vllm=args.use_vllm,
                       reuse_verdicts=args.reuse_verdicts)
    except (EvalInputError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render_report(res))
    return 1 if res.get("rollouts_exit_code") not in (None, 0) else 0


if __name__ == "__main__":
    sys.exit(main())
