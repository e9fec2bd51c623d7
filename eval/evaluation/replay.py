"""``python -m eval.run --replay``: re-verify an evaluation's stored artifacts and compare
per-test labels (:func:`replay`)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from eval.evaluation.report import label_agreement, render_replay
from eval.evaluation.slots import SCHEMA, EvalInputError
from eval.evaluation.verification import replay_selection, replay_trials, trial_retry
from eval.files import atomic_write_text, read_json_object, write_json
from eval.tasks.splits import load_tasks
from sandbox.backend import DEFAULTS, Runtime, SandboxOptions, open_runtime
from sandbox.trials.pool import VerifierPool


def replay(results_path: str | Path, out: str | Path | None = None, *,
           runtime: Runtime | SandboxOptions = DEFAULTS,
           concurrency: int = 2, sample: int | None = None, seed: int = 0,
           timeout_s: float | None = None, max_retries: int = 1,
           log: Callable[[str], None] | None = None) -> dict:
    """Re-verify the stored artifacts of an evaluation and compare per-test labels.

    Every graded slot (not unknown for infra reasons) whose artifact is stored gets one fresh
    trial; its grade's F2P/P2P statuses are compared with the original ones
    (:func:`eval.evaluation.report.label_agreement`). Empty artifacts are replayed as
    empty-patch trials.

    Args:
        results_path: ``results.json`` or the evaluation folder holding it.
        out: where ``replay.json`` / ``replay.md`` go (default: the evaluation folder).
        runtime: a :class:`sandbox.backend.Runtime` (not closed here) or the options of one
            (made and closed here).
        sample: replay only this many slots (chosen with ``random.Random(seed)``).

    Returns: the ``replay.json`` dict.

    Raises: FileNotFoundError / EvalInputError naming the results path or a missing artifact.
    """
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    rp = Path(results_path)
    if rp.is_dir():
        rp = rp / "results.json"
    if not rp.is_file():
        raise FileNotFoundError(f"--replay: no results.json at {rp}")
    results = read_json_object(rp, EvalInputError, what="--replay results")
    if not isinstance(results.get("split"), str) or not results["split"]:
        raise EvalInputError(f"--replay results {rp}: field split: expected the evaluated "
                             f"split's name (a non-empty string), got {results.get('split')!r}")
    src = rp.parent
    out = Path(out) if out else src
    tasks = {t.instance_id: t for t in load_tasks(results["split"], purpose="eval")}
    chosen, controls = replay_selection(src, results, tasks, sample, seed)
    t0 = time.time()
    with open_runtime(runtime, run_id=f"replay-{os.getpid()}") as rt, \
            VerifierPool(rt, max_concurrency=concurrency, retry=trial_retry(max_retries)) as pool:
        pairs, rows = replay_trials(pool, src, chosen, tasks, controls, timeout_s)
    agreement = label_agreement(pairs)
    rep = {"schema": SCHEMA, "results": str(rp), "binding": results.get("binding"),
           "slots_replayed": len(pairs), "sample": sample, "agreement": agreement,
           "slots": rows, "wall_s": round(time.time() - t0, 3)}
    write_json(out / "replay.json", rep)
    atomic_write_text(out / "replay.md", render_replay(rep))
    say(f"replay: {agreement['agree']}/{agreement['tests']} test labels agree, "
        f"{agreement['resolved_agree']}/{agreement['slots']} resolved verdicts agree")
    return rep
