"""``study run``: every unit of a study, resumably (issue 14 §1; DESIGN.md §4).

Order: training runs (arms × seeds, ``accelerate launch ecredit_trl/train.py`` each, a
subprocess so multi-GPU accelerate configs work unchanged), the step-0 baseline's and every
run's evaluations (``python -m eval.run``, a subprocess), one comparison per split
(:mod:`eval.compare`, in process), then the report
(:func:`ecredit_trl.study.report.write_report`).

Resume rules (states from :mod:`ecredit_trl.study.status`): done units are skipped; a
training run that was interrupted resumes through ``--resume-from`` its newest numbered
checkpoint with a receipt (none: the partial run is moved to ``<out>/abandoned/`` and
started again); an evaluation folder is resumable by ``eval.run`` itself; a stale unit
(another config's result) is redone only under ``--allow-changed`` (moved to
``abandoned/`` first, with the evaluations of a moved run). A failed unit does not stop the
independent ones: evaluations of a run that did not finish are skipped (pending).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ecredit_trl.runs.portable import portable_argv
from ecredit_trl.runs.resume import resume_checkpoint
from ecredit_trl.study.config import UNHASHED_KEYS, StudyConfig, changed_keys, split_dirname
from ecredit_trl.study.status import (
    LOCK_NAME,
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

REPO_ROOT = Path(__file__).resolve().parents[2]
TRAIN_PY = REPO_ROOT / "ecredit_trl" / "train.py"


class StudyRefused(RuntimeError):
    """The study cannot run on this folder (changed config, another run holds the lock)."""


def _write_json(path: Path, obj) -> None:
    from ecredit_trl.runs.records import write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, obj)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def bind_study(cfg: StudyConfig, out: Path, *, allow_changed: bool, command: list[str]) -> dict:
    """Write ``study.json`` into a new ``out``, or check it against ``cfg``.

    A changed resolved config is refused unless ``allow_changed``; an accepted change is
    appended to ``history`` (time, command, old/new sha256, changed keys).

    Raises: StudyRefused naming the changed keys.
    """
    path = out / "study.json"
    command = portable_argv(command, out)  # no machine paths in the record
    new = {**cfg.resolved(), "config_sha256": cfg.sha256(), "config_path": cfg.path,
           "command": command}
    if not path.is_file():
        rec = {**new, "started_at": _now(), "history": []}
        _write_json(path, rec)
        return rec
    old = json.loads(path.read_text(encoding="utf-8"))
    if old.get("config_sha256") == new["config_sha256"]:
        if old.get("sandbox") == new.get("sandbox"):
            return old
        # an unhashed key changed (where trials run): accepted, recorded in the history
        rec = {k: v for k, v in old.items() if k != "sandbox"}
        rec.update({k: new[k] for k in UNHASHED_KEYS if k in new})
        rec["history"] = list(old.get("history", [])) + [{
            "at": _now(), "command": command, "changed_keys": [
                k for k in changed_keys(old, new) if k.startswith("sandbox")]}]
        _write_json(path, rec)
        return rec
    keys = [k for k in changed_keys({k: old.get(k) for k in cfg.resolved()}, cfg.resolved())
            if k.split(".")[0] not in UNHASHED_KEYS]
    if not allow_changed:
        raise StudyRefused(f"{path}: the study config changed ({', '.join(keys) or 'hash'}); "
                           "rerun with --allow-changed to accept it, or use another --out")
    hist = list(old.get("history", [])) + [{
        "at": _now(), "command": command, "was_sha256": old.get("config_sha256"),
        "now_sha256": new["config_sha256"], "changed_keys": keys}]
    rec = {**new, "started_at": old.get("started_at"), "history": hist}
    _write_json(path, rec)
    return rec


class StudyLock:
    """``flock`` on ``<out>/.study.lock`` (holds our pid) so two runs never share a folder."""

    def __init__(self, out: Path) -> None:
        self.path = out / LOCK_NAME
        self.f = None

    def __enter__(self) -> StudyLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.path, "a+")
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.f.seek(0)
            pid = self.f.read().strip()
            self.f.close()
            raise StudyRefused(f"{self.path}: another study run (pid {pid or '?'}) holds this "
                               "folder") from None
        self.f.seek(0)
        self.f.truncate()
        self.f.write(str(os.getpid()))
        self.f.flush()
        return self

    def __exit__(self, *exc) -> None:
        self.f.seek(0)
        self.f.truncate()
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def _flag_values(key: str, value) -> list[str]:
    if isinstance(value, list):
        return [f"--{key}", *map(str, value)]
    return [f"--{key}", str(value)]


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
    for k, v in cfg.train.items():
        if v is not None:
            cmd += _flag_values(k, v)
    if cfg.sandbox["backend"] != "local":  # a local run's command stays as it always was
        cmd += cfg.sandbox_flags("train")
    return cmd


def eval_command(cfg: StudyConfig, model: str, split: str, out_dir: Path,
                 verdicts: Path | None = None) -> list[str]:
    """The ``python -m eval.run`` argv of one evaluation with the study's protocol;
    ``--reuse-verdicts verdicts`` (the study's ``<out>/verdicts``) when
    ``eval.reuse_verdicts`` is true (issue 14 §2, cost)."""
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
    if ev.get("reuse_verdicts"):
        if verdicts is None:
            raise ValueError("eval.reuse_verdicts: true needs the study's verdicts folder")
        cmd += ["--reuse-verdicts", str(verdicts)]
    return cmd


def control_policy(cfg: StudyConfig, out: Path, say) -> StudyConfig:
    """``cfg``, or (``warmstart`` set, ``model: null``) ``cfg`` with ``model`` = the embedded
    policy warm-started with those recipe overrides (built once, cached; a positive control's
    harmful blocks are screened with real trials first), so every run and evaluation uses it.
    Writes ``<out>/harmful.json`` (the policy's key, the harmful edits its demonstrations
    carry, the screened ids, every task's variant, and ``base_texts``: task id → the edited
    file's text at base, from which the report rebuilds a trajectory's final diff; temp +
    rename) for the report's detector.
    The study's bound config (``study.json``) keeps ``model: null``.

    Raises: what :func:`ecredit_trl.policy.warmstart.ensure_default_policy` raises.
    """
    import dataclasses

    if not cfg.warmstart or cfg.model is not None:
        return cfg
    from ecredit_trl.policy.warmstart import default_policy_tasks, ensure_default_policy
    from ecredit_trl.train import parse_args
    from eval.files import atomic_write_text
    from eval.tasks.splits import load_tasks

    argv = ["--arm", cfg.arms[0]]
    for k, v in cfg.train.items():
        if v is not None:
            argv += _flag_values(k, v)
    tcfg, margs = parse_args(argv)
    kw = {"steps": margs.warmstart_steps} if margs.warmstart_steps else {}
    tasks = default_policy_tasks(tcfg.tasks, load_tasks(tcfg.tasks, purpose="train"))
    path = ensure_default_policy(tasks, log=say, **kw, **cfg.warmstart)
    meta = json.loads((Path(path) / "warmstart.json").read_text(encoding="utf-8"))
    by_id = {t.instance_id: t for t in tasks}
    base = {i: subprocess.run(["git", "-C", str(by_id[i].repo_dir), "show",
                               f"{by_id[i].base_commit}:{e['path']}"], capture_output=True,
                              check=True).stdout.decode("utf-8")
            for i, e in (meta.get("harmful") or {}).items()}
    atomic_write_text(out / "harmful.json", json.dumps(
        {**{k: meta.get(k) for k in ("key", "harmful", "harmful_screened", "variants")},
         "base_texts": base}, indent=1, sort_keys=True))
    say(f"study: policy {Path(path).name[:12]} (warmstart {cfg.warmstart}); "
        f"{len(meta.get('harmful') or {})} demonstrations carry a harmful block")
    return dataclasses.replace(cfg, model=str(path))


def baseline_model(cfg: StudyConfig) -> str:
    """The starting policy: ``cfg.model``, or the embedded warm-started default resolved
    exactly as train.py resolves it for these train fields (built once, cached)."""
    if cfg.model is not None:
        return cfg.model
    from ecredit_trl.train import _tasks_and_policy, parse_args

    argv = ["--arm", cfg.arms[0]]
    for k, v in cfg.train.items():
        if v is not None:
            argv += _flag_values(k, v)
    tcfg, margs = parse_args(argv)
    return str(_tasks_and_policy(tcfg, margs)[1])


def run_subprocess(out: Path, unit: Unit, cmd: list[str], say) -> int:
    """Run one unit's command in its own process group, log to ``<out>/logs/<uid>.log``,
    record ``units/<uid>.json`` with its exit code.

    A SIGTERM/SIGINT to the study is passed on to the unit's whole process group, which stops
    cleanly (train.py: checkpoint + receipt); then the study exits. The group, not the child
    alone: the child of a training unit is ``accelerate launch``, whose one-process launcher
    dies on SIGTERM without passing it to train.py (a plain ``kill <study pid>`` left
    train.py training to its last step). In its own group, a Ctrl-C or a scheduler's signal
    to the study's group reaches the unit once, through the study."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    rec_path = out / "units" / f"{unit.uid}.json"
    log_path = logs / f"{unit.uid}.log"
    # relative to the study folder: a copied or moved folder's records still hold
    rec = {"uid": unit.uid, "cmd": cmd, "started_at": _now(), "rc": None,
           "log": study_relpath(log_path, out)}
    _write_json(rec_path, rec)
    _write_json(out / "units" / "current.json", {"uid": unit.uid, "pid": os.getpid()})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    say(f"study: {unit.kind} {unit.name}: {' '.join(cmd[2:6])} ... (log {rec['log']})")
    t0 = time.time()
    stopping: list[int] = []
    with open(log_path, "a") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)

        def forward(signum, frame):
            stopping.append(signum)
            with contextlib.suppress(ProcessLookupError):  # the group has already exited
                os.killpg(proc.pid, signum)

        old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            rc = proc.wait()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
    rec.update(rc=rc, ended_at=_now(), wall_s=round(time.time() - t0, 3))
    _write_json(rec_path, rec)
    say(f"study: {unit.kind} {unit.name}: exit {rc} after {rec['wall_s']:.0f} s")
    if stopping:
        raise KeyboardInterrupt(signal.Signals(stopping[0]).name)
    return rc


