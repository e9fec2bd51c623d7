"""Stages of a policy evaluation (``python -m eval.run``, orchestrated by :mod:`eval.run`).

``slots`` (slot rows, unknown reasons, shared helpers) · ``generation`` (the rollout
subprocess and reading its rows as they arrive) · ``verification`` (one factual trial per
slot, empty-patch controls, grading) · ``report`` (aggregation, ``report.md``, figures).
"""
