"""ecredit_trl.study.report: the study report from a study folder.

The folder is built with the real writers where they are cheap: ``ledger_row`` /
``trajectory_row`` (ecredit_trl.runs.ledger), ``RunReceipts`` (start + termination),
``summarize`` / ``unknown_slot`` (eval.evaluation) for ``results.json``'s summary.
"""

from __future__ import annotations

import json
import math
import shutil
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from ecredit_trl.runs.ledger import ledger_row, trajectory_row
from ecredit_trl.runs.receipts import RunReceipts
from ecredit_trl.study.report import StudyReportError, study_report, write_report
from ecredit_trl.study.report_tables import signal_table
from eval.evaluation.modelref import resolve_model
from eval.evaluation.report import summarize
from eval.evaluation.slots import unknown_slot
from eval.files import write_json

TASKS = ["t0", "t1", "t2", "t3"]
N = 2
SPLIT = "bundled:train"
# resolved rollouts (of N) per task, per policy
RESOLVED = {
    "baseline": [0, 1, 0, 0],
    "O-s0": [1, 1, 0, 0], "O-s1": [0, 1, 0, 1],
    "B-s0": [1, 1, 0, 0], "B-s1": [1, 1, 1, 0],
    "M-s0": [2, 2, 1, 0], "M-s1": [2, 1, 1, 1],
    "E-s0": [1, 1, 0, 0],
}
# (resolved, rollouts) per step of the ledger
STEPS = {"M-s0": [(1, 4), (3, 4)], "M-s1": [(2, 4), (2, 4)]}
SECONDS = {"M-s0": 100.0, "M-s1": 50.0}


def _slot(tid, i, resolved):
    return {"task_id": tid, "rollout_index": i, "resolved": resolved,
            "classification": {"raw": resolved, "report_binary": resolved, "strict": resolved,
                               "unknown": False}, "unknown_reason": None}


def _write_eval(out: Path, policy: str):
    slots = []
    for tid, k in zip(TASKS, RESOLVED[policy], strict=True):
        for i in range(N):
            if policy == "M-s1" and tid == "t3" and i == 1:  # an unknown slot (not resolved)
                slots.append(unknown_slot(tid, i, "incomplete_report"))
            else:
                slots.append(_slot(tid, i, i < k))
    summary = summarize(slots, [(t, "repo") for t in TASKS], N, len(TASKS))
    arm, _, seed = policy.partition("-s")
    ed = out / "evals" / policy / "bundled-train"
    write_json(ed / "run.json", {"binding": f"bind-{policy}"})  # eval.run's binding
    write_json(ed / "results.json", {
        "binding": f"bind-{policy}", "rollouts_exit_code": 0,
        "split": SPLIT, "n": N, "seed": 0, "tasks_sha256": "abc",
        "arm": None if policy == "baseline" else arm,
        "train_seed": None if policy == "baseline" else int(seed),
        "run_dir": None if policy == "baseline" else str(out / "runs" / policy),
        # eval.run's fingerprint of the weights it evaluated (eval.evaluation.modelref)
        "model": {"sha256": "base" if policy == "baseline"
                  else resolve_model(out / "runs" / policy).sha256},
        # the study's protocol: study.json's eval, unset fields from train.py's defaults
        "overrides": {"temperature": 1.0, "max_turns": 3, "max_new_tokens": 640},
        "summary": summary,
        "cost": {"trials_factual": 6, "trials_control": 4, "service_s": 3.0,
                 "generated_tokens": 100},
        "slots": slots, "wall_s": 20.0})


def _tot(**kw):
    t = defaultdict(float)
    t.update(kw)
    return t


