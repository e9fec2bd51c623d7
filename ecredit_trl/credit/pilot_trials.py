"""The pilot's verifier trials (phases B/C of :mod:`ecredit_trl.credit.pilot`): the
empty-patch control of each task (cached in ``DIR/controls/``), one factual trial per
admitted rollout, at most one counterfactual trial each, graded against the task's
fixed lists (design page, "Utility and the missing-observation rule"). A trial's result
becomes a utility by the trainer's own rule (:func:`ecredit_trl.runs.outcomes.trial_verdict`):
a failure the artifact caused (an attributable exit class,
:data:`eval.integrity.exits.ATTRIBUTABLE_CLASSES`, while the task's control is healthy under
the same limits and the pool's retry fails too) scores the failure value, so the pilot
measures the same D training would; every other failure leaves the utility unavailable.

This module is the pilot's one adapter to the integrity rules (:mod:`eval.integrity`, through
training's :mod:`ecredit_trl.runs.outcomes`): the verdict, the control facts
(:meth:`PilotTrials.control_facts`) and the pool's retry policy (:func:`pilot_retry`).
"""

from __future__ import annotations

import hashlib
import json
import re
from concurrent.futures import as_completed
from pathlib import Path

from ecredit_trl.runs.outcomes import ControlFacts, control_facts, trial_retry, trial_verdict
from eval.files import atomic_write_text
from eval.tasks.trialspec import task_trial_spec


def _slug(text: str, n: int = 48) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._-") or "x"
    h = hashlib.sha256(text.encode()).hexdigest()[:6]
    return f"{s[:n]}-{h}"


def _grade_summary(rep) -> dict:
    return {"utility": rep.utility, "resolved": rep.resolved, "complete": rep.complete,
            "attributed": rep.attributed, "control_complete": rep.control_complete,
            "missing": list(rep.missing), "f2p": dict(rep.f2p), "p2p": dict(rep.p2p),
            "log_rejected": rep.log_rejected, "f2p_passed": rep.f2p_passed,
            "p2p_all_passing": rep.p2p_all_passing}


def pilot_retry(max_retries: int):
    """The retry policy of the pilot's pool: the trainer's
    (:func:`ecredit_trl.runs.outcomes.trial_retry`)."""
    return trial_retry(max_retries)


def _control_key(task) -> str:
    blob = json.dumps([task.instance_id, task.image, task.base_commit,
                       hashlib.sha256(task.eval_script.encode()).hexdigest()])
    return hashlib.sha256(blob.encode()).hexdigest()


