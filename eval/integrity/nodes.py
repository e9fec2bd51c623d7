"""The node rule: a failure on a sandbox node whose doctor report had a rule not held is
never charged to the policy (design page, "Threat model").

A Ray sandbox node where a probe of ``python -m sandbox doctor`` did not hold serves only
when the run allows it (``sandbox_allow_unheld``); what it serves carries the probes that
did not hold (:attr:`sandbox.trials.trial.TrialResult.node_unheld`, ``node_unheld`` in a
remote workspace's evidence). On such a node the evidence a rule reads may be wrong (a
missing peak counter, forks counted elsewhere, an unreadable kernel log), so a failure there
stays unavailable, counted under :data:`NODE_UNHELD`, rather than charged.
"""

from __future__ import annotations

from eval.integrity.attribution import Attribution
from sandbox.doctor.gate import NODE_UNHELD


def on_unheld_node(att: Attribution, node_unheld) -> Attribution:
    """``att`` (:func:`eval.integrity.attribution.attribute_failure`'s answer) for a trial
    served by a node whose unheld probes are ``node_unheld`` (a list of probe names; empty:
    every rule held): a charged failure becomes unattributed with reason
    :data:`NODE_UNHELD`, its evidence naming the probes. Pure."""
    if att.failure_class is None or not node_unheld:
        return att
    return Attribution(None, NODE_UNHELD, {**att.evidence, "node_unheld": list(node_unheld)})


def exec_on_unheld_node(failure_class: str | None, evidence: dict | None) -> str | None:
    """The agent rule's class (:func:`eval.integrity.agent.classify_exec_failure`) of a failed
    exec whose ``evidence`` came from a node with probes not held (``node_unheld``): None
    (infrastructure) there, ``failure_class`` elsewhere. Pure."""
    return None if (evidence or {}).get("node_unheld") else failure_class


__all__ = ["NODE_UNHELD", "exec_on_unheld_node", "on_unheld_node"]
