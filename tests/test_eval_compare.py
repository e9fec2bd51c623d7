"""eval.compare: paired differences, bootstrap CI, missing tasks, costs; eval.evaluation.report aggregation."""

from __future__ import annotations

import json
import random

import pytest

from eval.compare import (
    PENDING,
    RunResult,
    arm_task_success,
    bootstrap_ci,
    compare,
    comparison_pairs,
    ledger_costs,
    load_run,
    main,
    paired_difference,
    render_markdown,
)
from eval.evaluation.report import label_agreement, summarize
from eval.evaluation.slots import unknown_slot


def _run(label, per_task, cost=None, tasks_sha="x", n=4):
    arm, _, seed = label.partition(":")
    return RunResult(label=label, arm=arm, seed=int(seed) if seed else None, path=f"{label}.json",
                     per_task=per_task, success=sum(per_task.values()) / len(per_task),
                     unknown=0, split="s", n=n, tasks_sha256=tasks_sha, cost=cost or {})


# ---------------------------------------------------------------------------
# pure statistics
# ---------------------------------------------------------------------------


def test_paired_differences_are_exact():
    m = {"t1": 0.75, "t2": 0.5, "t3": 1.0, "t4": 0.0}
    b = {"t1": 0.25, "t2": 0.5, "t3": 0.5, "t4": 0.25}
    pd = paired_difference(m, b)
    assert pd["tasks"] == ["t1", "t2", "t3", "t4"]
    assert pd["diffs"] == {"t1": 0.5, "t2": 0.0, "t3": 0.5, "t4": -0.25}
    assert pd["mean"] == pytest.approx(0.1875)
    assert pd["only_in_a"] == [] and pd["only_in_b"] == []


def test_ci_contains_true_difference_on_constructed_example():
    rng = random.Random(7)
    tasks = [f"t{i}" for i in range(200)]
    b = {t: rng.random() * 0.6 for t in tasks}
    true = 0.2
    m = {t: b[t] + true + rng.uniform(-0.1, 0.1) for t in tasks}
    diffs = list(paired_difference(m, b)["diffs"].values())
    lo, hi = bootstrap_ci(diffs, n_boot=4000, seed=0)
    assert lo < true < hi
    assert hi - lo < 0.05  # tight: 200 tasks, small noise
    # seeded: the same call gives the same interval
    assert bootstrap_ci(diffs, n_boot=4000, seed=0) == (lo, hi)


def test_ci_of_constant_differences_is_degenerate_and_empty_is_none():
    assert bootstrap_ci([0.25] * 10, n_boot=100) == pytest.approx((0.25, 0.25))
    assert bootstrap_ci([], n_boot=100) is None
    with pytest.raises(ValueError, match="n_boot"):
        bootstrap_ci([1.0], n_boot=0)


def test_arm_missing_tasks_is_reported_never_dropped():
    b = _run("B:0", {"t1": 0.5, "t2": 0.5, "t3": 1.0})
    m = _run("M:0", {"t1": 1.0, "t2": 0.5})  # t3 missing
    cmp = compare([b, m], n_boot=200)
    (pair,) = cmp["pairs"]
    assert pair["name"] == "M−B" and pair["n_tasks"] == 2
    assert pair["only_in_b"] == ["t3"] and pair["incomplete_a"] == ["t3"]
    assert pair["mean"] == pytest.approx(0.25)
    assert cmp["arms"]["M"]["incomplete"] == {"t3": ["M:0"]}
    md = render_markdown(cmp)
    assert "only arm B has 1 task(s): t3" in md
    assert any("arm M" in w and "t3" in w for w in cmp["warnings"])


def test_seed_missing_a_task_makes_it_incomplete_for_the_arm():
    runs = [_run("M:0", {"t1": 1.0, "t2": 0.0}), _run("M:1", {"t1": 0.5}),
            _run("B:0", {"t1": 0.0, "t2": 0.0})]
    arms = arm_task_success(runs)
    assert arms["M"]["per_task"] == {"t1": 0.75}
    assert arms["M"]["incomplete"] == {"t2": ["M:1"]}
    md = render_markdown(compare(runs, n_boot=100))
    assert "task t2 missing in M:1" in md


