"""The signal pilot: pure table aggregation, a local end-to-end run, and Podman on bundled tasks."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest
from conftest import git

from ecredit_trl.credit.pilot import main, run_pilot
from ecredit_trl.credit.pilot_report import (
    EXCLUSIONS,
    _median,
    _quantile,
    pilot_table,
    render_markdown,
)
from ecredit_trl.credit.planning import contrast
from ecredit_trl.credit.scripted import KINDS, scripted_for_task, scripted_trajectories
from ecredit_trl.credit.trajectory import FileWrite, Trajectory, Turn, dump_trajectories

# ----------------------------------------------------------------------------
# pure aggregation
# ----------------------------------------------------------------------------


def _usable(D, resolved=True, s=1.0, cap=False, m=10, L=100, empty=False, frac=0.5, off=False):
    return {"exclusion": None, "D": D, "resolved_P": resolved, "s": s, "cap_active": cap,
            "m": m, "L": L, "ablation": {"artifact_empty": empty, "touched_fraction": frac,
                                         "off_final_diff": off}}


def _trial(role, task="t", idx=0, attempts=1, service=1.0, exit_class="ok", cached=False):
    return {"role": role, "task_id": task, "rollout_index": None if role == "control" else idx,
            "attempts": attempts, "service_s": service, "queue_wait_s": 0.5,
            "exit_class": exit_class, "cached": cached}


def test_contrast():
    assert contrast(1.0, 0.0) == 1.0
    assert contrast(0.0, 0.5) == -0.5
    assert contrast(None, 1.0) is None and contrast(1.0, None) is None


def test_median_quantile():
    assert _median([]) is None and _quantile([], 0.95) is None
    assert _median([3.0, 1.0, 2.0]) == 2.0 and _median([1.0, 2.0, 3.0, 10.0]) == 2.5
    assert _quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.95) == pytest.approx(4.8)
    assert _quantile([7.0], 0.95) == 7.0


def test_table_counts_and_identities():
    records = [
        {"exclusion": "format_error", "ablation": None},
        {"exclusion": "no_eligible_block", "ablation": None},
        {"exclusion": "no_eligible_block", "ablation": None},
        {"exclusion": "no_original_utility",
         "ablation": {"artifact_empty": True, "touched_fraction": 1.0, "off_final_diff": False}},
        _usable(1.0, m=10, L=100, s=0.5, cap=True, empty=True, frac=1.0),
        _usable(0.0, m=20, L=100, frac=0.25, off=True),
        _usable(-0.5, resolved=False, m=30, L=100, s=0.8, cap=True, frac=None),
        _usable(0.25, resolved=False, m=40, L=100),
        _usable(None, resolved=False, m=50, L=100, s=1.0),
    ]
    trials = ([_trial("control", task="t", cached=True, attempts=0, service=0.0),
               _trial("control", task="u", attempts=2, service=9.0)]
              + [_trial("factual", idx=i, service=float(i)) for i in range(6)]
              + [_trial("counterfactual", idx=i, service=2.0, attempts=1 + (i == 0))
                 for i in range(5)])
    t = pilot_table(records, trials)
    assert t["planned"] == 9
    assert t["excluded"] == {"format_error": 1, "no_eligible_block": 2, "no_original_utility": 1}
    assert t["usable"] == 5
    assert t["planned"] == sum(t["excluded"].values()) + t["usable"]
    assert (t["nonzero"], t["positive"], t["negative"], t["zero"]) == (3, 2, 1, 1)
    assert t["nonzero"] == t["positive"] + t["negative"]
    assert t["contrast_unavailable"] == 1
    assert t["failed_original"] == {"queried": 3, "nonzero": 2, "positive": 1, "negative": 1}
    assert t["cap_active"] == 2
    assert t["median_m_over_L"] == pytest.approx(0.3)
    assert t["median_shrinkage"] == pytest.approx(0.9)  # over the 4 with D: 0.5, 1, 0.8, 1
    assert t["artifacts_constructed"] == 6
    assert t["empty_patch_artifacts"] == 2
    assert t["median_touched_fraction"] == pytest.approx(0.5)  # 1.0, 1.0, 0.25, 0.5, 0.5
    assert t["off_final_diff"] == 1
    assert t["trials"]["factual"] == 6 and t["trials"]["counterfactual"] == 5
    assert t["trials"]["control"] == 1 and t["trials"]["control_cached"] == 1
    assert t["trials"]["retries"] == 2
    assert t["trials"]["retries_by_role"] == {"control": 1, "factual": 0, "counterfactual": 1}
    fc = [float(i) for i in range(6)] + [2.0] * 5
    assert t["service_time_s"]["mean"] == pytest.approx(sum(fc) / len(fc))
    assert t["service_time_s"]["p95"] == pytest.approx(_quantile(fc, 0.95))
    assert t["query_bound"] == {"max_factual_per_rollout": 1,
                                "max_counterfactual_per_rollout": 1, "ok": True}
    assert all(t["identities"].values())
    md = render_markdown(t, {"seed": 3})
    assert "| usable | 5 |" in md and "planned = excluded + usable: **yes**" in md


def test_table_has_the_issue_keys():
    t = pilot_table([], [])
    for k in ("planned", "usable", "nonzero", "positive", "negative", "cap_active",
              "median_m_over_L", "median_shrinkage", "artifacts_constructed",
              "empty_patch_artifacts", "median_touched_fraction", "off_final_diff"):
        assert k in t, k
    assert set(t["excluded"]) == {"format_error", "no_eligible_block", "no_original_utility"}
    assert set(t["failed_original"]) == {"queried", "nonzero", "positive", "negative"}
    assert set(t["service_time_s"]) == {"mean", "p95"}
    assert {"factual", "counterfactual", "retries"} <= set(t["trials"])


def test_table_empty_and_bound_violation():
    t = pilot_table([], [])
    assert t["planned"] == 0 and t["usable"] == 0 and t["median_shrinkage"] is None
    assert t["service_time_s"] == {"mean": None, "p95": None}
    assert all(t["identities"].values()) and t["query_bound"]["ok"]
    t = pilot_table([_usable(1.0)], [_trial("factual"), _trial("counterfactual"),
                                     _trial("counterfactual")])
    assert t["query_bound"]["max_counterfactual_per_rollout"] == 2
    assert t["query_bound"]["ok"] is False
    assert "VIOLATED" in render_markdown(t)


def test_table_rejects_bad_records():
    with pytest.raises(ValueError, match="unknown reason"):
        pilot_table([{"exclusion": "bored", "ablation": None}], [])
    with pytest.raises(ValueError, match="lacks 'D'"):
        pilot_table([{"exclusion": None, "ablation": None}], [])
    assert EXCLUSIONS == ("format_error", "no_eligible_block", "no_original_utility")


# ----------------------------------------------------------------------------
# local end-to-end (LocalRuntime, a tiny repository with a known bug)
# ----------------------------------------------------------------------------

CHECK_PY = """\
import sys
sys.path.insert(0, ".")


