"""An opt-in verdict store shared across evaluations (``eval.run --reuse-verdicts DIR``;
to save cost): a clean trial of one artifact on one task is run once and its log is
re-graded for every later slot that submits the same bytes on the same task.

Off by default: official runs verify every slot. Fit for deterministic, flake-screened tasks
(the bundled ones); a task whose tests are flaky would have one draw of its flake frozen.

An entry is ``DIR/<key>.json`` with ``key`` = :func:`verdict_key` (task identity of
:func:`eval.evaluation.verification.control_key`, the trial limits, the log parser, the
protected set, the image digest, sha256 of the artifact bytes). It holds what grading reads from a trial
(``log``, ``log_swebench``, ``protected_touched``) plus where it came from (``trial_id``,
``eval`` folder, ``binding``). Only ``exit_class == "ok"`` trials whose grade is not unknown
are stored; a file that does not parse or disagrees with its key, task, artifact, exit class
or log digest is ignored with a warning (the slot is verified again), never trusted.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from eval.evaluation.slots import text_sha256
from eval.evaluation.verification import control_key
from eval.files import read_json_object, write_json
from eval.tasks.protection import protected_set
from eval.tasks.trialspec import trial_limits

SCHEMA = 1
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
"""Artifact digest of the empty patch: the key of a task's empty-patch control."""


def verdict_key(task, timeout_s: float | None, artifact_sha256: str,
                image_digest: str | None = None) -> str:
    """sha256 (hex) of everything that decides a trial's verdict of one artifact on ``task``.

    Args:
        task: an :class:`eval.tasks.schema.Task`.
        timeout_s: the evaluation's trial timeout flag (None: the task's rule); the resolved
            :func:`eval.tasks.trialspec.trial_limits` values (timeout s, memory, pids, CPUs) enter.
        artifact_sha256: sha256 (hex) of the artifact's UTF-8 bytes (:data:`EMPTY_SHA256`
            for the empty-patch control).
        image_digest: the local digest of ``task.image`` (``eval.run`` passes
            :func:`eval.tasks.presence.require_task_images`'s), so a rebuilt image misses.

    Raises: ValueError from :func:`eval.tasks.trialspec.trial_limits` (bad ``trial_defaults``).
    """
    lim = asdict(trial_limits(task, timeout_s=timeout_s))
    lim.pop("source")
    blob = json.dumps([control_key(task), lim, task.log_parser, sorted(protected_set(task)),
                       artifact_sha256, image_digest], default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class StoredTrial:
    """A stored trial, read back as the fields :func:`grade_trial` reads from a result."""

    def __init__(self, e: dict) -> None:
        self.exit_class, self.log, self.trial_id = e["exit_class"], e["log"], e["trial_id"]
        self.log_swebench = e.get("log_swebench")
        self.protected_touched = list(e.get("protected_touched") or [])
        self.error = None


class VerdictStore:
    """The folder of stored verdicts (created on first write).

    Args:
        root: the store folder (shared by evaluations, e.g. a study's ``<out>/verdicts``).
        eval_dir, binding: the evaluation writing entries (recorded as their origin).
        say: warning sink (corrupt entries).
        images: image → local digest of the evaluation's tasks (part of every key).

    ``rejected`` counts entries that existed but were not trusted.
    """

    def __init__(self, root: str | Path, *, eval_dir: Path, binding: str,
                 say: Callable[[str], None], images: dict | None = None) -> None:
        self.root, self.eval_dir, self.binding, self.say = Path(root), eval_dir, binding, say
        self.images = dict(images or {})
        self.rejected = 0

    def get(self, key: str, task_id: str, artifact_sha256: str) -> dict | None:
        """The trusted entry of ``key`` or None (absent, or rejected with a warning)."""
        path = self.root / f"{key}.json"
        if not path.is_file():
            return None
        try:
            e = read_json_object(path)
        except ValueError as exc:
            return self._reject(path, f"unreadable ({exc})")
        want = {"schema": SCHEMA, "key": key, "task_id": task_id,
                "artifact_sha256": artifact_sha256, "exit_class": "ok"}
        bad = [k for k, v in want.items() if e.get(k) != v]
        if not isinstance(e.get("log"), str) or not isinstance(e.get("trial_id"), str):
            bad.append("log/trial_id")
        elif e.get("log_sha256") != text_sha256(e["log"]):
            bad.append("log_sha256")
        if bad:
            return self._reject(path, f"field(s) {', '.join(bad)} do not match")
        return e

    def _reject(self, path: Path, why: str) -> None:
        self.rejected += 1
        self.say(f"eval: verdict store entry {path} ignored: {why}; verifying again")
        return None

    def put(self, key: str, task_id: str, artifact_sha256: str, res, trial: dict) -> dict:
        """Store trial ``res`` (must have ended ``ok``) under ``key``, atomically; returns
        the entry. Raises: ValueError when ``res.exit_class`` is not ``ok``."""
        if res.exit_class != "ok":
            raise ValueError(f"exit_class: only ok trials are stored, got {res.exit_class!r}")
        e = {"schema": SCHEMA, "key": key, "task_id": task_id,
             "artifact_sha256": artifact_sha256, "exit_class": "ok", "log": res.log,
             "log_sha256": text_sha256(res.log),
             "log_swebench": getattr(res, "log_swebench", None),
             "protected_touched": list(getattr(res, "protected_touched", None) or []),
             "trial_id": res.trial_id, "trial": trial, "eval": str(self.eval_dir),
             "binding": self.binding, "stored_at": time.time()}
        write_json(self.root / f"{key}.json", e)
        return e

    def key(self, task, timeout_s: float | None, artifact_sha256: str) -> str:
        """:func:`verdict_key` (a method so the verifier needs no import of this module)."""
        return verdict_key(task, timeout_s, artifact_sha256, self.images.get(task.image))

    @staticmethod
    def trial(e: dict) -> StoredTrial:
        """Entry ``e`` as a trial result to grade."""
        return StoredTrial(e)

    @staticmethod
    def origin(e: dict) -> dict:
        """The ``verdict_reused_from`` field of a slot answered by entry ``e``."""
        return {"trial_id": e["trial_id"], "eval": e.get("eval"), "binding": e.get("binding")}

    def to_json(self) -> dict:
        return {"path": str(self.root), "rejected_entries": self.rejected}
