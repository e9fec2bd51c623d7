"""eval.metrics: the per-rollout success and paired bootstrap ``evaluate`` modules.

The modules must give the numbers of the code they replaced (main @ 733b7b9): that code is
kept below as ``_legacy_*`` (copied verbatim, its arithmetic only) and compared field by
field on the existing fixtures and on seeded random ones.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import zipfile
from collections import Counter

import numpy as np
import pytest
from conftest import REPO_ROOT

from eval.compare import RunResult, bootstrap_ci, compare, paired_difference
from eval.evaluation.report import summarize
from eval.evaluation.slots import unknown_slot
from eval.metrics import (
    METRICS,
    MetricInputError,
    compute_metric,
    load_metric,
    metric_path,
    paired_bootstrap,
    per_rollout_success,
)

# ---------------------------------------------------------------------------
# the replaced code (main @ 733b7b9), as the reference
# ---------------------------------------------------------------------------


def _legacy_paired_difference(a, b):
    common = sorted(set(a) & set(b))
    diffs = {t: float(a[t]) - float(b[t]) for t in common}
    return {"tasks": common, "diffs": diffs,
            "mean": (sum(diffs.values()) / len(diffs)) if diffs else None,
            "only_in_a": sorted(set(a) - set(b)), "only_in_b": sorted(set(b) - set(a))}


def _legacy_bootstrap_ci(values, *, n_boot=10000, alpha=0.05, seed=0):
    x = np.asarray(list(values), dtype=np.float64)
    if x.size == 0:
        return None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(n_boot, x.size))
    means = x[idx].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def _legacy_success(slots, tasks, n):
    """eval.evaluation.report.summarize's success figures before the module."""
    def unk(r):
        return bool(r["classification"].get("unknown"))

    repo_of = dict(tasks)
    by_slot, ignored = {}, 0
    for row in slots:
        key = (row["task_id"], int(row["rollout_index"]))
        if key[0] not in repo_of or not 0 <= key[1] < n:
            ignored += 1
            continue
        by_slot[key] = row
    ids = [t for t, _ in tasks]
    rows = [by_slot.get((t, i)) or unknown_slot(t, i, "no_rollout") for t in ids
            for i in range(n)]
    total = len(ids) * n
    resolved = sum(1 for r in rows if r["resolved"] and not unk(r))
    unknown = sum(1 for r in rows if unk(r))
    per_task = {}
    for tid in ids:
        tr = [r for r in rows if r["task_id"] == tid]
        res = sum(1 for r in tr if r["resolved"] and not unk(r))
        u = sum(1 for r in tr if unk(r))
        per_task[tid] = {"repo": repo_of[tid], "n": n, "resolved": res, "unknown": u,
                         "failed": n - res - u, "success": res / n,
                         **{k: sum(1 for r in tr if r["classification"].get(k))
                            for k in ("raw", "strict")}}
    dist = Counter(per_task[t]["resolved"] for t in ids)
    return {"success": resolved / total, "resolved": resolved,
            "failed": total - resolved - unknown, "unknown": unknown,
            "success_bounds": [resolved / total, (resolved + unknown) / total],
            "per_task": per_task,
            "task_success_distribution": {f"{k}/{n}": dist.get(k, 0) for k in range(n + 1)},
            "ignored_rows": ignored}


def _slot(tid, i, resolved, unknown=False, raw=None):
    return {"task_id": tid, "rollout_index": i, "resolved": resolved,
            "classification": {"raw": resolved if raw is None else raw,
                               "report_binary": resolved, "strict": resolved,
                               "unknown": unknown},
            "unknown_reason": "incomplete_report" if unknown else None}


