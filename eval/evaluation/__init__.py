"""Stages of a policy evaluation (``python -m eval.run``, orchestrated by :mod:`eval.run`).

``options`` (:class:`~eval.evaluation.options.EvalOptions`, the flags as a dataclass) ·
``binding`` (the folder's binding, resume state, fixed denominators) · ``slots`` (slot rows,
unknown reasons, shared helpers) · ``generation`` (the rollout subprocess and reading its rows
as they arrive) · ``verification`` (one factual trial per slot, empty-patch controls, grading)
· ``results`` (``results.json``: summary, cost; the files written from it) · ``report``
(aggregation, ``report.md``, figures) · ``replay`` (``--replay``) · ``verdicts`` (the opt-in
verdict store) · ``modelref`` / ``templatecheck`` (the policy to evaluate and its template).
"""
