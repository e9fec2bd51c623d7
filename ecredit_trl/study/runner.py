"""``study run``: every unit of a study, resumably (design page, "Evaluation").

Order: training runs (arms × seeds, ``accelerate launch ecredit_trl/train.py`` each, a
subprocess so multi-GPU accelerate configs work unchanged), the step-0 baseline's and every
run's evaluations (``python -m eval.run``, a subprocess), one comparison per split
(:mod:`eval.compare`, in process), then the report
(:func:`ecredit_trl.study.report.write_report`). This module holds the plan and the
commands; the folder's lock, binding and child processes are
:mod:`ecredit_trl.study.supervisor`, the study's policies :mod:`ecredit_trl.study.positive_control`.

Resume rules (states from :mod:`ecredit_trl.study.status`): done units are skipped; a
training run that was interrupted resumes through ``--resume-from`` its newest numbered
checkpoint with a receipt (none: the partial run is moved to ``<out>/abandoned/`` and
started again); an evaluation folder is resumable by ``eval.run`` itself; a stale unit
(another config's result) is redone only under ``--allow-changed`` (moved to
``abandoned/`` first, with the evaluations of a moved run). A failed unit does not stop the
independent ones: evaluations of a run that did not finish are skipped (pending).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ecredit_trl.agent.scaffolds import default_scaffold_config
from ecredit_trl.runs.resume import resume_checkpoint
from ecredit_trl.study.config import StudyConfig, split_dirname
from ecredit_trl.study.pool import check_train_pool
from ecredit_trl.study.positive_control import baseline_model, control_policy, train_flags
from ecredit_trl.study.report import write_report
from ecredit_trl.study.status import (
    Unit,
    eval_inputs,
    eval_state,
    run_name,
    sha256_of,
    study_relpath,
    study_units,
    train_state,
    unit_record,
)
from ecredit_trl.study.supervisor import (
    REPO_ROOT,
    StudyLock,
    abandon,
    bind_study,
    run_subprocess,
    wait_sessions,
    write_record,
)
from eval.compare import compare, load_run, render_markdown, write_plots
from eval.files import atomic_write_text, write_json

TRAIN_PY = REPO_ROOT / "ecredit_trl" / "train.py"


def train_command(cfg: StudyConfig, arm: str, seed: int, run_dir: Path,
                  resume_from: Path | None = None, allow_code_change: bool = False) -> list[str]:
    """The ``accelerate launch ... train.py`` argv of one run (or its resume: the run's
    recorded command line is re-used by train.py, so only ``--resume-from`` is given, and
    with ``allow_code_change`` a changed code hash is accepted and recorded by train.py)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    if cfg.accelerate_config:
        cmd += ["--config_file", str(cfg.accelerate_config)]
    else:
        cmd += ["--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no",
                "--dynamo_backend", "no"]
    cmd.append(str(TRAIN_PY))
    if resume_from is not None:
        extra = (["--allow-changed", "code", "--reason", "study run --allow-changed"]
                 if allow_code_change else [])
        # the study's sandbox section wins over the run's recorded one (unbound fields)
        return cmd + [*cfg.sandbox_flags("train"), "--resume-from", str(resume_from), *extra]
    cmd += ["--arm", arm, "--seed", str(seed), "--output_dir", str(run_dir)]
    if cfg.model is not None:
        cmd += ["--model", cfg.model]
    cmd += train_flags(cfg.train)
    if cfg.sandbox["backend"] != "local":  # a local run's command stays as it always was
        cmd += cfg.sandbox_flags("train")
    return cmd


