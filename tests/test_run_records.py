"""Manifest binding, receipts, detection of sessions without receipt, checkpoint verification.

Fast: no training. Real processes where it matters (a SIGKILLed child for detection).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ecredit_trl.runs.manifest import (
    binding_differences,
    bound_config,
    code_version,
    sha256_json,
    tasks_record,
)
from ecredit_trl.runs.receipts import (
    CheckpointError,
    RunReceipts,
    detect_unterminated,
    live_sessions,
    process_alive,
    process_identity,
    process_start_ticks,
    read_sessions,
    verify_checkpoint,
)
from ecredit_trl.runs.records import write_json
from ecredit_trl.runs.resume import resume_checkpoint


def _manifest(**over):
    m = {"run_name": "r", "config": {"ecredit": {"learning_rate": 1e-4, "arm": "B",
                                                 "output_dir": "runs/a",
                                                 "podman_endpoints": []},
                                     "model": {"lora_r": 0, "path": "/p"}},
         "tasks": {"ids": ["a", "b"], "sha256": "t1"}, "code": {"sha256": "c1",
                                                                 "git_describe": "v1"},
         "world_size": 1, "packages": {"torch": "2.13"}, "images": {}}
    for k, v in over.items():
        m[k] = v
    m["config_sha256"] = sha256_json(bound_config(m["config"]))
    return m


def test_binding_lists_each_differing_field_and_ignores_unbound_ones():
    old = _manifest()
    new = _manifest(config={"ecredit": {"learning_rate": 2e-4, "arm": "B",
                                        "output_dir": "elsewhere",
                                        "podman_endpoints": ["unix:///x"],
                                        "sandbox_allow_unauthenticated": True},
                            "model": {"lora_r": 8, "path": "/p"}},
                    tasks={"ids": ["a", "c"], "sha256": "t2"},
                    code={"sha256": "c2", "git_describe": "v1-dirty"}, world_size=2)
    fields = [d["field"] for d in binding_differences(old, new)]
    assert fields == ["learning_rate", "model.lora_r", "tasks", "code", "world_size"]
    tasks = next(d for d in binding_differences(old, new) if d["field"] == "tasks")
    assert tasks["removed_ids"] == ["b"] and tasks["added_ids"] == ["c"]
    assert binding_differences(old, _manifest()) == []
    # unbound fields do not change the config hash
    moved = _manifest(config={"ecredit": {"learning_rate": 1e-4, "arm": "B",
                                          "output_dir": "runs/b", "podman_endpoints": ["x"]},
                              "model": {"lora_r": 0, "path": "/p"}})
    assert moved["config_sha256"] == old["config_sha256"]


def test_check_binding_refuses_unless_allowed_with_a_reason():
    from ecredit_trl.runs.binding import RunRefused, check_binding

    old = _manifest()
    new = _manifest(config={"ecredit": {"learning_rate": 2e-4, "arm": "B",
                                        "output_dir": "runs/a", "podman_endpoints": []},
                            "model": {"lora_r": 0, "path": "/p"}},
                    code={"sha256": "c2", "git_describe": "v2"})
    with pytest.raises(RunRefused, match=r"learning_rate: 0.0001 -> 0.0002") as err:
        check_binding(old, new, [], None)
    assert "code:" in str(err.value)
    with pytest.raises(RunRefused, match="--reason"):
        check_binding(old, new, ["learning_rate", "code"], None)
    with pytest.raises(RunRefused, match="code"):
        check_binding(old, new, ["learning_rate"], "lower lr after divergence")
    ok = check_binding(old, new, ["learning_rate", "code"], "bug fix in the grader")
    assert [d["field"] for d in ok["differences"]] == ["learning_rate", "code"]
    assert ok["reason"] == "bug fix in the grader"


def test_code_version_and_task_hash():
    v = code_version()
    assert len(v["sha256"]) == 64 and v["files"] > 20
    assert v["git_describe"] is None or isinstance(v["git_describe"], str)

    class T:
        def __init__(self, iid, repo_dir):
            self.d = {"instance_id": iid, "patch": "p", "repo_dir": repo_dir}

        def to_dict(self):
            return dict(self.d)

    a = tasks_record([T("x", "/home/a"), T("y", "/home/a")], "bundled:train")
    b = tasks_record([T("x", "/other"), T("y", "/other")], "bundled:train")
    assert a["sha256"] == b["sha256"]  # machine-local cache paths do not count
    assert a["ids"] == ["x", "y"] and a["n"] == 2


def test_unterminated_session_of_a_killed_process_is_detected_once(tmp_path):
    runs = tmp_path / "runs"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ident = dict(process_identity(), pid=child.pid,
                     start_ticks=process_start_ticks(child.pid))
        run = runs / "run-a"
        write_json(run / "manifest.json", {"run_name": "run-a"})
        rr = RunReceipts(run, 0)
        rr._write("start", {"process": ident})
        # alive: not touched, and it blocks a resume
        assert process_alive(ident) is True
        assert detect_unterminated(runs) == []
        assert [s.index for s in live_sessions(run)] == [0]
        # a terminated session next to it is not reported either
        done = RunReceipts(runs / "run-b", 0)
        done.start()
        done.termination("completed", step=2)
        child.send_signal(signal.SIGKILL)
        child.wait()
        found = detect_unterminated(runs, detected_by={"run": "next"})
    finally:
        if child.poll() is None:
            child.kill()
    assert len(found) == 1
    item = found[0]
    assert item["session"] == 0 and item["pid"] == child.pid
    assert "terminated without receipt" in item["message"] and "run-a" in item["message"]
    rec = json.loads(Path(item["receipt"]).read_text())
    assert rec["class"] in ("unknown", "oom") and rec["detected"] is True
    assert rec["detected_by"] == {"run": "next"}
    assert detect_unterminated(runs) == []  # reported once, then on record
    assert live_sessions(run) == []
    sessions = read_sessions(run)
    assert sessions[0].termination["class"] == rec["class"]


def test_pid_reuse_is_not_mistaken_for_the_session(tmp_path):
    ident = dict(process_identity(), start_ticks=(process_start_ticks(os.getpid()) or 0) + 1)
    assert process_alive(ident) is False  # same pid, different start time: not our process
    assert process_alive(dict(ident, host="another-host")) is None


def _fake_checkpoint(run: Path, step: int = 2) -> Path:
    write_json(run / "manifest.json", {"run_name": run.name})
    ck = run / f"checkpoint-{step}"
    ck.mkdir(parents=True)
    for name, data in {"model.safetensors": b"W" * 4000, "optimizer.pt": b"O" * 8000,
                       "scheduler.pt": b"S" * 100, "rng_state.pth": b"R" * 300,
                       "trainer_state.json": b'{"global_step": 2}',
                       "ecredit_state.json": b'{"generation_round": 2}'}.items():
        (ck / name).write_bytes(data)
    RunReceipts(run, 0).checkpoint(ck, step=step, reason="save_steps")
    return ck


def test_verify_checkpoint_refuses_corrupt_and_partial_checkpoints_naming_the_file(tmp_path):
    ck = _fake_checkpoint(tmp_path / "run")
    rec = verify_checkpoint(ck)
    assert rec["step"] == 2 and rec["weights"]["kind"] == "full"
    assert rec["state_present"]["optimizer"] and rec["state_present"]["rng"] == ["rng_state.pth"]

    data = bytearray((ck / "model.safetensors").read_bytes())
    data[100] ^= 0xFF
    (ck / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: sha256 does not match"):
        verify_checkpoint(ck)
    data[100] ^= 0xFF
    (ck / "model.safetensors").write_bytes(bytes(data))
    verify_checkpoint(ck)

    with open(ck / "optimizer.pt", "r+b") as f:
        f.truncate(5000)
    with pytest.raises(CheckpointError, match=r"optimizer\.pt: 5000 bytes, receipt says 8000"):
        verify_checkpoint(ck)
    (ck / "optimizer.pt").write_bytes(b"O" * 8000)
    (ck / "rng_state.pth").unlink()
    with pytest.raises(CheckpointError, match=r"rng_state\.pth: missing \(partial"):
        verify_checkpoint(ck)
    with pytest.raises(CheckpointError, match=r"rng_state_0\.pth: missing \(RNG state for world"):
        verify_checkpoint(_fake_checkpoint(tmp_path / "run2"), world_size=2)

    # a checkpoint directory without a receipt: the save never finished
    half = tmp_path / "run" / "checkpoint-3"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"W")
    with pytest.raises(CheckpointError, match=r"checkpoint-3: no checkpoint receipt.*partial"):
        verify_checkpoint(half)
    # weights-only checkpoints are not resumable
    final = tmp_path / "run" / "checkpoint-final"
    final.mkdir()
    (final / "model.safetensors").write_bytes(b"W")
    RunReceipts(tmp_path / "run", 0).checkpoint(final, step=2, reason="final")
    with pytest.raises(CheckpointError, match=r"optimizer\.pt: not in this checkpoint"):
        verify_checkpoint(final)


def test_train_cli_refuses_corrupt_checkpoint_and_silent_restart(tmp_path):
    """Through ``train.py``'s own entry point (refused before any model is loaded)."""
    import ecredit_trl.train as train

    ck = _fake_checkpoint(tmp_path / "runs" / "r1")
    with open(ck / "scheduler.pt", "ab") as f:
        f.write(b"!")
    with pytest.raises(CheckpointError, match=r"scheduler\.pt: 101 bytes"):
        train.main(["--resume-from", str(ck), "--runs_dir", str(tmp_path / "runs")])
    with pytest.raises(train.RunRefused, match="already holds a run; a restarted process is "
                                               "not a resumed run"):
        train.main(["--arm", "B", "--output_dir", str(tmp_path / "runs" / "r1")])
    with pytest.raises(train.RunRefused, match="manifest.json: missing"):
        train.main(["--resume-from", str(tmp_path / "nowhere" / "checkpoint-1")])


