"""The training / held-out split of a world recipe (one with a ``heldout`` field, e.g.
``datasets/procedural.yaml``): which unit of code an instance mutates and which split that
unit belongs to. Pure functions; the builder records both on every task
(``extra["unit"]``, ``extra["split"]``) and the loader reads them back.

A held-out split is by unit, never by instance: every instance that mutates one function
(or one module) lands on the same side, so no training instance breaks a function a held-out
instance breaks (design page, "Evaluation": generalisation is measured on bugs in code the
policy was never trained to fix). The training repositories still hold the pristine code of
held-out functions (a split by function shares modules, and a method's class with other
methods), which an agent may read; only a split by module keeps whole files apart.
"""

from __future__ import annotations

import hashlib

from eval.tasks.bundled.multi import single_id
from eval.tasks.bundled.mutations import Mutation, choose_candidates
from eval.tasks.bundled.recipe import HeldoutSpec, Recipe

#: The two sides of a world split, as recorded in ``extra["split"]``.
SPLITS = ("train", "heldout")


def unit_of(m: Mutation, by: str) -> str:
    """The unit ``m`` belongs to: ``"<path>"`` (``by="module"``) or ``"<path>::<function>"``
    (``by="function"``, the class-qualified top-level function holding the site).

    Raises: ValueError for another ``by``, or a function-level unit of a mutation that
    records no function.
    """
    if by == "module":
        return m.path
    if by == "function":
        if not m.function:
            raise ValueError(f"mutation {m.path}:{m.line} records no function")
        return f"{m.path}::{m.function}"
    raise ValueError(f"unknown held-out unit {by!r} (expected 'module' or 'function')")


def unit_split(seed: int, project: str, unit: str, fraction: float) -> str:
    """``"heldout"`` when ``int(sha256("<seed>:<project>:<unit>")[:8 bytes]) / 2**64`` is
    below ``fraction``, else ``"train"``: a deterministic draw per unit, the same on every
    machine, independent of which instances validate."""
    digest = hashlib.sha256(f"{seed}:{project}:{unit}".encode()).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") / 2 ** 64 < fraction else "train"


def instance_split(seed: int, project: str, m: Mutation, spec: HeldoutSpec) -> tuple[str, str]:
    """``(unit, split)`` of a single-mutation instance under ``spec``."""
    unit = unit_of(m, spec.by)
    return unit, unit_split(seed, project, unit, spec.fraction)


def heldout_ids(recipe: Recipe, texts: dict[str, dict[str, str]]) -> set[str]:
    """Ids of every candidate of ``recipe`` (a world recipe) whose unit is held out, whether
    or not it validates: what the training guard refuses by id, so a row whose
    ``extra["split"]`` was edited or dropped is still refused.

    Args:
        texts: project name -> repo-relative path -> text of every module and test file the
            recipe names (what :func:`eval.tasks.bundled.mutations.choose_candidates` reads).

    Raises: ValueError when ``recipe`` has no ``heldout`` field; KeyError for a project or
    file missing from ``texts``.
    """
    if recipe.heldout is None:
        raise ValueError("heldout_ids: the recipe has no 'heldout' field")
    out: set[str] = set()
    for p in recipe.projects:
        for k, m in enumerate(choose_candidates(p, texts[p.name], recipe)):
            if instance_split(recipe.seed, p.name, m, recipe.heldout)[1] == "heldout":
                out.add(single_id(p.name, p.version, k, recipe.id_prefix))
    return out
