"""Statistics of evaluations and comparisons (``python -m eval.compare`` is the CLI).

``paired`` (task-paired differences, bootstrap CIs, the whole comparison) · ``inputs``
(evaluation folders and training ledgers) · ``render`` (``compare.md`` and the figures) ·
``power`` (minimum detectable difference) · ``pairs`` (the comparison pairs every study
answers).
"""
