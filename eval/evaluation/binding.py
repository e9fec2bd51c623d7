"""An evaluation folder's binding and resume state (``run.json``, ``slots.jsonl``).

A folder is bound to one evaluation by sha256(model fingerprint, split, task-list sha256, eval
seed, n, generation overrides, rollouts source): a rerun with another binding is refused, slot
rows of another binding are ignored, graded slots are kept and slots whose trial hit an infra
error are retried (see the design page, "Evaluation"). The fixed task denominators of the
named splits live here too: a binding is only meaningful against a known task count.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

from eval.evaluation.slots import RETRY_REASONS, EvalInputError, read_rows
from eval.files import write_json

__all__ = ["BINDING_KEYS", "FIXED_DENOMINATORS", "bind_out", "resume_state", "run_binding",
           "split_denominator"]

#: Fixed task denominators of the named splits (design page, "Evaluation").
FIXED_DENOMINATORS = {"official500": 500, "holdout100": 100}

#: The ``run.json`` fields the binding hashes (named when a rerun is refused).
BINDING_KEYS = ("model_sha256", "split", "tasks_sha256", "seed", "n", "overrides",
                "rollouts_source")


def split_denominator(split: str, n_loaded: int) -> int:
    """The fixed task denominator of ``split`` (500 / 100 / the source's own size).

    Raises: EvalInputError when a named split loaded another number of tasks.
    """
    fixed = FIXED_DENOMINATORS.get(split.split(":", 1)[0])
    if fixed is not None and n_loaded != fixed:
        raise EvalInputError(f"split {split!r}: the fixed denominator is {fixed} tasks but "
                             f"{n_loaded} were loaded")
    return fixed if fixed is not None else n_loaded


def run_binding(*, model_sha256: str, split: str, tasks_sha256: str, seed: int, n: int,
                overrides: dict, rollouts_source: str) -> str:
    """sha256 (hex) binding an output directory to one evaluation.

    Args:
        model_sha256: :func:`eval.evaluation.modelref.dir_fingerprint` of the policy.
        split: the split name as given; tasks_sha256: sha256 of its task ids.
        seed: eval sampling seed; n: rollouts per task.
        overrides: generation settings given on the command line (None = run default).
        rollouts_source: ``"subprocess"`` or ``"file:<sha256 of the rollout rows>"``.
    """
    blob = json.dumps({"model": model_sha256, "split": split, "tasks": tasks_sha256,
                       "seed": seed, "n": n, "overrides": overrides,
                       "rollouts": rollouts_source}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def bind_out(out: Path, run_cfg: dict) -> None:
    """Write ``run.json`` into a new ``out``, or refuse an ``out`` bound to another
    evaluation; create ``logs/``, ``controls/``, ``artifacts/``.

    Args:
        out: the output folder; run_cfg: the ``run.json`` dict (``binding`` and
            :data:`BINDING_KEYS` at least).

    Raises: EvalInputError naming the fields that differ from the folder's binding.
    """
    binding = run_cfg["binding"]
    run_json = out / "run.json"
    if run_json.exists():
        old = json.loads(run_json.read_text())
        if old.get("binding") != binding:
            diff = [k for k in BINDING_KEYS if old.get(k) != run_cfg[k]]
            raise EvalInputError(
                f"--out {out}: bound to another evaluation (binding {str(old.get('binding'))[:12]}"
                f" != {binding[:12]}; differs in: {', '.join(diff) or 'binding'}); results from "
                "another model or run are never reused: choose another --out")
    else:
        out.mkdir(parents=True, exist_ok=True)
        write_json(run_json, {**run_cfg, "created_at": time.time()})
    for sub in ("logs", "controls", "artifacts"):
        (out / sub).mkdir(parents=True, exist_ok=True)


def resume_state(slots_path: Path, binding: str,
                 say: Callable[[str], None]) -> tuple[dict[tuple[str, int], dict], int]:
    """Graded slot rows of this binding by (task id, rollout index), retryable unknowns
    dropped (:data:`eval.evaluation.slots.RETRY_REASONS`), and the number of rows of another
    binding (ignored; ``say`` reports them)."""
    prior = read_rows(slots_path)
    foreign = sum(1 for r in prior if r.get("binding") != binding)
    final: dict[tuple[str, int], dict] = {}
    for r in prior:
        if r.get("binding") != binding:
            continue
        key = (r["task_id"], int(r["rollout_index"]))
        if r.get("unknown_reason") in RETRY_REASONS:
            final.pop(key, None)
        else:
            final[key] = r
    if foreign:
        say(f"eval: ignoring {foreign} slot row(s) of another binding in {slots_path}")
    return final, foreign