def run(name, fn):
    try:
        ok = bool(fn())
    except Exception:
        ok = False
    print(("PASSED " if ok else "FAILED ") + name)


run("tests/test_a.py::test_f", lambda: __import__("pkg.a", fromlist=["f"]).f(1) == 2)
run("tests/test_b.py::test_g", lambda: __import__("pkg.b", fromlist=["g"]).g(2) == 4)
run("tests/test_a.py::test_f_zero", lambda: __import__("pkg.a", fromlist=["f"]).f(0) == 1)
run("tests/test_c.py::test_keep", lambda: __import__("pkg.c", fromlist=["C"]).C == "needed")
"""


def _tiny_task(tmp_path: Path, name: str = "tiny-1", two_bugs: bool = False):
    """A tiny task run by LocalRuntime: bug in pkg/a.py (and in pkg/b.py when
    ``two_bugs``: then the gold patch touches two files, both needed)."""
    from eval.tasks.schema import Task

    r = tmp_path / f"repo-{name}"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "def f(x):\n    return x - 1\n",
        "pkg/b.py": "def g(x):\n    return x * 3\n" if two_bugs else "def g(x):\n    return x * 2\n",
        "pkg/c.py": "C = 'needed'\n",
        "check.py": CHECK_PY,
        "tests/test_a.py": "# the real tests live in check.py\n",
        "README.md": "tiny\n",
    }
    for p, t in files.items():
        (r / p).parent.mkdir(parents=True, exist_ok=True)
        (r / p).write_text(t)
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "base")
    base = git(r, "rev-parse", "HEAD")
    (r / "pkg" / "a.py").write_text("def f(x):\n    return x + 1\n")
    if two_bugs:
        (r / "pkg" / "b.py").write_text("def g(x):\n    return x * 2\n")
    gold = git(r, "diff") + "\n"
    git(r, "checkout", "--", ".")
    script = (f'echo ">>>>> Start Test Output"\n"{sys.executable}" check.py\n'
              'echo ">>>>> End Test Output"\n')
    return Task(instance_id=name, repo="local/tiny", base_commit=base,
                problem_statement="f(1) should be 2", patch=gold, test_patch="",
                FAIL_TO_PASS=["tests/test_a.py::test_f", "tests/test_a.py::test_f_zero"]
                + (["tests/test_b.py::test_g"] if two_bugs else []),
                PASS_TO_PASS=["tests/test_c.py::test_keep"]
                + ([] if two_bugs else ["tests/test_b.py::test_g"]), version="0",
                environment_setup_commit=base, image="local", eval_script=script,
                log_parser="parse_log_pytest", repo_dir=str(r))


class _FlakyRuntime:
    """LocalRuntime that fails chosen trials with infra_error (always or once)."""

    kind = backend = "local"

    def __init__(self, always=(), once=()):
        from sandbox.runtimes.local_runtime import LocalRuntime

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.inner = LocalRuntime()
        self.always, self.once, self.seen = set(always), set(once), set()

    def run_trial(self, spec):
        from sandbox.trials.trial import TrialResult

        if spec.trial_id in self.always or (spec.trial_id in self.once
                                             and spec.trial_id not in self.seen):
            self.seen.add(spec.trial_id)
            return TrialResult(trial_id=spec.trial_id, exit_class="infra_error",
                               error="injected")
        return self.inner.run_trial(spec)


def _read_jsonl(p: Path) -> list[dict]:
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def _check_table_against_records(table, records, trials):
    """Recount the table's key numbers from records.jsonl / trials.jsonl."""
    ex = {k: sum(r["exclusion"] == k for r in records) for k in EXCLUSIONS}
    usable = [r for r in records if r["exclusion"] is None]
    ds = [r["D"] for r in usable if r["D"] is not None]
    assert table["planned"] == len(records)
    assert table["excluded"] == ex
    assert table["usable"] == len(usable)
    assert table["planned"] == sum(table["excluded"].values()) + table["usable"]
    assert table["nonzero"] == sum(d != 0 for d in ds)
    assert table["positive"] == sum(d > 0 for d in ds)
    assert table["negative"] == sum(d < 0 for d in ds)
    assert table["nonzero"] == table["positive"] + table["negative"]
    assert table["failed_original"]["queried"] == sum(not r["resolved_P"] for r in usable)
    assert table["trials"]["factual"] == sum(t["role"] == "factual" for t in trials)
    assert table["trials"]["counterfactual"] == sum(t["role"] == "counterfactual" for t in trials)
    assert table["artifacts_constructed"] == sum(r["ablation"] is not None for r in records)
    # query bound: one factual per admitted rollout, at most one counterfactual
    admitted = [r for r in records if r["exclusion"] in (None, "no_original_utility")]
    assert table["trials"]["factual"] == len(admitted)
    assert table["trials"]["counterfactual"] == len(usable)
    assert table["query_bound"]["ok"] and table["query_bound"]["max_counterfactual_per_rollout"] <= 1
    for r in usable:
        assert r["D"] == (None if r["U_P"] is None or r["U_Pb"] is None else r["U_P"] - r["U_Pb"])
        assert r["trials"]["factual"]["role"] == "factual"
        assert r["trials"]["counterfactual"]["role"] == "counterfactual"
        assert r["s"] == r["credit_M"]["s"] and 0 < r["s"] <= 1
        assert r["cap_active"] == (r["s"] < 1)


