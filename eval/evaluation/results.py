"""The ``results.json`` of an evaluation and the files written from it.

:func:`build_results` assembles the dict (binding, model, settings, summary, cost, slot rows)
after verification; :func:`write_outputs` writes ``results.json``, the figures and
``report.md`` (each atomically). Cost figures add up across resumed calls of one binding.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from eval.evaluation.modelref import ModelRef
from eval.evaluation.report import render_report, summarize, write_plots
from eval.evaluation.slots import SCHEMA, read_rows
from eval.evaluation.verification import SlotVerifier
from eval.files import atomic_write_text, write_json
from eval.grading.flaky import flaky_slot_counts

__all__ = ["build_results", "cost_record", "rollout_settings", "store_record", "write_outputs"]

#: Counters of :attr:`SlotVerifier.stats` summed into ``results.json``'s ``cost``.
COUNTED = ("trials_factual", "trials_control", "slots_from_empty_control", "retries",
           "failure_retries", "slots_from_reused_verdict", "controls_from_reused_verdict")
#: Slot-row fields kept out of ``results.json`` (they stay in ``slots.jsonl``).
SLOT_ONLY = ("f2p", "p2p", "missing")


def cost_record(out: Path, binding: str, stats: dict, generated_tokens: int) -> dict:
    """Trial counts and service seconds (``service_s``) of this call added to those of
    earlier calls of this binding (read from ``out/results.json``), plus the generated
    tokens of every slot."""
    prev = {}
    if (out / "results.json").exists():
        try:
            prev = json.loads((out / "results.json").read_text())
        except json.JSONDecodeError:
            prev = {}
    cost_prev = prev.get("cost") if prev.get("binding") == binding else None
    cost = dict(cost_prev or {})
    for k in COUNTED:
        cost[k] = int(cost.get(k, 0)) + int(stats[k])
    cost["service_s"] = float(cost.get("service_s", 0.0)) + float(stats["service_s"])
    cost["generated_tokens"] = generated_tokens
    return cost


def rollout_settings(seen_rollouts: dict, rpath: Path) -> dict | None:
    """The generation settings recorded on the rollout rows (None when none say)."""
    settings = None
    for r in seen_rollouts.values():
        settings = r.get("settings") or settings
    if settings is None and rpath.exists():
        for r in read_rows(rpath)[:1]:
            settings = r.get("settings")
    return settings


def store_record(store, ver: SlotVerifier, slots: list[dict]) -> dict | None:
    """``results.json``'s ``verdict_store``: path, slots graded from a reused verdict (all
    and this call's), controls reused this call, untrusted entries ignored; None: off."""
    if store is None:
        return None
    return {**store.to_json(),
            "slots_reused": sum(1 for r in slots if r.get("verdict_reused_from")),
            "slots_reused_this_call": ver.stats["slots_from_reused_verdict"],
            "controls_reused_this_call": ver.stats["controls_from_reused_verdict"]}


def build_results(ver: SlotVerifier, tasks: Sequence, denominator: int, run_cfg: dict, *,
                  ref: ModelRef | None, out: Path, rpath: Path, admission_rec: dict | None,
                  rollout_rc: int | None, foreign: int, t_start: float) -> dict:
    """The ``results.json`` dict: binding, model, settings, summary, cost, slot rows.

    Args:
        ver: the verifier after every slot was graded (its ``final`` rows, ``stats``).
        tasks: the graded tasks (after admission); denominator: the split's task count.
        run_cfg: the folder's ``run.json`` dict (:func:`eval.evaluation.binding.bind_out`).
        ref: the resolved policy (None: rollouts from a file only).
        out, rpath: the output folder and the rollouts file read.
        admission_rec: the admission record (None without a manifest).
        rollout_rc: the rollout subprocess's exit code (None without one).
        foreign: slot rows of another binding ignored; t_start: ``time.time()`` at start.
    """
    n = run_cfg["n"]
    slot_rows = [ver.final[k] for k in sorted(ver.final)]
    summary = summarize(slot_rows, [(t.instance_id, t.repo) for t in tasks], n, denominator)
    return {
        "schema": SCHEMA, "binding": run_cfg["binding"], "split": run_cfg["split"], "n": n,
        "seed": run_cfg["seed"], "tasks_sha256": run_cfg["tasks_sha256"],
        "model": ref.to_json() if ref else {"sha256": run_cfg["model_sha256"]},
        "arm": ref.arm if ref else None, "train_seed": ref.seed if ref else None,
        "run_dir": ref.run_dir if ref else None,
        "settings": rollout_settings(ver.seen_rollouts, rpath),
        "overrides": run_cfg["overrides"], "rollouts_source": run_cfg["rollouts_source"],
        "admission": admission_rec, "summary": summary,
        "flaky": flaky_slot_counts([r["task_id"] for r in slot_rows], admission_rec),
        "cost": cost_record(out, run_cfg["binding"], ver.stats,
                            summary["generated_tokens"]["total"]),
        "rollouts_exit_code": rollout_rc, "foreign_rows_ignored": foreign,
        "slots": [{k: v for k, v in r.items() if k not in SLOT_ONLY} for r in slot_rows],
        "graded_this_call": len(ver.new_rows), "wall_s": round(time.time() - t_start, 3),
        "updated_at": time.time(),
    }


def write_outputs(out: Path, results: dict, say: Callable[[str], None]) -> None:
    """``results.json``, the figures and ``report.md`` into ``out``; one summary line to
    ``say``."""
    summary = results["summary"]
    write_json(out / "results.json", results)
    write_plots(results, out)
    atomic_write_text(out / "report.md", render_report(results))
    say(f"eval: success {summary['resolved']}/{summary['denominator']['slots']} = "
        f"{summary['success']:.3f}, unknown {summary['unknown']}; report {out / 'report.md'}")
