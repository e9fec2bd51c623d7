"""Arm comparison: task-paired differences of per-task success with a bootstrap CI.

``python -m eval.compare RUN_OR_RESULTS... [--out DIR --n-boot B --seed S]``

Each argument is an evaluation folder (``python -m eval.run --out``) or its ``results.json``,
optionally labelled ``ARM=PATH`` or ``ARM:SEED=PATH``; without a label the arm and seed come
from the results (the training run's ``config.json``: ``ecredit.arm``, ``ecredit.seed``).

* **Per-task success** of a run = resolved rollouts / n (``results.summary.per_task``). An
  arm's per-task success is the mean over its seeds; a task missing from any of the arm's
  seeds is *incomplete* for that arm: listed, never paired, never silently dropped.
* **Paired differences** over the tasks both arms have: M−B first, then M−O and M−E when
  present (other labels: every arm against the first one given). Mean difference and a
  percentile bootstrap 95% CI over tasks (seeded), computed by the ``paired_bootstrap``
  ``evaluate`` module shipped in :mod:`eval.metrics`; an arm's own CI is the same module
  against a zero baseline (:func:`eval.stats.paired.bootstrap_ci`). Tasks only one side has are listed. A pair
  pools the seeds both arms share (M−E on E's seeds) and states its minimum detectable
  difference at 80% power (:mod:`eval.stats.power`).
* **Per-seed table** with cost columns from the training run's ``ledger.jsonl``: generated
  tokens, factual and counterfactual trials, service hours ((setup_s + verify_s +
  cleanup_s) / 3600), GPU hours. A missing ledger or field prints **Pending**, never 0.
* Plots: ``arm_success.png`` (per-arm success with its 95% CI), ``cost_vs_success.png``.

Outputs with ``--out``: ``compare.json``, ``compare.md`` and the PNGs (written atomically).

This module is the CLI. The comparison lives in :mod:`eval.stats`: ``paired`` (the statistics,
:func:`compare`), ``inputs`` (evaluation folders and ledgers, :func:`load_run`) and ``render``
(``compare.md`` and the figures); their public names are importable from here as well.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from eval.files import atomic_write_text, write_json
from eval.stats.inputs import ledger_costs, load_run
from eval.stats.paired import (
    CompareInputError,
    RunResult,
    arm_task_success,
    bootstrap_ci,
    compare,
    comparison_pairs,
    paired_difference,
)
from eval.stats.render import PENDING, render_markdown, write_plots
from sandbox.bounds import ArgumentParser, Int, OutDir, Text

__all__ = [
    "PENDING",
    "CompareInputError",
    "RunResult",
    "arm_task_success",
    "bootstrap_ci",
    "compare",
    "comparison_pairs",
    "ledger_costs",
    "load_run",
    "main",
    "paired_difference",
    "render_markdown",
    "write_plots",
]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI. Exit 0, or 2 on bad input (the message names the argument or path)."""
    ap = ArgumentParser(prog="python -m eval.compare",
                                 description="Task-paired arm comparison with bootstrap CI.")
    ap.add_argument("runs", type=Text(why="an eval folder or results.json, optionally ARM=PATH"), nargs="+", help="eval folder or results.json, optionally "
                    "ARM=PATH or ARM:SEED=PATH")
    ap.add_argument("--out", type=OutDir(), default=None, help="write compare.json/.md and plots here")
    ap.add_argument("--n-boot", type=Int(ge=1), default=10000, help="bootstrap resamples")
    ap.add_argument("--seed", type=Int(ge=0, le=2**32 - 1, why="32-bit seeds"), default=0, help="bootstrap seed")
    args = ap.parse_args(argv)
    try:
        runs = [load_run(a) for a in args.runs]
        cmp = compare(runs, n_boot=args.n_boot, seed=args.seed)
    except (CompareInputError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    md = render_markdown(cmp)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "compare.json", cmp)
        atomic_write_text(out / "compare.md", md)
        write_plots(cmp, out)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
