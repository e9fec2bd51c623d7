"""Grade one verifier test log against a task's fixed FAIL_TO_PASS / PASS_TO_PASS lists.

Four layers, each with the source of its rules:

* **Reading** (:func:`eval.grading.log_parsing.read_log`): for pytest logs, statuses come only from
  pytest's own report lines (``-rA`` summary ``STATUS <id>``, ``-v`` ``<id> STATUS [ nn%]``),
  never from captured output, and a listed id is recognised exactly whatever characters it
  holds (:mod:`eval.grading.pytest_report`); other repos use their swebench parser.
  Only the text between the ``>>>>> Start Test Output`` / ``>>>>> End Test Output`` markers
  is read when present, and the raw ordered :class:`Observation` list is kept (design page,
  "Evaluation").
* **SWE-bench report** (``swebench.harness.grading``): ``resolved`` comes from swebench's own
  ``get_eval_tests_report`` + ``get_resolution_status`` on the listed tests' statuses (none
  when ``get_logs_eval`` would reject the log): a missing test fails, XFAIL passes, SKIPPED
  fails a FAIL_TO_PASS test but keeps a PASS_TO_PASS one.
* **Utility** (design page, "Utility and the missing-observation rule"):
  ``U = f2p_passed / |F2P| - 1[any P2P test not passing]`` with
  "passing" taken from that same swebench report; ``None`` when the report is incomplete
  unless the same task's empty-patch control observed every listed test (attribution).
* **Parser agreement**: the same log through swebench's own parser; every listed test whose
  graded status differs is a :class:`ParserDisagreement` (an id swebench cuts at a space, a
  status swebench reads from captured output, a ``-v`` line it does not read), never hidden.

Nothing here touches TRL or a sandbox: the input is log text, the output a
:class:`GradeReport`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from swebench.harness import grading as _swe_grading
from swebench.harness.constants import (
    FAIL_TO_PASS,
    PASS_TO_PASS,
    EvalType,
    ResolvedStatus,
    TestStatus,
)
from swebench.harness.grading import get_eval_tests_report, get_resolution_status
from swebench.types import TestSpec

from eval.grading.log_parsing import (
    BAD_CODES,
    MAP_REPO_TO_PARSER,
    Observation,
    ParsedLog,
    ParserFn,
    parse_log,
    parser_for_repo,
    read_log,
    resolve_parser,
)
from eval.grading.pytest_report import clean_line, fold_statuses
from eval.integrity.missing import ATTRIBUTED, has_utility, missing_observations

__all__ = [
    "MAP_REPO_TO_PARSER",
    "MISSING",
    "GradeReport",
    "Observation",
    "ParsedLog",
    "ParserDisagreement",
    "grade",
    "parse_log",
    "parser_for_repo",
    "read_log",
    "resolve_parser",
]

#: Status reported for a listed test that the log never mentions.
MISSING = "MISSING"

_PASSED = TestStatus.PASSED.value
_FAILED = TestStatus.FAILED.value


def _resolve_case(case: str, status_map: Mapping[str, str]) -> str | None:
    """Status-map key swebench grades ``case`` by (``grading._resolve_case`` when present).

    swebench 5 prefix-matches listed ids truncated mid-parameter (more ``[`` than ``]``)
    when the candidates agree on pass-vs-fail; otherwise the match is exact.
    """
    fn = getattr(_swe_grading, "_resolve_case", None)
    if fn is not None:
        return fn(case, dict(status_map))
    return case if case in status_map else None  # pragma: no cover - older swebench


def _check_list(name: str, value: Any) -> list[str]:
    if not isinstance(value, list):
        raise ValueError(f"{name}: expected a list of test ids, got {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ValueError(f"{name}[{i}]: expected a test id string, got {type(item).__name__}")
    return list(value)


@dataclass(frozen=True)
class ParserDisagreement:
    """A listed test graded differently by swebench's own parser on the same log.

    test_id: the listed id.
    status: our graded status (``MISSING`` when unobserved or the log is rejected).
    swebench_status: the status swebench's parser + ``get_logs_eval`` grade it by.
    reason: ``id_with_whitespace`` (swebench splits the id at a space),
        ``captured_output`` (swebench's status comes from a line that is not a pytest report
        line), ``status_after_id`` (a ``-v`` line swebench does not read),
        ``swebench_key_differs`` (swebench reads the line under another key, e.g. an XFAIL
        reason appended by ``parse_log_pytest_v2``),
        ``swebench_rejects_log:<why>`` / ``log_rejected:<why>`` (only one side rejects the
        log), ``fold_rule`` (a failing status within one pytest session wins over a later
        passing line; swebench keeps the last line).
    """

    test_id: str
    status: str
    swebench_status: str
    reason: str


@dataclass
class GradeReport:
    """What :func:`grade` found. All fields are JSON-friendly except ``observations``
    (dataclasses; :meth:`to_json` converts them).

    resolved: SWE-bench resolved (swebench ``get_resolution_status`` == RESOLVED_FULL on the
        map ``get_logs_eval`` would grade; ``False`` whenever swebench would reject the log).
    resolution_status: ``RESOLVED_FULL`` / ``RESOLVED_PARTIAL`` / ``RESOLVED_NO`` (swebench).
    complete: the log is not rejected (see :class:`ParsedLog`) and every listed test was
        observed.
    truncated: START marker without END marker.
    utility: the utility U, or ``None`` when unavailable.
    attributed: the utility counts missing tests as failures because the control observed
        every listed test.
    control_complete: the control log's own ``complete``; ``None`` without a control log.
    f2p / p2p: listed test id -> observed status in the parsed region (``MISSING`` when
        unobserved), the raw view; grading uses swebench's map.
    missing: listed ids (F2P then P2P, each once) with no observed status.
    duplicates: parser test id -> its statuses in log order, for ids observed more than once.
    classification: per-slot views (design page, "Evaluation"), each a bool, with
        ``expected`` the slot's
        expected outcome (``expected_resolved``; ``None`` means True, a rollout):
        ``raw``: the harness exit status matches ``expected`` (``"ok"`` when expected
        resolved, a known non-"ok" status when not); ``report_binary``: ``resolved ==
        expected``; ``strict``: ``complete``, every listed test observed exactly as PASSED or
        FAILED (no MISSING/SKIPPED/ERROR/XFAIL, no conflicting observations) and (all listed
        PASSED) == expected; ``unknown``: not complete and not attributed (utility None).
    f2p_passed: F2P tests passing under swebench semantics (PASSED or XFAIL).
    p2p_all_passing: every P2P test passing under swebench semantics (PASSED, XFAIL, SKIPPED).
    swebench_report: swebench ``get_eval_tests_report`` output (success/failure lists).
    status_map, observations, region, log_rejected, test_exit_code: see :class:`ParsedLog`.
    harness_exit: the harness exit status used for ``raw`` (given, or derived from the log).
    parser: the parser's registry name.
    reader: ``pytest_report`` or ``swebench_parser`` (see :class:`ParsedLog`).
    resolved_swebench_parser: ``resolved`` as swebench's own parser + ``get_logs_eval`` +
        ``get_eval_tests_report`` grade the same log (swebench 5.0.2 semantics, no protection).
    parser_disagreements: listed tests graded differently by swebench's parser (their count
        is the number of cases where this grader and swebench's read the log differently).
    """

    resolved: bool
    resolution_status: str
    complete: bool
    truncated: bool
    utility: float | None
    attributed: bool
    control_complete: bool | None
    f2p: dict[str, str]
    p2p: dict[str, str]
    missing: list[str]
    duplicates: dict[str, list[str]]
    classification: dict[str, bool]
    f2p_passed: int
    p2p_all_passing: bool
    swebench_report: dict[str, dict[str, list[str]]]
    status_map: dict[str, str]
    observations: list[Observation] = field(default_factory=list)
    region: str = "markers"
    log_rejected: str | None = None
    test_exit_code: int | None = None
    harness_exit: str | None = None
    parser: str = ""
    reader: str = "swebench_parser"
    resolved_swebench_parser: bool | None = None
    parser_disagreements: list[ParserDisagreement] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Plain dict (observations and disagreements as dicts), ready for ``json.dumps``."""
        return asdict(self)


