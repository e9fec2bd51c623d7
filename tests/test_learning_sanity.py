"""The learning sanity benchmark refuses a before/after comparison at different generation
settings (``benchmarks/learning_sanity.py``): a bare model directory evaluated with
``eval.run``'s defaults against a run directory evaluated with its training settings compares
different budgets."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import REPO_ROOT

spec = importlib.util.spec_from_file_location("learning_sanity",
                                              REPO_ROOT / "benchmarks" / "learning_sanity.py")
sanity = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sanity)

RUN = {"max_turns": 3, "max_new_tokens": 640, "temperature": 1.0, "top_p": 1.0}


def test_matching_settings_pass():
    sanity.same_settings({"settings": dict(RUN)}, {"settings": dict(RUN)}, "before vs after")


@pytest.mark.parametrize("field,value", [("max_turns", 4), ("max_new_tokens", 1024),
                                         ("temperature", 0.7), ("top_k", 50)])
def test_a_different_budget_stops_naming_the_field(field, value):
    with pytest.raises(SystemExit) as exc:
        sanity.same_settings({"settings": dict(RUN)}, {"settings": {**RUN, field: value}},
                             "before vs after arm O")
    msg = str(exc.value)
    assert "before vs after arm O" in msg and field in msg and repr(value) in msg


def test_running_mean_averages_one_visit_of_each_task():
    assert sanity.running_mean([1.0, 0.0, 1.0, 1.0, 0.0], 2) == [1.0, 0.5, 0.5, 1.0, 0.5]
    assert sanity.running_mean([0.25, 0.75], 4) == [0.25, 0.5]


def test_the_curve_is_drawn(tmp_path):
    sanity.plot({"O": [0.5, 0.25, 1.0], "M": [0.0, 1.0, 1.0]}, 0.4, 2, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_phase_that_ran_keeps_its_seconds_across_invocations(tmp_path):
    import json
    import sys

    sanity.run([sys.executable, "-c", "pass"], tmp_path / "select.log")
    sanity.run([sys.executable, "-c", "import time; time.sleep(0.3)"], tmp_path / "train-O.log")
    phases = json.loads((tmp_path / sanity.PHASES).read_text())
    assert list(phases) == ["select", "train-O"] and phases["train-O"] >= 0.3
    with pytest.raises(SystemExit, match="exited 3"):
        sanity.run([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "after-O.log")
    assert list(json.loads((tmp_path / sanity.PHASES).read_text())) == ["select", "train-O"]


def test_every_task_group_is_in_every_step():
    assert sanity.batch_flags([], tasks=4, group=8) == [
        "--num_generations", "8", "--per_device_train_batch_size", "32"]
    assert sanity.batch_flags(["--learning_rate", "2e-4"], tasks=3, group=4) == [
        "--num_generations", "4", "--per_device_train_batch_size", "12"]


@pytest.mark.parametrize("flags", [["--num_generations", "4"],
                                   ["--per_device_train_batch_size", "8"],
                                   ["--per-device-train-batch-size", "8"]])
def test_a_shape_the_user_gives_is_kept_whole(flags):
    assert sanity.batch_flags(flags, tasks=4, group=8) == []


def test_a_resume_that_selects_other_tasks_stops_naming_the_file(tmp_path):
    import json

    f = tmp_path / "sanity_tasks.jsonl"
    f.write_text("".join(json.dumps({"instance_id": i}) + "\n" for i in ("t-b", "t-a")))
    sanity.same_tasks(f, ["t-a", "t-b"])  # the same tasks, in any order: go on
    with pytest.raises(SystemExit, match=r"sanity_tasks.jsonl holds 2 tasks \(t-a, t-b\), "
                                         r"this invocation selects 3"):
        sanity.same_tasks(f, ["t-a", "t-b", "t-c"])
