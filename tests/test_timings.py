"""Stage timings of a generation round: unions, gaps, ledger fields."""

from __future__ import annotations

import pytest

from ecredit_trl.runs.ledger import ledger_row, round_counts
from ecredit_trl.runs.timings import (
    TIMING_FIELDS,
    RoundClock,
    gaps_seconds,
    stage_timings,
    union_seconds,
)


def test_union_counts_concurrent_work_once_and_clips_to_the_window():
    assert union_seconds([]) == 0.0
    assert union_seconds([(0, 2), (1, 3), (5, 6)]) == 4.0
    assert union_seconds([(0, 2), (2, 3)]) == 3.0
    assert union_seconds([(3, 1)]) == 0.0  # reversed: nothing
    assert union_seconds([(0, 10)], lo=2, hi=5) == 3.0
    assert union_seconds([(0, 1), (8, 12)], lo=2, hi=10) == 2.0


def test_gaps_are_the_waits_between_consecutive_intervals():
    assert gaps_seconds([(4, 5), (0, 1), (2, 3)]) == 2.0
    assert gaps_seconds([(0, 2), (1, 3)]) == 0.0
    assert gaps_seconds([(0, 1)]) == 0.0


def test_stage_timings_of_a_round():
    c = RoundClock(start=10.0)
    for a, b in ((11.0, 12.0), (13.0, 14.5), (16.0, 16.5)):  # three generations
        c.add("generation", a, b)
    c.add("tools", 12.0, 12.8)
    c.add("tools", 12.2, 13.0)  # concurrent with the first call
    c.add("trials", 12.5, 15.0)
    c.add("trials", 14.0, 18.0)
    t = stage_timings(c, end=20.0)
    assert set(t) == set(TIMING_FIELDS)
    assert t == {"generation_busy_s": 3.0, "tool_busy_s": 1.0, "verifier_busy_s": 5.5,
                 "generation_wait_s": 2.5, "verifier_idle_s": 4.5, "rollout_setup_s": 1.0}
    with pytest.raises(AttributeError):
        c.add("nothing", 0.0, 1.0)


class Res:
    retries = 0
    exit_class = "ok"
    queue_wait_s = setup_s = apply_s = test_s = cleanup_s = 1.0


def test_ledger_row_counts_discarded_counterfactuals_and_carries_the_timings():
    trials = [("factual", Res()), ("counterfactual", Res()), ("counterfactual_discarded", Res())]
    tot = {k: float(v) for k, v in round_counts([], [], trials).items()}
    timings = dict.fromkeys(TIMING_FIELDS, 1.5)
    row = ledger_row(tot, step=1, arm="B", wall_s=3.0, gpu_hours=0.0, timings=timings)
    assert (row["trials_counterfactual"], row["counterfactual_discarded"]) == (1, 1)
    assert row["setup_s"] == 3.0  # the discarded trial's seconds were paid
    assert all(row[k] == 1.5 for k in TIMING_FIELDS)
    assert not set(TIMING_FIELDS) & set(ledger_row(tot, step=1, arm="B", wall_s=3.0,
                                                   gpu_hours=0.0))