def _derive_harness_exit(parsed: ParsedLog) -> str | None:
    """Harness exit status read from the log: a swebench harness failure marker, else the
    recorded test exit status (0 -> ``"ok"``, n -> ``"exit_n"``), else ``None``."""
    if parsed.rejected in {reason for _, reason in BAD_CODES}:
        return parsed.rejected
    if parsed.test_exit_code is None:
        return None
    return "ok" if parsed.test_exit_code == 0 else f"exit_{parsed.test_exit_code}"


def _spec(name: str, f2p: list[str], p2p: list[str]) -> TestSpec:
    return TestSpec(
        instance_id="", image="", eval_script_list=[], repo="", version="",
        FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p, log_parser=name,
        eval_type=EvalType.PASS_AND_FAIL.value,
    )


def _swebench_keys(parsed: ParsedLog, log_text: str, fn: ParserFn, spec: TestSpec
                   ) -> list[dict[str, str]]:
    """Per observation of the report reader: what swebench's parser reads on that line alone
    (its key normalisation: ids cut at a space, ``pytest_options`` path shortening, ...)."""
    if parsed.reader != "pytest_report":
        return [{} for _ in parsed.observations]
    lines = log_text.split("\n")
    return [fn(clean_line(lines[o.line_no - 1]), spec) for o in parsed.observations]