def _abandon(out: Path, path: Path, say) -> None:
    """Move a partial or stale unit folder to ``<out>/abandoned/`` (kept, never deleted)."""
    if not path.exists():
        return
    dest = out / "abandoned" / f"{path.relative_to(out).as_posix().replace('/', '_')}-{int(time.time())}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(path), str(dest))
    say(f"study: moved {path} to {dest}")


def _wait_sessions(run_dir: Path, say, timeout_s: float = 900.0) -> None:
    """Wait until no live session works on ``run_dir``: accelerate's launcher may exit on a
    signal before train.py has written its checkpoint and termination receipt."""
    from ecredit_trl.runs.receipts import live_sessions

    deadline = time.monotonic() + timeout_s
    said = False
    while live_sessions(run_dir) and time.monotonic() < deadline:
        if not said:
            say(f"study: waiting for the training process of {run_dir} to stop")
            said = True
        time.sleep(1.0)


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
        _abandon(out, rd, say)
        for ev in (out / "evals" / unit.name).glob("*"):
            _abandon(out, ev, say)
    resume = resume_checkpoint(rd) if (rd / "manifest.json").is_file() else None
    if resume is None and rd.exists():
        _abandon(out, rd, say)
    if resume is not None:
        say(f"study: train {unit.name}: {detail}; resuming from {resume.name}")
    try:
        rc = run_subprocess(out, unit, train_command(cfg, arm, seed, rd, resume, allow_changed), say)
    finally:
        _wait_sessions(rd, say)
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
        _abandon(out, ed, say)
    rc = run_subprocess(out, unit, eval_command(cfg, model, split, ed, out / "verdicts"), say)
    if rd is not None and rc == 0:  # the run this eval is of, relative to the study folder
        rec = unit_record(out, unit.uid) or {}
        _write_json(out / "units" / f"{unit.uid}.json", {
            **rec, "run_dir": study_relpath(rd, out),
            "results_sha256": sha256_of(ed / "results.json")})
    return rc == 0 and eval_state(ed, cfg, split, rd)[0] == "done"


