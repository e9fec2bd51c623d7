"""The method (design page, "Credit arms"), pure where it can be.

* :mod:`.blocks` — edit blocks from per-turn snapshots, eligibility, verifier-blind
  selection, restore/ablation.
* :mod:`.arms` — the arm letters and which arms need a counterfactual trial.
* :mod:`.coefficients` — the per-token credit C_arm(t) of arms O/B/M/E.
* :mod:`.planning` — from a finished rollout to its credit query (turn map, selection,
  ablated artifact), the contrast D and the per-token advantages.
* :mod:`.injection` — per-token advantages A + C of a round, and what the records show of them.
* :mod:`.trajectory` — the agent-agnostic trajectory format and its replay into snapshots.
* :mod:`.scripted` — scripted trajectories with known answers (tests, pilot).
* :mod:`.taskbase` — where a task's S_0 lives for host-side replay.
* :mod:`.pilot` — the signal pilot (``python -m ecredit_trl.credit.pilot``); its trials in
  :mod:`.pilot_trials`, its table and ``pilot.md`` in :mod:`.pilot_report`.
"""