def eval_command(cfg: StudyConfig, model: str, split: str, out_dir: Path,
                 verdicts: Path | None = None) -> list[str]:
    """The ``python -m eval.run`` argv of one evaluation with the study's protocol;
    ``--reuse-verdicts verdicts`` (the study's ``<out>/verdicts``) when
    ``eval.reuse_verdicts`` is true (a verdict already graded is not paid for twice);
    ``--scaffold`` (and ``--scaffold-config``) when ``train.scaffold`` names another scaffold
    than the built-in one (design page, "Generation engines and scaffolds")."""
    ev = cfg.eval
    cmd = [sys.executable, "-m", "eval.run", "--model", str(model), "--split", split,
           "--n", str(cfg.eval_n(split)), "--out", str(out_dir), "--seed", str(ev["seed"]),
           "--concurrency", str(ev["concurrency"]), "--batch-size", str(ev["batch_size"]),
           "--runtime", ev["runtime"]]
    if cfg.sandbox["backend"] != "local":
        cmd += cfg.sandbox_flags("eval")
    for key, flag in (("temperature", "--temperature"), ("max_turns", "--max-turns"),
                      ("max_new_tokens", "--max-new-tokens")):
        if ev[key] is not None:
            cmd += [flag, str(ev[key])]
    # evaluations use the scaffold the runs trained with (train.scaffold / scaffold_config,
    # resolved by the trainer's rule: the compact config for the embedded policy)
    scaffold = cfg.train.get("scaffold", "ecredit")
    if scaffold != "ecredit":
        cmd += ["--scaffold", scaffold]
    config = default_scaffold_config(scaffold, cfg.train.get("scaffold_config") or None,
                                     embedded_policy=cfg.model is None)
    if config:
        cmd += ["--scaffold-config", str(config)]
    if ev.get("reuse_verdicts"):
        if verdicts is None:
            raise ValueError("eval.reuse_verdicts: true needs the study's verdicts folder")
        cmd += ["--reuse-verdicts", str(verdicts)]
    return cmd


def train_unit(cfg: StudyConfig, out: Path, arm: str, seed: int, *, allow_changed: bool,
               say) -> bool:
    """Bring one training run to done. Returns True when it is done afterwards."""
    rd = out / "runs" / run_name(arm, seed)
    unit = Unit("train", run_name(arm, seed), rd)
    state, detail = train_state(rd, cfg, arm, seed)
    if state == "done":
        say(f"study: train {unit.name}: done, skipped")
        return True
    if state == "running":
        say(f"study: train {unit.name}: a live session works on it; skipped")
        return False
    if state == "stale":
        if not allow_changed:
            say(f"study: train {unit.name}: {detail}; not redone without --allow-changed")
            return False
        abandon(out, rd, say)
        for ev in (out / "evals" / unit.name).glob("*"):
            abandon(out, ev, say)
    resume = resume_checkpoint(rd) if (rd / "manifest.json").is_file() else None
    if resume is None and rd.exists():
        abandon(out, rd, say)
    if resume is not None:
        say(f"study: train {unit.name}: {detail}; resuming from {resume.name}")
    try:
        rc = run_subprocess(out, unit, train_command(cfg, arm, seed, rd, resume, allow_changed), say)
    finally:
        wait_sessions(rd, say)
    return rc == 0 and train_state(rd, cfg, arm, seed)[0] == "done"


def eval_unit(cfg: StudyConfig, out: Path, policy: str, model: str, split: str, *,
              allow_changed: bool, say) -> bool:
    """Bring one evaluation to done (eval.run resumes its own folder). Returns done."""
    ed = out / "evals" / policy / split_dirname(split)
    unit = Unit("eval", f"{policy}/{split_dirname(split)}", ed)
    rd = None if policy == "baseline" else out / "runs" / policy
    state, detail = eval_state(ed, cfg, split, rd)
    if state == "done":
        say(f"study: eval {unit.name}: done, skipped")
        return True
    if state == "stale":
        if not allow_changed:
            say(f"study: eval {unit.name}: {detail}; not redone without --allow-changed")
            return False
        abandon(out, ed, say)
    rc = run_subprocess(out, unit, eval_command(cfg, model, split, ed, out / "verdicts"), say)
    if rd is not None and rc == 0:  # the run this eval is of, relative to the study folder
        rec = unit_record(out, unit.uid) or {}
        write_record(out / "units" / f"{unit.uid}.json", {
            **rec, "run_dir": study_relpath(rd, out),
            "results_sha256": sha256_of(ed / "results.json")})
    return rc == 0 and eval_state(ed, cfg, split, rd)[0] == "done"