def _traj(arm, step, i, *, exclusion=None, contrast=None, resolved=False, s=1.0, cap=False,
          m=0, L=10):
    rec = SimpleNamespace(
        task_id=TASKS[i % 4], rollout_index=i, format_error=exclusion == "format_error",
        num_turns=2, writes=[{}, {"a.py": "x"}], submit_turn=2, reward=float(resolved),
        resolved=resolved, utility=float(resolved), utility_ablated=None, contrast=contrast,
        selected_turn=2 if m else None, selected_paths=["a.py"] if m else [],
        eligible_turns=[2] if m else [], exclusion=exclusion, format_errors=0, tool_calls=[],
        factual=None, counterfactual=None,
        ablation={"artifact_empty": False, "touched_fraction": 1.0, "off_final_diff": False}
        if m else None, setup_error=None, factual_outcome="graded",
        counterfactual_outcome=None, calls_not_run=0, calls_after_submit=0, failure=None,
        record_error=None)
    st = SimpleNamespace(s=s, cap_active=cap, m=m, L=L)
    return trajectory_row(rec, arm=arm, step=step, generated_tokens=L,
                          tokens_per_turn=[L - m, m], advantage=0.5, stats=st)


# M-s0's trajectories: the signal table below is computed by hand from these rows
M0_TRAJ = [
    dict(contrast=1.0, resolved=True, s=0.5, cap=True, m=10, L=40),
    dict(contrast=0.0, m=5, L=20),
    dict(exclusion="no_eligible_block"),
    dict(exclusion="truncated"),
    dict(contrast=-0.5, m=8, L=16),
    dict(exclusion="format_error"),
    dict(contrast=None, m=6, L=12),
]


def _write_run(out: Path, label: str):
    arm, _, seed = label.partition("-s")
    d = out / "runs" / label
    d.mkdir(parents=True)
    write_json(d / "manifest.json", {"world_size": 1, "run_name": label})
    write_json(d / "config.json", {"ecredit": {"arm": arm, "seed": int(seed), "max_steps": 2},
                                   "model": {"model": None}})
    rr = RunReceipts(d, 0)
    rr.start(run_name=label, world_size=1)
    (d / "checkpoint-final").mkdir()
    write_json(d / "checkpoint-final" / "config.json", {"model_type": "crafted", "run": label})
    rr.checkpoint(d / "checkpoint-final", step=2, reason="final")
    rr.termination("completed", step=2, max_steps=2)
    term = d / "receipts" / "s00-termination.json"
    body = json.loads(term.read_text())
    body["seconds"] = SECONDS.get(label, 10.0)  # a fixed duration for the expectation
    term.write_text(json.dumps(body))
    rows = []
    for step, (res, n) in enumerate(STEPS.get(label, [(1, 4), (1, 4)]), 1):
        rows.append(ledger_row(_tot(generated_tokens=100, credited_tokens=60, trials_factual=4,
                                    trials_counterfactual=3 if arm in "BM" else 0,
                                    trials_control=1, queue_wait_s=2.5, rollouts=n,
                                    resolved=res), step=step, arm=arm, wall_s=30.0,
                               gpu_hours=0.0))
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if label == "M-s0":
        text += '{"step": 3, "arm": "M", "generated_'  # a crash mid-write: cut last line
    (d / "ledger.jsonl").write_text(text)
    traj = [_traj(arm, 1 + i % 2, i, **kw) for i, kw in enumerate(M0_TRAJ)] \
        if label in ("M-s0", "E-s0") else [_traj(arm, 1, 0, contrast=1.0, m=5, L=10)]
    (d / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in traj))


def _study(out: Path, *, runs=("O-s0", "O-s1", "B-s0", "B-s1", "M-s0", "M-s1", "E-s0")):
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "study.json", {
        "name": "unit", "model": None, "arms": ["O", "B", "M", "E"], "seeds": [0, 1],
        "seeds_by_arm": {"E": [0]}, "train": {"max_steps": 2},
        "eval": {"splits": [SPLIT], "n": N, "temperature": 1.0},
        "bootstrap": {"n_boot": 2000, "seed": 0, "alpha": 0.05}, "accelerate_config": None,
        "config_sha256": "f00", "started_at": "2026-11-30T15:00:00"})
    _write_eval(out, "baseline")
    for label in runs:
        _write_run(out, label)
        _write_eval(out, label)
    return out


