"""The arm study (issue 14 §1; DESIGN.md §4): ``python -m ecredit_trl.study run|status``.

``config`` (the study YAML), ``status`` (units and their states from the records),
``runner`` (training runs, evaluations, comparisons, report; resumable), ``report``
(the report of a study folder).
"""
