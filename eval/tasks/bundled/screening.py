"""Screening and controls of mutation candidates (pipeline steps 3 and 4 of :mod:`eval.tasks.bundled`).

Screening reads the mutant's test log: FAIL_TO_PASS = listed tests PASSED on pristine and
FAILED/ERROR on the mutant, PASS_TO_PASS = PASSED on both. Controls: the gold patch must
resolve and the empty patch must not (every F2P failing, every P2P passing), graded by
:func:`eval.grading.grader.grade`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eval.grading.flaky import varying_statuses
from eval.tasks.bundled.mutations import Mutation
from eval.tasks.bundled.recipe import PARSER, ModuleSpec, ProjectRecipe, Recipe


@dataclass
class Candidate:
    """One mutant on its way to a task; ``outcome`` goes pending → screened → kept (or a
    rejection reason)."""

    project: ProjectRecipe
    index: int
    mutation: Mutation
    module: ModuleSpec
    instance_id: str
    commit: str = ""
    eval_script: str = ""
    outcome: str = "pending"
    f2p: list[str] = field(default_factory=list)
    p2p: list[str] = field(default_factory=list)
    screen_log: str = ""
    gold: str = ""
    #: a pair task's parts (single candidates that were kept) and its test files (both
    #: modules' tests); empty for a single-mutation candidate
    parts: tuple = ()
    tests: tuple[str, ...] = ()
    #: the outcome came from the screening record (:mod:`.record`), not from a trial
    recorded: bool = False

    @property
    def test_files(self) -> tuple[str, ...]:
        return self.tests or self.module.tests

    @property
    def tag(self) -> str:
        """The id's tail after ``<project>-<version>-`` (``0007``, or ``0007-0012`` for a pair)."""
        return self.instance_id.split(f"-{self.project.version}-", 1)[-1]

    @property
    def mutations(self) -> tuple[Mutation, ...]:
        return tuple(p.mutation for p in self.parts) or (self.mutation,)


def listable_ids(parsed) -> set[str]:
    """Ids the parser reads unambiguously: seen once, brackets balanced."""
    counts: dict[str, int] = {}
    for o in parsed.observations:
        counts[o.test_id] = counts.get(o.test_id, 0) + 1
    return {i for i, c in counts.items() if c == 1 and i.count("[") == i.count("]")}


def in_test_files(test_id: str, tests: tuple[str, ...]) -> bool:
    """Whether ``test_id`` (``path::name``) belongs to one of the files ``tests``."""
    return test_id.split("::", 1)[0] in tests


def screen(c: Candidate, r, base: dict[str, str], recipe: Recipe, parse_log) -> None:
    """Set ``c.outcome`` / F2P / P2P from the mutant's screening trial. A pair candidate
    (``c.parts``) also needs, for each part, one of that part's own FAIL_TO_PASS tests among
    its FAIL_TO_PASS: fixing only the other part then leaves that test failing."""
    c.screen_log = r.log
    if r.exit_class != "ok":
        c.outcome = f"rejected({r.exit_class})"
        return
    parsed = parse_log(r.log, PARSER)
    listed = sorted(i for i in base if in_test_files(i, c.test_files))
    status = parsed.status_map
    f2p = [i for i in listed if status.get(i) in ("FAILED", "ERROR")]
    p2p = [i for i in listed if status.get(i) == "PASSED"]
    odd = [i for i in listed if status.get(i) not in ("FAILED", "ERROR", "PASSED")]
    c.f2p, c.p2p = f2p, p2p
    if parsed.rejected or odd:
        c.outcome = f"rejected({parsed.rejected or f'{len(odd)} tests not observed/skipped'})"
    elif not f2p:
        c.outcome = "no_failure"
    elif len(f2p) > recipe.max_fail_to_pass:
        c.outcome = f"rejected({len(f2p)} FAIL_TO_PASS > {recipe.max_fail_to_pass})"
    elif c.parts and not all(set(p.f2p) & set(f2p) for p in c.parts):
        c.outcome = "rejected(a part's failing tests all pass: fixing one part would resolve)"
    else:
        c.outcome = "screened"


def control(c: Candidate, g, e, grade, gold2=None) -> None:
    """Gold must resolve (complete); empty must not: every F2P FAILED/ERROR, every P2P PASSED.
    With ``gold2`` (a second gold trial) the listed tests' statuses must be the same in both
    gold runs: a candidate with a flaky listed test is dropped."""
    gr = grade(g.log, f2p=c.f2p, p2p=c.p2p, parser=PARSER)
    er = grade(e.log, f2p=c.f2p, p2p=c.p2p, parser=PARSER)
    empty_ok = (er.complete and not er.resolved
                and all(s in ("FAILED", "ERROR") for s in er.f2p.values())
                and all(s == "PASSED" for s in er.p2p.values()))
    flaky: dict[str, list[str]] = {}
    if gold2 is not None:
        g2 = grade(gold2.log, f2p=c.f2p, p2p=c.p2p, parser=PARSER)
        flaky = varying_statuses([{**gr.f2p, **gr.p2p}, {**g2.f2p, **g2.p2p}])
        if gold2.exit_class != "ok":
            flaky = flaky or {"(second gold run)": [g.exit_class, gold2.exit_class]}
    if g.exit_class == "ok" and e.exit_class == "ok" and gr.resolved and gr.complete and empty_ok:
        c.outcome = "kept" if not flaky else f"rejected(flaky: {', '.join(sorted(flaky)[:3])})"
    else:
        c.outcome = (f"control_failed(gold {g.exit_class} resolved={gr.resolved}, "
                     f"empty {e.exit_class} ok={empty_ok})")