def _listed_statuses(
    parsed: ParsedLog, listed: Sequence[str], log_text: str, fn: ParserFn, spec: TestSpec
) -> tuple[dict[str, str], dict[str, list[Observation]]]:
    """listed id -> status (``MISSING`` when unobserved), listed id -> its observations.

    Lookup order: the id exactly as read; else swebench's key for the report lines that name
    no listed id exactly (``_resolve_case``: the ids SWE-bench stores cut at a space,
    truncated mid-parameter, or path-shortened by ``parse_log_pytest_options``); else
    ``_resolve_case`` over the ids as read (truncated listed ids against full ids).
    """
    by_id: dict[str, list[Observation]] = {}
    for o in parsed.observations:
        by_id.setdefault(o.test_id, []).append(o)
    sw_obs: dict[str, list[Observation]] = {}
    entries = []
    named = set(listed)
    for o, keys in zip(parsed.observations, _swebench_keys(parsed, log_text, fn, spec),
                       strict=True):
        if o.test_id in named:
            continue  # the line names a listed id exactly: it speaks of that test only
        for k, s in keys.items():
            entries.append((k, s, o.session))
            sw_obs.setdefault(k, []).append(o)
    sw_map = fold_statuses(entries)
    sm = parsed.status_map
    status: dict[str, str] = {}
    obs: dict[str, list[Observation]] = {}
    lookups = (
        (lambda t: t if t in sm else None, sm, by_id),
        (lambda t: _resolve_case(t, sw_map), sw_map, sw_obs),
        (lambda t: _resolve_case(t, sm), sm, by_id),
    )
    for t in listed:
        for find, table, source in lookups:
            key = find(t)
            if key is not None:
                status[t], obs[t] = table[key], source.get(key, [])
                break
        else:
            status[t], obs[t] = MISSING, []
    return status, obs


def _swebench_report(graded: Mapping[str, str], f2p: list[str], p2p: list[str]
                     ) -> dict[str, dict[str, list[str]]]:
    """swebench ``get_eval_tests_report`` (PASS_AND_FAIL) on the listed tests' statuses, one
    test at a time so that a missing id never prefix-matches another listed id."""
    out: dict[str, dict[str, list[str]]] = {
        k: {"success": [], "failure": []}
        for k in (FAIL_TO_PASS, PASS_TO_PASS, "FAIL_TO_FAIL", "PASS_TO_FAIL")
    }
    for which, tests in ((FAIL_TO_PASS, f2p), (PASS_TO_PASS, p2p)):
        for t in tests:
            gold = {FAIL_TO_PASS: [], PASS_TO_PASS: [], which: [t]}
            one = get_eval_tests_report({t: graded[t]} if t in graded else {}, gold,
                                        eval_type=EvalType.PASS_AND_FAIL)
            for k in ("success", "failure"):
                out[which][k] += one[which][k]
    return out


def _duplicates(observations: Sequence[Observation]) -> dict[str, list[str]]:
    """id -> statuses in log order, for ids read more than once in the same report style
    (a ``-v`` line plus its ``-rA`` summary line is one test reported once each way)."""
    per_style = Counter((o.test_id, o.style) for o in observations)
    twice = {i for (i, _), n in per_style.items() if n > 1}
    by_id: dict[str, list[str]] = {}
    for o in observations:
        if o.test_id in twice:
            by_id.setdefault(o.test_id, []).append(o.status)
    return by_id


def _utility(report: Mapping[str, Mapping[str, list[str]]], f2p: list[str], p2p: list[str]
             ) -> float:
    """U = ``f2p_passed / |F2P| - 1[any P2P not passing]``; F2P term 0 when empty."""
    f2p_term = len(report[FAIL_TO_PASS]["success"]) / len(f2p) if f2p else 0.0
    return f2p_term - (0.0 if len(report[PASS_TO_PASS]["success"]) == len(p2p) else 1.0)