def _pair(rep, name, seed=None):
    d = rep["differences"][SPLIT]
    rows = d["pooled"] if seed is None else [r for r in d["per_seed"] if r.get("seed") == seed]
    (row,) = [r for r in rows if r["name"] == name]
    return row


def test_full_study_report_numbers(tmp_path):
    out = _study(tmp_path / "st")
    rep = write_report(out)
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == [
        "learning_curves.png", "paired_diffs.png", "report.json", "report.md", "study.json"]
    assert json.loads((out / "report.json").read_text())["answer"] == rep["answer"]
    ev = {r["policy"]: r for r in rep["evaluation"][SPLIT]}
    assert ev["baseline"]["success"] == pytest.approx(1 / 8)
    # M-s1: 5 resolved of 8 slots; the unknown slot stays in the denominator
    assert ev["M-s1"]["success"] == pytest.approx(5 / 8)
    assert (ev["M-s1"]["unknown"], ev["M-s1"]["slots"]) == (1, 8)
    assert ev["M-s1"]["success_bounds"] == pytest.approx([5 / 8, 6 / 8])
    # pooled M (t: 1, .75, .5, .25) − pooled B (.5, .5, .25, 0): diffs .5,.25,.25,.25
    mb = _pair(rep, "M−B")
    assert mb["mean"] == pytest.approx(0.3125) and mb["n_tasks"] == 4
    assert 0.25 <= mb["ci"][0] <= mb["ci"][1] <= 0.5 and mb["verdict"] == "positive"
    assert _pair(rep, "M−E")["mean"] == pytest.approx(0.375)
    # O − baseline: diffs .25, 0, 0, .25 → the CI reaches 0: no difference detected
    ob = _pair(rep, "O−baseline")
    assert ob["mean"] == pytest.approx(0.125) and ob["ci"][0] == 0.0
    assert ob["verdict"] == "no difference detected"
    # per seed: M:1 (1, .5, .5, .5) − B:1 (.5, .5, .5, 0)
    assert _pair(rep, "M−B", seed=1)["mean"] == pytest.approx(0.25)
    assert [a["name"] for a in rep["answer"][SPLIT]] == ["M−B", "M−O", "M−E", "O−baseline"]
    md = (out / "report.md").read_text()
    assert "**M−B** = +0.312" in md and "no difference detected" in md
    assert "| M | 2 of 2 | 0.625 | [" in md and "| baseline | 1 of 1 | 0.125 | [" in md
    (answer,) = [x for x in md.splitlines() if x.startswith("- `bundled:train`:")]
    assert "Pending" not in answer


def test_curves_costs_and_truncated_ledger_line(tmp_path):
    rep = study_report(_study(tmp_path / "st"))
    c = rep["curves"]["M"]  # M-s0's cut last ledger line (step 3) is ignored
    assert c["steps"] == [1, 2] and c["n_runs"] == [2, 2]
    assert c["mean"] == pytest.approx([0.375, 0.625])
    assert c["min"] == pytest.approx([0.25, 0.5]) and c["max"] == pytest.approx([0.5, 0.75])
    m = rep["costs"]["per_arm"]["M"]
    assert m["runs"] == 2 and m["trials_factual"] == 16 and m["trials_counterfactual"] == 12
    assert m["trials_control"] == 4 and m["generated_tokens"] == 400
    assert m["queue_wait_s"] == pytest.approx(10.0) and m["gpu_hours"] == 0.0
    assert m["train_wall_s"] == pytest.approx(150.0)
    assert m["cpu_hours"] == pytest.approx(150.0 / 3600)
    assert m["eval_wall_s"] == pytest.approx(40.0)
    assert m["credited_tokens"] == 240  # 4 rows × 60 tokens in the loss


