"""Turn a verifier test log into test statuses: swebench's log parsers, and for pytest logs
the report-line reader of :mod:`eval.grading.pytest_report`.

* :func:`parse_log`: a swebench log parser over the graded region, exactly as
  ``swebench.harness.grading.get_logs_eval`` (swebench 5.0.2) reads a log; next to the
  (last-wins) status map, the raw ordered :class:`Observation` list, one entry per parsed
  line, duplicates and reused names included (design page, "Evaluation"). The bundled task
  builder and the
  swebench side of every grade use it.
* :func:`read_log`: what :func:`eval.grading.grader.grade` reads. For swebench's pytest-family
  parsers (``parse_log_pytest``, ``_options``, ``_v2``, matplotlib, seaborn) statuses come
  only from pytest's own report lines, listed ids recognised exactly
  (:func:`eval.grading.pytest_report.read_report`); other parsers (django, sympy, a callable) as
  :func:`parse_log`.

Region and rejection rules are swebench's for both: the text between the
``>>>>> Start Test Output`` / ``>>>>> End Test Output`` markers (the whole log when that holds
no status), harness failure markers, missing markers, an empty map without swebench's
``SUITE_RAN`` evidence, a non-zero recorded test exit status with no FAILED/ERROR.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from swebench.harness import grading as _swe_grading
from swebench.harness.constants import (
    APPLY_PATCH_FAIL,
    END_TEST_OUTPUT,
    RESET_FAILED,
    START_TEST_OUTPUT,
    TESTS_ERROR,
    TESTS_TIMEOUT,
    TestStatus,
)
from swebench.harness.log_parsers import PARSER_REGISTRY
from swebench.types import TestSpec

from eval.grading.pytest_report import fold_statuses, read_report

__all__ = [
    "BAD_CODES",
    "MAP_REPO_TO_PARSER",
    "Observation",
    "ParsedLog",
    "is_pytest_family",
    "parse_log",
    "parser_for_repo",
    "read_log",
    "resolve_parser",
]

ParserFn = Callable[[str, Any], dict]

#: swebench's get_logs_eval rejects a log holding any of these harness markers.
BAD_CODES: tuple[tuple[str, str], ...] = (
    (APPLY_PATCH_FAIL, "patch_apply_failed"),
    (RESET_FAILED, "reset_failed"),
    (TESTS_ERROR, "tests_errored"),
    (TESTS_TIMEOUT, "tests_timed_out"),
)
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

    test_id: the id as read: for the pytest report reader the listed id the line names
        exactly, else the line's node id (spaces kept); for a swebench parser its key (may be
        truncated by the parser).
    status: a swebench ``TestStatus`` value (``PASSED``, ``FAILED``, ...).
    line_no: 1-based line of the *whole* log text on which the status was read.
    style: ``"summary"`` (``STATUS <id>``) or ``"verbose"`` (``<id> STATUS``) for the pytest
        report reader; ``"parser"`` for a swebench parser.
    session: pytest session (``test session starts`` header) the line belongs to, 0-based;
        0 for a swebench parser.
    """

    test_id: str
    status: str
    line_no: int
    style: str = "parser"
    session: int = 0


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
    reader: ``"pytest_report"`` (:func:`eval.grading.pytest_report.read_report`: listed ids exact,
        report lines only) or ``"swebench_parser"`` (the swebench parser over the region).
    """

    status_map: dict[str, str]
    observations: list[Observation]
    region: str
    truncated: bool
    rejected: str | None
    test_exit_code: int | None
    reader: str = "swebench_parser"


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


def _blank_spec(name: str) -> TestSpec:
    return TestSpec(
        instance_id="", image="", eval_script_list=[], repo="", version="",
        FAIL_TO_PASS=[], PASS_TO_PASS=[], log_parser=name,
    )


@dataclass(frozen=True)
class _Region:
    text: str
    offset: int  # character offset of ``text`` in the whole log
    name: str  # markers | after_start_marker | whole_log | whole_log_fallback
    truncated: bool
    has_start: bool
    has_end: bool

    def base_line(self, log_text: str) -> int:
        return log_text.count("\n", 0, self.offset) + 1


def _region(log_text: str) -> _Region:
    """The graded region: ``log.split(START)[1].split(END)[0]`` (swebench), else the log."""
    has_start = START_TEST_OUTPUT in log_text
    has_end = END_TEST_OUTPUT in log_text
    if not has_start:
        return _Region(log_text, 0, "whole_log", False, False, has_end)
    offset = log_text.index(START_TEST_OUTPUT) + len(START_TEST_OUTPUT)
    text = log_text.split(START_TEST_OUTPUT)[1].split(END_TEST_OUTPUT)[0]
    return _Region(text, offset, "markers" if has_end else "after_start_marker",
                   not has_end, True, has_end)


def _whole(log_text: str, region: _Region) -> _Region:
    return _Region(log_text, 0, "whole_log_fallback", region.truncated, region.has_start,
                   region.has_end)


def _rejection(log_text: str, region: _Region, status_map: dict[str, str],
               exit_code: int | None) -> str | None:
    """Why ``get_logs_eval`` would reject this log (see :class:`ParsedLog`), or None."""
    for marker, reason in BAD_CODES:
        if marker in log_text:
            return reason
    if region.truncated:
        return "truncated"
    if region.has_end and not region.has_start:
        return "missing_start_marker"
    if not status_map and not _swe_grading.SUITE_RAN.search(log_text):
        return "no_test_results"
    if (exit_code not in (None, 0) and status_map
            and not any(s in (_FAILED, _ERROR) for s in status_map.values())):
        return "exit_code_contradicts_log"
    return None


def _check_log(log_text: Any) -> None:
    if not isinstance(log_text, str):
        raise ValueError(f"log_text: expected str, got {type(log_text).__name__}")


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
    _check_log(log_text)
    name, fn = resolve_parser(parser)
    spec = test_spec or _blank_spec(name)

    def parse(text: str) -> dict:
        return fn(text, spec)

    region = _region(log_text)
    status_map = parse(region.text)
    if not status_map and region.has_start and region.has_end:
        region = _whole(log_text, region)
        status_map = parse(region.text)
    observations = _observations(region.text.split("\n"), region.base_line(log_text), parse,
                                 dict(status_map))
    exit_code = _swe_grading.parse_test_exit_code(log_text)
    return ParsedLog(
        status_map=dict(status_map),
        observations=observations,
        region=region.name,
        truncated=region.truncated,
        rejected=_rejection(log_text, region, status_map, exit_code),
        test_exit_code=exit_code,
    )


def _pytest_family() -> frozenset:
    mod = importlib.import_module("swebench.harness.log_parsers.python")
    names = ("parse_log_pytest", "parse_log_pytest_options", "parse_log_pytest_v2",
             "parse_log_matplotlib", "parse_log_seaborn")
    return frozenset(getattr(mod, n) for n in names if hasattr(mod, n))


_PYTEST_FAMILY = _pytest_family()


def is_pytest_family(parser: str | ParserFn) -> bool:
    """True when ``parser`` is one of swebench's pytest log parsers (its output is pytest's
    terminal report), so :func:`read_log` reads it with the report-line reader."""
    return resolve_parser(parser)[1] in _PYTEST_FAMILY


def _report_observations(text: str, base_line: int, listed: Collection[str]
                         ) -> list[Observation]:
    return [Observation(r.test_id, r.status, base_line + r.line_no, r.style, r.session)
            for r in read_report(text, listed)]


def read_log(
    log_text: str, parser: str | ParserFn, *, listed: Collection[str] = (),
    test_spec: TestSpec | None = None,
) -> ParsedLog:
    """Statuses of ``log_text`` as :func:`eval.grading.grader.grade` reads them.

    Pytest-family parsers (:func:`is_pytest_family`): only pytest's report lines, ``listed``
    ids recognised exactly, repeated observations folded by
    :func:`eval.grading.pytest_report.fold_statuses`; region and rejection rules as
    :func:`parse_log`. Any other parser: :func:`parse_log`.

    Args:
        log_text: the verifier's test log (str).
        parser: see :func:`resolve_parser`.
        listed: the task's F2P + P2P ids (any characters).
        test_spec: passed to a swebench parser.

    Raises:
        ValueError: naming ``log_text`` or ``parser`` for bad input.
    """
    _check_log(log_text)
    if not is_pytest_family(parser):
        return parse_log(log_text, parser, test_spec=test_spec)
    region = _region(log_text)
    obs = _report_observations(region.text, region.base_line(log_text), listed)
    if not obs and region.has_start and region.has_end:
        region = _whole(log_text, region)
        obs = _report_observations(region.text, 1, listed)
    status_map = fold_statuses((o.test_id, o.status, o.session) for o in obs)
    exit_code = _swe_grading.parse_test_exit_code(log_text)
    return ParsedLog(
        status_map=status_map,
        observations=obs,
        region=region.name,
        truncated=region.truncated,
        rejected=_rejection(log_text, region, status_map, exit_code),
        test_exit_code=exit_code,
        reader="pytest_report",
    )
