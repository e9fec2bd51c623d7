"""Task images present up front: train.py, eval.run and eval.controls refuse a
task list whose images are not in local Podman storage with one line naming the missing count
and the pull command, before anything is written; digests are recorded when present."""

import json
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from eval.tasks.presence import ImagesMissing, missing_message, pull_command, require_task_images
from sandbox.backend import SandboxOptions
from sandbox.images import default_image, image_digest

ABSENT = "docker.io/ecredit/absent-image:nope"


def test_the_message_is_one_line_with_the_count_and_the_command():
    msg = missing_message([ABSENT, "docker.io/a/b:1"], 500, "official500")
    assert msg == ("2 of 500 task image(s) not in local Podman storage (first: docker.io/a/b:1); "
                   "pull them with: python -m sandbox.images pull --split official500")
    assert pull_command("my tasks.jsonl") == \
        "python -m sandbox.images pull --split 'my tasks.jsonl'"
    local = missing_message(["localhost/x:1"], 3, "bundled")
    assert local.startswith("1 of 3 task image(s)") and "build-offline" in local
    assert "\n" not in msg + local


def _task_file(tmp_path, source: str, image: str, n: int = 1):
    from eval.tasks.schema import save_tasks
    from eval.tasks.splits import load_tasks

    tasks = load_tasks(source)[:n]
    for t in tasks:
        t.image = image
    path = tmp_path / "tasks.jsonl"
    save_tasks(tasks, path)
    return path


@pytest.mark.podman
def test_require_task_images_returns_digests_or_refuses(tmp_path):
    from eval.tasks.splits import load_tasks

    tasks = load_tasks("bundled:holdout")[:2]
    image = default_image()
    assert require_task_images(tasks, "bundled:holdout") == {image: image_digest(image)}
    assert require_task_images(tasks, "x", runtime=SandboxOptions(kind="local")) == {image: None}
    tasks[1].image = ABSENT
    with pytest.raises(ImagesMissing, match=r"^1 of 2 task image\(s\) not in local Podman "
                                            r"storage \(first: docker.io/ecredit/absent"):
        require_task_images(tasks, "bundled:holdout")


@pytest.mark.podman
def test_eval_run_refuses_missing_images_before_writing(tmp_path):
    from eval.run import main

    split = _task_file(tmp_path, "bundled:holdout", ABSENT)
    (tmp_path / "r.jsonl").write_text("")
    out = tmp_path / "ev"
    proc = subprocess.run([sys.executable, "-m", "eval.run", "--split", str(split), "--n", "1",
                           "--out", str(out), "--rollouts", str(tmp_path / "r.jsonl")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: 1 of 1 task image(s) not in local Podman storage (first: {ABSENT}); "
        f"pull them with: python -m sandbox.images pull --split {split}"]
    assert not out.exists()
    assert main  # the in-process entry point is the same function the module runs


@pytest.mark.podman
def test_eval_run_records_the_digest_of_every_task_image(tmp_path):
    from eval.evaluation.options import EvalOptions
    from eval.run import evaluate

    split = _task_file(tmp_path, "bundled:holdout", default_image(), n=2)
    rollouts = tmp_path / "r.jsonl"
    rollouts.write_text("")
    res = evaluate(EvalOptions(model=None, split=str(split), n=1, out=tmp_path / "ev",
                               rollouts=rollouts),
                   runtime=SandboxOptions(), log=lambda *_: None)
    assert res["images"] == {default_image(): image_digest(default_image())}
    on_disk = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert on_disk["images"] == res["images"]


@pytest.mark.podman
def test_eval_controls_refuses_missing_images_before_writing(tmp_path):
    from eval.controls import run_controls

    split = _task_file(tmp_path, "bundled:holdout", ABSENT)
    with pytest.raises(ImagesMissing, match=r"^1 of 1 task image\(s\) .* pull them with: "
                                            r"python -m sandbox.images pull --split "):
        run_controls(str(split), tmp_path / "ctl", runtime=SandboxOptions(), log=lambda *_: None)
    assert not (tmp_path / "ctl").exists()


@pytest.mark.podman
def test_train_refuses_missing_images_with_one_line(tmp_path):
    split = _task_file(tmp_path, "bundled:train", ABSENT)
    runs = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "ecredit_trl/train.py", "--arm", "B", "--tasks",
                           str(split), "--runs_dir", str(runs), "--model", str(tmp_path)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1]
    assert last == (f"train.py: error: 1 of 1 task image(s) not in local Podman storage "
                    f"(first: {ABSENT}); pull them with: python -m sandbox.images pull "
                    f"--split {split}")
    assert "Traceback" not in proc.stderr
    assert not runs.exists() or not any(runs.rglob("*.json"))


@pytest.mark.podman
def test_manifest_records_the_digest_of_every_distinct_task_image():
    from ecredit_trl.runs.manifest import image_digests

    image = default_image()
    assert image_digests([image, image, ABSENT]) == {image: image_digest(image), ABSENT: None}
