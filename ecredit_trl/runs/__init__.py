"""Run records (design page, "Run records"): what a run was made of, what happened, how it ended.

* :mod:`.manifest` — the hashed run manifest a resume binds to.
* :mod:`.receipts` — start / resume / checkpoint / termination receipts.
* :mod:`.records` — crash-safe JSON and JSONL (ledger, trajectories) writers.
* :mod:`.ledger` — the ledger and trajectory rows of one generation round (pure).
* :mod:`.binding` — resume binding: recorded command line, manifest match, superseded rows.
* :mod:`.session` — one training session's records, from run directory to termination.
* :mod:`.outcomes` — how a verifier trial's result becomes a utility (or not).
* :mod:`.faults` — signals, graceful stops, infra stops, termination classes.
* :mod:`.callbacks` — per-step progress lines.
* :mod:`.audit` — checkpoint audit (``python -m ecredit_trl.runs.audit``).
* :mod:`.rollout_record` — the rollout record (one trajectory row's source).
* :mod:`.round_records` — writing one generation round's records (gathered over ranks).
* :mod:`.sandbox_health` — the collective sandbox health check of a training round.
* :mod:`.resume` — which checkpoint a run resumes from (sessions and studies alike).
* :mod:`.portable` — recorded command lines without a machine's absolute paths.
* :mod:`.timings` — per-round stage timings of the training step.
"""
