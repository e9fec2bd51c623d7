"""Writing one generation round's records: trajectory rows, the ledger row, the metrics.

The rows themselves are pure functions of :mod:`ecredit_trl.runs.ledger`; this module
gathers them across ranks (counts summed, stage timings the maximum: the slowest rank)
and appends them to ``ledger.jsonl`` and ``trajectories.jsonl`` on the main process
(design page, "Run records"). Every rank must call :func:`write_round` (collectives).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate.utils import gather_object

from ecredit_trl.runs.ledger import ledger_row, round_counts, round_metrics, trajectory_row
from ecredit_trl.runs.records import append_jsonl
from ecredit_trl.runs.timings import TIMING_FIELDS


@dataclass
class RoundRows:
    """What one round wrote: the ledger row, every rank's trajectory rows, and the
    ``ecredit/*`` metrics of the round (for TRL's log)."""

    ledger: dict
    trajectories: list[dict]
    metrics: dict[str, float]


def _gathered_counts(accelerator, local: dict) -> dict[str, float]:
    """``local`` counts summed over ranks (same keys on every rank)."""
    keys = sorted(local)
    vec = torch.tensor([[float(local[k]) for k in keys]], device=accelerator.device)
    total = accelerator.gather(vec).sum(dim=0).tolist()
    return dict(zip(keys, total, strict=True))


def _slowest_timings(accelerator, timings: dict) -> dict[str, float]:
    """Stage timings as the slowest rank saw them (seconds, rounded to 0.1 ms)."""
    tvec = torch.tensor([[float(timings[k]) for k in TIMING_FIELDS]], device=accelerator.device)
    tmax = accelerator.gather(tvec).max(dim=0).values.tolist()
    return {k: round(v, 4) for k, v in zip(TIMING_FIELDS, tmax, strict=True)}


def write_round(records, credit, trials, *, accelerator, run_dir: str | Path, arm: str,
                step: int, wall_s: float, timings: dict | None = None,
                scaffold: str = "ecredit", agreement: dict | None = None) -> RoundRows:
    """Build, gather and (main process) append one round's records.

    Args:
        records: this rank's rollout records
            (:class:`~ecredit_trl.runs.rollout_record.RolloutRecord`), in row order.
        credit: one per record, its credit as the records show it
            (:class:`~ecredit_trl.credit.injection.RolloutCredit`: ``counts``, ``stats``,
            ``tokens_per_turn``, ``advantage``, ``generated_tokens``, ``credited_tokens``).
        trials: this rank's ``(kind, TrialResult)`` pairs of the round.
        accelerator: the trainer's ``Accelerator`` (gathers; ``is_main_process`` writes).
        run_dir: the run directory holding ``ledger.jsonl`` and ``trajectories.jsonl``.
        arm, step: the run's arm and the optimizer step this round feeds (1-based).
        wall_s: seconds of the generation round (environments, generation, tools, trials).
        timings: this rank's stage timings (:func:`ecredit_trl.runs.timings.stage_timings`).
        scaffold: the run's scaffold name, written in every trajectory row.
        agreement: the round's sampling–training agreement over every rank (TRL's metric
            names; :func:`ecredit_trl.trainer.agreement.combine`), or None.

    Returns: :class:`RoundRows`. Raises: RecordWriteError (main process) when a row cannot
    be appended.
    """
    traj_rows = [trajectory_row(rec, arm=arm, step=step, generated_tokens=c.generated_tokens,
                                credited_tokens=c.credited_tokens,
                                tokens_per_turn=c.tokens_per_turn, advantage=c.advantage,
                                stats=c.stats, scaffold=scaffold)
                 for rec, c in zip(records, credit, strict=True)]
    tot = _gathered_counts(accelerator, round_counts(records, [c.counts for c in credit], trials))
    if timings is not None:
        timings = _slowest_timings(accelerator, timings)
    all_traj = gather_object(traj_rows) if accelerator.num_processes > 1 else traj_rows
    gpu_hours = (round(wall_s / 3600 * accelerator.num_processes, 6)
                 if torch.cuda.is_available() else 0.0)
    row = ledger_row(tot, step=step, arm=arm, wall_s=wall_s, gpu_hours=gpu_hours,
                     timings=timings, agreement=agreement)
    if accelerator.is_main_process:
        append_jsonl(Path(run_dir) / "ledger.jsonl", [row])
        append_jsonl(Path(run_dir) / "trajectories.jsonl", all_traj)
    return RoundRows(ledger=row, trajectories=all_traj, metrics=round_metrics(tot))


__all__ = ["RoundRows", "write_round"]