def test_resume_moves_rows_past_the_checkpoint_aside(tmp_path):
    from ecredit_trl.runs.binding import RunRefused, supersede_records
    from ecredit_trl.runs.records import append_jsonl, read_jsonl

    append_jsonl(tmp_path / "ledger.jsonl", [{"step": 1}, {"step": 2}, {"step": 3}])
    with open(tmp_path / "ledger.jsonl", "a") as f:
        f.write('{"step": 4, "tor')  # killed mid-write
    append_jsonl(tmp_path / "trajectories.jsonl", [{"step": 1}, {"step": 2}])
    moved = supersede_records(tmp_path, {"ledger_rows_total": 2, "trajectory_rows_total": 2}, 1)
    assert moved == {"ledger.jsonl": 2}
    assert read_jsonl(tmp_path / "ledger.jsonl") == [{"step": 1}, {"step": 2}]
    side = (tmp_path / "superseded" / "ledger.s01.jsonl").read_text().splitlines()
    assert side == ['{"step": 3}', '{"step": 4, "tor']
    assert supersede_records(tmp_path, {"ledger_rows_total": 2,
                                        "trajectory_rows_total": 2}, 2) == {}
    with pytest.raises(RunRefused, match="ledger.jsonl: holds 2 complete rows, the checkpoint "
                                         "counted 5"):
        supersede_records(tmp_path, {"ledger_rows_total": 5, "trajectory_rows_total": 2}, 3)


