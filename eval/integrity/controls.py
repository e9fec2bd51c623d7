"""Control facts: what the artifact rule needs of a task's control trials.

One constructor, :func:`control_facts`, for every place a control is known: a fresh
:class:`sandbox.trials.trial.TrialResult` (training), a trial row or cached control dict
(the pilot, evaluation), and a record saved in a checkpoint (:func:`dataclasses.asdict` of
:class:`ControlFacts`; design page, "Who caused a failure decides the reward").
"""

from __future__ import annotations

from dataclasses import dataclass

from sandbox.trials.trial import OK


@dataclass(frozen=True)
class ControlFacts:
    """What the rule needs of one control trial.

    Attributes:
        exit_class: the control's exit class (``ok`` = completed).
        test_s: seconds the control's eval script ran (None if unknown, e.g. after a resume).
        limits: its :meth:`sandbox.trials.trial.TrialSpec.limits_record`, or None if unknown.
        kind: ``"empty"`` (empty-patch control) or ``"gold"``.
    """

    exit_class: str
    test_s: float | None = None
    limits: dict | None = None
    kind: str = "empty"

    @classmethod
    def of(cls, res, kind: str | None = None) -> ControlFacts:
        """:func:`control_facts` (the same arguments)."""
        return control_facts(res, kind)


def control_facts(res, kind: str | None = None) -> ControlFacts:
    """The facts of one control.

    Args:
        res: a :class:`sandbox.trials.trial.TrialResult`, or a dict with the same keys (a
            trial row, a cached control, a saved :class:`ControlFacts`). A missing
            ``exit_class`` reads ``ok`` (checkpoints that predate the facts kept only ``ok``
            controls, with no limits: their failures stay ``limits_differ``).
        kind: ``"empty"`` or ``"gold"``; None: the dict's ``kind``, else ``"empty"``.

    Returns: :class:`ControlFacts` with ``test_s`` rounded to milliseconds.
    """
    get = res.get if isinstance(res, dict) else lambda k, d=None: getattr(res, k, d)
    test_s = get("test_s")
    return ControlFacts(exit_class=get("exit_class", OK), limits=get("limits"),
                        kind=kind or get("kind", "empty") or "empty",
                        test_s=None if test_s is None else round(float(test_s), 3))


__all__ = ["ControlFacts", "control_facts"]
