"""The arm study (design page, "Evaluation"): ``ecredit-study run|status|report``
(:mod:`.__main__`, ``python -m ecredit_trl.study``).

* :mod:`.config` — the study YAML.
* :mod:`.status` — units and their states from the records.
* :mod:`.runner` — training runs, evaluations, comparisons, report; resumable.
* :mod:`.supervisor` — the study folder's lock, binding and child processes.
* :mod:`.pool` — the training pool never overlaps an evaluation split.
* :mod:`.positive_control` — the study's starting policy: positive control, step-0 baseline.
* :mod:`.report` — the report of a study folder; its figures from records
  (:mod:`.report_tables`), paired differences (:mod:`.report_pairs`), the budget that would
  detect a difference (:mod:`.report_power`), the policy's size (:mod:`.report_model`), the
  positive control (:mod:`.report_control`, rendered by :mod:`.report_control_render`),
  ``report.md`` (:mod:`.report_render`) and the figures (:mod:`.plots`).
"""
