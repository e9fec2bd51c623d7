"""``benchmarks/suite_budget.py``: the area table from small pytest logs the test writes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("suite_budget")


# as pytest -q prints it with --durations=3 (a shortened addopts log)
LOG_30 = """\
........................................................................ [ 50%]
.......................................s................................ [100%]
============================== slowest 3 durations ==============================
567.21s call     tests/test_build_tasks.py::test_cold_rebuild_gives_identical_tasks
215.00s setup    tests/test_ray_dispatch.py::test_trials_on_two_nodes
12.50s teardown tests/test_ray_dispatch.py::test_trials_on_two_nodes
=========================== short test summary info ============================
SKIPPED [1] tests/test_x.py:3: no GPU
143 passed, 1 skipped in 1000.00s (0:16:40)
"""

# --durations=0: every phase, the hidden-rows note, and the framed closing line
LOG_0 = """\
============================= slowest durations ==============================
100.00s call     tests/test_study.py::test_smoke[embedded]
40.00s setup    tests/test_study.py::test_smoke[embedded]
30.00s call     tests/test_vllm_engine.py::test_generate
20.00s call     tests/test_widgets.py::test_a
0.50s call     tests/test_docs.py::test_build

(12 durations < 0.005s hidden.  Use -vv to show these durations.)
======================== 5 passed, 2 warnings in 200.00s (0:03:20) =========================
"""


def test_a_durations_30_log_is_charged_by_area_and_the_rest_is_not_listed(bench):
    phases, wall = bench.parse_log(LOG_30)
    assert [(p.seconds, p.when) for p in phases] == [(567.21, "call"), (215.0, "setup"),
                                                    (12.5, "teardown")]
    assert wall == 1000.0
    areas = {a.name: a for a in bench.by_area(phases)}
    assert set(areas) == {"tasks", "Ray"}
    assert areas["tasks"].seconds == pytest.approx(567.21)
    # setup and teardown of one test are one test, summed
    assert areas["Ray"].tests == 1 and areas["Ray"].seconds == pytest.approx(227.5)
    out = bench.table(bench.by_area(phases), wall)
    assert "| tasks | 1 | 567 | 71 % | 57 % |" in out
    assert "| Ray | 1 | 228 | 29 % | 23 % |" in out
    assert "| not listed | | 205 | | 21 % | |" in out  # 1000 - 794.71
    assert "1000 s wall (16.7 min)" in out


def test_a_durations_0_log_sums_every_phase_and_unknown_files_are_other(bench):
    phases, wall = bench.parse_log(LOG_0)
    assert len(phases) == 5 and wall == 200.0
    areas = bench.by_area(phases)
    assert [(a.name, a.seconds) for a in areas] == [("study", 140.0), ("vLLM", 30.0),
                                                   ("other", 20.0), ("docs", 0.5)]
    assert areas[0].slowest == ("tests/test_study.py::test_smoke[embedded]", 140.0)


def test_the_cli_prints_the_table_and_json_and_refuses_a_log_without_durations(tmp_path):
    log = tmp_path / "pytest.log"
    log.write_text(LOG_30)
    out = tmp_path / "areas.json"
    run = subprocess.run([sys.executable, "benchmarks/suite_budget.py", str(log), "--json",
                          str(out)], cwd=REPO_ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "| tasks | 1 | 567 |" in run.stdout
    data = json.loads(out.read_text())
    assert data["wall_s"] == 1000.0 and data["areas"][0]["area"] == "tasks"

    bad = tmp_path / "bad.log"
    bad.write_text("5 passed in 3.00s\n")
    run = subprocess.run([sys.executable, "benchmarks/suite_budget.py", str(bad)], cwd=REPO_ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"suite_budget: error: {bad}: no 'slowest ... durations' section "
        "(run pytest with --durations=N)"]


def test_an_xdist_log_shares_the_workers_time_and_reads_the_worker_count(bench, tmp_path):
    # pytest -q on two xdist workers: the listed seconds pass the wall; the shares are of
    # workers x wall, and the count comes from the log or, with -q, from the addopts' -n
    quiet = "bringing up nodes...\n" + LOG_30
    assert bench.workers_of(LOG_30, 2) == 1  # no xdist in the log: one lane
    assert bench.workers_of(quiet, 2) == 2 and bench.workers_of(quiet, None) == 1
    assert bench.workers_of("created: 3/3 workers\n" + LOG_30, 2) == 3
    project = tmp_path / "pyproject.toml"
    project.write_text('[tool.pytest.ini_options]\naddopts = "-ra --durations=30 -n 4"\n')
    assert bench.addopts_workers(project) == 4
    assert bench.addopts_workers(tmp_path / "missing.toml") is None
    phases, wall = bench.parse_log(quiet)
    out = bench.table(bench.by_area(phases), wall, 2)
    assert "| area | tests | s | % of listed | % of worker time | slowest test (s) |" in out
    assert "| tasks | 1 | 567 | 71 % | 28 % |" in out  # 567.21 / 2000
    assert "| not listed | | 1205 | | 60 % | |" in out  # 2000 - 794.71
    assert "1000 s wall (16.7 min), 2 workers" in out
    # the project's own addopts name the workers its -q logs come from
    assert bench.addopts_workers(REPO_ROOT / "pyproject.toml") == 2
