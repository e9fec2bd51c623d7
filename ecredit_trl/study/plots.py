"""The study report's figures (matplotlib, Agg backend; PNGs written atomically).

* ``learning_curves.png`` — resolved rate per training step per arm: the mean over seeds as a
  line, the min–max over seeds as a band. An arm without a ledger is named "Pending" in
  the legend and draws nothing.
* ``paired_diffs.png`` — per split, every seeds-pooled difference (M−B, M−O, M−E,
  arm − baseline) as a point with its bootstrap CI; Pending ones are listed, not drawn.
* ``harmful_curve.png`` — only with a positive control:
  :func:`ecredit_trl.study.report_control_render.write_control_plot`.

"""

from __future__ import annotations

from pathlib import Path

from ecredit_trl.study.report_control_render import write_control_plot
from eval.files import save_figure

__all__ = ["write_plots"]

PENDING = "Pending"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _learning_curves(report: dict, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for arm, c in report["curves"].items():
        if not c or not c["steps"]:
            ax.plot([], [], label=f"{arm} ({PENDING})")
            continue
        (line,) = ax.plot(c["steps"], c["mean"], marker="o", ms=3,
                          label=f"{arm} (mean of {len(c['runs'])})")
        ax.fill_between(c["steps"], c["min"], c["max"], alpha=0.2, color=line.get_color())
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel("resolved rate (training rollouts)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("learning curves: mean over seeds, min–max band")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def _paired_diffs(report: dict, path: Path) -> None:
    plt = _plt()
    splits = list(report["differences"])
    cov = int(round(100 * (1 - float(report["study"]["bootstrap"]["alpha"]))))
    n_rows = max([len(d["pooled"]) for d in report["differences"].values()] + [1])
    fig, axes = plt.subplots(1, max(1, len(splits)), figsize=(4.2 * max(1, len(splits)),
                                                              0.45 * n_rows + 1.6),
                             squeeze=False)
    for ax, split in zip(axes[0], splits or [None], strict=True):
        rows = report["differences"][split]["pooled"] if split else []
        names = [r["name"] + ("" if r["ci"] else f" ({PENDING})") for r in rows]
        for y, r in enumerate(rows):
            if r["ci"] is None:
                continue
            lo, hi = r["ci"]
            ax.errorbar([r["mean"]], [y], xerr=[[r["mean"] - lo], [hi - r["mean"]]],
                        fmt="o", capsize=4, color="tab:red" if r["verdict"] in (
                            "positive", "negative") else "tab:blue")
        ax.axvline(0.0, color="grey", lw=0.8, ls="--")
        ax.set_yticks(range(len(rows)), names)
        ax.set_ylim(-0.7, max(0.7, len(rows) - 0.3))
        ax.invert_yaxis()
        ax.set_xlabel("paired difference of success")
        ax.set_title(f"{split}: pooled seeds, {cov}% CI" if split else PENDING,
                     fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def write_plots(report: dict, out_dir: str | Path) -> list[str]:
    """Write ``learning_curves.png`` and ``paired_diffs.png`` into ``out_dir``.

    Args:
        report: the :func:`ecredit_trl.study.report.study_report` dict.

    Returns: the file names written.
    """
    out = Path(out_dir)
    _learning_curves(report, out / "learning_curves.png")
    _paired_diffs(report, out / "paired_diffs.png")

    return ["learning_curves.png", "paired_diffs.png", *write_control_plot(report, out)]
