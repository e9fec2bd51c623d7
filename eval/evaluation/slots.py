"""Slot rows of an evaluation: their schema constants, unknown slots, and small helpers
shared by the stages (design page, "Evaluation")."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from eval.files import read_jsonl

SCHEMA = 1

#: Unknown reasons after which a rerun tries the slot again (the rollout is kept).
#: ``trial_unattributed``: the trial broke its limits or did not apply, but the attribution
#: rule (:mod:`eval.integrity.attribution`) could not charge it to the artifact (control failed, ...).
RETRY_REASONS = ("trial_infra_error", "control_infra_error", "trial_unattributed")
UNKNOWN_REASONS = ("no_rollout", "agent_sandbox_error", "incomplete_report", *RETRY_REASONS)

#: Classification keys of a slot (design page, "Evaluation"), in report order.
SLOT_KEYS = ("raw", "report_binary", "strict", "unknown")


class EvalInputError(ValueError):
    """Bad input to an evaluation (the message names the flag, field or path)."""


def read_rows(path: Path) -> list[dict]:
    """Rows of a JSONL file; raises EvalInputError for a corrupt line that is not the last."""
    return read_jsonl(path, error=EvalInputError)


def slug(text: str, n: int = 40) -> str:
    """A file-name-safe form of ``text`` (at most ``n`` characters) + 6 hex of its sha256."""
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._-") or "x"
    return f"{s[:n]}-{hashlib.sha256(text.encode()).hexdigest()[:6]}"


def text_sha256(text: str) -> str:
    """sha256 (hex) of ``text`` as UTF-8 (surrogates kept)."""
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def unknown_slot(task_id: str, rollout_index: int, reason: str, **extra) -> dict:
    """A slot row for an unknown outcome (not resolved, every classification False but
    ``unknown``)."""
    if reason not in UNKNOWN_REASONS:
        raise ValueError(f"reason: expected one of {UNKNOWN_REASONS}, got {reason!r}")
    return {"task_id": task_id, "rollout_index": rollout_index, "resolved": False,
            "utility": None, "complete": False, "attributed": False,
            "classification": {"raw": False, "report_binary": False, "strict": False,
                               "unknown": True},
            "unknown_reason": reason, **extra}
