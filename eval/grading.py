"""Grade one verifier test log against a task's fixed FAIL_TO_PASS / PASS_TO_PASS lists.

Three layers, each with the source of its rules:

* **Parsing** (swebench ``log_parsers``): the repo's swebench log parser turns the test
  output into a status map ``test id -> PASSED|FAILED|SKIPPED|ERROR|XFAIL``. Like
  ``swebench.harness.grading.get_logs_eval``, only the text between the
  ``>>>>> Start Test Output`` / ``>>>>> End Test Output`` markers is parsed when the markers
  are present. Next to the (last-wins) status map we keep the raw ordered
  :class:`Observation` list, one entry per parsed line, duplicates and reused names included
  (DESIGN §4).
* **SWE-bench report** (``swebench.harness.grading``): ``resolved`` comes from swebench's own
  ``get_eval_tests_report`` + ``get_resolution_status`` on the status map swebench would
  grade (empty when ``get_logs_eval`` would reject the log): a missing test fails, XFAIL
  passes, SKIPPED fails a FAIL_TO_PASS test but keeps a PASS_TO_PASS one.
* **Utility** (DESIGN §3): ``U = f2p_passed / |F2P| - 1[any P2P test not passing]`` with
  "passing" taken from that same swebench report; ``None`` when the report is incomplete
  unless the same task's empty-patch control observed every listed test (attribution).

Nothing here touches TRL or a sandbox: the input is log text, the output a
:class:`GradeReport`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from swebench.harness import grading as _swe_grading
from swebench.harness.constants import (
    APPLY_PATCH_FAIL,
    END_TEST_OUTPUT,
    FAIL_TO_PASS,
    PASS_TO_PASS,
    RESET_FAILED,
    START_TEST_OUTPUT,
    TESTS_ERROR,
    TESTS_TIMEOUT,
    EvalType,
    ResolvedStatus,
    TestStatus,
)
from swebench.harness.grading import get_eval_tests_report, get_resolution_status
from swebench.harness.log_parsers import PARSER_REGISTRY
from swebench.types import TestSpec

__all__ = [
    "MAP_REPO_TO_PARSER",
    "MISSING",
    "GradeReport",
    "Observation",
    "ParsedLog",
    "grade",
    "parse_log",
    "parser_for_repo",
    "resolve_parser",
]

#: Status reported for a listed test that the log never mentions.
MISSING = "MISSING"

ParserFn = Callable[[str, Any], dict]

# swebench's get_logs_eval rejects a log holding any of these harness markers.
_BAD_CODES: tuple[tuple[str, str], ...] = (
    (APPLY_PATCH_FAIL, "patch_apply_failed"),
    (RESET_FAILED, "reset_failed"),
    (TESTS_ERROR, "tests_errored"),
    (TESTS_TIMEOUT, "tests_timed_out"),
)
_PASSED = TestStatus.PASSED.value
_FAILED = TestStatus.FAILED.value
_ERROR = TestStatus.ERROR.value


def _build_repo_map() -> dict[str, ParserFn]:
    """repo ("owner/name") -> swebench log parser.

    swebench < 5 exports one ``MAP_REPO_TO_PARSER``; swebench 5 keeps one map per language
    (``MAP_REPO_TO_PARSER_PY``, ``_JS``, ...) in ``swebench.harness.log_parsers.<lang>``.
    """
    pkg = importlib.import_module("swebench.harness.log_parsers")
    merged = getattr(pkg, "MAP_REPO_TO_PARSER", None)
    if isinstance(merged, dict):
        return dict(merged)
    out: dict[str, ParserFn] = {}
    for lang in ("python", "javascript", "c", "go", "java", "php", "ruby", "rust"):
        try:
            mod = importlib.import_module(f"swebench.harness.log_parsers.{lang}")
        except ImportError:  # pragma: no cover - depends on the swebench build
            continue
        for name in dir(mod):
            value = getattr(mod, name)
            if name.startswith("MAP_REPO_TO_PARSER") and isinstance(value, dict):
                out.update(value)
    return out


#: repo ("owner/name") -> swebench log parser function (swebench's per-repo maps, merged).
MAP_REPO_TO_PARSER: dict[str, ParserFn] = _build_repo_map()


def _registry_name(fn: ParserFn) -> str:
    """The PARSER_REGISTRY key of ``fn`` (its own ``__name__`` preferred), else its name."""
    own = getattr(fn, "__name__", None)
    if own in PARSER_REGISTRY and PARSER_REGISTRY[own] is fn:
        return own
    for key, value in PARSER_REGISTRY.items():
        if value is fn:
            return key
    return own or repr(fn)


def resolve_parser(parser: str | ParserFn) -> tuple[str, ParserFn]:
    """Turn ``parser`` into ``(name, function)``.

    ``parser`` may be a callable ``(log: str, test_spec) -> dict[str, str]`` (a swebench log
    parser), a swebench ``PARSER_REGISTRY`` key (``"parse_log_pytest"``), the same without
    its prefix (``"pytest"``, ``"django"``) or a repo known to swebench (``"django/django"``).

    Raises:
        ValueError: naming ``parser`` when the name is unknown or the value is neither a
            string nor a callable.
    """
    if isinstance(parser, str):
        if parser in PARSER_REGISTRY:
            return parser, PARSER_REGISTRY[parser]
        if f"parse_log_{parser}" in PARSER_REGISTRY:
            return f"parse_log_{parser}", PARSER_REGISTRY[f"parse_log_{parser}"]
        if parser in MAP_REPO_TO_PARSER:
            fn = MAP_REPO_TO_PARSER[parser]
            return _registry_name(fn), fn
        raise ValueError(
            f"parser: unknown log parser {parser!r}; expected a swebench PARSER_REGISTRY key "
            "(e.g. 'parse_log_pytest'), its short form ('pytest') or a repo in "
            "MAP_REPO_TO_PARSER (e.g. 'django/django')"
        )
    if callable(parser):
        return _registry_name(parser), parser
    raise ValueError(f"parser: expected a parser name or a callable, got {type(parser).__name__}")


def parser_for_repo(repo: str) -> tuple[str, ParserFn]:
    """``(name, function)`` of swebench's log parser for ``repo`` (``MAP_REPO_TO_PARSER``).

    Raises:
        ValueError: naming ``repo`` when swebench has no parser for it.
    """
    if not isinstance(repo, str) or repo not in MAP_REPO_TO_PARSER:
        raise ValueError(f"repo: no swebench log parser for repo {repo!r} (MAP_REPO_TO_PARSER)")
    fn = MAP_REPO_TO_PARSER[repo]
    return _registry_name(fn), fn


@dataclass(frozen=True)
class Observation:
    """One test status as the log parser read it.

    test_id: the id exactly as the parser produced it (may be truncated by the parser).
    status: a swebench ``TestStatus`` value (``PASSED``, ``FAILED``, ...).
    line_no: 1-based line of the *whole* log text on which the status was read.
    """

    test_id: str
    status: str
    line_no: int


@dataclass
class ParsedLog:
    """Result of :func:`parse_log`.

    status_map: the parser's map over the graded region (last status wins), as swebench has it.
    observations: every status the parser read, in log order, duplicates included.
    region: which text was parsed — ``"markers"`` (between START/END), ``"after_start_marker"``
        (START without END: the log is truncated), ``"whole_log"`` (no markers at all) or
        ``"whole_log_fallback"`` (markers present but nothing parsed between them, so the
        whole log was parsed, as ``get_logs_eval`` does).
    truncated: START marker present without an END marker.
    rejected: ``None`` when ``swebench.harness.grading.get_logs_eval`` would accept this log,
        else the reason it would not (``patch_apply_failed``, ``reset_failed``,
        ``tests_errored``, ``tests_timed_out``, ``truncated``, ``missing_start_marker``,
        ``no_test_results``, ``exit_code_contradicts_log``). A log with neither marker is
        accepted as all test output (our bundled tasks), where swebench would reject it.
    test_exit_code: the test command's exit status recorded after the END marker
        (``>>>>> Test Exit Code: N``), or ``None``.
    """

    status_map: dict[str, str]
    observations: list[Observation]
    region: str
    truncated: bool
    rejected: str | None
    test_exit_code: int | None


_WINDOW = 32


def _locate_in_window(
    key: str, status: str, lines: list[str], parse: Callable[[str], dict]
) -> int | None:
    """Index of the line at which ``key`` gets ``status`` when parsing a window that starts at
    one of the lines mentioning ``key`` (latest mention first), or None."""
    for start in reversed([i for i, line in enumerate(lines) if key in line]):
        for width in range(2, min(_WINDOW, len(lines) - start) + 1):
            if parse("\n".join(lines[start:start + width])).get(key) == status:
                return start + width - 1
    return None


def _observations(
    lines: list[str], base_line: int, parse: Callable[[str], dict], final: dict[str, str]
) -> list[Observation]:
    """Ordered observations of ``lines`` (``"\\n".join(lines)`` parsed gives ``final``).

    Each line is parsed on its own. Parsers with cross-line state (django's "ok" printed on a
    later line than its test, its multi-line patterns) can give a test a final status that no
    single line shows. For those tests only, the line is located by parsing short windows
    (up to ``_WINDOW`` lines) starting at the test's latest mention, else by bisecting over
    prefixes of the region (memoised) for the line where the final status first appears.
    """
    obs: list[Observation] = []
    last: dict[str, str] = {}
    for i, line in enumerate(lines):
        for test_id, status in parse(line).items():
            obs.append(Observation(test_id, status, base_line + i))
            last[test_id] = status
    pending = [k for k, v in final.items() if last.get(k) != v]
    if not pending:
        return obs
    extra: list[Observation] = []
    unlocated: list[str] = []
    for key in pending:
        at = _locate_in_window(key, final[key], lines, parse)
        if at is None:
            unlocated.append(key)
        else:
            extra.append(Observation(key, final[key], base_line + at))
    pending = unlocated
    cache: dict[int, dict] = {len(lines): final, 0: {}}

    def prefix(j: int) -> dict:
        if j not in cache:
            cache[j] = parse("\n".join(lines[:j]))
        return cache[j]

    # Invariant per key: status at prefix lo != final, at prefix hi == final.
    stack: list[tuple[int, int, list[str]]] = [(0, len(lines), pending)] if pending else []
    while stack:
        lo, hi, keys = stack.pop()
        if hi - lo <= 1:
            extra.extend(Observation(k, final[k], base_line + hi - 1) for k in keys)
            continue
        mid = (lo + hi) // 2
        at_mid = prefix(mid)
        left = [k for k in keys if at_mid.get(k) == final[k]]
        right = [k for k in keys if at_mid.get(k) != final[k]]
        if left:
            stack.append((lo, mid, left))
        if right:
            stack.append((mid, hi, right))
    obs.extend(extra)
    obs.sort(key=lambda o: o.line_no)  # stable: same-line order kept
    return obs


def parse_log(
    log_text: str, parser: str | ParserFn, *, test_spec: TestSpec | None = None
) -> ParsedLog:
    """Parse ``log_text`` with a swebench log parser, keeping the ordered observations.

    Region and rejection rules mirror ``swebench.harness.grading.get_logs_eval`` (swebench
    5.0.2): the text ``log.split(START)[1].split(END)[0]``; the whole log when that parses to
    nothing; harness failure markers, a missing marker, an empty map without swebench's
    ``SUITE_RAN`` evidence, or a non-zero recorded test exit status with no FAILED/ERROR in the
    map make the log rejected. Unlike swebench, a log with no marker at all is parsed whole
    and not rejected (bundled tasks whose harness prints no markers).

    Args:
        log_text: the verifier's test log (str).
        parser: see :func:`resolve_parser`.
        test_spec: passed to the parser (python parsers ignore it); a blank one by default.

    Raises:
        ValueError: naming ``log_text`` or ``parser`` for bad input.
    """
    if not isinstance(log_text, str):
        raise ValueError(f"log_text: expected str, got {type(log_text).__name__}")
    name, fn = resolve_parser(parser)
    spec = test_spec or TestSpec(
        instance_id="", image="", eval_script_list=[], repo="", version="",
        FAIL_TO_PASS=[], PASS_TO_PASS=[], log_parser=name,
    )

    def parse(text: str) -> dict:
        return fn(text, spec)

    has_start = START_TEST_OUTPUT in log_text
    has_end = END_TEST_OUTPUT in log_text
    truncated = has_start and not has_end
    if has_start:
        offset = log_text.index(START_TEST_OUTPUT) + len(START_TEST_OUTPUT)
        region_text = log_text.split(START_TEST_OUTPUT)[1].split(END_TEST_OUTPUT)[0]
        region = "markers" if has_end else "after_start_marker"
    else:
        offset, region_text, region = 0, log_text, "whole_log"
    status_map = parse(region_text)
    if not status_map and has_start and has_end:
        offset, region_text, region = 0, log_text, "whole_log_fallback"
        status_map = parse(region_text)
    base_line = log_text.count("\n", 0, offset) + 1
    observations = _observations(region_text.split("\n"), base_line, parse, dict(status_map))

    exit_code = _swe_grading.parse_test_exit_code(log_text)
    rejected: str | None = None
    for marker, reason in _BAD_CODES:
        if marker in log_text:
            rejected = reason
            break
    if rejected is None:
        if truncated:
            rejected = "truncated"
        elif has_end and not has_start:
            rejected = "missing_start_marker"
        elif not status_map and not _swe_grading.SUITE_RAN.search(log_text):
            rejected = "no_test_results"
        elif (
            exit_code not in (None, 0)
            and status_map
            and not any(s in (_FAILED, _ERROR) for s in status_map.values())
        ):
            rejected = "exit_code_contradicts_log"
    return ParsedLog(
        status_map=dict(status_map),
        observations=observations,
        region=region,
        truncated=truncated,
        rejected=rejected,
        test_exit_code=exit_code,
    )


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


@dataclass
class GradeReport:
    """What :func:`grade` found. All fields are JSON-friendly except ``observations``
    (dataclasses; :meth:`to_json` converts them).

    resolved: SWE-bench resolved (swebench ``get_resolution_status`` == RESOLVED_FULL on the
        map ``get_logs_eval`` would grade; ``False`` whenever swebench would reject the log).
    resolution_status: ``RESOLVED_FULL`` / ``RESOLVED_PARTIAL`` / ``RESOLVED_NO`` (swebench).
    complete: the log is not rejected (see :class:`ParsedLog`) and every listed test was
        observed (DESIGN §3).
    truncated: START marker without END marker.
    utility: DESIGN §3 utility, or ``None`` when unavailable.
    attributed: the utility counts missing tests as failures because the control observed
        every listed test (DESIGN §3).
    control_complete: the control log's own ``complete``; ``None`` without a control log.
    f2p / p2p: listed test id -> observed status in the parsed region (``MISSING`` when
        unobserved), the raw view; grading uses swebench's map.
    missing: listed ids (F2P then P2P, each once) with no observed status.
    duplicates: parser test id -> its statuses in log order, for ids observed more than once.
    classification: per-slot views (DESIGN §4), see :func:`grade`.
    f2p_passed: F2P tests passing under swebench semantics (PASSED or XFAIL).
    p2p_all_passing: every P2P test passing under swebench semantics (PASSED, XFAIL, SKIPPED).
    swebench_report: swebench ``get_eval_tests_report`` output (success/failure lists).
    status_map, observations, region, log_rejected, test_exit_code: see :class:`ParsedLog`.
    harness_exit: the harness exit status used for ``raw`` (given, or derived from the log).
    parser: the parser's registry name.
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

    def to_json(self) -> dict[str, Any]:
        """Plain dict (observations as dicts), ready for ``json.dumps``."""
        return asdict(self)