def test_pairs_pool_shared_seeds_and_carry_their_mdd():
    """M ran seeds 0 and 1, E seed 0 only: M−E compares M:0 with E:0; MDD =
    (z_0.975 + z_0.8) * sd(d) / sqrt(T) with the published quantiles."""
    runs = [_run("M:0", {"t1": 1.0, "t2": 0.5, "t3": 0.0}),
            _run("M:1", {"t1": 0.0, "t2": 0.0, "t3": 0.0}),
            _run("E:0", {"t1": 0.5, "t2": 0.5, "t3": 0.5})]
    (me,) = compare(runs, n_boot=200)["pairs"]
    assert me["diffs"] == {"t1": 0.5, "t2": 0.0, "t3": -0.5}
    assert (me["seeds_a"], me["seeds_b"], me["mixed_seeds"]) == ([0], [0], False)
    sd = (0.5 ** 2 * 2 / 2) ** 0.5  # deviations .5, 0, -.5 over T - 1 = 2
    assert me["mdd"] == pytest.approx((1.959963984540054 + 0.8416212335729143) * sd / 3 ** 0.5)
    (allp,) = compare(runs, n_boot=200, pooled_seeds="all")["pairs"]
    assert allp["diffs"] == {"t1": 0.0, "t2": -0.25, "t3": -0.5} and allp["mixed_seeds"]
    assert "| M−E | [0, 1] vs [0] (mixed) | 3 | -0.250 |" in render_markdown(
        compare(runs, n_boot=200, pooled_seeds="all"))


def test_pair_order_and_fallback():
    assert comparison_pairs(["O", "B", "M", "E"]) == [("M", "B"), ("M", "O"), ("M", "E")]
    assert comparison_pairs(["M", "O"]) == [("M", "O")]
    assert comparison_pairs(["base", "ft1", "ft2"]) == [("ft1", "base"), ("ft2", "base")]
    assert comparison_pairs(["B"]) == []


def test_duplicate_labels_refused():
    with pytest.raises(ValueError, match="given twice"):
        compare([_run("M:0", {"t": 1.0}), _run("M:0", {"t": 0.0})])


def test_ledger_costs_sum_and_pending():
    rows = [{"generated_tokens": 100, "trials_factual": 4, "trials_counterfactual": 2,
             "setup_s": 1.0, "verify_s": 3.0, "cleanup_s": 0.6, "gpu_hours": 0.0},
            {"generated_tokens": 50, "trials_factual": 4, "trials_counterfactual": 1,
             "setup_s": 1.0, "verify_s": 1.6, "cleanup_s": 0.0, "gpu_hours": 0.0}]
    c = ledger_costs(rows)
    assert c["generated_tokens"] == 150 and c["trials_factual"] == 8
    assert c["trials_counterfactual"] == 3 and c["steps"] == 2
    assert c["service_hours"] == pytest.approx(7.2 / 3600)
    assert c["gpu_hours"] == 0.0  # a measured zero stays zero
    assert all(v is None for v in ledger_costs(None).values())
    partial = ledger_costs([{"generated_tokens": 5}])
    assert partial["generated_tokens"] == 5 and partial["service_hours"] is None


def test_markdown_prints_pending_not_zero():
    runs = [_run("B:0", {"t1": 0.0, "t2": 1.0}),
            _run("M:0", {"t1": 1.0, "t2": 1.0}, cost=ledger_costs(
                [{"generated_tokens": 10, "trials_factual": 2, "trials_counterfactual": 1,
                  "setup_s": 36.0, "verify_s": 0.0, "cleanup_s": 0.0, "gpu_hours": 0.5}]))]
    md = render_markdown(compare(runs, n_boot=100))
    b_row = next(line for line in md.splitlines() if line.startswith("| B:0 |"))
    m_row = next(line for line in md.splitlines() if line.startswith("| M:0 |"))
    assert b_row.count(PENDING) == 5
    assert PENDING not in m_row and "0.0100" in m_row