def _random_slots(seed, n_tasks, n):
    """Seeded slot rows with resolved / failed / unknown rows, missing slots, duplicates
    (the last wins) and rows outside the split."""
    rng = random.Random(seed)
    tasks = [(f"repo{rng.randrange(4)}__t{i:03d}", f"repo{i % 4}") for i in range(n_tasks)]
    slots, later = [], []
    for tid, _ in tasks:
        for i in range(n):
            u = rng.random()
            if u < 0.1:
                continue  # missing
            slots.append(_slot(tid, i, rng.random() < 0.4, unknown=u < 0.2,
                               raw=rng.random() < 0.5))
            if rng.random() < 0.1:  # a later row for the same slot wins
                later.append(_slot(tid, i, rng.random() < 0.5, unknown=rng.random() < 0.2))
    outside = [_slot("nope", 0, True), _slot(tasks[0][0], n, True), _slot(tasks[0][0], -1, True)]
    return tasks, slots[: len(slots) // 2] + outside + slots[len(slots) // 2:] + later


# ---------------------------------------------------------------------------
# same numbers as the replaced code
# ---------------------------------------------------------------------------


def test_summary_fixture_gives_the_replaced_codes_numbers():
    tasks = [("a", "r1"), ("b", "r1"), ("c", "r2")]
    slots = [_slot("a", 0, True), _slot("a", 1, False), _slot("b", 0, False, unknown=True),
             unknown_slot("b", 1, "trial_infra_error"), _slot("c", 0, True),
             _slot("zzz", 0, True), _slot("c", 5, True)]
    s = summarize(slots, tasks, n=2, denominator=3)
    old = _legacy_success(slots, tasks, 2)
    for k in ("success", "resolved", "failed", "unknown", "success_bounds", "per_task",
              "task_success_distribution", "ignored_rows"):
        assert s[k] == old[k], k
    assert s["success"] == 2 / 6 and s["unknown"] == 3 and s["failed"] == 1
    assert list(s["per_task"]["a"]) == ["repo", "n", "resolved", "unknown", "failed",
                                        "success", "raw", "strict"]  # results.json key order
    m = per_rollout_success(slots, [t for t, _ in tasks], 2, ignore_outside=True)
    assert m["missing"] == 1 and m["ignored_rows"] == 2 and m["duplicate_rows"] == 0
    assert m["per_task"]["c"] == {"n": 2, "resolved": 1, "unknown": 1, "failed": 0,
                                  "success": 0.5}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_summary_random_slots_equal_the_replaced_code(seed):
    tasks, slots = _random_slots(seed, n_tasks=40, n=5)
    s = summarize(slots, tasks, n=5, denominator=40)
    old = _legacy_success(slots, tasks, 5)
    for k, v in old.items():
        assert s[k] == v, k
    m = per_rollout_success(slots, [t for t, _ in tasks], 5, ignore_outside=True)
    assert m["duplicate_rows"] == sum(1 for _ in slots) - m["ignored_rows"] - (
        m["slots"] - m["missing"])
    assert 0 < m["missing"] < m["unknown"] and m["ignored_rows"] == 3


def test_bootstrap_fixture_gives_the_replaced_codes_interval():
    # tests/test_eval_compare.py's constructed example; figures printed by main @ 733b7b9
    rng = random.Random(7)
    tasks = [f"t{i}" for i in range(200)]
    b = {t: rng.random() * 0.6 for t in tasks}
    m = {t: b[t] + 0.2 + rng.uniform(-0.1, 0.1) for t in tasks}
    pd = paired_difference(m, b)
    assert pd == _legacy_paired_difference(m, b)
    assert pd["mean"] == 0.19856430615000023
    diffs = list(pd["diffs"].values())
    assert bootstrap_ci(diffs, n_boot=4000, seed=0) == (0.19028724024197105, 0.20646162446772187)
    pb = paired_bootstrap(m, b, n_boot=4000, seed=0)
    assert pb["ci"] == [0.19028724024197105, 0.20646162446772187]
    assert pb["mean"] == pd["mean"] and pb["n_tasks"] == 200


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_paired_bootstrap_random_equals_the_replaced_code(seed):
    rng = random.Random(seed)
    ids = [f"task-{rng.randrange(10**6)}" for _ in range(rng.randrange(1, 120))]
    a = {t: rng.randrange(5) / 4 for t in ids if rng.random() < 0.9}
    b = {t: rng.randrange(5) / 4 for t in ids if rng.random() < 0.9}
    old = _legacy_paired_difference(a, b)
    new = paired_bootstrap(a, b, n_boot=500, seed=seed, alpha=0.1)
    for k in ("tasks", "diffs", "mean", "only_in_a", "only_in_b"):
        assert new[k] == old[k], k
    assert new["ci"] == list(_legacy_bootstrap_ci(old["diffs"].values(), n_boot=500, seed=seed,
                                                  alpha=0.1))
    vals = [rng.random() for _ in range(37)]  # bootstrap_ci keeps the given order
    assert bootstrap_ci(vals, n_boot=300, seed=seed) == _legacy_bootstrap_ci(vals, n_boot=300,
                                                                             seed=seed)


def test_compare_fixture_gives_the_replaced_codes_intervals():
    def run(label, per_task):
        arm, _, s = label.partition(":")
        return RunResult(label=label, arm=arm, seed=int(s), path="x", per_task=per_task)

    cmp = compare([run("B:0", {"t1": 0.5, "t2": 0.5, "t3": 1.0}),
                   run("M:0", {"t1": 1.0, "t2": 0.5})], n_boot=200)
    (pair,) = cmp["pairs"]
    assert pair["ci"] == [0.0, 0.5] and pair["mean"] == 0.25  # printed by main @ 733b7b9
    assert cmp["arms"]["B"]["ci"] == [0.5, 1.0] and cmp["arms"]["M"]["ci"] == [0.5, 1.0]
    runs = [run("M:0", {"t1": 1.0, "t2": 0.0}), run("M:1", {"t1": 0.5}),
            run("B:0", {"t1": 0.0, "t2": 0.0})]
    # every seed pooled (the replaced code's rule, now pooled_seeds="all")
    cmp = compare(runs, n_boot=100, pooled_seeds="all")
    assert cmp["pairs"][0]["ci"] == [0.75, 0.75] and cmp["pairs"][0]["only_in_b"] == ["t2"]
    assert cmp["arms"]["M"]["ci"] == [0.75, 0.75] and cmp["arms"]["B"]["ci"] == [0.0, 0.0]
    # the default: the seed both arms share, M:0 against B:0
    (pair,) = compare(runs, n_boot=100)["pairs"]
    assert pair["diffs"] == {"t1": 1.0, "t2": 0.0} and pair["only_in_b"] == []
    assert (pair["seeds_a"], pair["seeds_b"]) == ([0], [0])


def test_paired_interval_does_not_depend_on_row_order():
    ids = [f"t{i}" for i in range(30)]
    a = [i % 3 / 2 for i in range(30)]
    b = [i % 5 / 4 for i in range(30)]
    one = compute_metric("paired_bootstrap", task_id=ids, a=a, b=b, n_boot=300)
    rev = compute_metric("paired_bootstrap", task_id=ids[::-1], a=a[::-1], b=b[::-1], n_boot=300)
    assert one["ci"] == rev["ci"] and one["tasks"] == sorted(ids)


# ---------------------------------------------------------------------------
# bad input names the field
# ---------------------------------------------------------------------------


def test_bad_per_rollout_input_names_the_field():
    tasks = ["a", "b"]
    rows = [{"task_id": "a", "rollout_index": 0, "unknown": False}]
    with pytest.raises(MetricInputError, match=r"rows\[0\]\.resolved: missing"):
        per_rollout_success(rows, tasks, 2)
    rows = [{"task_id": "a", "rollout_index": 0, "resolved": True}]
    with pytest.raises(MetricInputError, match=r"rows\[0\]\.unknown: missing"):
        per_rollout_success(rows, tasks, 2)
    with pytest.raises(MetricInputError, match="unknown: missing"):
        compute_metric("per_rollout_success", task_id=["a"], rollout_index=[0],
                       resolved=[True], tasks=tasks, n=2)
    with pytest.raises(MetricInputError, match="lengths differ"):
        compute_metric("per_rollout_success", task_id=["a", "b"], rollout_index=[0],
                       resolved=[True], unknown=[False], tasks=tasks, n=2)
    # more slots than the fixed denominator holds: refused unless asked to ignore them
    ok = {"task_id": "a", "rollout_index": 1, "resolved": True, "unknown": False}
    over = {"task_id": "a", "rollout_index": 2, "resolved": True, "unknown": False}
    with pytest.raises(MetricInputError, match=r"rollout_index: row 1: rollout_index 2 is "
                                               r"outside range\(n=2\).*2 × 2 = 4 slots"):
        per_rollout_success([ok, over], tasks, 2)
    with pytest.raises(MetricInputError, match=r"task_id: row 0: task 'zz' is not one of the 2"):
        per_rollout_success([{**ok, "task_id": "zz"}], tasks, 2)
    assert per_rollout_success([ok, over], tasks, 2, ignore_outside=True)["ignored_rows"] == 1
    with pytest.raises(MetricInputError, match="tasks: 2 given but the split's denominator is 500"):
        per_rollout_success([ok], tasks, 2, denominator=500)
    with pytest.raises(MetricInputError, match="n: must be an int >= 1"):
        per_rollout_success([ok], tasks, 0)
    with pytest.raises(MetricInputError, match="tasks: duplicate"):
        per_rollout_success([ok], ["a", "a"], 2)


def test_bad_paired_input_names_the_field():
    with pytest.raises(MetricInputError, match="b: missing"):
        compute_metric("paired_bootstrap", task_id=["t"], a=[1.0])
    with pytest.raises(MetricInputError, match=r"task_id: duplicate task ids \['t'\]"):
        compute_metric("paired_bootstrap", task_id=["t", "t"], a=[1.0, 0.0], b=[0.0, 0.0])
    with pytest.raises(MetricInputError, match="a/b: task 'u' has neither value"):
        compute_metric("paired_bootstrap", task_id=["t", "u"], a=[1.0, None], b=[0.0, None])
    with pytest.raises(MetricInputError, match="alpha: must be in"):
        paired_bootstrap({"t": 1.0}, {"t": 0.0}, alpha=1.5)
    with pytest.raises(ValueError, match="n_boot: must be >= 1"):
        bootstrap_ci([1.0], n_boot=0)
    with pytest.raises(MetricInputError, match=r"a\['t'\]: not a finite number: nan"):
        paired_bootstrap({"t": float("nan")}, {"t": 0.0})


# ---------------------------------------------------------------------------
# loading: a local path, never a hub
# ---------------------------------------------------------------------------


def test_only_shipped_names_are_loaded():
    assert METRICS == ("per_rollout_success", "paired_bootstrap")
    with pytest.raises(ValueError, match="not one of"):
        load_metric("accuracy")  # a hub name is refused before evaluate sees it
    m = load_metric("per_rollout_success")
    assert load_metric("per_rollout_success") is m  # cached per process
    assert type(m).__name__ == "PerRolloutSuccess"
    assert "Never best-of-n" in m.description and "section 4: Evaluation" in m.citation
    assert set(m.features) == {"task_id", "rollout_index", "resolved", "unknown"}
    assert metric_path("paired_bootstrap") == REPO_ROOT / "eval" / "metrics" / "paired_bootstrap"


_OFFLINE_PROBE = r"""
import json, socket, sys
def refuse(*a, **k):
    raise OSError("network used")
socket.socket.connect = refuse
socket.create_connection = refuse
import evaluate
out = {}
for name in ("per_rollout_success", "paired_bootstrap"):
    m = evaluate.load(sys.argv[1] + "/" + name, keep_in_memory=True)
    out[name] = type(m).__name__
out["success"] = evaluate.load(sys.argv[1] + "/per_rollout_success").compute(
    task_id=["a"], rollout_index=[0], resolved=[True], unknown=[False], tasks=["a", "b"],
    n=1)["success"]
try:
    evaluate.load("accuracy")
    out["hub"] = "loaded"
except Exception as exc:
    out["hub"] = type(exc).__name__
print(json.dumps(out))
"""


def test_evaluate_loads_the_modules_from_a_path_offline(tmp_path):
    """A fresh modules cache, HF_HUB_OFFLINE=1 and every socket connect refused: the local
    folders load (and a hub name does not)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1",
           "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HOME": str(tmp_path / "hf")}
    res = subprocess.run([sys.executable, "-c", _OFFLINE_PROBE,
                          str(REPO_ROOT / "eval" / "metrics")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["per_rollout_success"] == "PerRolloutSuccess"
    assert out["paired_bootstrap"] == "PairedBootstrap"
    assert out["success"] == 0.5 and out["hub"] != "loaded"
    assert any((tmp_path / "modules").rglob("per_rollout_success.py"))  # copied there


@pytest.mark.slow
def test_wheel_ships_the_modules_and_they_load_from_it(tmp_path):
    """Build the wheel from the tracked + new files (as a fresh clone would hold them),
    unpack it, and load both modules from the unpacked install with no repo on the path."""
    files = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "-co", "--exclude-standard"],
                           capture_output=True, text=True, check=True).stdout.split()
    src = tmp_path / "src"
    for f in files:
        if (REPO_ROOT / f).is_file() and not f.startswith(("tests/", "benchmarks/")):
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / f, src / f)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "whl"), str(src)], check=True, timeout=600)
    (whl,) = (tmp_path / "whl").glob("*.whl")
    names = zipfile.ZipFile(whl).namelist()
    for name in METRICS:
        assert f"eval/metrics/{name}/{name}.py" in names
    site = tmp_path / "site"
    zipfile.ZipFile(whl).extractall(site)
    probe = ("import sys; sys.path[:] = [p for p in sys.path if 'wt-' not in p and "
             "p not in ('', '.')]; sys.path.insert(0, sys.argv[1]);"
             "import eval.metrics as m; assert m.__file__.startswith(sys.argv[1]), m.__file__;"
             "print(m.paired_bootstrap({'t': 1.0}, {'t': 0.5}, n_boot=10)['mean'])")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_MODULES_CACHE"] = str(tmp_path / "modules")
    res = subprocess.run([sys.executable, "-c", probe, str(site)], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "0.5"