def test_signal_table_from_training_trajectories(tmp_path):
    rep = study_report(_study(tmp_path / "st"))
    t = rep["signal"]["M"]["per_run"]["M-s0"]
    assert t["planned"] == 7 and t["usable"] == 4
    assert t["excluded"] == {"format_error": 1, "no_eligible_block": 1,
                             "no_original_utility": 0, "truncated": 1}
    assert (t["nonzero"], t["positive"], t["negative"]) == (2, 1, 1)
    assert t["cap_active"] == 1 and t["contrast_unavailable"] == 1
    assert t["median_m_over_L"] == pytest.approx(0.375)  # .25, .25, .5, .5
    assert t["median_shrinkage"] == pytest.approx(1.0)  # s of rows with D: .5, 1, 1
    assert rep["signal"]["M"]["pooled"]["planned"] == 8
    e = rep["signal"]["E"]["per_run"]["E-s0"]  # arm E never queries D
    assert e["d_measured"] is False and e["nonzero"] is None
    assert e["cap_active"] == 1 and e["median_shrinkage"] == pytest.approx(1.0)
    assert "O" not in rep["signal"]
    md = (write_report(tmp_path / "st") and (tmp_path / "st" / "report.md")).read_text()
    assert "| M | pooled (2 of 2 runs) | 8 |" in md
    assert "| M | M-s0 | 7 | format_error 1, no_eligible_block 1, truncated 1 | 4 | 2 | 1 | 1 |" \
        in md


def test_missing_units_print_pending_never_numbers(tmp_path):
    out = _study(tmp_path / "st", runs=("O-s0", "B-s0", "M-s0", "M-s1"))
    rep = write_report(out)
    units = {u["name"]: u["status"] for u in rep["units"]}
    assert units["B-s1"] == "pending" and units["E-s0"] == "pending"
    assert units["M-s0"] == "done" and units["E-s0/bundled-train"] == "pending"
    # B has one of its two seeds evaluated: the pooled M−B is Pending, seed 0 is measured
    assert _pair(rep, "M−B")["mean"] is None and _pair(rep, "M−B")["verdict"] == "Pending"
    assert _pair(rep, "M−B", seed=0)["mean"] == pytest.approx(0.375)  # (1,1,.5,0)-(.5,.5,0,0)
    assert _pair(rep, "M−E")["ci"] is None
    assert rep["costs"]["per_arm"]["B"]["trials_factual"] is None
    assert rep["costs"]["per_arm"]["E"]["generated_tokens"] is None
    assert rep["signal"]["E"]["pooled"] is None
    ev = {r["policy"]: r for r in rep["evaluation"][SPLIT]}
    assert ev["E-s0"]["success"] is None and ev["E-s0"]["status"] == "pending"
    md = (out / "report.md").read_text()
    assert "**M−B**: Pending" in md and "**M−E**: Pending" in md
    assert "| E-s0 | E | 0 | Pending | Pending |" in md
    assert "| E | 0 | Pending |" in md  # costs row of the arm that did not run
    assert "| B-s1 | Pending | Pending |" in md and "| B-s0 | done | 2 | 8 | 6 | 2 | 200 |" in md


