"""Run records (DESIGN.md §5): what a run was made of, what happened, how it ended.

* :mod:`.manifest` — the hashed run manifest a resume binds to.
* :mod:`.receipts` — start / resume / checkpoint / termination receipts.
* :mod:`.records` — crash-safe JSON and JSONL (ledger, trajectories) writers.
* :mod:`.outcomes` — how a verifier trial's result becomes a utility (or not).
* :mod:`.faults` — signals, graceful stops, infra stops, termination classes.
* :mod:`.callbacks` — per-step progress lines.
* :mod:`.audit` — checkpoint audit (``python -m ecredit_trl.runs.audit``).
"""
