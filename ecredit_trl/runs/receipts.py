"""Receipts of a run: start, resume, every checkpoint, termination (design page, "Run records").

A run directory holds ``receipts/`` with one JSON file per event, named by
*session* (one process lifetime working on the run: the first start is
session 0, every ``--resume-from`` opens the next)::

    s00-start.json                 who/where/when, pid, host, boot id
    s00-checkpoint-000002.json     step, path, sha256 of every file, state present
    s00-checkpoint-final.json      the same for the weights-only final save
    s00-termination.json           class: completed | sigterm | sigint | exception | oom | unknown
    s00-traceback.txt              the traceback of an ``exception``/``oom`` termination
    s01-resume.json                the checkpoint, its verification, the manifest binding,
                                   allowed changes with their reason, how the previous
                                   session ended, records superseded

A session with a start/resume receipt and no termination receipt whose
process is gone "terminated without receipt" (SIGKILL, kernel OOM killer,
power loss): :func:`detect_unterminated` finds those at the next start in the
same runs directory, reports them and writes their termination receipt with
class ``unknown`` (``oom`` when the memory cgroup's OOM-kill counter rose) and
``"detected": true``; the process's own receipt never existed and none is
pretended.

All files are written atomically (:mod:`ecredit_trl.runs.records`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ecredit_trl.runs.records import read_jsonl, write_json, write_text_atomic

TERMINATION_CLASSES = ("completed", "sigterm", "sigint", "exception", "oom", "unknown")
ECREDIT_STATE = "ecredit_state.json"
_RECEIPT_RE = re.compile(r"^s(\d+)-(start|resume|termination|checkpoint-(\d+|[A-Za-z][\w.-]*))\.json$")

WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors", "pytorch_model.bin",
                "adapter_model.bin", "model.safetensors.index.json")


class CheckpointError(ValueError):
    """A checkpoint cannot be resumed from; the message names the file and why."""


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """sha256 (hex) of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


