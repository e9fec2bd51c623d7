"""Flaky listed tests: named, never averaged away (design page, "Evaluation").

A listed test is *flaky* when its observed status differs between repeats of the same patch
(the gold patch run N times, or the empty patch run N times, each in a fresh container).
``MISSING`` is a status like any other here: a test observed in one repeat and not in another
is flaky. Repeats that ended in ``infra_error`` carry no statuses and are left out.

The rule (:func:`flaky_rule`): a task with a flaky FAIL_TO_PASS test is not admitted; a flaky
PASS_TO_PASS test is dropped from the task's PASS_TO_PASS list for utility and resolution;
``keep_flaky`` overrides both (the flaky tests stay named in the manifest either way).

Pure functions; the controls (:mod:`eval.controls`), the bundled builder and ``eval.run`` use
them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["FLAKY_RULE", "FlakyTests", "drop_flaky_p2p", "find_flaky", "flaky_rule",
           "flaky_slot_counts", "varying_statuses"]

#: Recorded in every admission manifest.
FLAKY_RULE = (
    "A listed test is flaky when its status (MISSING included) differs between repeats of the "
    "same patch (gold repeated, empty repeated; infra_error repeats left out). A task with a "
    "flaky FAIL_TO_PASS test is not admitted; a flaky PASS_TO_PASS test is dropped from the "
    "task's PASS_TO_PASS list for utility and resolution; --keep-flaky keeps both. Flaky tests "
    "are listed per task in the manifest either way."
)


def varying_statuses(repeats: Sequence[Mapping[str, str]]) -> dict[str, list[str]]:
    """test id -> its status in every repeat, for ids whose status is not the same in all.

    Args:
        repeats: one ``test id -> status`` map per repeat of the same patch; an id absent
            from a repeat counts as ``"MISSING"`` there.

    Returns:
        ``{id: [status per repeat]}`` in first-seen id order; empty with fewer than 2 repeats.
    """
    if len(repeats) < 2:
        return {}
    ids = list(dict.fromkeys(t for r in repeats for t in r))
    out = {}
    for t in ids:
        seen = [r.get(t, "MISSING") for r in repeats]
        if len(set(seen)) > 1:
            out[t] = seen
    return out


@dataclass
class FlakyTests:
    """Flaky listed tests of one task.

    f2p / p2p: flaky FAIL_TO_PASS / PASS_TO_PASS ids, in list order.
    statuses: role (``gold`` / ``empty``) -> id -> status per usable repeat, flaky ids only.
    repeats: role -> number of usable (non-infra) repeats.
    """

    f2p: list[str] = field(default_factory=list)
    p2p: list[str] = field(default_factory=list)
    statuses: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    repeats: dict[str, int] = field(default_factory=dict)

    @property
    def any(self) -> bool:
        """True when some listed test is flaky."""
        return bool(self.f2p or self.p2p)

    def to_json(self) -> dict[str, Any]:
        """Plain dict."""
        return asdict(self)


def find_flaky(by_role: Mapping[str, Sequence[Mapping[str, str]]], f2p: Sequence[str],
               p2p: Sequence[str]) -> FlakyTests:
    """Flaky listed tests from repeated controls.

    Args:
        by_role: role -> the listed tests' statuses per usable repeat (each a
            ``{id: status}`` map, e.g. a grade report's ``f2p`` and ``p2p`` merged).
        f2p, p2p: the task's lists.

    Returns:
        FlakyTests (ids in list order; a test flaky under either patch counts once).
    """
    statuses: dict[str, dict[str, list[str]]] = {}
    flaky: set[str] = set()
    listed = set(f2p) | set(p2p)
    for role, repeats in by_role.items():
        varying = {t: s for t, s in varying_statuses(repeats).items() if t in listed}
        if varying:
            statuses[role] = varying
            flaky |= set(varying)
    return FlakyTests(f2p=[t for t in f2p if t in flaky], p2p=[t for t in p2p if t in flaky],
                      statuses=statuses,
                      repeats={role: len(r) for role, r in by_role.items()})


def flaky_rule(flaky: FlakyTests, p2p: Sequence[str], *, keep_flaky: bool = False
               ) -> tuple[list[str], list[str], list[str]]:
    """Apply :data:`FLAKY_RULE` to one task.

    Returns:
        ``(reasons not to admit, PASS_TO_PASS list for utility, dropped PASS_TO_PASS ids)``.
    """
    if keep_flaky:
        return [], list(p2p), []
    reasons = [f"flaky FAIL_TO_PASS: {', '.join(flaky.f2p[:5])}"] if flaky.f2p else []
    dropped = [t for t in p2p if t in set(flaky.p2p)]
    return reasons, [t for t in p2p if t not in set(dropped)], dropped


def drop_flaky_p2p(tasks: Sequence[Any], p2p_dropped: Mapping[str, Sequence[str]]) -> list[Any]:
    """The tasks with each one's dropped flaky P2P tests removed from ``PASS_TO_PASS``
    (an admission manifest's ``p2p_dropped``); tasks without drops are returned as they are.
    ``tasks``: dataclasses with ``instance_id`` and ``PASS_TO_PASS``."""
    from dataclasses import replace

    out = []
    for t in tasks:
        gone = set(p2p_dropped.get(t.instance_id) or ())
        out.append(replace(t, PASS_TO_PASS=[x for x in t.PASS_TO_PASS if x not in gone])
                   if gone else t)
    return out


def flaky_slot_counts(slot_task_ids: Sequence[str], admission: Mapping[str, Any] | None
                      ) -> dict[str, Any]:
    """How many evaluation slots depended on a flaky test (per split: one ``eval.run``).

    Args:
        slot_task_ids: the task id of every graded slot.
        admission: :func:`eval.controls.check_admission`'s record, or None (no manifest).

    Returns:
        ``{"repeats", "tasks_with_flaky", "slots_of_flaky_tasks", "slots_depending_on_flaky"
        (graded on a flaky test still in its lists: a flaky F2P test of an admitted task, or
        a flaky P2P test kept by --keep-flaky), "p2p_tests_dropped"}``; ``repeats`` is None
        without a manifest (flakiness was not measured).
    """
    adm = admission or {}
    flaky = adm.get("flaky") or {}
    dropped = adm.get("p2p_dropped") or {}
    depends = {t for t, f in flaky.items()
               if f.get("f2p") or set(f.get("p2p") or ()) - set(dropped.get(t) or ())}
    return {"repeats": adm.get("repeats", 1) if admission else None,
            "tasks_with_flaky": len(flaky),
            "slots_of_flaky_tasks": sum(t in flaky for t in slot_task_ids),
            "slots_depending_on_flaky": sum(t in depends for t in slot_task_ids),
            "p2p_tests_dropped": sum(len(v) for v in dropped.values())}
