"""The screening record: the candidates a recipe's reference build rejected at screening, so
a later build of the same recipe need not run their trials again.

Most of a cold build's time goes to candidates that are never kept: a mutant that breaks no
test, one that breaks more than ``max_fail_to_pass``, or one that hangs (a hang holds a
verifier slot for the trial timeout and again for its longer retry: two hanging toolz
mutants held both slots of the bundled build for about three of its five minutes). The
record, committed beside its recipe (``datasets/bundled.yaml`` →
``datasets/bundled.screening.json``), lists those rejections by instance id with the
mutation they were made of. A build that uses it gives each recorded candidate its recorded
outcome instead of a trial and runs everything else as before: the screening rounds,
batch sizes, controls and pairs see the same outcomes as the build that wrote it, so the
tasks come out byte for byte the same whenever the recorded rejections would repeat.

A record only ever skips: every kept task is still screened and controlled by its own
trials, so a wrong record can cost a task (a recorded rejection that would now validate
stays out, exactly as in the build that wrote it) but never admit one. It belongs to one
recipe hash (recipe, builder version, image): after any change the build says the record
is stale and screens every candidate; ``python -m eval.build_tasks --force --no-record
--write-record`` writes a new one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from eval.files import write_json
from eval.tasks.bundled.mutations import Mutation

#: Screening outcomes a record may hold: decided by the mutant's own screening trial (a
#: control failure or a kept / screened candidate is never recorded).
RECORDABLE = ("no_failure", "rejected(")

_SCHEMA = 1


def record_path(recipe_path: str | Path) -> Path:
    """The record beside a recipe: ``<dir>/<stem>.screening.json``."""
    p = Path(recipe_path)
    return p.with_name(p.stem + ".screening.json")


def mutation_key(sdist_sha256: str, m: Mutation) -> str:
    """16 hex digits of sha256 over the sdist and the edit (path, offsets, text): an entry
    applies only to the candidate made of exactly this mutation of exactly this source."""
    blob = json.dumps([sdist_sha256, m.path, m.line, m.start, m.end, m.original,
                       m.replacement, m.kind]).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def recordable(outcome: str) -> bool:
    """Whether ``outcome`` is a screening rejection (see :data:`RECORDABLE`)."""
    return outcome == RECORDABLE[0] or outcome.startswith(RECORDABLE[1])


@dataclass
class ScreeningRecord:
    """Recorded screening rejections of one recipe hash.

    Attributes:
        recipe_hash: the build's cache key (:func:`eval.tasks.bundled.recipe.recipe_hash`).
        rejections: instance id → ``{"mutation": mutation_key, "outcome": str}``.
        path: where it was read from or will be written ("" for a new one).
    """

    recipe_hash: str
    rejections: dict[str, dict[str, str]] = field(default_factory=dict)
    path: str = ""

    def outcome(self, instance_id: str, key: str) -> str | None:
        """The recorded outcome of the candidate ``instance_id`` made of mutation ``key``;
        None when not recorded or recorded for another mutation."""
        e = self.rejections.get(instance_id)
        return e["outcome"] if e is not None and e["mutation"] == key else None

    def add(self, instance_id: str, key: str, outcome: str) -> None:
        """Record one screening rejection.

        Raises: ValueError when ``outcome`` is not a screening rejection."""
        if not recordable(outcome):
            raise ValueError(f"screening record: {instance_id}: {outcome!r} is not a "
                             "screening rejection")
        self.rejections[instance_id] = {"mutation": key, "outcome": outcome}

    def save(self, path: str | Path) -> Path:
        """Write the record to ``path`` (key-sorted JSON, atomically: never half-written)."""
        doc = {"schema": _SCHEMA, "recipe_hash": self.recipe_hash,
               "about": "screening rejections of this recipe's reference build "
                        "(eval/tasks/bundled/record.py); python -m eval.build_tasks --force "
                        "--no-record --write-record rewrites it",
               "rejections": self.rejections}
        path = write_json(path, doc, indent=1)
        self.path = str(path)
        return path


def load_record(path: str | Path) -> ScreeningRecord | None:
    """The record at ``path``; None when there is no such file.

    Raises: ValueError naming the path and the field when the file is not a record
    (bad JSON, another schema, an entry without ``mutation`` / ``outcome`` strings, an
    outcome that is not a screening rejection).
    """
    path = Path(path)
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a screening record: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("schema") != _SCHEMA:
        raise ValueError(f"{path}: schema: expected {_SCHEMA}")
    if not isinstance(doc.get("recipe_hash"), str):
        raise ValueError(f"{path}: recipe_hash: expected a string")
    rej = doc.get("rejections")
    if not isinstance(rej, dict):
        raise ValueError(f"{path}: rejections: expected an object")
    rec = ScreeningRecord(doc["recipe_hash"], path=str(path))
    for iid, e in rej.items():
        if not (isinstance(e, dict) and isinstance(e.get("mutation"), str)
                and isinstance(e.get("outcome"), str)):
            raise ValueError(f"{path}: rejections.{iid}: expected "
                             '{"mutation": str, "outcome": str}')
        try:
            rec.add(iid, e["mutation"], e["outcome"])
        except ValueError as exc:
            raise ValueError(f"{path}: rejections.{iid}.outcome: {exc}") from exc
    return rec