def _check_signs(records):
    """The sign of D where the scripted expectation is definite. Returns #checked."""
    n = 0
    for r in records:
        if r["exclusion"] is not None or r["D"] is None:
            continue
        sc = r["trajectory_extra"].get("scripted")
        if not sc:
            continue
        exp = sc["turns"][r["selected_turn"] - 1]
        if exp["expect_d"] == "+" and r["resolved_P"]:
            assert r["D"] > 0, (r["task_id"], r["rollout_index"], exp)
            n += 1
        elif exp["expect_d"] == "0":
            assert r["D"] == 0, (r["task_id"], r["rollout_index"], exp)
            n += 1
    return n


def _check_eligibility(records):
    for r in records:
        sc = r["trajectory_extra"].get("scripted")
        if not sc or r["selection"] is None:
            continue
        by_turn = {e["turn"]: e for e in r["selection"]["eligibility"]}
        for k, exp in enumerate(sc["turns"], start=1):
            assert by_turn[k]["reasons"] == exp["expect_reasons"], (r["task_id"], k, exp)


def test_scripted_rollouts_of_tiny_task(tmp_path):
    task = _tiny_task(tmp_path)
    trajs = scripted_for_task(task)
    assert [t.rollout_index for t in trajs] == list(range(len(KINDS) - 1))  # no gold_split
    mixed = trajs[0].extra["scripted"]
    roles = [t["role"] for t in mixed["turns"]]
    assert mixed["gold_split"] == "none"
    assert roles[:4] == ["create", "test_only", "draft", "damage"]
    assert {"gold", "noise", "repair", "delete_doc"} <= set(roles)
    assert trajs[KINDS.index("format_error")].format_error
    f = tmp_path / "t.jsonl"
    dump_trajectories(trajs, f)
    from ecredit_trl.credit.trajectory import load_trajectories

    assert load_trajectories(f) == trajs


