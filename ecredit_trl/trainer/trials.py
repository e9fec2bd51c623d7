"""Verifier trials of one generation round: sequential or overlapped.

The method's query rules (design page, "Query bound") in one place for both orders:

* one factual trial per planned rollout (empty artifacts included);
* at most one counterfactual trial per rollout, arms B/M only, for a rollout admitted
  by the plan (``exclusion is None``: format error / no eligible block excluded, and with
  ``mask_truncated_completions`` a truncated row, known when its episode ends);
* a counterfactual result is *used* only when the factual utility exists; otherwise the
  rollout is excluded as ``no_original_utility`` (admission order unchanged);
* an **empty** ablated artifact (restoring the selected block gives the base tree) is the
  artifact of the task's empty-patch control, which every arm runs once per task and rank
  under the same limits: with ``reuse_control_for_empty_ablation`` (the default) its
  U(P\\b) is that control's utility and no trial of its own runs (the record's
  ``counterfactual`` is ``{"source": "control", "trial_id": <the control's>}``, counted as
  ``counterfactual_from_control``). A control that did not complete, or whose report is not
  complete, is never reused: the rollout then runs its own counterfactual trial, after the
  controls are in;
* a trial that ended in an attributable exit class (:mod:`eval.integrity.exits`) is scored
  with the failure value when the task's control is healthy and the pool's one retry broke
  too (:mod:`eval.integrity.attribution`, through :mod:`ecredit_trl.runs.outcomes`): factual and counterfactual alike, the record
  carrying ``failure_class`` / ``failure_evidence``; else it is unavailable.

``pipeline: sequential`` (the original order) runs, after every episode has ended,
the missing empty-patch controls, then all factual trials, then the counterfactual
trials of the rollouts whose factual utility exists. ``pipeline: overlapped`` submits the
controls of the batch's tasks when the round's generation starts, and each rollout's
factual **and** counterfactual trial the moment its episode ends (the selection and the
ablation are fixed before any trial, so neither depends on a verifier result); the reward
function then only collects. A counterfactual trial of a rollout whose factual utility
turns out unavailable has run for nothing: its result is not used (the record holds no
counterfactual, no contrast) and it is counted as ``counterfactual_discarded``.

Both orders fill the records with the same values, append the trials to the round's
list in the same order (controls, factual by rollout, counterfactual by rollout) and use
the same trial ids; only timings differ. One difference in which trials run: overlapped
submits a control for every task of the batch that has none, sequential only for tasks
with a planned rollout (a task whose every rollout was excluded before any trial gets its
control one round earlier).

:class:`TrialPipelineMixin` is mixed into the trainer; it uses ``self.pool``,
``self.tasks``, ``self.ecfg``, ``self.accelerator``, ``self._control`` and
``self.verified_trial_ids`` (run-long); a round's trials, records and clock travel in the
:class:`~ecredit_trl.trainer.round.Round` every method here takes.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass

from ecredit_trl.credit.arms import COUNTERFACTUAL_ARMS
from ecredit_trl.credit.planning import contrast
from ecredit_trl.runs.outcomes import TrialVerdict, control_facts, trial_verdict
from ecredit_trl.trainer.round import Round
from eval.grading.grader import grade
from eval.tasks.trialspec import task_trial_spec

TRAIN_BUNDLED_TIMEOUT_S = 120.0
"""Trial timeout (s) of bundled tasks in training when ``trial_timeout_s`` is not given."""

PIPELINES = ("sequential", "overlapped")


@dataclass
class PendingRollout:
    """One ended episode of the overlapped pipeline: its record and plan (``plan`` None:
    excluded before any trial) and the futures of its submitted trials (no counterfactual
    future for an admitted rollout: an empty ablation, decided once the controls are in)."""

    record: object
    plan: object | None
    factual: Future | None = None
    counterfactual: Future | None = None


class TrialPipelineMixin:
    """Trial submission and collection of the trainer (see the module docstring)."""

    # -- specs, grading ------------------------------------------------------------------
    def _grade(self, task, log: str, control_log: str | None):
        return grade(log, f2p=task.FAIL_TO_PASS, p2p=task.PASS_TO_PASS, parser=task.log_parser,
                     control_log=control_log)

    def _spec(self, task, artifact: str, trial_id: str):
        # limits from the task's split unless given; recorded on each result
        return task_trial_spec(task, artifact, trial_id, timeout_s=self.ecfg.trial_timeout_s,
                               memory=self.ecfg.trial_memory, cpus=self.ecfg.trial_cpus,
                               bundled_timeout_s=TRAIN_BUNDLED_TIMEOUT_S,
                               labels={"ecredit.arm": self.ecfg.arm})

    def _control_facts(self) -> dict:
        """Task id → :class:`~eval.integrity.controls.ControlFacts` of its latest control, failed
        ones included (the ``ok`` ones are saved in checkpoints with the logs)."""
        return self.__dict__.setdefault("_control_facts_by_task", {})

    def _control_trial_ids(self) -> dict:
        """Task id → trial id of its ``ok`` control (saved in checkpoints; one older than
        this field resumes without them, and an empty ablation then names no trial id)."""
        return self.__dict__.setdefault("_control_trial_id_by_task", {})

    def _wants_control(self, rec, plan) -> bool:
        """Whether admitted rollout ``rec`` (arms B/M) takes its U(P\\b) from the task's
        control rather than a trial: its ablated artifact is empty and reuse is on."""
        return self.ecfg.reuse_control_for_empty_ablation and plan.ablated_artifact == ""

    def _control_ablation(self, task_id: str) -> TrialVerdict | None:
        """The empty-patch control's verdict as the U(P\\b) of an empty ablation: the
        control completed (``ok``) with a complete report (a utility); else None (the
        rollout needs a trial of its own). The control was graded without a control log;
        a complete report needs none (:func:`eval.grading.grader.grade`)."""
        control = self._control.get(task_id)
        if control is None or control[0].utility is None or control[0].log_rejected:
            return None
        return TrialVerdict(control[0].utility, control[0].resolved, "graded")

    def _verdict_of(self, task, res):
        """:func:`~ecredit_trl.runs.outcomes.trial_verdict` of ``res`` with the task's control."""
        control = self._control.get(task.instance_id)
        facts = self._control_facts().get(task.instance_id)
        return trial_verdict(task, res, control[1] if control else None,
                             [facts] if facts is not None else [])

    # -- submission --------------------------------------------------------------------------
    def _submit_trial(self, rnd: Round, spec) -> Future:
        """Queue one trial of ``rnd`` on the pool; its service interval (queue wait excluded)
        goes to the round's clock when it resolves."""
        submitted = time.monotonic()
        fut = self.pool.submit(spec)
        clock = rnd.clock
        if clock is not None:
            def done(f: Future) -> None:
                if not f.cancelled() and f.exception() is None:
                    clock.add("trials", submitted + f.result().queue_wait_s, time.monotonic())
            fut.add_done_callback(done)
        return fut

    def _control_specs(self, rnd: Round, task_ids) -> tuple[list[str], list]:
        missing = sorted(t for t in task_ids if t not in self._control)
        rank = self.accelerator.process_index
        specs = [self._spec(self.tasks[t], "", f"control-r{rank}-{rnd.index}-{i}")
                 for i, t in enumerate(missing)]
        return missing, specs

    def _take_controls(self, rnd: Round, pairs) -> None:
        """Record control results ``(task id, TrialResult)`` in order; an ``ok`` one is kept
        for the attribution rules (a failed one is run again next round, and until then no
        failure of the task's trials is attributed; design page, "Who caused a failure
        decides the reward")."""
        for tid, res in pairs:
            rnd.trials.append(("control", res))
            self.verified_trial_ids.append(res.trial_id)
            self._control_facts()[tid] = control_facts(res)
            if res.exit_class == "ok":
                self._control[tid] = (self._grade(self.tasks[tid], res.log, None), res.log)
                self._control_trial_ids()[tid] = res.trial_id

    def _ensure_controls(self, rnd: Round, task_ids: set[str]) -> None:
        """Run the empty-patch control once per task and rank (for the attribution rule)."""
        missing, specs = self._control_specs(rnd, task_ids)
        futures = [self._submit_trial(rnd, s) for s in specs]
        self._take_controls(rnd, zip(missing, [f.result() for f in futures], strict=True))

    def _submit_controls(self, rnd: Round, task_ids) -> list[tuple[str, Future]]:
        """Overlapped pipeline: queue the controls of ``task_ids`` that have none; returns
        ``(task id, future)`` pairs to collect with :meth:`_take_controls`."""
        missing, specs = self._control_specs(rnd, task_ids)
        return [(t, self._submit_trial(rnd, s)) for t, s in zip(missing, specs, strict=True)]

    def _submit_rollout_trials(self, rnd: Round, rec, plan) -> PendingRollout:
        """Overlapped pipeline: the factual trial of a planned rollout and, arms B/M, its
        counterfactual trial when the plan admits it, submitted now."""
        pending = PendingRollout(rec, plan)
        if plan is None:
            return pending
        task = self.tasks[rec.task_id]
        pending.factual = self._submit_trial(rnd, self._spec(task, plan.final_artifact,
                                                             f"f-{rec.rollout_index}"))
        if (self.ecfg.arm in COUNTERFACTUAL_ARMS and rec.exclusion is None
                and not self._wants_control(rec, plan)):  # else: decided when the controls are in
            pending.counterfactual = self._submit_cf(rnd, rec, plan)
        return pending

    def _submit_cf(self, rnd: Round, rec, plan) -> Future:
        """Queue the counterfactual trial of ``rec`` (its ablated artifact, trial id
        ``cf-<rollout index>``)."""
        return self._submit_trial(rnd, self._spec(self.tasks[rec.task_id],
                                                  plan.ablated_artifact or "",
                                                  f"cf-{rec.rollout_index}"))

    # -- results into records ------------------------------------------------------------------
    def _take_factual(self, rnd: Round, rec, res) -> None:
        """Factual result ``res`` into ``rec``: utility, resolved, outcome, reward (or
        ``no_original_utility``)."""
        rnd.trials.append(("factual", res))
        self.verified_trial_ids.append(res.trial_id)
        rec.factual = res.to_json()
        v = self._verdict_of(self.tasks[rec.task_id], res)
        rec.utility, rec.resolved, rec.factual_outcome = v.utility, v.resolved, v.outcome
        rec.failure_class, rec.failure_evidence = v.failure_class, v.failure_evidence
        if rec.utility is None:
            rec.reward = None
        elif self.ecfg.terminal_reward == "utility":
            rec.reward = float(rec.utility)
        else:
            rec.reward = 1.0 if rec.resolved else 0.0
        if rec.exclusion is None and rec.utility is None:
            rec.exclusion = "no_original_utility"

    def _take_counterfactual(self, rnd: Round, rec, res) -> None:
        """Counterfactual result ``res`` into ``rec``: U(P\\b) and the contrast D, used
        only when ``rec`` is still admitted (its factual utility exists)."""
        self.verified_trial_ids.append(res.trial_id)
        if rec.exclusion is not None:  # the factual utility is unavailable: not used
            rnd.trials.append(("counterfactual_discarded", res))
            return
        rnd.trials.append(("counterfactual", res))
        rec.counterfactual = res.to_json()
        v = self._verdict_of(self.tasks[rec.task_id], res)
        rec.utility_ablated, rec.counterfactual_outcome = v.utility, v.outcome
        rec.contrast = contrast(rec.utility, rec.utility_ablated)

    def _take_control_ablation(self, rec) -> None:
        """U(P\\b) of ``rec``'s empty ablation from its task's usable control
        (:meth:`_control_ablation`) and the contrast D; no trial ran."""
        verdict = self._control_ablation(rec.task_id)
        rec.counterfactual = {"source": "control",
                              "trial_id": self._control_trial_ids().get(rec.task_id)}
        rec.utility_ablated, rec.counterfactual_outcome = verdict.utility, verdict.outcome
        rec.contrast = contrast(rec.utility, rec.utility_ablated)

    def _counterfactuals(self, rnd: Round, items) -> None:
        """The counterfactual side of planned rollouts (arms B/M), in rollout order, after
        the controls and the factual results are in. ``items`` are ``(record, plan, future
        or None)``; a record admitted when its trials were submitted and given no future
        has an empty ablation (:meth:`_wants_control`): it takes the control's U(∅) when the
        control is usable (:meth:`_control_ablation`), else its trial is submitted now. A
        record excluded by then takes nothing: its submitted trial is discarded, its empty
        ablation runs nothing."""
        items = [(rec, fut if fut is not None or rec.exclusion is not None
                  or self._control_ablation(rec.task_id) is not None
                  else self._submit_cf(rnd, rec, plan)) for rec, plan, fut in items]
        for rec, fut in items:  # every trial is queued before the first wait
            if fut is not None:
                self._take_counterfactual(rnd, rec, fut.result())
            elif rec.exclusion is None:
                self._take_control_ablation(rec)

    def _verify(self, rnd: Round, records: list, plans: list) -> None:
        """Sequential pipeline: factual trials for every planned rollout, then (arms B/M)
        one counterfactual trial per admitted rollout; fills the records in place."""
        planned = [i for i, p in enumerate(plans) if p is not None]
        self._ensure_controls(rnd, {records[i].task_id for i in planned})
        futures = [self._submit_trial(rnd, self._spec(self.tasks[records[i].task_id],
                                                 plans[i].final_artifact,
                                                 f"f-{records[i].rollout_index}"))
                   for i in planned]
        for i, fut in zip(planned, futures, strict=True):
            self._take_factual(rnd, records[i], fut.result())
        if self.ecfg.arm in COUNTERFACTUAL_ARMS:
            self._counterfactuals(rnd, [
                (records[i], plans[i],
                 None if self._wants_control(records[i], plans[i])
                 else self._submit_cf(rnd, records[i], plans[i]))
                for i in planned if records[i].exclusion is None])

    def _collect(self, rnd: Round, pending: list[PendingRollout]) -> None:
        """Overlapped pipeline: wait for the round's controls and every rollout's trials and
        fill the records in the sequential order (controls, factual, counterfactual)."""
        self._take_controls(rnd, ((tid, fut.result()) for tid, fut in rnd.controls))
        for p in pending:
            if p.factual is not None:
                self._take_factual(rnd, p.record, p.factual.result())
        if self.ecfg.arm in COUNTERFACTUAL_ARMS:
            self._counterfactuals(rnd, [(p.record, p.plan, p.counterfactual) for p in pending
                                        if p.plan is not None])


__all__ = ["PIPELINES", "PendingRollout", "TrialPipelineMixin"]