def test_cli_reads_results_and_labels(tmp_path, capsys):
    def write(name, per_task, arm=None, seed=None, run_dir=None):
        d = tmp_path / name
        d.mkdir()
        res = {"arm": arm, "train_seed": seed, "split": "bundled", "n": 2, "tasks_sha256": "s",
               "run_dir": run_dir,
               "summary": {"success": sum(per_task.values()) / len(per_task), "unknown": 1,
                           "per_task": {t: {"success": v} for t, v in per_task.items()}}}
        (d / "results.json").write_text(json.dumps(res))
        return d

    run_dir = tmp_path / "runs" / "m"
    run_dir.mkdir(parents=True)
    (run_dir / "ledger.jsonl").write_text(json.dumps(
        {"generated_tokens": 7, "trials_factual": 1, "trials_counterfactual": 1, "setup_s": 0,
         "verify_s": 3600, "cleanup_s": 0, "gpu_hours": 0.0}) + "\n")
    m = write("m", {"a": 1.0, "b": 0.5}, arm="M", seed=3, run_dir=str(run_dir))
    b = write("b", {"a": 0.5, "b": 0.5})
    assert load_run(str(m)).label == "M:3" and load_run(str(m)).cost["service_hours"] == 1.0
    with pytest.raises(ValueError, match="no arm"):
        load_run(str(b))
    out = tmp_path / "cmp"
    assert main([str(m), f"B:1={b}", "--out", str(out), "--n-boot", "200"]) == 0
    md = capsys.readouterr().out
    assert "| M−B | [3] vs [1] (mixed) | 2 | +0.250 |" in md  # no shared seed: says so
    saved = json.loads((out / "compare.json").read_text())
    assert saved["pairs"][0]["diffs"] == {"a": 0.5, "b": 0.0}
    assert (out / "arm_success.png").stat().st_size > 0
    assert (out / "cost_vs_success.png").stat().st_size > 0
    assert main([str(tmp_path / "nope")]) == 2


# ---------------------------------------------------------------------------
# eval.evaluation.report aggregation (pure)
# ---------------------------------------------------------------------------


def _slot(tid, i, resolved, unknown=False, **kw):
    return {"task_id": tid, "rollout_index": i, "resolved": resolved,
            "classification": {"raw": resolved, "report_binary": resolved, "strict": resolved,
                               "unknown": unknown},
            "unknown_reason": "incomplete_report" if unknown else None, **kw}


def test_summary_fixed_denominator_and_unknowns():
    tasks = [("a", "r1"), ("b", "r1"), ("c", "r2")]
    slots = [_slot("a", 0, True), _slot("a", 1, False), _slot("b", 0, False, unknown=True),
             unknown_slot("b", 1, "trial_infra_error"), _slot("c", 0, True),
             _slot("zzz", 0, True), _slot("c", 5, True)]  # two rows outside the split
    s = summarize(slots, tasks, n=2, denominator=3)
    assert s["denominator"] == {"tasks": 3, "n": 2, "slots": 6}
    assert s["resolved"] == 2 and s["unknown"] == 3 and s["failed"] == 1  # c#1 missing
    assert s["success"] == pytest.approx(2 / 6)
    assert s["success_bounds"] == pytest.approx([2 / 6, 5 / 6])
    assert s["unknown_reasons"] == {"incomplete_report": 1, "no_rollout": 1,
                                    "trial_infra_error": 1}
    assert s["classification"]["unknown"]["count"] == 3
    assert s["per_task"]["a"]["success"] == 0.5 and s["per_task"]["c"]["unknown"] == 1
    assert s["per_repo"]["r1"] == {"tasks": 2, "slots": 4, "resolved": 1, "unknown": 2,
                                   "success": 0.25, "failed": 1}
    assert s["task_success_distribution"] == {"0/2": 1, "1/2": 2, "2/2": 0}
    assert s["ignored_rows"] == 2
    with pytest.raises(ValueError, match="denominator"):
        summarize(slots, tasks, n=2, denominator=500)


def test_label_agreement_counts_each_test():
    a = {"task_id": "t", "rollout_index": 0, "resolved": False,
         "f2p": {"x": "FAILED"}, "p2p": {"y": "PASSED", "z": "PASSED"}}
    b = {"task_id": "t", "rollout_index": 0, "resolved": False,
         "f2p": {"x": "FAILED"}, "p2p": {"y": "PASSED", "z": "MISSING"}}
    ag = label_agreement([(a, b), (a, a)])
    assert ag["tests"] == 6 and ag["agree"] == 5 and ag["resolved_agree"] == 2
    assert ag["disagreements"] == [{"task_id": "t", "rollout_index": 0, "test": "z",
                                    "original": "PASSED", "replay": "MISSING"}]