def compare_split(cfg: StudyConfig, out: Path, split: str) -> dict:
    """``eval.compare`` of every evaluated policy on ``split`` (``baseline`` labelled as its
    own arm) into ``<out>/compare/<split>/`` with ``inputs.json`` (sha256 of each input).
    Missing evaluations are left out (the report shows them Pending)."""
    from eval.compare import compare, load_run, render_markdown, write_plots
    from eval.files import atomic_write_text, write_json

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


def _report_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("ecredit_trl.study.report") is not None


def write_study_report(out: Path, say) -> bool:
    """The report through :func:`ecredit_trl.study.report.write_report` when it exists."""
    try:
        from ecredit_trl.study.report import write_report
    except ImportError:
        say("report: pending (ecredit_trl.study.report not available)")
        return False
    write_report(out)
    say(f"study: report {out / 'report.md'}")
    return True


def run_study(cfg: StudyConfig, out: str | Path, *, allow_changed: bool = False,
              command: list[str] | None = None, say=None, load_tasks=None) -> int:
    """Run or resume the whole study in ``out`` (``load_tasks``: source → tasks for the
    overlap check, default :func:`eval.tasks.splits.load_tasks`). Returns 0 when every unit is done (the
    report only when :mod:`ecredit_trl.study.report` exists; otherwise "report: pending" is
    printed), 1 when some unit failed or is not done (the independent ones still ran),
    143/130 when stopped by a signal.

    Raises: StudyRefused (changed config without ``allow_changed``; folder locked);
        StudyConfigError (one line) when the training pool overlaps an evaluation split
        that ``eval.in_distribution`` does not list
        (:func:`ecredit_trl.study.pool.check_train_pool`; checked before anything is
        written).
    """
    from ecredit_trl.study.pool import check_train_pool

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
    left = [u for u in units if u.state != "done"
            and not (u.kind == "report" and u.state == "pending" and not _report_available())]
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


__all__ = ["StudyLock", "StudyRefused", "baseline_model", "bind_study", "compare_split",
           "control_policy",
           "eval_command", "run_study", "train_command", "train_unit"]
