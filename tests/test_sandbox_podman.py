"""Verifier trials in real Podman containers (marker: podman)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import make_tar

from eval.integrity.retry import RetryPolicy
from sandbox.images import default_image
from sandbox.runtimes.podman_runtime import RUN_LABEL, podman_env
from sandbox.trials.pool import VerifierPool
from sandbox.trials.trial import Limits, TrialSpec

pytestmark = pytest.mark.podman

CALC = "def add(a, b):\n    return a + b\n"
TESTS = ("from calc import add\n\n"
         "def test_add():\n    assert add(2, 3) == 5\n\n"
         "def test_zero():\n    assert add(0, 0) == 0\n")
EVAL = ("echo '>>>>> Start Test Output'\n"
        "python3 -m pytest -rA -p no:cacheprovider test_calc.py\n"
        "echo '>>>>> End Test Output'\n")
BUG = ("diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n"
       " def add(a, b):\n-    return a + b\n+    return a - b\n")


class _Task:
    """The fixed test lists the trainer grades these trials against (ecredit_trl.runs.outcomes)."""

    instance_id = "calc-1"
    FAIL_TO_PASS = ["test_calc.py::test_add"]
    PASS_TO_PASS = ["test_calc.py::test_zero"]
    log_parser = "parse_log_pytest"


def outcome(result, control_log=None):
    from ecredit_trl.runs.outcomes import trial_outcome

    return trial_outcome(_Task, result, control_log)


def spec(trial_id, **kw):
    kw.setdefault("image", default_image())
    kw.setdefault("eval_script", EVAL)
    kw.setdefault("repo_archive", make_tar({"calc.py": CALC, "test_calc.py": TESTS}))
    kw.setdefault("timeout_s", 60)
    return TrialSpec(trial_id=trial_id, **kw)


def test_passing_and_failing_suites(podman_runtime):
    ok = podman_runtime.run_trial(spec("pass"))
    assert ok.exit_class == "ok", ok.error
    assert ok.applied_with == "empty artifact"
    assert "PASSED test_calc.py::test_add" in ok.log
    assert "PASSED test_calc.py::test_zero" in ok.log
    assert ok.test_exit_code == 0
    bad = podman_runtime.run_trial(spec("fail", artifact=BUG))
    assert bad.exit_class == "ok"
    assert bad.applied_with == "git apply --verbose"
    assert "FAILED test_calc.py::test_add" in bad.log
    assert "PASSED test_calc.py::test_zero" in bad.log
    assert bad.test_exit_code == 0  # the eval script ends with the marker echo, as SWE-bench's do
    for r in (ok, bad):
        assert r.setup_s > 0 and r.test_s > 0 and r.cleanup_s >= 0
    assert outcome(ok) == (1.0, True, "graded")  # U = 1/1 - 0
    assert outcome(bad) == (0.0, False, "graded")


def test_patch_fallback_chain_is_recorded(podman_runtime):
    # context line differs from the base: git apply refuses, patch --fuzz applies it
    fuzzy = ("--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n"
             " def add(a, b):  # adds\n-    return a + b\n+    return a - b\n")
    r = podman_runtime.run_trial(spec("fuzz", artifact=fuzzy))
    assert r.exit_class == "ok", r.log
    assert r.applied_with == "patch --batch --forward --fuzz=5 -p1"
    assert "FAILED test_calc.py::test_add" in r.log


def test_artifact_that_does_not_apply(podman_runtime):
    junk = ("--- a/nothere.py\n+++ b/nothere.py\n@@ -1,1 +1,1 @@\n-x = 1\n+x = 2\n")
    r = podman_runtime.run_trial(spec("noapply", artifact=junk))
    assert r.exit_class == "apply_failed"
    assert ">>>>> Patch Apply Failed" in r.log
    assert r.test_exit_code is None
    assert outcome(r) == (None, None, "apply_failed")  # unavailable, never a zero reward


def test_timeout_kills_the_container(podman_runtime):
    t0 = time.monotonic()
    r = podman_runtime.run_trial(spec("slow", eval_script="sleep 60\n", timeout_s=2))
    assert r.exit_class == "timeout"
    assert time.monotonic() - t0 < 20
    assert outcome(r) == (None, None, "timeout")


def test_truncated_test_log_is_not_a_result(podman_runtime):
    """The test output stops between SWE-bench's markers (the eval shell died mid-run while
    the trial script survived): exit class ``truncated_log``; without the retry the
    attribution rule needs (a bare ``run_trial``) no utility, even though the control observed
    every listed test. The pooled, retried case is ``tests/test_attribution.py``."""
    control = podman_runtime.run_trial(spec("trunc-control"))
    cut = ("echo '>>>>> Start Test Output'\n"
           "python3 -m pytest -rA -p no:cacheprovider test_calc.py -k test_zero\n"
           "kill -9 $$\n"
           "echo '>>>>> End Test Output'\n")
    r = podman_runtime.run_trial(spec("trunc", eval_script=cut, artifact=BUG))
    assert r.exit_class == "truncated_log" and "End Test Output" not in r.log
    assert "PASSED test_calc.py::test_zero" in r.log
    assert outcome(r, control.log) == (None, None, "truncated_log")


def test_no_network_inside(podman_runtime):
    probe = ("python3 - <<'EOF'\nimport socket\ntry:\n"
             "    socket.create_connection(('1.1.1.1', 53), timeout=3)\n    print('NET-REACHED')\n"
             "except OSError as e:\n    print('NET-BLOCKED', type(e).__name__)\nEOF\n"
             "ip_out=$(cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' | tr '\\n' ,)\n"
             "echo IFACES=$ip_out\n")
    r = podman_runtime.run_trial(spec("nonet", eval_script=probe))
    assert r.exit_class == "ok"
    assert "NET-BLOCKED" in r.log and "NET-REACHED" not in r.log
    assert "IFACES=lo," in r.log


def _kill_when_running(run_id, trial_label, stop):
    while not stop.is_set():
        out = subprocess.run(["podman", "ps", "--filter", f"label=ecredit.trial={trial_label}",
                              "--filter", f"label={RUN_LABEL}={run_id}", "--format", "{{.Names}}"],
                             capture_output=True, text=True, env=podman_env()).stdout.split()
        if out:
            subprocess.run(["podman", "kill", *out], capture_output=True, env=podman_env())
            return
        time.sleep(0.1)


def test_container_killed_mid_trial_is_infra_error_and_retried(podman_runtime):
    slow = "echo '>>>>> Start Test Output'\nsleep 5\necho '>>>>> End Test Output'\n"
    stop = threading.Event()
    killer = threading.Thread(target=_kill_when_running,
                              args=(podman_runtime.run_id, "killed", stop))
    killer.start()
    r = podman_runtime.run_trial(spec("killed", eval_script=slow, timeout_s=30))
    stop.set()
    killer.join()
    assert r.exit_class == "infra_error"
    assert r.test_exit_code is None and "End Test Output" not in r.log
    assert "before the eval script finished" in r.error

    # with one retry allowed, the pool retries and counts the retry
    stop = threading.Event()
    killer = threading.Thread(target=_kill_when_running,
                              args=(podman_runtime.run_id, "retried", stop))
    killer.start()
    with VerifierPool(podman_runtime, max_concurrency=1, retry=RetryPolicy(max_retries=1),
                      retry_backoff_s=0.0) as pool:
        r2 = pool.map([spec("retried", eval_script="sleep 2\necho done\n", timeout_s=30)])[0]
    stop.set()
    killer.join()
    assert r2.exit_class == "ok"
    assert r2.attempts == 2 and r2.retries == 1 and len(r2.retried_errors) == 1
    assert pool.stats["retries"] == 1

    # killed on every attempt: still infra_error after the retries, all counted, and the
    # rollout's utility is unavailable (None), never 0
    stop = threading.Event()
    killer = threading.Thread(target=_kill_every, args=(podman_runtime.run_id, "always", stop))
    killer.start()
    with VerifierPool(podman_runtime, max_concurrency=1, retry=RetryPolicy(max_retries=2),
                      retry_backoff_s=0.0) as pool:
        r3 = pool.map([spec("always", eval_script=slow, timeout_s=30)])[0]
    stop.set()
    killer.join()
    assert r3.exit_class == "infra_error"
    assert r3.attempts == 3 and len(r3.retried_errors) == 2
    assert pool.stats == {"submitted": 1, "completed": 1, "retries": 2, "infra_errors": 1,
                          "failure_retries": 0}
    assert outcome(r3) == (None, None, "infra_error")


def _kill_every(run_id, trial_label, stop):
    while not stop.is_set():
        _kill_when_running(run_id, trial_label, stop)


def test_memory_limit_is_enforced(podman_runtime):
    hog = "python3 -c \"x = bytearray(400 * 1024 * 1024); print('ALLOCATED')\"\n"
    r = podman_runtime.run_trial(spec("hog", eval_script=hog, limits=Limits(memory="64m")))
    assert "ALLOCATED" not in r.log.splitlines()
    # the kernel OOM-kills the python child; the trial script itself survives, and the
    # cgroup's oom_kill counter makes the trial `oom`, never a test result
    assert r.exit_class == "oom", r.log
    assert r.oom_kills == 1
    assert r.test_exit_code == 137
    assert outcome(r) == (None, None, "oom")


def test_pool_runs_concurrently_and_measures_queue_wait(podman_runtime):
    specs = [spec(f"conc{i}", eval_script="sleep 1\n") for i in range(4)]
    with VerifierPool(podman_runtime, max_concurrency=2, retry=RetryPolicy()) as pool:
        t0 = time.monotonic()
        results = pool.map(specs)
        wall = time.monotonic() - t0
    assert [r.exit_class for r in results] == ["ok"] * 4
    assert [r.trial_id for r in results] == [f"conc{i}" for i in range(4)]
    assert wall < 4 * 1.0 + 4 * 0.5  # less than running them one by one
    waits = sorted(r.queue_wait_s for r in results)
    assert waits[-1] > 0.8  # the last two waited for a worker


def test_gc_removes_labelled_leftovers():
    from sandbox.runtimes.podman_runtime import gc

    name = "ecredit-gc-probe"
    subprocess.run(["podman", "rm", "-f", name], capture_output=True, env=podman_env())
    subprocess.run(["podman", "create", "--name", name, "--label", f"{RUN_LABEL}=gc-test",
                    default_image(), "true"], check=True, capture_output=True, env=podman_env())
    assert gc("gc-test") == [name]
    assert gc("gc-test") == []


def test_private_service_dies_with_a_killed_owner():
    """A SIGKILLed trainer must not leave its private `podman system service` behind."""
    import shutil
    import signal
    import sys

    from conftest import REPO_ROOT

    code = ("import sys, time; sys.path.insert(0, sys.argv[1])\n"
            "from sandbox.runtimes.podman_runtime import PodmanService\n"
            "s = PodmanService(); print(s.proc.pid, s._dir, flush=True); time.sleep(120)\n")
    owner = subprocess.Popen([sys.executable, "-c", code, str(REPO_ROOT)],
                             stdout=subprocess.PIPE, text=True)
    pid, workdir = owner.stdout.readline().split()
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    def running() -> bool:
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and running():
        time.sleep(0.1)
    gone = not running()
    shutil.rmtree(workdir, ignore_errors=True)
    assert gone, f"podman system service {pid} outlived its SIGKILLed owner"


def _volumes() -> list[str]:
    out = subprocess.run(["podman", "volume", "ls", "--format", "{{.Name}}"],
                         capture_output=True, text=True, env=podman_env(), check=True)
    return out.stdout.split()


def test_trial_inputs_are_read_only_and_leave_nothing_behind(podman_runtime):
    """The trial's archive comes in through a read-only bind mount (not a copy through the
    engine): code in the trial can neither write nor remount it, and after the trial neither
    the archive on the host nor the control volume is left."""
    from sandbox.trials.archive import INPUTS_PATH

    attack = (f"echo tampered >> {INPUTS_PATH} && echo WROTE-INPUTS\n"
              f"mount -o remount,rw {INPUTS_PATH} && echo REMOUNTED\n"
              "echo mine > /ecredit/scratch && echo WROTE-CONTROL\n"
              "echo '>>>>> Start Test Output'\n"
              "python3 -m pytest -rA -p no:cacheprovider test_calc.py\n"
              "echo '>>>>> End Test Output'\n")
    r = podman_runtime.run_trial(spec("ro-inputs", eval_script=attack))
    assert r.exit_class == "ok", r.error
    assert "Read-only file system" in r.log
    assert "WROTE-INPUTS" not in r.log and "REMOUNTED" not in r.log
    assert "WROTE-CONTROL" in r.log  # the control directory stays the script's to write
    assert "PASSED test_calc.py::test_add" in r.log
    assert list(podman_runtime._inputs_dir().iterdir()) == [
        podman_runtime._inputs_dir() / ".ecredit-owner.json"]
    assert not [v for v in _volumes() if v.startswith(f"ecredit-{podman_runtime.run_id}-")]


def test_gc_removes_control_volumes_left_by_a_killed_run():
    from sandbox.runtimes.podman_runtime import gc
    from sandbox.trials.archive import control_volume

    left = control_volume("ecredit-gc-test-t1-abc123")
    other = "ecredit-gc-test-not-a-control-volume"
    for name in (left, other):
        subprocess.run(["podman", "volume", "rm", "-f", name], capture_output=True,
                       env=podman_env())
        subprocess.run(["podman", "volume", "create", name], check=True, capture_output=True,
                       env=podman_env())
    gc("gc-test")
    assert left not in _volumes() and other in _volumes()
    subprocess.run(["podman", "volume", "rm", "-f", other], capture_output=True,
                   env=podman_env())


def test_an_image_without_tar_is_an_infra_error_naming_the_unpack(podman_runtime):
    """A trial image that cannot unpack the inputs ends the trial as unavailable, with the
    reason, never as a test result of an empty tree."""
    image, box = "localhost/ecredit-test-notar:1", "ecredit-test-notar-build"
    run = dict(capture_output=True, env=podman_env())
    subprocess.run(["podman", "rm", "-f", box], **run)
    subprocess.run(["podman", "run", "--name", box, default_image(), "rm", "-f", "/usr/bin/tar",
                    "/bin/tar"], check=True, **run)
    subprocess.run(["podman", "commit", "-q", box, image], check=True, **run)
    subprocess.run(["podman", "rm", "-f", box], **run)
    try:
        r = podman_runtime.run_trial(spec("notar", image=image))
    finally:
        subprocess.run(["podman", "rmi", "-f", image], **run)
    assert r.exit_class == "infra_error"
    assert "could not be unpacked" in r.error and "tar" in r.error
    assert outcome(r) == (None, None, "infra_error")


def test_a_tmpdir_too_deep_for_a_socket_still_runs_trials(tmp_path, monkeypatch):
    """A ``TMPDIR`` so deep that the private service's socket path would pass the 107 bytes a
    unix socket address holds (unix(7)): the service binds under /tmp instead (owner-marked,
    for gc), a real trial runs through it, and closing the runtime removes that directory."""
    import os
    import tempfile

    from sandbox.runtimes.podman_runtime import PodmanRuntime, gc
    from sandbox.runtimes.tempdirs import MAX_SOCKET_PATH, OWNER_FILE, SHORT_ROOT

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    # the fault's precondition: a socket in TMPDIR cannot be bound
    assert len(os.fsencode(deep / "ecredit-podman-12345678" / "podman.sock")) > MAX_SOCKET_PATH
    rt = PodmanRuntime()
    try:
        sock = rt._service.socket
        assert sock.parent.parent == Path(SHORT_ROOT) and sock.is_socket()
        assert len(os.fsencode(sock)) <= MAX_SOCKET_PATH
        assert (sock.parent / OWNER_FILE).is_file()
        res = rt.run_trial(spec("deep-tmpdir"))
        assert res.exit_class == "ok", (res.error, res.log[-1500:])
        assert "PASSED test_calc.py::test_add" in res.log
    finally:
        rt.close()
        assert gc(rt.run_id) == []
    assert not sock.parent.exists()
