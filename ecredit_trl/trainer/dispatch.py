"""Which verifier trials of a generation round run when, for both pipelines.

The trial rules themselves (one factual trial per planned rollout, at most one
counterfactual, controls, verdicts) are :class:`~ecredit_trl.trainer.trials.TrialPipelineMixin`;
this mixin drives them over a round's rows (design page, "Query bound"):

* ``pipeline: overlapped`` — the round's empty-patch controls are queued when generation
  starts (:meth:`RoundDispatchMixin._queue_controls`); each rollout leaving TRL's tool loop
  has its record built and its trials submitted at once, on the agent pool
  (:meth:`RoundDispatchMixin._episode_ended`); the reward function then only collects.
* ``pipeline: sequential`` — after the last episode: every agent container released, every
  record built, then the trials (:meth:`RoundDispatchMixin._verify_sequential`).

Every method takes the round (:class:`~ecredit_trl.trainer.round.Round`): what it queued,
its completions and ids, and the records and trials it ends with. The agent side of an
ended episode is the host's (the trainer): ``_release_container(env)`` (the container goes,
its tree stays) and ``_episode_record(env, completion, rollout_index, completion_ids)`` →
``(record, plan)`` (the record built, then the tree removed). The host also holds
``environments``, ``accelerator``, ``_tool_executor`` and what :class:`TrialPipelineMixin`
uses.
"""

from __future__ import annotations

from ecredit_trl.trainer.round import Round
from ecredit_trl.trainer.trials import PendingRollout, TrialPipelineMixin


class RoundDispatchMixin(TrialPipelineMixin):
    """A round's trials in pipeline order (see the module docstring)."""

    def _rollout_index(self, rnd: Round, i: int, n_local: int) -> int:
        """Row ``i`` of this rank's ``n_local`` rows → its index in the run (unique over
        rounds and ranks; it seeds the row's selection and names its trials)."""
        proc, nproc = self.accelerator.process_index, self.accelerator.num_processes
        return rnd.index * n_local * nproc + proc * n_local + i

    def _queue_controls(self, rnd: Round, task_ids) -> None:
        """Overlapped pipeline, start of a round: queue the controls of ``task_ids`` and
        open the round's table of submitted rollouts."""
        rnd.pending = {}
        rnd.controls = self._submit_controls(rnd, task_ids)

    def _episode_ended(self, rnd: Round, i: int) -> None:
        """Overlapped pipeline: row ``i`` left the tool loop; build its records and submit
        its trials on the agent pool (:meth:`_finish_episode`), once."""
        if rnd.pending is not None and i not in rnd.pending:
            rnd.pending[i] = self._tool_executor.submit(
                self._finish_episode, rnd, i, rnd.completions[i])

    def _finish_episode(self, rnd: Round, i: int, completion) -> PendingRollout:
        """Release row ``i``'s container, build its record and plan, remove its tree, and
        submit its trials (overlapped pipeline; row ``i``'s ids are final: truncation known)."""
        env = self.environments[i]
        self._release_container(env)
        rec, plan = self._episode_record(env, completion,
                                         self._rollout_index(rnd, i, len(self.environments)),
                                         rnd.completion_ids[i])
        return self._submit_rollout_trials(rnd, rec, plan)

    def _verify_sequential(self, rnd: Round, environments, completions, completion_ids) -> list:
        """Sequential pipeline: release every container, build every record (removing each
        tree once built; ``completion_ids`` for truncation), then run the trials."""
        for env in environments:
            self._release_container(env)
        records, plans = [], []
        for i, (env, completion) in enumerate(zip(environments, completions, strict=True)):
            rec, plan = self._episode_record(env, completion,
                                             self._rollout_index(rnd, i, len(environments)),
                                             completion_ids[i])
            records.append(rec)
            plans.append(plan)
        self._verify(rnd, records, plans)
        return records

    def _verify_round(self, rnd: Round, environments, completions, completion_ids) -> list:
        """Every rollout of the round verified (factual + counterfactual), once every
        episode has ended: the overlapped trials collected, or the sequential ones run.
        Sets ``rnd.trials`` (the round's trials in order) and ``rnd.records``.

        Returns: the round's records, in row order.
        """
        rnd.trials = []
        if rnd.pending is not None:  # overlapped: the trials are under way
            pending = [rnd.pending[i].result() if i in rnd.pending
                       else self._finish_episode(rnd, i, completion)
                       for i, completion in enumerate(completions)]
            rnd.pending = None
            records = [p.record for p in pending]
            self._collect(rnd, pending)
        else:
            records = self._verify_sequential(rnd, environments, completions, completion_ids)
        rnd.records = records
        return records


__all__ = ["RoundDispatchMixin"]
