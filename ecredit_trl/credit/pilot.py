"""The signal pilot: replay trajectories, verify each artifact and one ablation, tabulate D.

``python -m ecredit_trl.credit.pilot --tasks SOURCE --trajectories FILE --out DIR
[--seed N --credit-lambda X --credit-cap X --concurrency N --runtime podman|local]``

Per trajectory (design page, "Exclusion reasons", "Query bound"), in file order:

1. ``format_error`` rollouts are excluded (reason ``format_error``; a rollout whose
   writes cannot be replayed onto its repository counts here too, with the
   replay error as ``exclusion_detail``).
2. Replay → snapshots ``S_0..S_K`` → edit blocks → eligibility → verifier-blind
   selection (:func:`ecredit_trl.credit.blocks.select_block`). No eligible block →
   excluded (``no_eligible_block``). Otherwise the ablated artifact is built.
   **All selections are written to ``selections.jsonl`` before the first trial
   is submitted.**
3. One factual trial per admitted rollout, graded with :func:`eval.grading.grader.grade`
   against the task's fixed FAIL_TO_PASS/PASS_TO_PASS lists, with the task's
   empty-patch control log for attribution (the control runs once per task and
   is cached in ``DIR/controls/``). No utility → excluded (``no_original_utility``).
4. At most one counterfactual trial (the ablated artifact), then
   ``D = U(P) − U(P\\b)`` (None when either side is unavailable) and the shared
   shrinkage ``s`` / cap flag / m / L of :func:`ecredit_trl.credit.coefficients.credit_stats`
   (arm M).

Image-held tasks (no ``repo_dir``) are replayed from S_0 = the image's tree at
reset, the base their training rollouts start from (:mod:`ecredit_trl.credit.taskbase`); their
trials run in the task images as for any task.

A trial's utility follows the trainer's rule (:func:`ecredit_trl.runs.outcomes.trial_verdict`):
a completed trial is graded, a missing observation attributed to the artifact only when the
task's control observed every listed test (design page, "Utility and the missing-observation
rule"); a trial the artifact broke (``timeout``, ``oom``, ``pids``, ``output_limit``,
``apply_failed``, ``truncated_log`` with a healthy control under the same limits and a retry
that broke too) scores the failure value (:mod:`eval.integrity.attribution`); ``infra_error``
and every unattributed failure give no utility.

Outputs (each written atomically: temp file + rename): ``selections.jsonl``,
``trials.jsonl`` (every trial submitted, controls included), ``records.jsonl``
(one per trajectory), ``pilot.json`` (:func:`pilot_table`), ``pilot.md``
(:func:`render_markdown`), ``logs/<trial_id>.log``.

source: the design page, "Utility and the missing-observation rule" and "Query bound"
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path

from ecredit_trl.credit.blocks import (
    DEFAULT_TEST_PATTERNS,
    SelectionRecord,
    ablate,
    edit_blocks,
    eligibility,
)
from ecredit_trl.credit.coefficients import credit_stats
from ecredit_trl.credit.pilot_report import EXCLUSIONS, pilot_table, render_markdown
from ecredit_trl.credit.pilot_trials import PilotTrials, pilot_retry
from ecredit_trl.credit.planning import contrast
from ecredit_trl.credit.taskbase import s0_source
from ecredit_trl.credit.trajectory import (
    ReplayError,
    Trajectory,
    generated_token_turns,
    load_trajectories,
    replay,
)
from eval.files import atomic_write_text
from eval.tasks.splits import load_tasks
from sandbox.backend import DEFAULTS, Runtime, SandboxOptions, open_runtime, runtime_from_args
from sandbox.bounds import ArgumentParser, Float, InFile, Int, OutDir, Source, Text
from sandbox.snapshots.snapshot import artifact as _artifact
from sandbox.trials.pool import VerifierPool

__all__ = [
    "EXCLUSIONS",
    "pilot_table",
    "render_markdown",
    "run_pilot",
    "main",
]

DEFAULT_CREDIT_LAMBDA = 0.5  # the trainer's defaults (ECreditConfig)
DEFAULT_CREDIT_CAP = 1.0


# ----------------------------------------------------------------------------
# I/O helpers
# ----------------------------------------------------------------------------


def _jsonl(rows: Iterable[dict]) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)


# ----------------------------------------------------------------------------
# the pilot
# ----------------------------------------------------------------------------


def run_pilot(tasks: Sequence, trajectories: Sequence[Trajectory], out_dir, *,
              seed: int = 0, credit_lambda: float = DEFAULT_CREDIT_LAMBDA,
              credit_cap: float = DEFAULT_CREDIT_CAP, concurrency: int = 2,
              runtime: Runtime | SandboxOptions = DEFAULTS, max_retries: int = 1, timeout_s: float | None = None,
              test_patterns: Sequence[str] = DEFAULT_TEST_PATTERNS,
              log: Callable[[str], None] | None = None) -> dict:
    """Run the signal pilot and write its files into ``out_dir``.

    Args:
        tasks: :class:`eval.tasks.schema.Task` list; every trajectory's ``task_id`` must
            be one of their ``instance_id`` s and those tasks need a ``repo_dir``
            (the local git repository the replay checks out) or, image-held, an
            ``image`` present locally: the replay then starts from S_0 = the image's
            tree at reset, the base the training rollouts start from
            (:func:`ecredit_trl.credit.taskbase.s0_source`).
        trajectories: the rollouts (:func:`ecredit_trl.credit.trajectory.load_trajectories`).
        out_dir: output folder (created; files in it are replaced).
        seed: run seed of the selection RNG.
        credit_lambda, credit_cap: λ >= 0 and c > 0 for s / cap flag (arm M).
        concurrency: verifier trials at once (>= 1).
        runtime: a :class:`sandbox.backend.Runtime` (not closed by the pilot) or the options
            of one (made and closed here).
        max_retries: infra retries per trial (counted, never hidden).
        timeout_s: wall-clock limit of one trial (seconds); None: from the task
            (:func:`eval.tasks.trialspec.trial_limits`).
        test_patterns: test-path patterns for eligibility.
        log: progress printer (default: stderr).

    Returns:
        The pilot table (:func:`pilot_table`) plus ``meta``.

    Raises:
        ValueError: a trajectory names an unknown task, a needed task has neither
            ``repo_dir`` nor ``image``, or a bad λ/c/concurrency.
        sandbox.workspace.imagetree.ImageTreeError: an image-held task's image cannot be read.

    source: the design page, "Query bound"
    """
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    by_id = _check_inputs(tasks, trajectories, concurrency=concurrency,
                          credit_lambda=credit_lambda, credit_cap=credit_cap)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    (out / "controls").mkdir(exist_ok=True)
    t_start = time.time()

    # -- phase A: replay, blocks, selection, ablation (no trial runs) ----------
    records = _plan_all(trajectories, by_id, seed=seed, credit_lambda=credit_lambda,
                        credit_cap=credit_cap, test_patterns=test_patterns)
    selections_written_at = _write_selections(out, records)
    admitted = [r for r in records if r["exclusion"] is None]
    say(f"pilot: {len(records)} planned, {len(admitted)} with a selected block; "
        f"selections written to {out / 'selections.jsonl'}")

    # -- phase B/C: controls, factual, counterfactual trials --------------------
    trials = PilotTrials(out, by_id, timeout_s)
    with open_runtime(runtime, run_id=f"pilot-{os.getpid()}") as rt, \
            VerifierPool(rt, max_concurrency=concurrency, retry=pilot_retry(max_retries)) as pool:
        trials.first_trial_at = time.time()
        trials.submit_controls(pool, admitted)
        fact_fut = trials.submit_factual(pool, records)
        cf_fut = trials.collect_factual(pool, records, fact_fut, say)
        trials.collect_counterfactual(records, cf_fut)

    # -- D, s, cap flag --------------------------------------------------------
    _contrasts(records, trajectories, credit_lambda=credit_lambda, credit_cap=credit_cap)
    table = pilot_table(records, trials.rows)
    table["meta"] = _meta(records, trials, seed=seed, credit_lambda=credit_lambda,
                          credit_cap=credit_cap, runtime=runtime, concurrency=concurrency,
                          max_retries=max_retries, test_patterns=test_patterns,
                          t_start=t_start, selections_written_at=selections_written_at)
    _write_outputs(out, table, trials.rows, records)
    say(f"pilot: usable {table['usable']}, D>0 {table['positive']}, D<0 {table['negative']}, "
        f"D=0 {table['zero']}; query bound {'ok' if table['query_bound']['ok'] else 'VIOLATED'}")
    return table


def _meta(records: list[dict], trials: PilotTrials, *, seed, credit_lambda, credit_cap,
          runtime, concurrency, max_retries, test_patterns, t_start: float,
          selections_written_at: float) -> dict:
    """The table's ``meta``: settings, wall seconds, and whether every selection was written
    before the first trial was submitted."""
    meta = {"tasks": len({r["task_id"] for r in records}), "trajectories": len(records),
            "seed": seed, "credit_lambda": credit_lambda, "credit_cap": credit_cap,
            "runtime": runtime.kind, "sandbox_backend": runtime.backend,
            "concurrency": concurrency, "max_retries": max_retries,
            "test_patterns": list(test_patterns), "wall_s": time.time() - t_start,
            "selections_written_at": selections_written_at,
            "first_trial_at": trials.first_trial_at,
            "selections_before_trials": (trials.first_trial_at is None
                                         or selections_written_at <= trials.first_trial_at)}
    return meta


def _write_outputs(out: Path, table: dict, trial_rows: list[dict], records: list[dict]) -> None:
    """``trials.jsonl``, ``records.jsonl``, ``pilot.json`` and ``pilot.md`` (each atomic)."""
    atomic_write_text(out / "trials.jsonl", _jsonl(trial_rows))
    atomic_write_text(out / "records.jsonl", _jsonl(records))
    atomic_write_text(out / "pilot.json", json.dumps(table, indent=2, sort_keys=True) + "\n")
    atomic_write_text(out / "pilot.md", render_markdown(table, table["meta"]))


def _check_inputs(tasks: Sequence, trajectories: Sequence[Trajectory], *, concurrency: int,
                  credit_lambda: float, credit_cap: float) -> dict:
    """instance_id → task, after checking concurrency, λ/c, that every trajectory names a
    known task and that every replayed task has a ``repo_dir`` or an image. Raises
    ValueError."""
    if concurrency < 1:
        raise ValueError(f"concurrency: must be >= 1, got {concurrency}")
    credit_stats("M", contrast=None, token_turn=generated_token_turns(Trajectory("x", 0, False, ())),
                 selected_turn=None, credit_lambda=credit_lambda, credit_cap=credit_cap)
    by_id = {t.instance_id: t for t in tasks}
    unknown = sorted({tr.task_id for tr in trajectories} - set(by_id))
    if unknown:
        raise ValueError(f"trajectories: unknown task_id(s) {unknown[:10]} (not in the task list)")
    no_repo = sorted({tr.task_id for tr in trajectories
                      if not tr.format_error and not by_id[tr.task_id].repo_dir
                      and not getattr(by_id[tr.task_id], "image", None)})
    if no_repo:
        raise ValueError(f"tasks: neither repo_dir nor image for {no_repo[:10]}; replay needs "
                         "the task's git repository locally or its image")
    return by_id


def _plan_all(trajectories: Sequence[Trajectory], by_id: dict, *, seed: int,
              credit_lambda: float, credit_cap: float,
              test_patterns: Sequence[str]) -> list[dict]:
    """Phase A: one record per trajectory (in file order), replayed in a temporary folder
    that is removed afterwards (with the S_0 stores of image-held tasks); no trial runs."""
    records: list[dict] = []
    work_root = Path(tempfile.mkdtemp(prefix="ecredit-pilot-"))
    sources: dict[str, tuple[str, str]] = {}
    try:
        for i, tr in enumerate(trajectories):
            task = by_id[tr.task_id] if not tr.format_error else None
            if task is not None and tr.task_id not in sources:
                sources[tr.task_id] = s0_source(task, work_root / ".images")
            records.append(_plan_one(tr, task, sources.get(tr.task_id),
                                     work_root / f"r{i}", seed=seed,
                                     credit_lambda=credit_lambda, credit_cap=credit_cap,
                                     test_patterns=test_patterns))
    finally:
        shutil.rmtree(work_root, ignore_errors=True)
    return records


def _plan_one(tr: Trajectory, task, source: tuple[str, str] | None, work: Path, *, seed: int,
              credit_lambda: float, credit_cap: float, test_patterns: Sequence[str]) -> dict:
    """One trajectory's record (replayed onto ``source`` = (repository, S_0 commit) of
    :func:`ecredit_trl.credit.taskbase.s0_source`): exclusion (format error, replay error,
    no eligible block)
    or its selection, snapshots, both artifacts (``_factual_artifact``,
    ``_ablated_artifact``, dropped before the records are written) and m / L."""
    tt = generated_token_turns(tr)
    rec: dict = {"task_id": tr.task_id, "rollout_index": tr.rollout_index,
                 "K": tr.K, "L": tr.L, "exclusion": None, "exclusion_detail": None,
                 "trajectory_extra": tr.extra, "selection": None, "ablation": None}
    if tr.format_error:
        rec["exclusion"] = "format_error"
        return rec
    try:
        snaps = replay(tr, source[0], source[1], work)
    except ReplayError as exc:
        rec["exclusion"] = "format_error"
        rec["exclusion_detail"] = f"replay: {exc}"
        return rec
    blocks = edit_blocks(work, snaps)
    judged = eligibility(work, snaps, blocks, test_patterns=test_patterns)
    sel = SelectionRecord.build(task_id=tr.task_id, rollout_index=tr.rollout_index,
                                run_seed=seed, blocks=blocks, judged=judged,
                                test_patterns=test_patterns)
    rec["selection"] = sel.to_json()
    rec["snapshots"] = snaps
    rec["selected_turn"] = sel.selected_turn
    rec["selected_paths"] = sel.selected_paths
    rec["eligible_turns"] = sel.eligible_turns
    if sel.selected_turn is None:
        rec["exclusion"] = "no_eligible_block"
        return rec
    block = next(b for b in blocks if b.turn == sel.selected_turn)
    abl = ablate(work, snaps, block)
    rec["_factual_artifact"] = _artifact(work, snaps[0], snaps[-1])
    rec["_ablated_artifact"] = abl.artifact
    rec["ablation"] = abl.to_json()
    rec["factual_artifact_bytes"] = len(rec["_factual_artifact"].encode(
        "utf-8", errors="surrogateescape"))
    cs0 = credit_stats("M", contrast=None, token_turn=tt,
                       selected_turn=sel.selected_turn, credit_lambda=credit_lambda,
                       credit_cap=credit_cap)
    rec["m"], rec["L"] = cs0.m, cs0.L
    return rec


def _write_selections(out: Path, records: list[dict]) -> float:
    """``selections.jsonl``, written before any trial is submitted; returns when."""
    selections = [{"task_id": r["task_id"], "rollout_index": r["rollout_index"],
                   "exclusion": r["exclusion"], "selection": r["selection"],
                   "written_at": time.time()} for r in records]
    atomic_write_text(out / "selections.jsonl", _jsonl(selections))
    return time.time()


def _contrasts(records: list[dict], trajectories: Sequence[Trajectory], *,
               credit_lambda: float, credit_cap: float) -> None:
    """Drop the artifacts from every record; give each usable one D and arm M's
    s / cap flag / m / L (``credit_M``)."""
    traj_by_key = {(t.task_id, t.rollout_index): t for t in trajectories}
    for r in records:
        for k in ("_factual_artifact", "_ablated_artifact"):
            r.pop(k, None)
        if r["exclusion"] is not None:
            continue
        d = contrast(r.get("U_P"), r.get("U_Pb"))
        r["D"] = d
        tt = generated_token_turns(traj_by_key[(r["task_id"], r["rollout_index"])])
        cs = credit_stats("M", contrast=d, token_turn=tt, selected_turn=r["selected_turn"],
                          credit_lambda=credit_lambda, credit_cap=credit_cap)
        r["s"], r["cap_active"], r["m"], r["L"] = cs.s, cs.cap_active, cs.m, cs.L
        r["credit_M"] = asdict(cs)



# ----------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------


def _run_credit_config(trajectories: Path) -> dict:
    """λ and c of the training run that wrote ``trajectories`` (its ``config.json``), if any."""
    cfg_path = trajectories.resolve().parent / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text()).get("ecredit", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {k: float(cfg[k]) for k in ("credit_lambda", "credit_cap") if k in cfg}


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns 0 when the table's identities and the query bound hold."""
    ap = ArgumentParser(prog="python -m ecredit_trl.credit.pilot",
                                 description="Signal pilot: verify artifacts and one ablation "
                                             "each, tabulate D.")
    ap.add_argument("--tasks", type=Source(), required=True, help="task source for eval.tasks.splits.load_tasks "
                    "(bundled, a .jsonl path, ...)")
    ap.add_argument("--trajectories", type=InFile("jsonl"), required=True, help="trajectory JSONL (replay format)")
    ap.add_argument("--out", type=OutDir(), required=True, help="output folder")
    ap.add_argument("--seed", type=Int(ge=0, le=2**32 - 1, why="32-bit seeds"), default=0, help="run seed of the selection RNG")
    ap.add_argument("--credit-lambda", type=Float(ge=0), default=DEFAULT_CREDIT_LAMBDA)
    ap.add_argument("--credit-cap", type=Float(gt=0), default=DEFAULT_CREDIT_CAP)
    ap.add_argument("--concurrency", type=Int(ge=1), default=2, help="verifier trials at once")
    SandboxOptions.add_args(ap)  # --runtime and the sandbox backend flags
    ap.add_argument("--max-retries", type=Int(ge=0), default=1, help="infra retries per trial")
    ap.add_argument("--timeout-s", type=Float(gt=0, why="seconds"), default=None,
                    help="per-trial limit, seconds (default: from the task, eval.trial"
                         "spec.trial_limits: 1800 for SWE-bench-format image tasks, 600 for bundled)")
    ap.add_argument("--test-pattern", type=Text(), action="append", default=None,
                    help="test-path pattern (repeatable; default: the built-in test-path patterns)")
    args = ap.parse_args(argv)

    if not Path(args.trajectories).is_file():
        print(f"error: --trajectories: no such file {args.trajectories}", file=sys.stderr)
        return 2
    run_cfg = _run_credit_config(Path(args.trajectories))
    for key in ("credit_lambda", "credit_cap"):
        given = getattr(args, key)
        if key in run_cfg and abs(run_cfg[key] - given) > 1e-12:
            print(f"warning: --{key.replace('_', '-')} {given} differs from the run's "
                  f"{key} {run_cfg[key]} (config.json beside the trajectories); shrinkage and "
                  "cap figures follow the command line", file=sys.stderr)
    try:
        tasks = load_tasks(args.tasks)
        trajs = load_trajectories(args.trajectories)
        runtime = runtime_from_args(args, "pilot")
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    table = run_pilot(tasks, trajs, args.out, seed=args.seed, credit_lambda=args.credit_lambda,
                      credit_cap=args.credit_cap, concurrency=args.concurrency,
                      runtime=runtime, max_retries=args.max_retries,
                      timeout_s=args.timeout_s,
                      test_patterns=tuple(args.test_pattern or DEFAULT_TEST_PATTERNS))
    print(render_markdown(table, table["meta"]))
    ok = all(table["identities"].values()) and table["query_bound"]["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