def test_graceful_stop_and_termination_classes():
    from ecredit_trl.runs.faults import (
        GracefulStop,
        SandboxUnavailable,
        exit_code,
        signal_consequence,
        termination_class,
    )
    from sandbox.snapshots.gitsafe import SnapshotError

    stop = GracefulStop(step_fn=lambda: 4)
    with stop:
        assert termination_class(None, stop) == "completed"
        os.kill(os.getpid(), signal.SIGTERM)  # a real signal: handled, not fatal
        assert stop.requested and stop.signal_name == "SIGTERM" and stop.step == 4
        os.kill(os.getpid(), signal.SIGTERM)  # again: still just a request
        assert termination_class(None, stop) == "sigterm"
        # the group's SIGTERM killed a git child: the error that followed is its consequence
        died = SnapshotError("commit-tree of the base failed: ")
        assert termination_class(died, stop) == "sigterm"
        assert signal_consequence(died, "sigterm") and exit_code("sigterm", died) == 143
        assert exit_code("sigterm", SandboxUnavailable("killed with the group")) == 143
        assert termination_class(MemoryError(), stop) == "oom"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    sigint = GracefulStop()
    with sigint:
        os.kill(os.getpid(), signal.SIGINT)
        assert termination_class(None, sigint) == "sigint"
        with pytest.raises(KeyboardInterrupt):  # the second Ctrl-C aborts
            os.kill(os.getpid(), signal.SIGINT)
    assert termination_class(KeyboardInterrupt(), None) == "sigint"
    assert termination_class(MemoryError(), None) == "oom"
    assert termination_class(RuntimeError("DefaultCPUAllocator: can't allocate memory"),
                             None) == "oom"
    assert termination_class(ValueError("x"), None) == "exception"
    assert not signal_consequence(ValueError("x"), "exception")
    assert exit_code("exception", SandboxUnavailable("gone")) == 75
    assert (exit_code("sigterm"), exit_code("sigint"), exit_code("completed")) == (143, 130, 0)