def _derive_harness_exit(parsed: ParsedLog) -> str | None:
    """Harness exit status read from the log: a swebench harness failure marker, else the
    recorded test exit status (0 -> ``"ok"``, n -> ``"exit_n"``), else ``None``."""
    if parsed.rejected in {reason for _, reason in _BAD_CODES}:
        return parsed.rejected
    if parsed.test_exit_code is None:
        return None
    return "ok" if parsed.test_exit_code == 0 else f"exit_{parsed.test_exit_code}"


def _is_complete(parsed: ParsedLog, listed: Sequence[str]) -> bool:
    return parsed.rejected is None and all(
        _resolve_case(t, parsed.status_map) is not None for t in listed
    )


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

    Rules and their sources:

    * statuses: swebench log parser over the marker region (:func:`parse_log`); a listed id is
      matched like swebench's ``_resolve_case`` (exact, or a unique-outcome prefix match for
      ids truncated mid-parameter). ``MISSING`` when unobserved.
    * resolved (swebench ``get_eval_tests_report`` + ``get_resolution_status``, PASS_AND_FAIL):
      missing = failed, XFAIL passes, SKIPPED fails F2P but keeps P2P; every F2P and P2P must
      pass; a log ``get_logs_eval`` rejects is never resolved. With an empty F2P list swebench
      counts the F2P rate as 1, so all P2P passing resolves.
    * utility (DESIGN §3): ``f2p_passed / |F2P| - 1[any P2P test not passing]`` with passing as
      in swebench's report on the graded map (empty when the log is rejected). When
      ``|F2P| == 0`` the F2P term is defined as 0 (so such a task scores 0 or -1, never 1).
      Available when ``complete``; otherwise only when ``control_log`` (the same task's
      empty-patch control) is itself complete: then missing tests count as failures and
      ``attributed`` is True. Else ``None``.
    * classification (DESIGN §4), each a bool, with ``expected = expected_resolved`` (``None``
      means True: a rollout slot is expected to resolve):
        - ``raw``: the harness exit status matches ``expected``: ``harness_exit == "ok"`` when
          expected resolved, a known non-"ok" status when not. ``harness_exit=None`` is read
          from the log (swebench failure marker, or ``>>>>> Test Exit Code: N``: 0 -> "ok").
        - ``report_binary``: ``resolved == expected`` (SWE-bench resolved).
        - ``strict``: ``complete``, every listed test observed exactly as PASSED or FAILED (no
          MISSING/SKIPPED/ERROR/XFAIL, no conflicting duplicate observations), and
          (all listed PASSED) == expected.
        - ``unknown``: not complete and not attributed (needs attribution; utility is None).

    Args:
        log_text: verifier test log.
        f2p, p2p: FAIL_TO_PASS / PASS_TO_PASS test ids (lists of str).
        parser: see :func:`resolve_parser`.
        control_log: the same task's empty-patch control log, or None.
        harness_exit: harness exit status of this trial ("ok" = test run succeeded), or None.
        expected_resolved: expected outcome of this slot (gold control True, empty control
            False, rollout None/True).

    Returns:
        GradeReport.

    Raises:
        ValueError: naming the field (``log_text``, ``f2p``, ``p2p``, ``parser``,
            ``control_log``, ``harness_exit``, ``expected_resolved``) for bad input.
    """
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
    name, fn = resolve_parser(parser)
    spec = TestSpec(
        instance_id="", image="", eval_script_list=[], repo="", version="",
        FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p, log_parser=name,
        eval_type=EvalType.PASS_AND_FAIL.value,
    )
    parsed = parse_log(log_text, fn, test_spec=spec)
    sm = parsed.status_map
    listed = list(dict.fromkeys(f2p + p2p))

    def status_of(test_id: str) -> str:
        key = _resolve_case(test_id, sm)
        return MISSING if key is None else sm[key]

    f2p_status = {t: status_of(t) for t in f2p}
    p2p_status = {t: status_of(t) for t in p2p}
    missing = [t for t in listed if status_of(t) == MISSING]

    by_id: dict[str, list[str]] = {}
    for o in parsed.observations:
        by_id.setdefault(o.test_id, []).append(o.status)
    duplicates = {k: v for k, v in by_id.items() if len(v) > 1}

    # swebench's report on the map get_logs_eval would hand it ({} when it rejects the log).
    graded = {} if parsed.rejected else sm
    report = get_eval_tests_report(
        graded, {FAIL_TO_PASS: f2p, PASS_TO_PASS: p2p}, eval_type=EvalType.PASS_AND_FAIL
    )
    # get_eval_report stops before grading a rejected log: resolved False, status NO.
    resolution = get_resolution_status(report) if parsed.rejected is None else (
        ResolvedStatus.NO.value
    )
    resolved = resolution == ResolvedStatus.FULL.value

    f2p_passed = len(report[FAIL_TO_PASS]["success"])
    p2p_all_passing = len(report[PASS_TO_PASS]["success"]) == len(p2p)

    complete = _is_complete(parsed, listed)
    control_complete: bool | None = None
    if control_log is not None:
        control_complete = _is_complete(parse_log(control_log, fn, test_spec=spec), listed)
    attributed = (not complete) and bool(control_complete)
    utility: float | None = None
    if complete or attributed:
        f2p_term = f2p_passed / len(f2p) if f2p else 0.0
        utility = f2p_term - (0.0 if p2p_all_passing else 1.0)

    expected = True if expected_resolved is None else expected_resolved
    exit_status = harness_exit if harness_exit is not None else _derive_harness_exit(parsed)
    if expected:
        raw = exit_status == "ok"
    else:
        raw = exit_status is not None and exit_status != "ok"
    clean = complete and all(
        s in (_PASSED, _FAILED) for s in (*f2p_status.values(), *p2p_status.values())
    )
    if clean:
        for t in listed:
            key = _resolve_case(t, sm)
            if key is not None and len(set(by_id.get(key, []))) > 1:
                clean = False
                break
    all_passed = all(s == _PASSED for s in (*f2p_status.values(), *p2p_status.values()))
    classification = {
        "raw": raw,
        "report_binary": resolved == expected,
        "strict": clean and all_passed == expected,
        "unknown": not complete and not attributed,
    }
    return GradeReport(
        resolved=resolved,
        resolution_status=resolution,
        complete=complete,
        truncated=parsed.truncated,
        utility=utility,
        attributed=attributed,
        control_complete=control_complete,
        f2p=f2p_status,
        p2p=p2p_status,
        missing=missing,
        duplicates=duplicates,
        classification=classification,
        f2p_passed=f2p_passed,
        p2p_all_passing=p2p_all_passing,
        swebench_report={k: {kk: list(vv) for kk, vv in v.items()} for k, v in report.items()},
        status_map=dict(sm),
        observations=list(parsed.observations),
        region=parsed.region,
        log_rejected=parsed.rejected,
        test_exit_code=parsed.test_exit_code,
        harness_exit=exit_status,
        parser=name,
    )
