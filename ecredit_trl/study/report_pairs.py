"""The study's paired differences: which seeds each side pools, and the rows (pure).

Seeds rule: a seeds-pooled difference A − B averages each arm's per-task
figure over **the seeds both arms share** (M − E on E's seeds only), unless the study sets
``pooled_seeds: all`` (every seed of each arm). A pair with no shared seed, or under ``all``
with different seed sets, still mixes seed sets, and its row says so (``mixed_seeds`` and
``seeds_note``). An arm − baseline difference pools all of the arm's seeds: the baseline is
one fixed policy, not a seed of anything.

A pooled row is Pending until every seed it pools is evaluated (done). The rows work on any
per-task figure in [0, 1] (success today; a later per-task rate, e.g. a harmful-block rate,
goes through the same functions with its own ``per_task`` maps).

source: the design page, "Evaluation" (task-paired comparison, M−B primary; M−O, M−E)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ecredit_trl.study.report_tables import pair_row
from eval.compare import arm_task_success
from eval.stats.pairs import STANDARD_PAIRS

__all__ = ["BASELINE", "per_seed_rows", "pooled_rows", "pair_seeds"]

BASELINE = "baseline"


def pair_seeds(a: str, b: str, seeds: Mapping[str, Sequence[int]], rule: str = "shared"
               ) -> tuple[list[int], list[int] | None, str]:
    """The seeds each side of ``a − b`` pools (see the module docstring).

    Args:
        seeds: arm → its design's seeds (the baseline has none).
        rule: ``shared`` (default) or ``all``.

    Returns: ``(seeds_a, seeds_b, note)``: ``seeds_b`` None for the baseline; ``note`` is ""
        unless the row mixes seed sets (then it names both sets and why).

    Raises: ValueError for another ``rule``.
    """
    if rule not in ("shared", "all"):
        raise ValueError(f"pooled_seeds: expected shared or all, got {rule!r}")
    sa = sorted(seeds.get(a, []))
    if b == BASELINE:
        return sa, None, ""
    sb = sorted(seeds.get(b, []))
    common = sorted(set(sa) & set(sb))
    if rule == "shared" and common:
        return common, common, ""
    if sa == sb:
        return sa, sb, ""
    why = "no shared seed" if rule == "shared" else "pooled_seeds: all"
    return sa, sb, f"mixes seed sets ({why}): {a} seeds {sa}, {b} seeds {sb}"


def _per_task(runs: Sequence, arm: str, use: Sequence[int] | None) -> dict | None:
    """Per-task mean over ``arm``'s runs with a seed in ``use`` (all of them for the
    baseline); None when any of those seeds has no (done) evaluation."""
    rs = [r for r in runs if r.arm == arm and (use is None or r.seed in use)]
    if use is not None and {r.seed for r in rs} != set(use) or not rs:
        return None
    return arm_task_success(rs)[arm]["per_task"]


def pooled_rows(runs: Sequence, seeds: Mapping[str, Sequence[int]], arms: Sequence[str], *,
                rule: str = "shared", **kw) -> list[dict]:
    """Seeds-pooled rows: M−B, M−O, M−E (arms present), then every arm − baseline.

    Args:
        runs: done evaluations of one split (``arm``, ``seed``, ``per_task`` as
            :class:`eval.compare.RunResult`), the baseline labelled ``baseline``.
        seeds: arm → its design's seeds. arms: the study's arms, in order.
        rule: the study's ``pooled_seeds``. kw: :func:`pair_row`'s bootstrap/power settings.

    Returns: :func:`pair_row` dicts plus ``a``, ``b``, ``seeds_a``, ``seeds_b``,
        ``mixed_seeds`` (bool) and ``seeds_note``.
    """
    pairs = [(a, b) for a, b in STANDARD_PAIRS if a in arms and b in arms]
    pairs += [(a, BASELINE) for a in arms]
    rows = []
    for a, b in pairs:
        sa, sb, note = pair_seeds(a, b, seeds, rule)
        pa = _per_task(runs, a, sa)
        pb = _per_task(runs, b, sb) if b != BASELINE else _per_task(runs, BASELINE, None)
        rows.append(pair_row(f"{a}−{b}", pa, pb, a=a, b=b, seeds_a=sa, seeds_b=sb,
                             mixed_seeds=bool(note), seeds_note=note, **kw))
    return rows


def per_seed_rows(runs: Sequence, design: Sequence[tuple[str, int]], arms: Sequence[str],
                  **kw) -> list[dict]:
    """Per-seed rows: M−B, M−O, M−E on each seed both arms ran, then each run − baseline
    (same arguments as :func:`pooled_rows`; ``design``: the study's (arm, seed) runs)."""
    run_pt = {(r.arm, r.seed): r.per_task for r in runs if r.arm != BASELINE}
    base_pt = next((r.per_task for r in runs if r.arm == BASELINE), None)
    rows = []
    for a, b in STANDARD_PAIRS:
        if a not in arms or b not in arms:
            continue
        seeds_a = {s for x, s in design if x == a}
        for s in sorted(seeds_a & {s for x, s in design if x == b}):
            rows.append(pair_row(f"{a}−{b}", run_pt.get((a, s)), run_pt.get((b, s)),
                                 a=a, b=b, seed=s, **kw))
    for a, s in design:
        rows.append(pair_row(f"{a}−{BASELINE}", run_pt.get((a, s)), base_pt, a=a,
                             b=BASELINE, seed=s, **kw))
    return rows