def _retarget_gold(task, edit):
    """Same task, gold patch = ``edit`` applied to the base (a dict path -> new text)."""
    import dataclasses

    r = Path(task.repo_dir)
    for p, t in edit.items():
        (r / p).write_text(t)
    gold = git(r, "diff") + "\n"
    git(r, "checkout", "--", ".")
    return dataclasses.replace(task, patch=gold)


def test_scripted_gold_split_by_hunks_and_files(tmp_path):
    task = _tiny_task(tmp_path)
    r = Path(task.repo_dir)
    # a long file so that two edits give two hunks
    body = "".join(f"V{i} = {i}\n" for i in range(40))
    (r / "pkg" / "long.py").write_text(body)
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "long")
    import dataclasses

    task = dataclasses.replace(task, base_commit=git(r, "rev-parse", "HEAD"))
    two_hunks = body.replace("V1 = 1\n", "V1 = 100\n").replace("V38 = 38\n", "V38 = 380\n")
    t_h = _retarget_gold(task, {"pkg/long.py": two_hunks})
    mixed = scripted_for_task(t_h, kinds=["mixed"])[0]
    sc = mixed.extra["scripted"]
    assert sc["gold_split"] == "hunks"
    roles = {e["role"]: (k, e) for k, e in enumerate(sc["turns"], start=1)}
    k1, e1 = roles["gold_part1"]
    k2, e2 = roles["gold_part2"]
    assert e1["expect_reasons"] == ["not_last_touch"] and e2["expect_d"] == "+"
    part1 = mixed.turns[k1 - 1].writes["pkg/long.py"].data.decode()
    assert "V1 = 100" in part1 and "V38 = 38\n" in part1
    assert mixed.turns[k2 - 1].writes["pkg/long.py"].data.decode() == two_hunks
    t_f = _retarget_gold(task, {"pkg/a.py": "def f(x):\n    return x + 1\n",
                                "pkg/b.py": "def g(x):\n    return -x\n"})
    sc = scripted_for_task(t_f, kinds=["mixed"])[0].extra["scripted"]
    assert sc["gold_split"] == "files" and sc["gold_paths"] == ["pkg/a.py", "pkg/b.py"]
    roles = [e["role"] for e in sc["turns"]]
    assert "gold_part1" in roles and "gold_part2" in roles