def compare_split(cfg: StudyConfig, out: Path, split: str) -> dict:
    """``eval.compare`` of every evaluated policy on ``split`` (``baseline`` labelled as its
    own arm) into ``<out>/compare/<split>/`` with ``inputs.json`` (sha256 of each input).
    Missing evaluations are left out (the report shows them Pending)."""
    sd = split_dirname(split)
    args = []
    base = out / "evals" / "baseline" / sd
    if (base / "results.json").is_file():
        args.append("baseline=" + str(base))
    for arm, seed in cfg.design():
        ed = out / "evals" / run_name(arm, seed) / sd
        if (ed / "results.json").is_file():
            args.append(f"{arm}:{seed}=" + str(ed))
    bs = cfg.bootstrap
    cmp = compare([load_run(a) for a in args], n_boot=bs["n_boot"], seed=bs["seed"],
                  alpha=bs["alpha"], power=bs["power"], pooled_seeds=cfg.pooled_seeds)
    cd = out / "compare" / sd
    cd.mkdir(parents=True, exist_ok=True)
    write_json(cd / "compare.json", cmp)
    atomic_write_text(cd / "compare.md", render_markdown(cmp))
    write_plots(cmp, cd)
    rel = [f"{a.split('=', 1)[0]}={study_relpath(a.split('=', 1)[1], out)}" for a in args]
    write_json(cd / "inputs.json", {"inputs": eval_inputs(out, cfg, split), "args": rel})
    return cmp


def write_study_report(out: Path, say) -> bool:
    """The report (:func:`ecredit_trl.study.report.write_report`) into ``<out>/report.md``."""
    write_report(out)
    say(f"study: report {out / 'report.md'}")
    return True


def run_study(cfg: StudyConfig, out: str | Path, *, allow_changed: bool = False,
              command: list[str] | None = None, say=None, load_tasks=None) -> int:
    """Run or resume the whole study in ``out`` (``load_tasks``: source → tasks for the
    overlap check, default :func:`eval.tasks.splits.load_tasks`). Returns 0 when every unit
    is done (the report included), 1 when some unit failed or is not done (the independent
    ones still ran), 143/130 when stopped by a signal.

    Raises: StudyRefused (changed config without ``allow_changed``; folder locked);
        StudyConfigError (one line) when the training pool overlaps an evaluation split
        that ``eval.in_distribution`` does not list
        (:func:`ecredit_trl.study.pool.check_train_pool`; checked before anything is
        written).
    """
    say = say or (lambda m: print(m, flush=True))
    out = Path(out)
    check_train_pool(cfg, load=load_tasks)
    with StudyLock(out):
        bind_study(cfg, out, allow_changed=allow_changed, command=command or sys.argv)
        try:
            ok = _run_units(control_policy(cfg, out, say), out, allow_changed=allow_changed,
                            say=say)
        except KeyboardInterrupt as exc:
            say(f"study: stopped by {exc}; rerun the same command to resume")
            return 130 if "SIGINT" in str(exc) else 143
        finally:
            (out / "units" / "current.json").unlink(missing_ok=True)
    units = study_units(cfg, out)
    left = [u for u in units if u.state != "done"]
    if left:
        say("study: not done: " + ", ".join(f"{u.kind} {u.name} ({u.state})" for u in left))
    return 0 if ok and not left else 1


def _run_units(cfg: StudyConfig, out: Path, *, allow_changed: bool, say) -> bool:
    """Long because it is the study's plan in one place: baseline evals, then per run its
    training and evals, then comparisons and the report; failures are collected."""
    ok = True
    splits = cfg.eval["splits"]
    pend_base = [s for s in splits if eval_state(out / "evals" / "baseline" / split_dirname(s),
                                                 cfg, s, None)[0] != "done"]
    base_model = baseline_model(cfg) if pend_base else None
    for split in splits:
        ok &= eval_unit(cfg, out, "baseline", base_model or "", split,
                        allow_changed=allow_changed, say=say)
    for arm, seed in cfg.design():
        name = run_name(arm, seed)
        if not train_unit(cfg, out, arm, seed, allow_changed=allow_changed, say=say):
            ok = False
            say(f"study: evals of {name} skipped (training not done)")
            continue
        for split in splits:
            ok &= eval_unit(cfg, out, name, str(out / "runs" / name), split,
                            allow_changed=allow_changed, say=say)
    states = {u.uid: u.state for u in study_units(cfg, out)}
    for split in splits:
        if states.get(f"compare-{split_dirname(split)}") == "done":
            say(f"study: compare {split_dirname(split)}: done, skipped")
            continue
        try:
            compare_split(cfg, out, split)
        except (ValueError, FileNotFoundError) as exc:
            ok = False
            say(f"study: compare {split_dirname(split)}: {exc}")
    try:
        write_study_report(out, say)
    except Exception as exc:  # noqa: BLE001 - the report must not hide the study's results
        ok = False
        say(f"study: report failed: {type(exc).__name__}: {exc}")
    return ok


__all__ = ["TRAIN_PY", "compare_split", "eval_command", "eval_unit", "run_study",
           "train_command", "train_unit", "write_study_report"]
