"""Reward integrity: every rule that decides whether an observation is scored, charged to the
policy, or excluded (design page, "Who caused a failure decides the reward").

The sandbox reports facts (how a trial ended: :data:`sandbox.trials.trial.EXIT_CLASSES`, its
limits and durations; an agent container's cgroup evidence: :mod:`sandbox.workspace.health`);
every decision is a pure function here, one module per rule:

* :mod:`eval.integrity.exits`: what each trial exit class decides (graded, attributable,
  infrastructure).
* :mod:`eval.integrity.attribution`: the artifact rule, who caused a failed verifier trial.
* :mod:`eval.integrity.agent`: the agent rule, who broke an agent container, and the score
  of an episode the policy broke.
* :mod:`eval.integrity.failure_value`: the failure value, U of an observation charged to the
  policy.
* :mod:`eval.integrity.missing`: the missing-observation rule, when a report that lacks
  listed tests still has a utility.
* :mod:`eval.integrity.retry`: the retry policy, which exit classes run again and how often
  (executed by :class:`sandbox.trials.pool.VerifierPool`).
* :mod:`eval.integrity.controls`: the control facts the artifact rule reads.
* :mod:`eval.integrity.nodes`: the node rule, no failure is charged on a sandbox node whose
  doctor report had a rule not held.

Each consumer reaches the rules through one adapter: training through
:mod:`ecredit_trl.runs.outcomes`, the pilot through :mod:`ecredit_trl.credit.pilot_trials`,
evaluation through :mod:`eval.evaluation.verification` (the grader applies the
missing-observation rule itself). This package imports only :mod:`sandbox`.
"""
