"""``python -m ecredit_trl.study run --config studies/<name>.yaml [--out DIR] [--allow-changed]``
, ``python -m ecredit_trl.study status (--out DIR | --config YAML)`` and
``python -m ecredit_trl.study report --out DIR``.

``run`` trains every arm × seed, evaluates the step-0 baseline and every run on each eval
split, compares per split and writes the report into ``--out`` (default
``studies/<name>/``); rerunning the same command resumes (:mod:`ecredit_trl.study.runner`).
``status`` prints every unit: done / running / failed (termination class, exit code) /
stale / pending (:mod:`ecredit_trl.study.status`). ``report`` rebuilds ``report.md`` /
``report.json`` / PNGs from whatever the folder holds (:mod:`ecredit_trl.study.report`).

Exit status of ``run``: 0 all done; 1 a unit failed or is not done; 2 bad input or a refused
folder (changed config, locked, a training pool that overlaps an evaluation split);
143/130 stopped by SIGTERM/SIGINT (rerun to resume). ``status``: 1 when a unit failed, else 0
(pending, running and stale units are not failures); 2 bad input. ``report``: 0, or 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ecredit_trl.study.config import StudyConfigError, config_from_study_json, load_study_config
from ecredit_trl.study.report import StudyReportError, write_report
from ecredit_trl.study.runner import run_study
from ecredit_trl.study.status import render_status, study_units
from ecredit_trl.study.supervisor import StudyRefused
from eval.console import quiet_upstream_warnings
from sandbox.bounds import ArgumentParser, InFile, OutDir


def _parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m ecredit_trl.study",
                                 description="Run or inspect an arm study.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run or resume every unit of a study")
    run.add_argument("--config", type=InFile("yaml"), required=True, help="study YAML (studies/<name>.yaml)")
    run.add_argument("--out", type=OutDir(), default=None, help="study folder (default studies/<name>/)")
    run.add_argument("--allow-changed", action="store_true",
                     help="accept a changed study config (recorded in study.json history)")
    st = sub.add_parser("status", help="print the state of every unit")
    st.add_argument("--out", type=OutDir(), default=None, help="study folder")
    st.add_argument("--config", type=InFile("yaml"), default=None, help="study YAML (default: the folder's study.json)")
    rp = sub.add_parser("report", help="rebuild the report from the study folder")
    rp.add_argument("--out", type=OutDir(), required=True, help="study folder")
    return ap


def _status_config(args):
    if args.config:
        cfg = load_study_config(args.config)
        return cfg, Path(args.out or Path("studies") / cfg.name)
    if not args.out:
        raise ValueError("status: give --out DIR or --config YAML")
    out = Path(args.out)
    return config_from_study_json(out / "study.json"), out


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring for the exit statuses)."""
    quiet_upstream_warnings()
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "report":
            if not (Path(args.out) / "study.json").is_file():
                raise FileNotFoundError(f"--out: {Path(args.out) / 'study.json'} missing "
                                        "(not a study folder?)")
            try:
                write_report(args.out)
            except StudyReportError as exc:
                raise ValueError(str(exc)) from None
            print(f"report: {Path(args.out) / 'report.md'}")
            return 0
        if args.cmd == "status":
            cfg, out = _status_config(args)
            units = study_units(cfg, out)
            print(render_status(units, out))
            return 1 if any(u.state == "failed" for u in units) else 0

        cfg = load_study_config(args.config)
        out = Path(args.out or Path("studies") / cfg.name)
        command = [sys.executable, "-m", "ecredit_trl.study", *(argv or sys.argv[1:])]
        try:
            return run_study(cfg, out, allow_changed=args.allow_changed, command=command)
        except StudyRefused as exc:
            print(f"study: error: {exc}", file=sys.stderr)
            return 2
    except (StudyConfigError, FileNotFoundError, ValueError) as exc:
        print(f"study: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
