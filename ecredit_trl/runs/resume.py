"""Which checkpoint a run resumes from: one rule for the training session and the study
(design page, "Run records").

Used when a session ends (the termination receipt names the checkpoint a later
``--resume-from`` should take) and when a study restarts an unfinished run.
"""

from __future__ import annotations

from pathlib import Path

from ecredit_trl.runs.receipts import checkpoint_receipt, read_sessions

__all__ = ["resume_checkpoint"]


def resume_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint to resume ``run_dir`` from, or None when it has none.

    1. The last session's termination receipt names a ``resumable_checkpoint`` that is still
       a directory with its checkpoint receipt: that one (an emergency checkpoint, or the
       last one a signalled session saved).
    2. Else the newest checkpoint (highest step; of equal steps the later receipt) whose
       receipt records optimizer state and whose directory exists. A receipt's recorded
       path is tried first, then the run-relative one (the run directory may have moved).

    A session still open (no termination receipt yet) names nothing, so a session asking at
    its own end gets rule 2. Unreadable receipts (a corrupt line) give None.
    """
    run_dir = Path(run_dir)
    try:
        sessions = read_sessions(run_dir)
    except ValueError:
        return None
    named = (sessions[-1].termination or {}).get("resumable_checkpoint") if sessions else None
    if named and Path(named).is_dir() and checkpoint_receipt(named) is not None:
        return Path(named)
    best, best_step = None, None
    for s in sessions:
        for rec in s.checkpoints:
            if not rec.get("state_present", {}).get("optimizer"):
                continue
            path = _existing(run_dir, rec)
            step = rec.get("step", 0)
            if path is not None and (best_step is None or step >= best_step):
                best, best_step = path, step
    return best


def _existing(run_dir: Path, rec: dict) -> Path | None:
    """The directory a checkpoint receipt describes, if it exists (recorded path first)."""
    for p in (rec.get("path"), rec.get("relpath") and run_dir / rec["relpath"]):
        if p and Path(p).is_dir():
            return Path(p)
    return None