# -- process identity -----------------------------------------------------------------
def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def process_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: split after the last ')'
    fields = stat.rsplit(")", 1)[1].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def oom_kill_count() -> int | None:
    """OOM kills counted by this process's memory cgroup (v2 ``memory.events`` or v1
    ``memory.oom_control``), None when unreadable."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        rel = rel.lstrip("/")
        if controllers == "":
            candidates.append(Path("/sys/fs/cgroup") / rel / "memory.events")
        elif "memory" in controllers.split(","):
            candidates.append(Path("/sys/fs/cgroup/memory") / rel / "memory.oom_control")
    candidates += [Path("/sys/fs/cgroup/memory.events"),
                   Path("/sys/fs/cgroup/memory/memory.oom_control")]
    for p in candidates:
        try:
            for line in p.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def process_identity() -> dict:
    """pid, host, boot id, process start ticks and the cgroup OOM-kill count of this process."""
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "boot_id": boot_id(),
            "start_ticks": process_start_ticks(pid), "oom_kill_count": oom_kill_count()}


def process_alive(ident: dict) -> bool | None:
    """Is the process of ``ident`` (from :func:`process_identity`) still running?

    None when it cannot be told (another host or another boot: a shared runs directory).
    """
    if ident.get("host") != socket.gethostname():
        return None
    if ident.get("boot_id") and ident.get("boot_id") != boot_id():
        return False
    ticks = process_start_ticks(int(ident.get("pid", -1)))
    return ticks is not None and ticks == ident.get("start_ticks")


# -- receipts ---------------------------------------------------------------------------
@dataclass
class Session:
    """One session of a run as its receipts show it."""

    index: int
    opened: dict | None  # the start or resume receipt
    termination: dict | None
    checkpoints: list[dict]


def receipts_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "receipts"


def read_sessions(run_dir: str | Path) -> list[Session]:
    """Every session of ``run_dir`` in order, from its ``receipts/``.

    Raises: ValueError naming a receipt file that is not valid JSON.
    """
    sessions: dict[int, Session] = {}
    rdir = receipts_dir(run_dir)
    if not rdir.is_dir():
        return []
    for p in sorted(rdir.iterdir()):
        m = _RECEIPT_RE.match(p.name)
        if not m:
            continue
        try:
            rec = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{p}: unreadable receipt ({exc})") from exc
        rec["_file"] = str(p)
        s = sessions.setdefault(int(m.group(1)), Session(int(m.group(1)), None, None, []))
        kind = m.group(2)
        if kind in ("start", "resume"):
            s.opened = rec
        elif kind == "termination":
            s.termination = rec
        else:
            s.checkpoints.append(rec)
    for s in sessions.values():
        s.checkpoints.sort(key=lambda r: r.get("step", 0))
    return [sessions[k] for k in sorted(sessions)]


class RunReceipts:
    """Writes the receipts of one session of ``run_dir`` (main process only).

    Args:
        run_dir: the run directory.
        session: this session's index (:meth:`next_session` for a new one).
    """

    def __init__(self, run_dir: str | Path, session: int) -> None:
        self.run_dir = Path(run_dir)
        self.session = session
        self.dir = receipts_dir(run_dir)
        self.opened_at = time.time()

    @staticmethod
    def next_session(run_dir: str | Path) -> int:
        sessions = read_sessions(run_dir)
        return sessions[-1].index + 1 if sessions else 0

    def path(self, kind: str) -> Path:
        return self.dir / f"s{self.session:02d}-{kind}.json"

    def _write(self, kind: str, body: dict) -> Path:
        rec = {"kind": kind.split("-")[0], "session": self.session, "time": now_iso(),
               "run_dir": str(self.run_dir), **body}
        return write_json(self.path(kind), rec)

    def start(self, **body) -> Path:
        """Write ``sNN-start.json`` (process identity added)."""
        return self._write("start", {"process": process_identity(), **body})

    def resume(self, **body) -> Path:
        """Write ``sNN-resume.json`` (process identity added)."""
        return self._write("resume", {"process": process_identity(), **body})

    def checkpoint(self, checkpoint_dir: str | Path, *, step: int, reason: str,
                   counters: dict | None = None) -> Path:
        """Hash ``checkpoint_dir`` and write ``sNN-checkpoint-<step>.json``.

        ``reason``: ``save_steps``, ``signal``, ``infra_stop`` (emergency
        checkpoint of the last completed step) or ``final`` (weights only).
        """
        body = describe_checkpoint(checkpoint_dir, self.run_dir)
        name = Path(checkpoint_dir).name
        tag = f"{step:06d}" if re.fullmatch(r"checkpoint-\d+", name) else name.removeprefix(
            "checkpoint-")
        return self._write(f"checkpoint-{tag}", {"step": step, "reason": reason,
                                                 "counters": counters or {}, **body})

    def termination(self, cls: str, *, step: int | None, traceback_text: str | None = None,
                    **body) -> Path:
        """Write ``sNN-termination.json`` (and ``sNN-traceback.txt`` when a traceback is given).

        Raises: ValueError for a class not in :data:`TERMINATION_CLASSES`.
        """
        if cls not in TERMINATION_CLASSES:
            raise ValueError(f"class: expected one of {TERMINATION_CLASSES}, got {cls!r}")
        if traceback_text is not None:
            tb = write_text_atomic(self.dir / f"s{self.session:02d}-traceback.txt",
                                   traceback_text)
            body["traceback_file"] = str(tb)
        return self._write("termination", {"class": cls, "step": step,
                                           "seconds": round(time.time() - self.opened_at, 3),
                                           "process": {"pid": os.getpid()}, **body})


# -- checkpoints ------------------------------------------------------------------------
def describe_checkpoint(checkpoint_dir: str | Path, run_dir: str | Path | None = None) -> dict:
    """Hashes and contents of a saved checkpoint (transformers layout).

    Returns ``{"path", "relpath", "files": {name: {"sha256", "bytes"}}, "weights":
    {"kind": "full"|"lora"|None, "files": [...], "sha256": ...}, "state_present":
    {"optimizer", "scheduler", "rng", "trainer_state", "dataloader", "ecredit_state"}}``.
    ``weights.sha256`` hashes the weight files' own hashes in name order.
    ``dataloader``: transformers restores the data position from
    ``trainer_state.json``'s global step (skip the consumed batches of TRL's seeded
    RepeatSampler), so it is present when the trainer state is.
    """
    ck = Path(checkpoint_dir)
    files = {}
    for p in sorted(ck.rglob("*")):
        if p.is_file():
            rel = str(p.relative_to(ck))
            files[rel] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
    weight_files = [n for n in files if Path(n).name in WEIGHT_FILES or
                    re.fullmatch(r"model-\d+-of-\d+\.safetensors", Path(n).name)]
    kind = None
    if any("adapter_model" in n for n in weight_files):
        kind = "lora"
    elif weight_files:
        kind = "full"
    wh = hashlib.sha256()
    for n in sorted(weight_files):
        wh.update(n.encode() + b"\0" + files[n]["sha256"].encode())
    names = set(files)
    trainer_state = "trainer_state.json" in names
    present = {
        "optimizer": any(n in names for n in ("optimizer.pt", "optimizer.bin")),
        "scheduler": "scheduler.pt" in names,
        "rng": sorted(n for n in names if re.fullmatch(r"rng_state(_\d+)?\.pth", n)),
        "trainer_state": trainer_state,
        "dataloader": trainer_state,
        "ecredit_state": sorted(n for n in names if n.startswith("ecredit_state")),
    }
    rel = None
    if run_dir is not None:
        try:
            rel = str(ck.resolve().relative_to(Path(run_dir).resolve()))
        except ValueError:
            rel = None
    return {"path": str(ck.resolve()), "relpath": rel, "files": files,
            "weights": {"kind": kind, "files": sorted(weight_files),
                        "sha256": wh.hexdigest() if weight_files else None},
            "state_present": present}


def checkpoint_receipt(checkpoint_dir: str | Path) -> dict | None:
    """The newest checkpoint receipt (any session) for ``checkpoint_dir``, or None."""
    ck = Path(checkpoint_dir).resolve()
    run_dir = ck.parent
    best = None
    for s in read_sessions(run_dir):
        for rec in s.checkpoints:
            # the relative path survives moving the run directory; the absolute one is a fallback
            same = (rec.get("relpath") == ck.name if rec.get("relpath")
                    else Path(rec.get("path", "")).resolve() == ck)
            if same:
                best = rec  # sessions and steps come in order: the last one wins
    return best


def verify_checkpoint(checkpoint_dir: str | Path, *, world_size: int = 1) -> dict:
    """Check a checkpoint against its receipt before resuming from it.

    Every file the receipt lists must exist with the recorded size and sha256,
    and the state an exact resume needs must be there: weights, optimizer,
    scheduler, RNG state (one per rank), trainer state and the trainer's own
    counters (``ecredit_state*.json``).

    Returns: the checkpoint receipt.

    Raises:
        CheckpointError: naming the file: no such directory, no receipt (the
            process died while saving: a partial checkpoint), a missing or
            truncated file, a sha256 mismatch (corrupt), missing resume state.
    """
    ck = Path(checkpoint_dir)
    if not ck.is_dir():
        raise CheckpointError(f"{ck}: no such checkpoint directory")
    if not (ck.parent / "manifest.json").is_file():
        raise CheckpointError(f"{ck.parent / 'manifest.json'}: missing; {ck} is not inside a "
                              "run directory with a manifest, so it cannot be bound")
    rec = checkpoint_receipt(ck)
    if rec is None:
        raise CheckpointError(f"{ck}: no checkpoint receipt in {receipts_dir(ck.parent)} "
                              "(partial checkpoint: the process stopped while saving it?)")
    for name, meta in sorted(rec.get("files", {}).items()):
        p = ck / name
        if not p.is_file():
            raise CheckpointError(f"{p}: missing (partial checkpoint; receipt {rec['_file']})")
        size = p.stat().st_size
        if size != meta["bytes"]:
            raise CheckpointError(f"{p}: {size} bytes, receipt says {meta['bytes']} "
                                  f"(truncated or rewritten; receipt {rec['_file']})")
        if sha256_file(p) != meta["sha256"]:
            raise CheckpointError(f"{p}: sha256 does not match the receipt (corrupt; "
                                  f"receipt {rec['_file']})")
    present = rec.get("state_present", {})
    needed = {"optimizer": "optimizer.pt", "scheduler": "scheduler.pt",
              "trainer_state": "trainer_state.json"}
    for key, fname in needed.items():
        if not present.get(key):
            raise CheckpointError(f"{ck / fname}: not in this checkpoint (saved with reason "
                                  f"{rec.get('reason')!r}); it holds weights only and cannot "
                                  "be resumed exactly")
    if not rec.get("weights", {}).get("files"):
        raise CheckpointError(f"{ck}: no weight file (model.safetensors / adapter_model.safetensors)")
    want_rng = ["rng_state.pth"] if world_size <= 1 else [f"rng_state_{r}.pth"
                                                          for r in range(world_size)]
    for fname in want_rng:
        if fname not in present.get("rng", []):
            raise CheckpointError(f"{ck / fname}: missing (RNG state for world size {world_size})")
    want_state = [ECREDIT_STATE] if world_size <= 1 else [
        ECREDIT_STATE.replace(".json", f"_{r}.json") for r in range(world_size)]
    for fname in want_state:
        if fname not in present.get("ecredit_state", []):
            raise CheckpointError(f"{ck / fname}: missing (trainer counters for world size "
                                  f"{world_size})")
    try:
        json.loads((ck / "trainer_state.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{ck / 'trainer_state.json'}: unreadable ({exc})") from exc
    return rec


# -- sessions that ended without a receipt -----------------------------------------------
def _last_ledger_step(run_dir: Path) -> int | None:
    p = run_dir / "ledger.jsonl"
    if not p.is_file():
        return None
    try:
        rows = read_jsonl(p)
    except ValueError:
        return None
    return rows[-1].get("step") if rows else None


def detect_unterminated(runs_dir: str | Path, *, exclude: str | Path | None = None,
                        detected_by: dict | None = None, write: bool = True) -> list[dict]:
    """Find sessions under ``runs_dir`` that terminated without a receipt.

    A session counts when its start/resume receipt exists, it has no
    termination receipt, and its process is provably gone (same host: the pid
    is dead or belongs to another process; another boot). Sessions whose
    process still runs, or that ran on another host, are not touched.

    For each, a termination receipt is written (when ``write``) with class
    ``oom`` if the recorded memory-cgroup OOM-kill counter has grown since the
    session started, else ``unknown``, and ``"detected": true``.

    Returns: one dict per session: ``run_dir``, ``session``, ``pid``,
    ``started``, ``last_ledger_step``, ``last_checkpoint``, ``class``,
    ``receipt`` (path written or None), ``message`` (the readable report).
    """
    runs_dir = Path(runs_dir)
    found = []
    if not runs_dir.is_dir():
        return found
    skip = Path(exclude).resolve() if exclude else None
    for run in sorted(p for p in runs_dir.iterdir() if p.is_dir()):
        if skip is not None and run.resolve() == skip:
            continue
        try:
            sessions = read_sessions(run)
        except ValueError as exc:
            found.append({"run_dir": str(run), "session": None, "class": None, "receipt": None,
                          "message": f"[ecredit] run {run.name}: {exc}"})
            continue
        for s in sessions:
            if s.opened is None or s.termination is not None:
                continue
            ident = s.opened.get("process", {})
            alive = process_alive(ident)
            if alive is None or alive:
                continue
            now_oom = oom_kill_count()
            was_oom = ident.get("oom_kill_count")
            cls = "unknown"
            evidence = None
            if now_oom is not None and was_oom is not None and now_oom > was_oom:
                cls = "oom"
                evidence = (f"memory cgroup oom_kill counter rose from {was_oom} to {now_oom} "
                            "since the session started")
            last_ck = s.checkpoints[-1]["path"] if s.checkpoints else None
            for later in sessions:
                if later.index > s.index and later.checkpoints:
                    last_ck = later.checkpoints[-1]["path"]
            step = _last_ledger_step(run)
            item = {"run_dir": str(run), "session": s.index, "pid": ident.get("pid"),
                    "started": s.opened.get("time"), "last_ledger_step": step,
                    "last_checkpoint": last_ck, "class": cls, "receipt": None}
            if write:
                rr = RunReceipts(run, s.index)
                rr.opened_at = time.time()
                item["receipt"] = str(rr._write("termination", {
                    "class": cls, "step": step, "detected": True,
                    "note": "terminated without receipt: the process was gone without writing "
                            "its own termination receipt (SIGKILL, OOM killer, power loss...); "
                            "this receipt was written at a later start",
                    "evidence": evidence, "detected_by": detected_by or {},
                    "process": {"pid": ident.get("pid")}, "last_checkpoint": last_ck}))
            item["message"] = (
                f"[ecredit] run {run.name}: session {s.index} (pid {ident.get('pid')}, started "
                f"{s.opened.get('time')}) terminated without receipt; last ledger step "
                f"{step}, last checkpoint {last_ck or 'none'}; class {cls}"
                + (f" ({evidence})" if evidence else "")
                + (f"; recorded in {item['receipt']}" if item["receipt"] else "")
                + ". It is not resumed unless you pass --resume-from a checkpoint of it.")
            found.append(item)
    return found


def live_sessions(run_dir: str | Path) -> list[Session]:
    """Sessions of ``run_dir`` without termination receipt whose process may still run."""
    out = []
    for s in read_sessions(run_dir):
        if s.opened is not None and s.termination is None:
            if process_alive(s.opened.get("process", {})) is not False:
                out.append(s)
    return out


__all__ = ["CheckpointError", "RunReceipts", "Session", "TERMINATION_CLASSES",
           "checkpoint_receipt", "describe_checkpoint", "detect_unterminated", "live_sessions",
           "read_sessions", "sha256_file", "verify_checkpoint"]
