"""Verifier trials of one generation round: sequential or overlapped.

The method's query rules (design page, "Query bound") in one place for both orders:

* one factual trial per planned rollout (empty artifacts included);
* at most one counterfactual trial per rollout, arms B/M only, for a rollout admitted
  by the plan (``exclusion is None``: format error / no eligible block excluded, and with
  ``mask_truncated_completions`` a truncated row, known when its episode ends);
* a counterfactual result is *used* only when the factual utility exists; otherwise the
  rollout is excluded as ``no_original_utility`` (admission order unchanged);
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
from ecredit_trl.runs.outcomes import control_facts, trial_verdict
from ecredit_trl.trainer.round import Round
from eval.grading.grader import grade
from eval.tasks.trialspec import task_trial_spec

TRAIN_BUNDLED_TIMEOUT_S = 120.0
"""Trial timeout (s) of bundled tasks in training when ``trial_timeout_s`` is not given."""

PIPELINES = ("sequential", "overlapped")


@dataclass
class PendingRollout:
    """One ended episode of the overlapped pipeline: its record and plan (``plan`` None:
    excluded before any trial) and the futures of its submitted trials."""

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
        if self.ecfg.arm in COUNTERFACTUAL_ARMS and rec.exclusion is None:
            pending.counterfactual = self._submit_trial(
                rnd, self._spec(task, plan.ablated_artifact or "", f"cf-{rec.rollout_index}"))
        return pending

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
            cf_idx = [i for i in planned if records[i].exclusion is None]
            futures = [self._submit_trial(rnd, self._spec(self.tasks[records[i].task_id],
                                                     plans[i].ablated_artifact or "",
                                                     f"cf-{records[i].rollout_index}"))
                       for i in cf_idx]
            for i, fut in zip(cf_idx, futures, strict=True):
                self._take_counterfactual(rnd, records[i], fut.result())

    def _collect(self, rnd: Round, pending: list[PendingRollout]) -> None:
        """Overlapped pipeline: wait for the round's controls and every rollout's trials and
        fill the records in the sequential order (controls, factual, counterfactual)."""
        self._take_controls(rnd, ((tid, fut.result()) for tid, fut in rnd.controls))
        for p in pending:
            if p.factual is not None:
                self._take_factual(rnd, p.record, p.factual.result())
        for p in pending:
            if p.counterfactual is not None:
                self._take_counterfactual(rnd, p.record, p.counterfactual.result())


__all__ = ["PIPELINES", "PendingRollout", "TrialPipelineMixin"]