_STOPPING_SCRIPT = """
import sys, time, pathlib
from ecredit_trl.runs.faults import GracefulStop, follow_launcher_signals
out = pathlib.Path(sys.argv[1])
stop = GracefulStop().install()
assert follow_launcher_signals(), "the parent is not accelerate launch"
(out / "ready").write_text("1")
while not stop.requested:
    time.sleep(0.05)
time.sleep(8)  # the step in progress finishes and its checkpoint is written
(out / "receipt").write_text(stop.signal_name)
"""


@pytest.mark.parametrize("form", ["accelerate", "python-m"])
@pytest.mark.parametrize("how", ["sigterm-to-launcher", "ctrl-c-to-group"])
def test_a_stop_through_accelerate_launch_is_graceful(tmp_path, how, form):
    """The installed ``accelerate launch`` lets the training process finish its step after a
    scheduler's SIGTERM to the launcher or a Ctrl-C to the terminal's group (accelerate 1.16
    SIGKILLs it 5 s later: no checkpoint, no receipt)."""
    import time

    from ecredit_trl.runs.faults import launcher_kills_on_stop

    script = tmp_path / "stopping.py"
    script.write_text(_STOPPING_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    launch = ([str(Path(sys.executable).parent / "accelerate"), "launch"] if form == "accelerate"
              else [sys.executable, "-m", "accelerate.commands.launch"])
    launcher = subprocess.Popen(
        launch + ["--num_processes", "1", "--cpu", str(script), str(tmp_path)], env=env,
        start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "ready").exists():
        assert launcher.poll() is None, launcher.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    if how == "sigterm-to-launcher":
        os.kill(launcher.pid, signal.SIGTERM)
    else:
        os.killpg(launcher.pid, signal.SIGINT)
    sig = "SIGTERM" if how == "sigterm-to-launcher" else "SIGINT"
    launcher.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while not (tmp_path / "receipt").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (tmp_path / "receipt").read_text() == sig
    assert not launcher_kills_on_stop()


def test_a_launcher_that_kills_its_child_on_stop_is_recognised():
    import types

    from ecredit_trl.runs.faults import launcher_kills_on_stop

    assert launcher_kills_on_stop(types.SimpleNamespace(_terminate_process_tree=lambda p: None))
    assert not launcher_kills_on_stop(types.SimpleNamespace(simple_launcher=lambda a: None))


def test_changes_accepted_by_an_earlier_resume_stay_accepted():
    from ecredit_trl.runs.binding import check_binding

    old = _manifest()
    new = _manifest(config={"ecredit": {"learning_rate": 2e-4, "arm": "B",
                                        "output_dir": "runs/a", "podman_endpoints": []},
                            "model": {"lora_r": 0, "path": "/p"}})
    ok = check_binding(old, new, [], None, allowed_before=["learning_rate"])
    assert ok["allowed_before"] == ["learning_rate"] and ok["allowed"] == []


def test_one_resume_rule_for_sessions_and_studies(tmp_path):
    run = tmp_path / "run"
    assert resume_checkpoint(run) is None
    ck2 = _fake_checkpoint(run, step=2)
    ck4 = run / "checkpoint-4"
    ck4.mkdir()
    for f in ck2.iterdir():
        (ck4 / f.name).write_bytes(f.read_bytes())
    RunReceipts(run, 0).checkpoint(ck4, step=4, reason="save_steps")
    weights_only = run / "checkpoint-final"
    weights_only.mkdir()
    (weights_only / "model.safetensors").write_bytes(b"W")
    RunReceipts(run, 0).checkpoint(weights_only, step=6, reason="final")
    # no termination yet (a session asking at its own end): newest with optimizer state
    assert resume_checkpoint(run) == ck4.resolve()
    # a termination receipt that names a checkpoint wins
    RunReceipts(run, 0).termination("sigterm", step=4, resumable_checkpoint=str(ck2.resolve()))
    assert resume_checkpoint(run) == ck2.resolve()
    # ... unless it is gone; and a moved run directory is found by the relative path
    moved = tmp_path / "moved"
    run.rename(moved)
    assert resume_checkpoint(moved) == moved / "checkpoint-4"
