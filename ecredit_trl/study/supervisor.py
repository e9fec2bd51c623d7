"""The study folder's supervision: its lock, its binding to the config, the child processes
of its units, and the resume of an interrupted training run.

* :class:`StudyLock` — ``flock`` on ``<out>/.study.lock``: two study runs never share a folder.
* :func:`bind_study` — ``study.json``: a rerun with another config is refused unless allowed.
* :func:`run_subprocess` — one unit's command in its own process group, logged and recorded,
  with SIGTERM/SIGINT passed on to the whole group.
* :func:`wait_sessions`, :func:`abandon` — resuming a training
  run from its newest checkpoint with a receipt, or moving a partial folder aside.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from ecredit_trl.runs.portable import portable_argv
from ecredit_trl.runs.receipts import live_sessions
from ecredit_trl.runs.records import write_json
from ecredit_trl.study.config import UNHASHED_KEYS, StudyConfig, changed_keys
from ecredit_trl.study.status import LOCK_NAME, Unit, study_relpath

REPO_ROOT = Path(__file__).resolve().parents[2]


class StudyRefused(RuntimeError):
    """The study cannot run on this folder (changed config, another run holds the lock)."""


def write_record(path: Path, obj) -> None:
    """Write one JSON record of the study folder (parents made; temp + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, obj)


def now() -> str:
    """Local time with its offset, as the study's records hold it."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def bind_study(cfg: StudyConfig, out: Path, *, allow_changed: bool, command: list[str]) -> dict:
    """Write ``study.json`` into a new ``out``, or check it against ``cfg``.

    A changed resolved config is refused unless ``allow_changed``; an accepted change is
    appended to ``history`` (time, command, old/new sha256, changed keys).

    Raises: StudyRefused naming the changed keys.
    """
    path = out / "study.json"
    command = portable_argv(command, out)  # no machine paths in the record
    new = {**cfg.resolved(), "config_sha256": cfg.sha256(), "config_path": cfg.path,
           "command": command}
    if not path.is_file():
        rec = {**new, "started_at": now(), "history": []}
        write_record(path, rec)
        return rec
    old = json.loads(path.read_text(encoding="utf-8"))
    if old.get("config_sha256") == new["config_sha256"]:
        if old.get("sandbox") == new.get("sandbox"):
            return old
        # an unhashed key changed (where trials run): accepted, recorded in the history
        rec = {k: v for k, v in old.items() if k != "sandbox"}
        rec.update({k: new[k] for k in UNHASHED_KEYS if k in new})
        rec["history"] = list(old.get("history", [])) + [{
            "at": now(), "command": command, "changed_keys": [
                k for k in changed_keys(old, new) if k.startswith("sandbox")]}]
        write_record(path, rec)
        return rec
    keys = [k for k in changed_keys({k: old.get(k) for k in cfg.resolved()}, cfg.resolved())
            if k.split(".")[0] not in UNHASHED_KEYS]
    if not allow_changed:
        raise StudyRefused(f"{path}: the study config changed ({', '.join(keys) or 'hash'}); "
                           "rerun with --allow-changed to accept it, or use another --out")
    hist = list(old.get("history", [])) + [{
        "at": now(), "command": command, "was_sha256": old.get("config_sha256"),
        "now_sha256": new["config_sha256"], "changed_keys": keys}]
    rec = {**new, "started_at": old.get("started_at"), "history": hist}
    write_record(path, rec)
    return rec


class StudyLock:
    """``flock`` on ``<out>/.study.lock`` (holds our pid) so two runs never share a folder.

    Raises (on enter): StudyRefused naming the pid that holds the lock.
    """

    def __init__(self, out: Path) -> None:
        self.path = out / LOCK_NAME
        self.f = None

    def __enter__(self) -> StudyLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.path, "a+")
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.f.seek(0)
            pid = self.f.read().strip()
            self.f.close()
            raise StudyRefused(f"{self.path}: another study run (pid {pid or '?'}) holds this "
                               "folder") from None
        self.f.seek(0)
        self.f.truncate()
        self.f.write(str(os.getpid()))
        self.f.flush()
        return self

    def __exit__(self, *exc) -> None:
        self.f.seek(0)
        self.f.truncate()
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def run_subprocess(out: Path, unit: Unit, cmd: list[str], say) -> int:
    """Run one unit's command in its own process group, log to ``<out>/logs/<uid>.log``,
    record ``units/<uid>.json`` with its exit code.

    A SIGTERM/SIGINT to the study is passed on to the unit's whole process group, which stops
    cleanly (train.py: checkpoint + receipt); then the study exits. The group, not the child
    alone: the child of a training unit is ``accelerate launch``, whose one-process launcher
    dies on SIGTERM without passing it to train.py (a plain ``kill <study pid>`` left
    train.py training to its last step). In its own group, a Ctrl-C or a scheduler's signal
    to the study's group reaches the unit once, through the study.

    Returns: the unit's exit status. Raises: KeyboardInterrupt (named by the signal) after a
    forwarded stop."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    rec_path = out / "units" / f"{unit.uid}.json"
    log_path = logs / f"{unit.uid}.log"
    # relative to the study folder: a copied or moved folder's records still hold
    rec = {"uid": unit.uid, "cmd": cmd, "started_at": now(), "rc": None,
           "log": study_relpath(log_path, out)}
    write_record(rec_path, rec)
    write_record(out / "units" / "current.json", {"uid": unit.uid, "pid": os.getpid()})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    say(f"study: {unit.kind} {unit.name}: {' '.join(cmd[2:6])} ... (log {rec['log']})")
    t0 = time.time()
    stopping: list[int] = []
    with open(log_path, "a") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)

        def forward(signum, frame):
            stopping.append(signum)
            with contextlib.suppress(ProcessLookupError):  # the group has already exited
                os.killpg(proc.pid, signum)

        old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            rc = proc.wait()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
    rec.update(rc=rc, ended_at=now(), wall_s=round(time.time() - t0, 3))
    write_record(rec_path, rec)
    say(f"study: {unit.kind} {unit.name}: exit {rc} after {rec['wall_s']:.0f} s")
    if stopping:
        raise KeyboardInterrupt(signal.Signals(stopping[0]).name)
    return rc


def abandon(out: Path, path: Path, say) -> None:
    """Move a partial or stale unit folder to ``<out>/abandoned/`` (kept, never deleted)."""
    if not path.exists():
        return
    dest = out / "abandoned" / f"{path.relative_to(out).as_posix().replace('/', '_')}-{int(time.time())}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(path), str(dest))
    say(f"study: moved {path} to {dest}")


def wait_sessions(run_dir: Path, say, timeout_s: float = 900.0) -> None:
    """Wait until no live session works on ``run_dir``: accelerate's launcher may exit on a
    signal before train.py has written its checkpoint and termination receipt."""
    deadline = time.monotonic() + timeout_s
    said = False
    while live_sessions(run_dir) and time.monotonic() < deadline:
        if not said:
            say(f"study: waiting for the training process of {run_dir} to stop")
            said = True
        time.sleep(1.0)


__all__ = ["REPO_ROOT", "StudyLock", "StudyRefused", "abandon", "bind_study", "now",
           "run_subprocess", "wait_sessions", "write_record"]