def _classify(*, expected: bool, exit_status: str | None, resolved: bool, complete: bool,
              attributed: bool, status: Mapping[str, str],
              obs_of: Mapping[str, list[Observation]]) -> dict[str, bool]:
    """The slot views (see :func:`grade`)."""
    raw = exit_status == "ok" if expected else (exit_status is not None and exit_status != "ok")
    clean = (complete
             and all(s in (_PASSED, _FAILED) for s in status.values())
             and all(len({o.status for o in obs_of[t]}) <= 1 for t in status))
    all_passed = all(s == _PASSED for s in status.values())
    return {
        "raw": raw,
        "report_binary": resolved == expected,
        "strict": clean and all_passed == expected,
        "unknown": not complete and not attributed,
    }


def _graded_status(rejected: str | None, status_map: Mapping[str, str], test_id: str) -> str:
    if rejected:
        return MISSING
    key = _resolve_case(test_id, status_map)
    return MISSING if key is None else status_map[key]


def _disagreement_reason(t: str, sw: ParsedLog, parsed: ParsedLog, sw_report_only: str,
                         sw_status: str, line_keys: list[tuple[str, dict[str, str]]]) -> str:
    """Why swebench grades ``t`` differently (see :class:`ParserDisagreement`);
    ``line_keys``: (style, swebench's reading of the line) for each observation of ``t``."""
    if bool(sw.rejected) != bool(parsed.rejected):
        return (f"swebench_rejects_log:{sw.rejected}" if sw.rejected
                else f"log_rejected:{parsed.rejected}")
    if sw_report_only != sw_status:
        return "captured_output"
    if any(ch.isspace() for ch in t):
        return "id_with_whitespace"
    if any(style == "verbose" and not keys for style, keys in line_keys):
        return "status_after_id"
    if any(t not in keys for _, keys in line_keys):
        return "swebench_key_differs"
    return "fold_rule"


def _parser_agreement(
    log_text: str, fn: ParserFn, spec: TestSpec, parsed: ParsedLog, status: Mapping[str, str],
    obs_of: Mapping[str, list[Observation]], f2p: list[str], p2p: list[str],
) -> tuple[list[ParserDisagreement], bool]:
    """swebench's own verdict on the same log, and the listed tests it grades differently."""
    sw = parse_log(log_text, fn, test_spec=spec)
    sw_graded = {} if sw.rejected else sw.status_map
    report = get_eval_tests_report(sw_graded, {FAIL_TO_PASS: f2p, PASS_TO_PASS: p2p},
                                   eval_type=EvalType.PASS_AND_FAIL)
    sw_resolved = (sw.rejected is None
                   and get_resolution_status(report) == ResolvedStatus.FULL.value)
    if parsed.reader != "pytest_report":
        return [], sw_resolved
    lines = log_text.split("\n")
    report_text = "\n".join(lines[o.line_no - 1] for o in parsed.observations)
    report_only = fn(report_text, spec)
    out = []
    for t in dict.fromkeys(f2p + p2p):
        ours = MISSING if parsed.rejected else status[t]
        theirs = _graded_status(sw.rejected, sw.status_map, t)
        if ours != theirs:
            line_keys = [(o.style, fn(clean_line(lines[o.line_no - 1]), spec))
                         for o in obs_of[t]]
            why = _disagreement_reason(t, sw, parsed, _graded_status(sw.rejected, report_only, t),
                                       theirs, line_keys)
            out.append(ParserDisagreement(t, ours, theirs, why))
    return out, sw_resolved


def _check_args(f2p: Any, p2p: Any, control_log: Any, harness_exit: Any,
                expected_resolved: Any) -> tuple[list[str], list[str]]:
    f2p = _check_list("f2p", f2p)
    p2p = _check_list("p2p", p2p)
    if control_log is not None and not isinstance(control_log, str):
        raise ValueError(f"control_log: expected str or None, got {type(control_log).__name__}")
    if harness_exit is not None and not isinstance(harness_exit, str):
        raise ValueError(f"harness_exit: expected str or None, got {type(harness_exit).__name__}")
    if expected_resolved is not None and not isinstance(expected_resolved, bool):
        raise ValueError(
            f"expected_resolved: expected bool or None, got {type(expected_resolved).__name__}"
        )
    return f2p, p2p


