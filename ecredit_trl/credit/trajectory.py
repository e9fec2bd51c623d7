"""Agent-agnostic trajectory records and their replay into snapshot trees.

A trajectory file is JSONL, one rollout per line:

.. code-block:: json

    {"task_id": "toolz-3", "rollout_index": 0, "format_error": false,
     "turns": [{"generated_tokens": 57,
                "writes": {"pkg/a.py": "text",            # write UTF-8 text
                           "old.txt": null,              # delete the path
                           "logo.png": {"base64": "iVBO..."}}}]}

* ``writes`` maps a repository-relative POSIX path to the file's **whole new
  content** after the turn: a string (UTF-8 text, written byte for byte, no
  newline translation), ``null`` (delete; deleting an absent path is a no-op),
  or an object ``{"base64": str}`` (raw bytes) or ``{"text": str}``; either object
  form may add ``"executable": bool`` (mode 100755 / 100644; absent = keep the
  file's current mode, 100644 for a new file); ``{"symlink": str}`` makes the path a
  symbolic link (mode 120000) to that target, as git records it. Within a turn, deletions are
  applied first (directories they leave empty are removed), then writes in
  path order; a turn with no writes is allowed (it still has a snapshot).
* ``generated_tokens`` (int >= 0) counts the policy-generated tokens of the
  turn (the m and L of the design page, "Credit arms"); environment/tool-result tokens are not
  counted.
* Extra fields are allowed at the record and turn level and are kept in
  ``extra`` (the trainer writes its own rollouts in this format).

The loader is strict: any malformed value fails with the line number and the
field's path. Paths must be relative, normalised, not empty, and outside
``.git``. Writes to paths the repository's ``.gitignore`` ignores are applied
but do not show in snapshots (as in SWE-bench patch extraction).

source: the design page, "Trajectory and snapshots"
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from eval.files import write_jsonl
from sandbox.snapshots.snapshot import (
    DEFAULT_SNAPSHOT_IGNORE,
    Snapshotter,
    changed_paths,
    read_blob,
)

__all__ = [
    "FileWrite",
    "ReplayError",
    "Trajectory",
    "TrajectoryFormatError",
    "Turn",
    "checkout_base",
    "dump_trajectories",
    "load_trajectories",
    "parse_trajectory",
    "remove_workdir",
    "replay",
    "generated_token_turns",
]

_RECORD_KEYS = ("task_id", "rollout_index", "format_error", "turns")
_TURN_KEYS = ("generated_tokens", "writes")


class TrajectoryFormatError(ValueError):
    """A trajectory record is malformed; the message names the line and field."""


class ReplayError(RuntimeError):
    """A trajectory could not be replayed onto its repository (message names the turn/path)."""


@dataclass(frozen=True)
class FileWrite:
    """New content of one path after a turn.

    Attributes:
        data: the bytes to write, or None to delete the path.
        executable: True → mode 100755, False → 100644, None → keep the
            current mode (100644 for a new file).
        symlink: the path becomes a symbolic link whose target is ``data``.
    """

    data: bytes | None
    executable: bool | None = None
    symlink: bool = False

    def to_json(self):
        if self.data is None:
            return None
        if self.symlink:
            return {"symlink": self.data.decode("utf-8", errors="surrogateescape")}
        try:
            text = self.data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if self.executable is None and text is not None:
            return text
        out: dict = ({"text": text} if text is not None
                     else {"base64": base64.b64encode(self.data).decode("ascii")})
        if self.executable is not None:
            out["executable"] = self.executable
        return out


@dataclass(frozen=True)
class Turn:
    """One agent turn: its generated-token count and the files it wrote."""

    generated_tokens: int
    writes: dict[str, FileWrite]
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {**self.extra, "generated_tokens": self.generated_tokens,
                "writes": {p: w.to_json() for p, w in self.writes.items()}}


@dataclass(frozen=True)
class Trajectory:
    """One rollout in the replay format (turns are 1-based in every other API:
    ``turns[0]`` is turn 1)."""

    task_id: str
    rollout_index: int
    format_error: bool
    turns: tuple[Turn, ...]
    extra: dict = field(default_factory=dict)

    @property
    def K(self) -> int:
        """Number of turns."""
        return len(self.turns)

    @property
    def L(self) -> int:
        """Generated tokens of the rollout (sum over turns)."""
        return sum(t.generated_tokens for t in self.turns)

    def m(self, turn: int | None) -> int:
        """Generated tokens of 1-based ``turn`` (0 for None)."""
        if turn is None:
            return 0
        if not 1 <= turn <= self.K:
            raise ValueError(f"turn: {turn} outside 1..{self.K}")
        return self.turns[turn - 1].generated_tokens

    def to_json(self) -> dict:
        return {**self.extra, "task_id": self.task_id, "rollout_index": self.rollout_index,
                "format_error": self.format_error, "turns": [t.to_json() for t in self.turns]}


def generated_token_turns(traj: Trajectory):
    """``token_turn`` of a recorded rollout for :mod:`ecredit_trl.credit.coefficients`: a
    ``(L,)`` int64 tensor holding the 1-based turn of every *generated* token, in order (no
    tool-result or padding positions; the trainer's padded ``(B, T)`` map with -1 is
    :func:`ecredit_trl.credit.planning.token_turns`)."""
    import torch

    counts = torch.tensor([t.generated_tokens for t in traj.turns], dtype=torch.long)
    turns = torch.arange(1, traj.K + 1, dtype=torch.long)
    return torch.repeat_interleave(turns, counts) if traj.K else torch.zeros(0, dtype=torch.long)


# ----------------------------------------------------------------------------
# strict parsing
# ----------------------------------------------------------------------------


def _fail(where: str, field_: str, msg: str) -> TrajectoryFormatError:
    return TrajectoryFormatError(f"{where}: field {field_!r}: {msg}")


def _check_path(where: str, field_: str, path: object) -> str:
    if not isinstance(path, str) or not path:
        raise _fail(where, field_, f"path must be a non-empty string, got {path!r}")
    if "\0" in path or "\\" in path:
        raise _fail(where, field_, f"path {path!r} holds NUL or a backslash")
    p = PurePosixPath(path)
    if p.is_absolute() or str(p) != path or any(part in ("..", ".") for part in p.parts):
        raise _fail(where, field_, f"path {path!r} must be relative and normalised "
                    "(no leading '/', '.', '..', '//' or trailing '/')")
    if p.parts[0] == ".git":
        raise _fail(where, field_, f"path {path!r} is inside .git")
    return path


def _parse_write(where: str, field_: str, value: object) -> FileWrite:
    if value is None:
        return FileWrite(None)
    if isinstance(value, str):
        return FileWrite(value.encode("utf-8", errors="surrogateescape"))
    if isinstance(value, dict):
        keys = set(value)
        if "symlink" in keys:
            if keys != {"symlink"} or not isinstance(value["symlink"], str) \
                    or not value["symlink"] or "\0" in value["symlink"]:
                raise _fail(where, f"{field_}.symlink", "expected {'symlink': non-empty "
                            "target string} and no other key")
            return FileWrite(value["symlink"].encode("utf-8", errors="surrogateescape"),
                             symlink=True)
        allowed = {"base64", "text", "executable"}
        if keys - allowed:
            raise _fail(where, field_, f"unknown keys {sorted(keys - allowed)} "
                        "(expected 'base64' or 'text', optional 'executable')")
        if ("base64" in keys) == ("text" in keys):
            raise _fail(where, field_, "object needs exactly one of 'base64' or 'text'")
        exe = value.get("executable")
        if exe is not None and not isinstance(exe, bool):
            raise _fail(where, f"{field_}.executable", f"expected bool, got {exe!r}")
        if "text" in keys:
            if not isinstance(value["text"], str):
                raise _fail(where, f"{field_}.text", "expected a string")
            return FileWrite(value["text"].encode("utf-8", errors="surrogateescape"), exe)
        if not isinstance(value["base64"], str):
            raise _fail(where, f"{field_}.base64", "expected a string")
        try:
            data = base64.b64decode(value["base64"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise _fail(where, f"{field_}.base64", f"invalid base64: {exc}") from None
        return FileWrite(data, exe)
    raise _fail(where, field_, "expected a string, null or an object {'base64': ...}, "
                f"got {type(value).__name__}")


def parse_trajectory(obj: object, *, where: str = "record") -> Trajectory:
    """Validate one decoded JSON record.

    Args:
        obj: the decoded JSON value of one line.
        where: location prefix for error messages (e.g. ``"file.jsonl:3"``).

    Raises:
        TrajectoryFormatError: a missing/ill-typed field; the message names it.
    """
    if not isinstance(obj, dict):
        raise TrajectoryFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for k in _RECORD_KEYS:
        if k not in obj:
            raise _fail(where, k, "missing")
    task_id = obj["task_id"]
    if not isinstance(task_id, str) or not task_id:
        raise _fail(where, "task_id", f"expected a non-empty string, got {task_id!r}")
    ri = obj["rollout_index"]
    if isinstance(ri, bool) or not isinstance(ri, int) or ri < 0:
        raise _fail(where, "rollout_index", f"expected an int >= 0, got {ri!r}")
    fe = obj["format_error"]
    if not isinstance(fe, bool):
        raise _fail(where, "format_error", f"expected a bool, got {fe!r}")
    turns_raw = obj["turns"]
    if not isinstance(turns_raw, list):
        raise _fail(where, "turns", f"expected a list, got {type(turns_raw).__name__}")
    turns: list[Turn] = []
    for i, t in enumerate(turns_raw):
        f = f"turns[{i}]"
        if not isinstance(t, dict):
            raise _fail(where, f, f"expected an object, got {type(t).__name__}")
        for k in _TURN_KEYS:
            if k not in t:
                raise _fail(where, f"{f}.{k}", "missing")
        g = t["generated_tokens"]
        if isinstance(g, bool) or not isinstance(g, int) or g < 0:
            raise _fail(where, f"{f}.generated_tokens", f"expected an int >= 0, got {g!r}")
        w = t["writes"]
        if not isinstance(w, dict):
            raise _fail(where, f"{f}.writes", f"expected an object, got {type(w).__name__}")
        writes: dict[str, FileWrite] = {}
        for path in sorted(w):
            fp = f"{f}.writes[{path!r}]"
            _check_path(where, fp, path)
            writes[path] = _parse_write(where, fp, w[path])
        _check_prefix_clash(where, f"{f}.writes", writes)
        turns.append(Turn(g, writes, {k: v for k, v in t.items() if k not in _TURN_KEYS}))
    extra = {k: v for k, v in obj.items() if k not in _RECORD_KEYS}
    return Trajectory(task_id, ri, fe, tuple(turns), extra)


def _check_prefix_clash(where: str, field_: str, writes: dict[str, FileWrite]) -> None:
    """One turn may not write both ``a`` and ``a/b`` as files."""
    written = {p for p, w in writes.items() if w.data is not None}
    for p in written:
        for parent in PurePosixPath(p).parents:
            if str(parent) in written:
                raise _fail(where, field_, f"writes both {str(parent)!r} and {p!r} as files")


def load_trajectories(path: str | os.PathLike) -> list[Trajectory]:
    """Read a trajectory JSONL file strictly.

    Blank lines are skipped. ``(task_id, rollout_index)`` must be unique.

    Raises:
        TrajectoryFormatError: bad JSON, a bad field, or a duplicate rollout; the
            message is ``<file>:<line>: field '<name>': <problem>``.
        FileNotFoundError: the file does not exist.
    """
    out: list[Trajectory] = []
    seen: dict[tuple[str, int], int] = {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TrajectoryFormatError(f"{where}: invalid JSON: {exc}") from None
            traj = parse_trajectory(obj, where=where)
            key = (traj.task_id, traj.rollout_index)
            if key in seen:
                raise _fail(where, "rollout_index",
                            f"duplicate rollout {key} (first at line {seen[key]})")
            seen[key] = lineno
            out.append(traj)
    return out


def dump_trajectories(trajs: Iterable[Trajectory], path: str | os.PathLike) -> None:
    """Write trajectories as JSONL atomically (:func:`eval.files.write_jsonl`)."""
    write_jsonl(path, (t.to_json() for t in trajs))


# ----------------------------------------------------------------------------
# replay
# ----------------------------------------------------------------------------


def _git(args: list[str], cwd: str | os.PathLike | None = None, *, what: str = "") -> str:
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull,
               GIT_TERMINAL_PROMPT="0")
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise ReplayError(f"{what or 'git ' + args[0]} failed: {proc.stderr.strip()}")
    return proc.stdout


def checkout_base(repo_dir: str | os.PathLike, base_commit: str,
                  workdir: str | os.PathLike) -> Path:
    """Fresh working tree of ``repo_dir`` at ``base_commit`` in ``workdir``.

    ``repo_dir`` is only read: ``workdir`` is a ``git clone --shared
    --no-checkout`` (objects borrowed through alternates) with ``base_commit``
    checked out detached.

    Raises: ReplayError when ``workdir`` exists and is not empty, or git fails.
    """
    work = Path(workdir)
    if work.exists() and any(work.iterdir()):
        raise ReplayError(f"workdir: {work} exists and is not empty")
    work.parent.mkdir(parents=True, exist_ok=True)
    _git(["clone", "--quiet", "--shared", "--no-checkout", str(repo_dir), str(work)],
         what=f"clone of {repo_dir}")
    _git(["-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach",
          base_commit], cwd=work, what=f"checkout of base {base_commit!r} from {repo_dir}")
    return work


def _apply_write(work: Path, path: str, w: FileWrite, turn: int) -> None:
    dest = work / path
    # refuse to follow a symlink out of the working tree
    for parent in [work / p for p in reversed(PurePosixPath(path).parents) if str(p) != "."]:
        if parent.is_symlink():
            raise ReplayError(f"turn {turn}: path {path!r}: parent {parent} is a symlink")
        if parent.exists() and not parent.is_dir():
            if w.data is None:
                return  # nothing under a file can exist: deleting is a no-op
            raise ReplayError(f"turn {turn}: path {path!r}: parent {parent.relative_to(work)} "
                              "is a file")
    if w.data is None:
        if dest.is_symlink() or dest.is_file():
            dest.unlink()
            # git has no empty directories: drop those the delete left behind
            for parent in PurePosixPath(path).parents:
                d = work / parent
                if str(parent) == "." or any(d.iterdir()):
                    break
                d.rmdir()
        elif dest.is_dir():
            raise ReplayError(f"turn {turn}: path {path!r} is a directory; delete its files")
        return
    if dest.is_dir() and not dest.is_symlink():
        raise ReplayError(f"turn {turn}: path {path!r} is a directory")
    mode = None
    if dest.is_file() and not dest.is_symlink():
        mode = stat.S_IMODE(dest.stat().st_mode)
    if dest.is_symlink() or (w.symlink and dest.exists()):
        dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    if w.symlink:
        os.symlink(os.fsdecode(w.data), dest)
        return
    dest.write_bytes(w.data)
    if w.executable is not None:
        mode = 0o755 if w.executable else 0o644
    if mode is not None:
        os.chmod(dest, mode)


def replay(trajectory: Trajectory, repo_dir: str | os.PathLike, base_commit: str,
           workdir: str | os.PathLike, *,
           ignore: Sequence[str] = DEFAULT_SNAPSHOT_IGNORE) -> list[str]:
    """Replay a trajectory's writes and snapshot after every turn.

    Args:
        trajectory: the rollout (a ``format_error`` rollout is replayed too; the
            caller decides whether to exclude it).
        repo_dir: the task repository (only read).
        base_commit: commit-ish of the base state S_0.
        workdir: an absent or empty directory; it becomes the replay clone and
            holds every snapshot tree (pass it as ``repo`` to
            :mod:`ecredit_trl.credit.blocks`). The caller removes it.
        ignore: generated-file patterns never recorded (see ``sandbox.snapshots.snapshot``).

    Returns:
        ``[S_0, S_1, ..., S_K]`` tree ids (length K + 1).

    Raises:
        ReplayError: the base cannot be checked out, or a write is impossible
            (a parent is a file, the path is a directory, a symlinked parent).
        SnapshotError: git could not snapshot the working tree.

    source: the design page, "Trajectory and snapshots"
    """
    work = checkout_base(repo_dir, base_commit, workdir)
    # the clone's .git is ours alone: it becomes the private store (our config, attributes)
    with Snapshotter(work, base="HEAD", store=work / ".git", ignore=ignore) as snap:
        snaps = [snap.base_tree]
        for k, turn in enumerate(trajectory.turns, start=1):
            ordered = sorted(turn.writes.items(), key=lambda kv: (kv[1].data is not None, kv[0]))
            for path, w in ordered:
                _apply_write(work, path, w, k)
            snaps.append(snap.snapshot())
    return snaps


def remove_workdir(workdir: str | os.PathLike) -> None:
    """Remove a replay clone (ignores a missing directory)."""
    shutil.rmtree(workdir, ignore_errors=True)


def turn_writes(repo, snaps: Sequence[str]) -> list[dict]:
    """Per turn k = 1..K, the replay-format writes from ``S_{k-1}`` to ``S_k``: path → UTF-8
    text, ``None`` (deleted), ``{"base64": ...}`` for bytes that are not UTF-8,
    ``{"text"|"base64": ..., "executable": bool}`` when the mode changed to/from 100755, and
    ``{"symlink": target}`` for a symbolic link (mode 120000), so :func:`replay` rebuilds
    the same trees (modes included).

    Args: ``repo``: the store holding the trees (``sandbox.snapshots.snapshot.store_of``).
    Raises: SnapshotError for a tree unknown in ``repo``.
    """
    out = []
    for k in range(1, len(snaps)):
        writes: dict = {}
        if snaps[k] != snaps[k - 1]:
            for ch in changed_paths(repo, snaps[k - 1], snaps[k]):
                if ch.status == "D" or ch.new_mode == "160000":
                    writes[ch.path] = None
                    continue
                mode, blob = read_blob(repo, snaps[k], ch.path)
                if mode == "120000":
                    writes[ch.path] = FileWrite(blob, symlink=True).to_json()
                    continue
                exe_old = ch.old_mode == "100755"
                exe_new = mode == "100755"
                keep_mode = not exe_new and (ch.status == "A" or exe_old == exe_new)
                writes[ch.path] = FileWrite(blob, None if keep_mode else exe_new).to_json()
        out.append(writes)
    return out