class PilotTrials:
    """Phases B/C: the empty-patch controls (cached in ``out/controls/``), one factual
    trial per admitted rollout, then at most one counterfactual trial for each rollout
    with an original utility. ``rows`` collects every trial (``trials.jsonl``)."""

    def __init__(self, out: Path, by_id: dict, timeout_s: float) -> None:
        self.out = out
        self.by_id = by_id
        self.timeout_s = timeout_s
        self.rows: list[dict] = []
        self.first_trial_at: float | None = None
        # task_id -> {"log", "exit_class", "test_s", "limits"}
        self.controls: dict[str, dict] = {}
        self.ctrl_fut: dict = {}

    def row_of(self, res, role: str, task_id: str, rollout_index, cached=False) -> dict:
        """A ``trials.jsonl`` row of one trial result; its log goes to ``logs/``."""
        d = res.to_json(with_log=False) if hasattr(res, "to_json") else dict(res)
        d.update(role=role, task_id=task_id, rollout_index=rollout_index, cached=cached)
        if not cached:
            lp = self.out / "logs" / f"{d['trial_id']}.log"
            atomic_write_text(lp, res.log)
            d["log_path"] = str(lp.relative_to(self.out))
        return d

    def submit_controls(self, pool, admitted: list[dict]) -> None:
        """Read each admitted task's control from the cache (same key, exit ok) or submit it."""
        for task_id in sorted({r["task_id"] for r in admitted}):
            task = self.by_id[task_id]
            cpath = self.out / "controls" / f"{_slug(task_id)}.json"
            key = _control_key(task)
            if cpath.exists():
                try:
                    cached = json.loads(cpath.read_text())
                except (OSError, json.JSONDecodeError):
                    cached = None
                # an entry without limits predates failure attribution: it cannot vouch
                # for a healthy control under a trial's limits, so the control reruns
                if (cached and cached.get("key") == key and cached.get("exit_class") == "ok"
                        and "limits" in cached):
                    self.controls[task_id] = cached
                    self.rows.append({"role": "control", "task_id": task_id,
                                      "rollout_index": None, "cached": True,
                                      "trial_id": cached["trial_id"],
                                      "exit_class": cached["exit_class"],
                                      "attempts": 0, "service_s": 0.0})
                    continue
            spec = task_trial_spec(task, "", f"control-{_slug(task_id)}",
                                   timeout_s=self.timeout_s, labels={"ecredit.role": "control"})
            self.ctrl_fut[task_id] = pool.submit(spec)

    def submit_factual(self, pool, records: list[dict]) -> dict:
        """One factual trial per admitted record; returns future → record index."""
        fact_fut = {}
        for i, r in enumerate(records):
            if r["exclusion"] is not None:
                continue
            spec = task_trial_spec(self.by_id[r["task_id"]], r["_factual_artifact"],
                                   f"{_slug(r['task_id'])}-r{r['rollout_index']}-fact",
                                   timeout_s=self.timeout_s, labels={"ecredit.role": "factual"})
            fact_fut[pool.submit(spec)] = i
        return fact_fut

    def control_log(self, task_id: str) -> str | None:
        """The task's control log (waiting for its trial; a new ok control is cached), or
        None when the control did not run to its end."""
        if task_id not in self.controls:
            res = self.ctrl_fut[task_id].result()
            self.rows.append(self.row_of(res, "control", task_id, None))
            c = {"key": _control_key(self.by_id[task_id]), "trial_id": res.trial_id,
                 "exit_class": res.exit_class, "log": res.log, "test_s": res.test_s,
                 "limits": res.limits}
            if res.exit_class == "ok":
                atomic_write_text(self.out / "controls" / f"{_slug(task_id)}.json",
                              json.dumps(c, sort_keys=True))
            self.controls[task_id] = c
        c = self.controls[task_id]
        return c["log"] if c["exit_class"] == "ok" else None

    def control_facts(self, task_id: str) -> list[ControlFacts]:
        """The task's control as the attribution rule needs it (after :meth:`control_log`)."""
        return [control_facts(self.controls[task_id])]

    def utility_of(self, res, task, row: dict):
        """(utility, grade summary) of a trial by :func:`ecredit_trl.runs.outcomes.trial_verdict`;
        (None, None) when the utility is unavailable. A failure charged to the artifact gives
        the failure value and a summary with ``failure_class`` / ``failure_evidence``; ``row``
        (the trial's ``trials.jsonl`` row) gets the ``outcome`` and ``failure_class``."""
        from eval.grading.grader import grade  # start-up: swebench, ~1 s

        ctrl = self.control_log(task.instance_id)
        v = trial_verdict(task, res, ctrl, self.control_facts(task.instance_id))
        row.update(outcome=v.outcome, failure_class=v.failure_class)
        if v.utility is None:
            return None, None
        if v.failure_class is not None:
            return v.utility, {"utility": v.utility, "resolved": False,
                               "failure_class": v.failure_class,
                               "failure_evidence": v.failure_evidence}
        rep = grade(res.log, f2p=task.FAIL_TO_PASS, p2p=task.PASS_TO_PASS,
                    parser=task.log_parser, control_log=ctrl)
        return rep.utility, _grade_summary(rep)

    def collect_factual(self, pool, records: list[dict], fact_fut: dict, say) -> dict:
        """Grade the factual trials as they finish; a record without an original utility is
        excluded, every other one gets its counterfactual trial submitted (returned as
        future → record index)."""
        cf_fut = {}
        done_f = 0
        for fut in as_completed(fact_fut):
            i = fact_fut[fut]
            r = records[i]
            task = self.by_id[r["task_id"]]
            res = fut.result()
            frow = self.row_of(res, "factual", r["task_id"], r["rollout_index"])
            self.rows.append(frow)
            u, g = self.utility_of(res, task, frow)
            r["trials"] = {"factual": frow, "counterfactual": None}
            r["grades"] = {"factual": g, "counterfactual": None}
            r["U_P"] = u
            r["resolved_P"] = bool(g and g["resolved"])
            done_f += 1
            if u is None:
                r["exclusion"] = "no_original_utility"
                r["exclusion_detail"] = f"factual trial {frow['outcome']}"
                continue
            spec = task_trial_spec(task, r["_ablated_artifact"],
                                   f"{_slug(r['task_id'])}-r{r['rollout_index']}-cf",
                                   timeout_s=self.timeout_s,
                                   labels={"ecredit.role": "counterfactual"})
            cf_fut[pool.submit(spec)] = i
        say(f"pilot: {done_f} factual trials graded, {len(cf_fut)} counterfactual queued")
        return cf_fut

    def collect_counterfactual(self, records: list[dict], cf_fut: dict) -> None:
        """Grade the counterfactual trials as they finish (``U_Pb``, ``resolved_Pb``)."""
        for fut in as_completed(cf_fut):
            i = cf_fut[fut]
            r = records[i]
            task = self.by_id[r["task_id"]]
            res = fut.result()
            row = self.row_of(res, "counterfactual", r["task_id"], r["rollout_index"])
            self.rows.append(row)
            u, g = self.utility_of(res, task, row)
            r["trials"]["counterfactual"] = row
            r["grades"]["counterfactual"] = g
            r["U_Pb"] = u
            r["resolved_Pb"] = bool(g and g["resolved"])