def _observe(log_text: str, fn: ParserFn, spec: TestSpec, listed: list[str]
             ) -> tuple[ParsedLog, dict[str, str], dict[str, list[Observation]], bool]:
    """Read one log: (parsed, listed statuses, their observations, complete)."""
    parsed = read_log(log_text, fn, listed=listed, test_spec=spec)
    status, obs_of = _listed_statuses(parsed, listed, log_text, fn, spec)
    complete = parsed.rejected is None and all(s != MISSING for s in status.values())
    return parsed, status, obs_of, complete


def grade(
    log_text: str,
    *,
    f2p: list[str],
    p2p: list[str],
    parser: str | ParserFn,
    control_log: str | None = None,
    harness_exit: str | None = None,
    expected_resolved: bool | None = None,
) -> GradeReport:
    """Grade one verifier log against the task's fixed FAIL_TO_PASS / PASS_TO_PASS lists.

    Steps (rules and sources: module docstring, :class:`GradeReport`): read the listed tests'
    statuses (:func:`_observe`) -> swebench's report on them (:func:`_swebench_report`; a
    rejected log never resolves) -> utility (:func:`_utility`; when not ``complete``, only if
    the ``control_log`` is complete: ``attributed``) -> slot views (:func:`_classify`)
    -> swebench's own parser on the same log (:func:`_parser_agreement`).

    Args:
        log_text: verifier test log.
        f2p, p2p: FAIL_TO_PASS / PASS_TO_PASS test ids (lists of str).
        parser: see :func:`resolve_parser`.
        control_log: the same task's empty-patch control log, or None.
        harness_exit: harness exit status of this trial ("ok" = test run succeeded), or None
            (then read from the log: swebench failure marker, or ``>>>>> Test Exit Code: N``).
        expected_resolved: expected outcome of this slot (gold control True, empty control
            False, rollout None/True).

    Returns:
        GradeReport.

    Raises:
        ValueError: naming the field (``log_text``, ``f2p``, ``p2p``, ``parser``, ...).
    """
    f2p, p2p = _check_args(f2p, p2p, control_log, harness_exit, expected_resolved)
    name, fn = resolve_parser(parser)
    spec = _spec(name, f2p, p2p)
    listed = list(dict.fromkeys(f2p + p2p))
    parsed, status, obs_of, complete = _observe(log_text, fn, spec, listed)
    graded = {} if parsed.rejected else {t: s for t, s in status.items() if s != MISSING}
    report = _swebench_report(graded, f2p, p2p)
    # get_eval_report stops before grading a rejected log: resolved False, status NO.
    resolution = (get_resolution_status(report) if parsed.rejected is None
                  else ResolvedStatus.NO.value)
    resolved = resolution == ResolvedStatus.FULL.value
    control_complete = None if control_log is None else _observe(control_log, fn, spec, listed)[3]
    reading = missing_observations(complete, control_complete)  # the missing-observation rule
    attributed = reading == ATTRIBUTED
    exit_status = harness_exit if harness_exit is not None else _derive_harness_exit(parsed)
    disagreements, sw_resolved = _parser_agreement(log_text, fn, spec, parsed, status, obs_of,
                                                   f2p, p2p)
    return GradeReport(
        resolved=resolved,
        resolution_status=resolution,
        complete=complete,
        truncated=parsed.truncated,
        utility=_utility(report, f2p, p2p) if has_utility(reading) else None,
        attributed=attributed,
        control_complete=control_complete,
        f2p={t: status[t] for t in f2p},
        p2p={t: status[t] for t in p2p},
        missing=[t for t in listed if status[t] == MISSING],
        duplicates=_duplicates(parsed.observations),
        classification=_classify(
            expected=True if expected_resolved is None else expected_resolved,
            exit_status=exit_status, resolved=resolved, complete=complete,
            attributed=attributed, status=status, obs_of=obs_of),
        f2p_passed=len(report[FAIL_TO_PASS]["success"]),
        p2p_all_passing=len(report[PASS_TO_PASS]["success"]) == len(p2p),
        swebench_report=report,
        status_map=dict(parsed.status_map),
        observations=list(parsed.observations),
        region=parsed.region,
        log_rejected=parsed.rejected,
        test_exit_code=parsed.test_exit_code,
        harness_exit=exit_status,
        parser=name,
        reader=parsed.reader,
        resolved_swebench_parser=sw_resolved,
        parser_disagreements=disagreements,
    )