def test_local_pilot_end_to_end(tmp_path):
    tasks = [_tiny_task(tmp_path, "tiny-1"), _tiny_task(tmp_path, "tiny-2", two_bugs=True)]
    trajs = scripted_trajectories(tasks)
    # one extra hand-written rollout whose factual trial always hits an infra error
    extra = Trajectory("tiny-2", 9, False, (
        Turn(7, {"pkg/b.py": FileWrite(b"def g(x):\n    return x  # hmm\n")}),))
    trajs.append(extra)
    from ecredit_trl.credit.pilot_trials import _slug

    rt = _FlakyRuntime(always={f"{_slug('tiny-2')}-r9-fact"},
                       once={f"{_slug('tiny-1')}-r1-cf"})
    out = tmp_path / "out"
    table = run_pilot(tasks, trajs, out, seed=5, credit_lambda=1.0, credit_cap=1.0,
                      concurrency=2, runtime=rt, max_retries=1, log=lambda _m: None)
    records = _read_jsonl(out / "records.jsonl")
    trials = _read_jsonl(out / "trials.jsonl")
    on_disk = json.loads((out / "pilot.json").read_text())
    assert on_disk["usable"] == table["usable"]
    assert (out / "pilot.md").read_text().startswith("# Signal pilot")
    _check_table_against_records(on_disk, records, trials)
    assert table["excluded"] == {"format_error": 2, "no_eligible_block": 2,
                                 "no_original_utility": 1}
    assert table["usable"] == 7  # 3 + 4 (tiny-2's fix is split over two files)
    assert table["trials"]["retries_by_role"]["factual"] == 1   # the always-failing one retried
    assert table["trials"]["retries_by_role"]["counterfactual"] == 1
    assert table["trials"]["control"] == 2
    by_key = {(r["task_id"], r["rollout_index"]): r for r in records}
    # gold_only: the only eligible block is the fix; its ablation is the empty patch
    for tid in ("tiny-1", "tiny-2"):
        g = by_key[(tid, KINDS.index("gold_only"))]
        assert g["U_P"] == 1.0 and g["U_Pb"] == 0.0 and g["D"] == 1.0
        assert g["ablation"]["artifact_empty"] is True
        assert g["m"] == g["L"] and g["s"] == 1.0  # λ·|D|·L/m = 1 = c: cap not active
        n = by_key[(tid, KINDS.index("nofix"))]
        assert n["U_P"] == 0.0 and n["D"] == 0.0 and not n["resolved_P"]
    # tiny-2's fix spans two files, both needed: removing either half lowers U
    sp = by_key[("tiny-2", KINDS.index("gold_split"))]
    assert sp["trajectory_extra"]["scripted"]["gold_split"] == "files"
    assert sp["eligible_turns"] == [1, 2] and sp["U_P"] == 1.0 and sp["D"] > 0
    assert ("tiny-1", KINDS.index("gold_split")) not in by_key  # a one-file fix: not built
    assert by_key[("tiny-2", 9)]["exclusion"] == "no_original_utility"
    assert by_key[("tiny-2", 9)]["exclusion_detail"] == "factual trial infra_error"
    assert _check_signs(records) >= 4
    _check_eligibility(records)
    # selections were written before any trial and match the records
    sels = {(s["task_id"], s["rollout_index"]): s for s in _read_jsonl(out / "selections.jsonl")}
    assert table["meta"]["selections_before_trials"] is True
    for key, r in by_key.items():
        assert sels[key]["selection"] == r["selection"]
    # the control is cached: a second run over the same out dir does not rerun it
    table2 = run_pilot(tasks, trajs[:3], out, seed=5, runtime=rt, log=lambda _m: None)
    assert table2["trials"]["control"] == 0 and table2["trials"]["control_cached"] == 1


