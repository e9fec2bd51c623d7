"""The arm study (design page, "Evaluation"): ``python -m ecredit_trl.study run|status``.

``config`` (the study YAML), ``status`` (units and their states from the records),
``runner`` (training runs, evaluations, comparisons, report; resumable), ``report``
(the report of a study folder).
"""