def test_bad_input_leaves_the_previous_report_intact(tmp_path, monkeypatch):
    out = _study(tmp_path / "st")
    write_report(out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    led = out / "runs" / "B-s0" / "ledger.jsonl"
    lines = led.read_text().splitlines()
    led.write_text("\n".join([lines[0], "{not json", lines[1]]) + "\n")
    with pytest.raises(StudyReportError, match=r"B-s0/ledger.jsonl:2"):
        write_report(out)
    led.write_text("\n".join([lines[0], lines[1]]) + "\n")
    import ecredit_trl.study.plots as plots

    def boom(report, path):
        (Path(path)).write_bytes(b"half")
        raise RuntimeError("plot failed")

    monkeypatch.setattr(plots, "_paired_diffs", boom)
    with pytest.raises(RuntimeError, match="plot failed"):
        write_report(out)
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert after == before
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no stage left


def test_study_json_errors_name_the_field(tmp_path):
    with pytest.raises(StudyReportError, match="no study.json"):
        study_report(tmp_path)
    out = _study(tmp_path / "st", runs=())
    s = json.loads((out / "study.json").read_text())
    s["seeds_by_arm"] = {"E": "0"}
    (out / "study.json").write_text(json.dumps(s))
    with pytest.raises(StudyReportError, match=r"seeds_by_arm\.E"):
        study_report(out)
    shutil.rmtree(out)


def test_signal_table_names_the_row_lacking_a_field():
    rows = [_traj("M", 1, 0, contrast=1.0, m=5, L=10), {"exclusion": None, "contrast": 0.0}]
    with pytest.raises(ValueError, match="trajectories row 2: usable record lacks"):
        signal_table(rows, "M")


def test_a_study_where_nothing_ran_reports_only_pending(tmp_path):
    out = _study(tmp_path / "st", runs=())
    (out / "evals" / "baseline" / "bundled-train" / "results.json").unlink()
    rep = write_report(out)
    assert {u["status"] for u in rep["units"]} == {"pending"}
    assert all(c is None for c in rep["curves"].values())
    assert [a["verdict"] for a in rep["answer"][SPLIT]] == ["Pending"] * 4
    assert all(v is None for c in rep["costs"]["per_arm"].values() for k, v in c.items()
               if k != "runs")
    md = (out / "report.md").read_text()
    assert "**M−B**: Pending; **M−O**: Pending; **M−E**: Pending; **O−baseline**: Pending" in md
    assert "0.000" not in md


def test_receipt_summary_from_receipts(tmp_path):
    from ecredit_trl.study.report import receipt_summary

    assert receipt_summary(tmp_path / "absent") == {"class": None, "sessions": 0, "step": None}
    live, dead, killed = tmp_path / "live", tmp_path / "dead", tmp_path / "killed"
    RunReceipts(live, 0).start(run_name="live")  # this process: alive, no termination yet
    assert receipt_summary(live)["class"] is None
    RunReceipts(dead, 0).start(run_name="dead")
    rec = dead / "receipts" / "s00-start.json"
    body = json.loads(rec.read_text())
    body["process"]["start_ticks"] = -1  # another process with this pid: the run's is gone
    rec.write_text(json.dumps(body))
    assert receipt_summary(dead)["class"] == "no termination receipt"
    RunReceipts(killed, 0).start(run_name="killed")
    RunReceipts(killed, 0).termination("sigterm", step=1)
    assert receipt_summary(killed) == {"class": "sigterm", "sessions": 1, "step": 1}


# -- power, seeds, one definition of done, measured size, relocation ----------------
Z = 1.959963984540054 + 0.8416212335729143  # z_0.975 + z_0.8 (published constants)


def test_every_comparison_carries_its_minimum_detectable_difference(tmp_path):
    out = _study(tmp_path / "st")
    rep = write_report(out)
    # M − B pooled: diffs .5, .25, .25, .25 -> sd .125, SE .0625
    assert _pair(rep, "M−B")["mdd"] == pytest.approx(Z * 0.0625, rel=1e-9)
    # O − baseline: diffs .25, 0, 0, .25 -> sd = sqrt(4 * .125^2 / 3), SE = sd / 2
    ob = _pair(rep, "O−baseline")
    assert ob["mdd"] == pytest.approx(Z * math.sqrt(4 * 0.125 ** 2 / 3) / 2, rel=1e-9)
    assert round(ob["mdd"], 3) == 0.202 and ob["verdict"] == "no difference detected"
    d = rep["differences"][SPLIT]
    assert all(r["mdd"] is not None or r["mdd_reason"] for r in d["pooled"] + d["per_seed"]
               if r["n_tasks"])
    md = (out / "report.md").read_text()
    assert ("**O−baseline** = +0.125, 95% CI [+0.000, +0.250] over 4 tasks — no difference "
            "detected (CI contains 0) — would have detected |Δ| ≥ 0.202 (80% power)") in md
    assert "| O−baseline | [0, 1] | 4 | +0.125 | [+0.000, +0.250] | 0.202 | no difference" in md
    assert "MDD = (z_(1−α/2) + z_power) · sd(d_t) / √T" in md


def test_pooled_differences_use_the_seeds_both_arms_share(tmp_path, monkeypatch):
    monkeypatch.setitem(RESOLVED, "M-s1", [0, 0, 0, 0])
    out = _study(tmp_path / "st")
    rep = study_report(out)
    me = _pair(rep, "M−E")  # E ran seed 0 only: M-s0 (1, 1, .5, 0) - E-s0 (.5, .5, 0, 0)
    assert (me["seeds_a"], me["seeds_b"], me["mixed_seeds"]) == ([0], [0], False)
    assert me["mean"] == pytest.approx(0.375)
    mb = _pair(rep, "M−B")  # both seeds: (.5, .5, .25, 0) - (.5, .5, .25, 0)
    assert mb["seeds_a"] == [0, 1] and mb["mean"] == 0.0
    assert mb["mdd"] is None and "all 4 paired differences equal +0.000" in mb["mdd_reason"]
    # pooled_seeds: all pools every seed of each side, and the row says it mixes seed sets
    sj = json.loads((out / "study.json").read_text())
    (out / "study.json").write_text(json.dumps({**sj, "pooled_seeds": "all"}))
    rep = write_report(out)
    me = _pair(rep, "M−E")  # (.5, .5, .25, 0) - (.5, .5, 0, 0)
    assert me["mean"] == pytest.approx(0.0625) and me["mixed_seeds"] is True
    assert me["seeds_note"] == "mixes seed sets (pooled_seeds: all): M seeds [0, 1], E seeds [0]"
    md = (out / "report.md").read_text()
    assert "| M−E | [0, 1] vs [0] **mixes seed sets** | 4 | +0.062 |" in md
    assert "over 4 tasks (mixes seed sets (pooled_seeds: all): M seeds [0, 1], E seeds [0])" in md


def test_pair_seeds_without_a_shared_seed_says_it_mixes():
    from ecredit_trl.study.report_pairs import pair_seeds

    assert pair_seeds("M", "E", {"M": [0, 1], "E": [1]}) == ([1], [1], "")
    sa, sb, note = pair_seeds("M", "E", {"M": [0, 1], "E": [5]})
    assert (sa, sb) == ([0, 1], [5]) and note.startswith("mixes seed sets (no shared seed)")
    assert pair_seeds("O", "baseline", {"O": [1, 0]}) == ([0, 1], None, "")


def test_report_and_status_share_one_definition_of_done(tmp_path):
    from ecredit_trl.study.config import config_from_study_json
    from ecredit_trl.study.status import study_units

    out = _study(tmp_path / "st")
    res_p = out / "evals" / "M-s1" / "bundled-train" / "results.json"
    res = json.loads(res_p.read_text())
    res_p.write_text(json.dumps({**res, "rollouts_exit_code": 1}))  # rollouts crashed
    rep = write_report(out)
    status = {f"{u.kind} {u.name}": u.state for u in
              study_units(config_from_study_json(out / "study.json"), out)}
    assert status["eval M-s1/bundled-train"] == "failed"
    assert {f"{u['kind']} {u['name']}": u["status"] for u in rep["units"]} == {
        k: v for k, v in status.items() if k.split()[0] in ("train", "eval")}
    ev = {r["policy"]: r for r in rep["evaluation"][SPLIT]}
    assert ev["M-s1"]["status"] == "failed" and ev["M-s1"]["success"] is None
    assert _pair(rep, "M−B")["verdict"] == "Pending"  # a pooled seed is not done
    assert _pair(rep, "M−B", seed=0)["mean"] == pytest.approx(0.375)
    assert status["report report"] == "done"


def test_caveat_states_the_measured_parameter_count(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    out = _study(tmp_path / "st")
    assert "parameter count Pending (no weights" in (write_report(out) and (
        out / "report.md")).read_text()
    ck = out / "runs" / "O-s0" / "checkpoint-final"
    save_file({"emb": np.zeros((1000, 2000), np.uint8), "head": np.zeros((540, 1000), np.uint8)},
              str(ck / "model.safetensors"))
    rep = write_report(out)
    assert rep["model"] == {"parameters": 2_540_000, "source": "runs/O-s0/checkpoint-final",
                            "adapter": False}
    md = (out / "report.md").read_text()
    assert ("tiny model warm-started on these bundled tasks: 2.54M parameters (2,540,000, "
            "counted from `runs/O-s0/checkpoint-final`)") in md
    assert "2M-parameter" not in md


def test_a_copied_study_folder_reads_the_same(tmp_path):
    """cp -r (new mtimes, the old place gone): every unit stays done, absolute records of the
    old place are matched by the run's weights, the study's relative records by path."""
    from ecredit_trl.study.config import config_from_study_json
    from ecredit_trl.study.status import sha256_of, study_units

    old = _study(tmp_path / "st")
    write_report(old)
    # a newer record of the study itself: the run named relative to the study folder
    res_m = old / "evals" / "M-s0" / "bundled-train" / "results.json"
    res = json.loads(res_m.read_text())
    res_m.write_text(json.dumps({**res, "run_dir": "/elsewhere/runs/M-s0",
                                 "model": {"sha256": "not-these-weights"}}))
    write_json(old / "units" / "eval-M-s0-bundled-train.json",
               {"rc": 0, "run_dir": "runs/M-s0", "results_sha256": sha256_of(res_m)})
    from ecredit_trl.study.runner import compare_split

    compare_split(config_from_study_json(old / "study.json"), old, SPLIT)
    write_report(old)
    assert json.loads((old / "compare" / "bundled-train" / "inputs.json").read_text())[
        "args"][0] == "baseline=evals/baseline/bundled-train"  # relative to the study folder
    new = tmp_path / "copy"
    shutil.copytree(old, new, copy_function=shutil.copy)  # mtimes not kept
    shutil.rmtree(old)

    def states():
        return {f"{u.kind} {u.name}": (u.state, u.detail) for u in
                study_units(config_from_study_json(new / "study.json"), new)}

    got = states()
    assert {s for s, _ in got.values()} == {"done"}, got
    # another run's weights under the same name: not this run's evaluation
    res_o = new / "evals" / "O-s0" / "bundled-train" / "results.json"
    res = json.loads(res_o.read_text())
    res_o.write_text(json.dumps({**res, "model": {"sha256": "other"}}))
    got = states()
    assert got["eval O-s0/bundled-train"] == ("stale", "differs in run_dir")
    assert got["report report"] == ("stale", "units changed since")


def test_an_in_distribution_split_is_labelled_training_tasks(tmp_path):
    out = _study(tmp_path / "st")
    sj = json.loads((out / "study.json").read_text())
    sj["eval"]["in_distribution"] = [SPLIT]  # the embedded study's bundled:train
    (out / "study.json").write_text(json.dumps(sj))
    write_report(out)
    md = (out / "report.md").read_text()
    assert "### `bundled:train` (training tasks: in-distribution on purpose) — seeds pooled" in md
    assert "- `bundled:train` (training tasks: in-distribution on purpose): **M−B**" in md