def test_selection_does_not_depend_on_verifier(tmp_path):
    """Same seed, different verifier outcomes → same selections."""
    task = _tiny_task(tmp_path)
    trajs = scripted_for_task(task, kinds=["mixed"])
    a = run_pilot([task], trajs, tmp_path / "a", seed=11, runtime=_FlakyRuntime(),
                  log=lambda _m: None)
    from ecredit_trl.credit.pilot_trials import _slug

    broken = _FlakyRuntime(always={f"{_slug(task.instance_id)}-r0-fact"})
    b = run_pilot([task], trajs, tmp_path / "b", seed=11, runtime=broken, log=lambda _m: None)
    ra = _read_jsonl(tmp_path / "a" / "records.jsonl")[0]
    rb = _read_jsonl(tmp_path / "b" / "records.jsonl")[0]
    assert ra["selection"] == rb["selection"]
    assert a["usable"] == 1 and b["excluded"]["no_original_utility"] == 1


def test_pilot_refuses_unknown_task(tmp_path):
    task = _tiny_task(tmp_path)
    with pytest.raises(ValueError, match="unknown task_id"):
        run_pilot([task], [Trajectory("nope", 0, False, ())], tmp_path / "o",
                  runtime=_FlakyRuntime())


def test_cli_local(tmp_path, monkeypatch):
    from eval.tasks.schema import save_tasks

    task = _tiny_task(tmp_path)
    tasks_file = tmp_path / "tasks.jsonl"
    save_tasks([task], tasks_file)
    trajs_file = tmp_path / "trajs.jsonl"
    dump_trajectories(scripted_for_task(task, kinds=["gold_only", "format_error"]), trajs_file)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = main(["--tasks", str(tasks_file), "--trajectories", str(trajs_file),
                   "--out", str(tmp_path / "out"), "--runtime", "local", "--seed", "1",
                   "--credit-lambda", "0.5", "--credit-cap", "2", "--concurrency", "1"])
    assert rc == 0
    t = json.loads((tmp_path / "out" / "pilot.json").read_text())
    assert t["usable"] == 1 and t["positive"] == 1 and t["excluded"]["format_error"] == 1
    assert t["meta"]["credit_lambda"] == 0.5 and t["meta"]["credit_cap"] == 2.0


# ----------------------------------------------------------------------------
# Podman end-to-end on bundled tasks
# ----------------------------------------------------------------------------


@pytest.mark.podman
def test_pilot_podman_bundled(tmp_path, podman_runtime):
    from eval.tasks.splits import load_tasks

    tasks = load_tasks("bundled")
    trajs = scripted_trajectories(tasks, max_tasks=5)
    assert len(trajs) >= 20
    out = tmp_path / "pilot"
    table = run_pilot(tasks, trajs, out, seed=0, concurrency=2, runtime=podman_runtime,
                      timeout_s=300, log=lambda _m: None)
    records = _read_jsonl(out / "records.jsonl")
    trials = _read_jsonl(out / "trials.jsonl")
    _check_table_against_records(table, records, trials)
    _check_eligibility(records)
    assert table["excluded"]["format_error"] == 5
    assert table["excluded"]["no_eligible_block"] == 5
    assert table["excluded"]["no_original_utility"] == 0
    assert table["usable"] == 15
    by_key = {(r["task_id"], r["rollout_index"]): r for r in records}
    for t in {r["task_id"] for r in records}:
        g = by_key[(t, KINDS.index("gold_only"))]
        assert g["resolved_P"] and g["D"] > 0 and g["ablation"]["artifact_empty"]
        n = by_key[(t, KINDS.index("nofix"))]
        assert not n["resolved_P"] and n["D"] == 0
    assert _check_signs(records) >= 10
    assert table["meta"]["selections_before_trials"]


