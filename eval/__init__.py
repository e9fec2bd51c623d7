"""Judgement (design page, "Inside `eval/`"): tasks, grading, the reward-integrity rules,
evaluation runs, statistics. Nothing here imports TRL or the trainer.

The command lines: :mod:`.run` (``ecredit-eval``), :mod:`.compare` (``ecredit-compare``),
:mod:`.controls` (``ecredit-controls``), :mod:`.grade` (``ecredit-grade``), :mod:`.holdout`
(``ecredit-holdout``), :mod:`.images` (``ecredit-images``), :mod:`.build_tasks`
(``ecredit-build-tasks``). Beneath them: :mod:`.files` (crash-safe record files),
:mod:`.console` (the upstream warnings the entry points filter), and the subpackages
:mod:`.tasks`, :mod:`.grading`, :mod:`.integrity`, :mod:`.stats`, :mod:`.metrics`,
:mod:`.doctor` and :mod:`.evaluation`.
"""