@pytest.mark.podman
def test_pilot_charges_a_hang_to_the_artifact_like_training(tmp_path, podman_runtime):
    """A rollout whose artifact hangs at import (its control healthy under the same limits,
    the pool's retry hangs too) is scored the failure value, as training scores it
    (:func:`ecredit_trl.runs.outcomes.trial_verdict`), not excluded: before, the pilot
    dropped every non-``ok`` trial, so a policy that hangs its verifier left the pilot's D
    table. The selection (run seed 1) ablates the hanging edit, so the ablated patch (the
    harmless new file alone) no longer hangs and D = U(P) − U(P\\b) exists.

    Cost: the hang costs its timeout and the retry's doubled one (20 s + 40 s) once, on the
    factual trial only; the counterfactual runs the task's tests as usual. (With run seed 0
    the harmless file was ablated and the counterfactual hung as well: another minute that
    proved nothing the factual does not.) What it still proves: a hang at import is charged
    to the artifact (timeout, retried once under twice the limit, the control healthy under
    the same limits), scored the failure value, never excluded, and its D exists."""
    import subprocess

    from eval.integrity.failure_value import failure_utility
    from eval.tasks.splits import load_tasks

    task = load_tasks("bundled:holdout")[0]
    path = next(line[len("+++ b/"):].split("\t")[0] for line in task.patch.splitlines()
                if line.startswith("+++ b/") and line.endswith(".py"))
    base = subprocess.run(["git", "-C", task.repo_dir, "show", f"{task.base_commit}:{path}"],
                          check=True, capture_output=True, text=True).stdout
    hang = Trajectory(task.instance_id, 0, False, (
        Turn(5, {"NOTES.md": FileWrite(b"looked at the bug\n")}),
        Turn(7, {path: FileWrite(("import time\ntime.sleep(10**6)\n" + base).encode())})))
    out = tmp_path / "pilot"
    table = run_pilot([task], [hang], out, seed=1, concurrency=2, runtime=podman_runtime,
                      timeout_s=20, log=lambda _m: None)
    (rec,) = _read_jsonl(out / "records.jsonl")
    trials = _read_jsonl(out / "trials.jsonl")
    fact = next(t for t in trials if t["role"] == "factual")
    assert fact["exit_class"] == "timeout" and fact["outcome"] == "artifact_timeout"
    assert [a["exit_class"] for a in fact["failed_attempts"]] == ["timeout"]  # retried once
    assert rec["exclusion"] is None and table["excluded"]["no_original_utility"] == 0
    assert rec["U_P"] == failure_utility(task.FAIL_TO_PASS, task.PASS_TO_PASS)
    assert rec["resolved_P"] is False
    assert rec["grades"]["factual"]["failure_class"] == "artifact_timeout"
    assert rec["grades"]["factual"]["failure_evidence"]["controls"][0]["exit_class"] == "ok"
    # whichever block was ablated, D is the contrast of two utilities, never a missing value
    assert rec["U_Pb"] is not None and rec["D"] == rec["U_P"] - rec["U_Pb"]
    # run seed 1 ablates the hang (the cost note above): the counterfactual ran to its end
    cf = next(t for t in trials if t["role"] == "counterfactual")
    assert rec["selected_paths"] == [path] and cf["exit_class"] == "ok", cf
    assert table["usable"] == 1
