"""Read test statuses from pytest's own report lines, never from captured output.

swebench's pytest parsers split every line that starts with a status word on whitespace. Two
consequences: a listed id with spaces inside its parametrize brackets is cut at the first space
(the listed test is then reported missing), and a line a test *printed* (``FAILED a.py::t``
in its captured stdout) counts as a status. This reader instead

* splits the log into pytest's own sections (``=== title ===`` headers, pytest
  ``terminal.py``): statuses are read only in the per-test progress lines of a session
  (``-v``: ``<id> STATUS [ nn%]``, xdist ``[gw0] [ 50%] STATUS <id>``) and in the
  session's last ``short test summary info`` section (``-rA``: ``STATUS <id>`` or
  ``STATUS <id> - message``; pytest prints it after every captured section);
  the FAILURES / ERRORS / PASSES / XFAILURES / XPASSES / warnings bodies (tracebacks,
  ``Captured stdout call``, ``Captured log call``) and ``live log`` blocks are never read
  (the bare ``PASSED [ 50%]`` ending a live log block is the status of the id line above it);
  a log without any ``test session starts`` header (a snippet, ``pytest -q``) is read
  everywhere outside those captured sections, as swebench reads it;
* recognises a *listed* id exactly, whatever characters it holds (spaces, ``::``, brackets,
  unicode): a report line matches a listed id when it is ``STATUS <id>``, ``STATUS <id> - …``
  or ``<id> STATUS`` followed by pytest's verbose tail (nothing, ``[ nn%]``, ``(reason)``,
  ``[N] reason``); the longest listed id wins;
* folds repeated observations like pytest reports them: the last session (``test session
  starts``) that observed a test decides; inside one session a failing status (FAILED,
  ERROR) wins over a passing one, because pytest reports a test once per phase and a
  failing phase is never followed by a genuine pass of the same test (a teardown error
  after PASSED, an injected ``PASSED <id>`` line in a multi-line failure message: the
  failure stands).

Pure functions over text; no swebench import, so the rules are readable on their own.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass

__all__ = ["FAILING", "STATUSES", "ReportLine", "fold_statuses", "line_zones", "read_report"]

#: swebench ``TestStatus`` values, the statuses a report line can carry (XPASS is not one:
#: swebench never grades it, so an XPASS line is not an observation).
STATUSES = ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL")
#: statuses that win over any other status of the same test in the same session.
FAILING = frozenset({"FAILED", "ERROR"})

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SEP = re.compile(r"^=+ (.+?) =+$")
_SUB_LIVE_LOG = re.compile(r"^-+ live log .* -+$")
_STATS = re.compile(
    r"\b(passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?|no tests ran)\b"
    r".* in [\d.]+ ?s"
)
_ALT = "|".join(STATUSES)
_XDIST = r"\[gw\d+\]\s+(?:\[\s*\d+%\]\s+)?"
_SUMMARY = re.compile(rf"^((?:{_XDIST})?)({_ALT}) (.+)$")
# a long id leaves no room to pad: older pytest then writes "PASSED[ 50%]" (rjust, no space)
_VERBOSE_AT = re.compile(rf" ({_ALT})(?=\s|$|\[\s*\d+%\])")
_VERBOSE_TAIL = re.compile(r"^(?:|\s*\[\s*\d+%\]|\s+\(.*|\s+\[\d+\]\s.*)$")
_BARE_STATUS = re.compile(rf"^(?:{_ALT})(?:\s+\[\s*\d+%\])?$")
_SKIP_SUMMARY = re.compile(r"^\[\d+\](?:\s|$)")

# zones
_REPORT = "report"  # no session structure: both line forms, outside captured sections
_PROGRESS = "progress"  # per-test lines of a session (verbose form, xdist summary form)
_SUMMARY_ZONE = "summary"  # short test summary info (summary form)
_SKIP = "skip"  # captured output, tracebacks, live logs, text outside a session
_LIVE_STATUS = "live_status"  # "PASSED [ 50%]" ending a live log block (log_cli)


@dataclass(frozen=True)
class ReportLine:
    """One status read from a pytest report line.

    line_no: 0-based index of the line in the text given to :func:`read_report`.
    status: one of :data:`STATUSES`.
    test_id: the listed id the line names exactly, else the line's own node id (spaces kept).
    style: ``"summary"`` (``STATUS <id>``) or ``"verbose"`` (``<id> STATUS``).
    session: 0-based index of the ``test session starts`` header the line follows (0 also
        before the first one).
    text: the line with ANSI colour codes removed.
    """

    line_no: int
    status: str
    test_id: str
    style: str
    session: int
    text: str


def clean_line(line: str) -> str:
    """``line`` without ANSI escape codes and trailing whitespace (``\\r`` included)."""
    return _ANSI.sub("", line).rstrip()


def _last_summary_headers(lines: list[str], structured: bool) -> set[int]:
    """Indexes of the last ``short test summary info`` header of each session: pytest prints
    the genuine one after every captured section, so an earlier one was printed by a test."""
    last: dict[int, int] = {}
    session = -1 if structured else 0
    for i, line in enumerate(lines):
        m = _SEP.match(line)
        if m and m.group(1).startswith("test session starts"):
            session += 1
        elif m and m.group(1) == "short test summary info":
            last[session] = i
    return set(last.values())


def line_zones(lines: list[str]) -> list[tuple[str, int]]:
    """Per line: (zone, session). Lines are already :func:`clean_line`-ed.

    Zones: ``progress`` (after ``test session starts`` up to the next section header),
    ``summary`` (after the session's last ``short test summary info`` header), ``report`` (a
    log without any session header: everything that is not a captured section), ``skip``
    (section headers, the bodies of every other section, ``live log`` blocks up to the next
    bare status line, text before the first session and after a session's final statistics
    line). Source: pytest ``terminal.py`` section layout (``sep("=", title)``).
    """
    structured = any(
        (m := _SEP.match(ln)) is not None and m.group(1).startswith("test session starts")
        for ln in lines
    )
    summaries = _last_summary_headers(lines, structured)
    zone = _SKIP if structured else _REPORT
    session = -1 if structured else 0
    out: list[tuple[str, int]] = []
    for i, line in enumerate(lines):
        m = _SEP.match(line)
        if m:
            title = m.group(1)
            if title.startswith("test session starts"):
                session += 1
                zone = _PROGRESS
            elif title == "short test summary info":
                zone = _SUMMARY_ZONE if i in summaries else _SKIP
            elif _STATS.search(title):
                zone = _SKIP if structured else _REPORT
            else:
                zone = _SKIP
            out.append((_SKIP, max(session, 0)))
            continue
        if zone == _PROGRESS and _SUB_LIVE_LOG.match(line):
            zone = "live_log"
        elif zone == "live_log" and _BARE_STATUS.match(line):
            zone = _PROGRESS
            out.append((_LIVE_STATUS, session))  # the status of the id above the live log
            continue
        out.append((_SKIP if zone == "live_log" else zone, max(session, 0)))
    return out


def _summary_candidates(rest: str) -> Iterator[str]:
    """Ids a ``STATUS <rest>`` line may name: ``rest`` and every prefix before a `` - ``."""
    yield rest
    for m in re.finditer(" - ", rest):
        yield rest[:m.start()]


def _balanced(text: str) -> bool:
    return text.count("[") == text.count("]")


def _natural_summary_id(status: str, rest: str) -> str | None:
    """The node id of an unlisted ``STATUS <rest>`` line: the shortest bracket-balanced
    prefix before a `` - `` message separator (else the text before the first separator);
    ``None`` for pytest's ``SKIPPED [N] path:line: reason`` summary, which names no test."""
    if status == "SKIPPED" and _SKIP_SUMMARY.match(rest):
        return None
    cands = sorted(set(_summary_candidates(rest)), key=len)
    for cand in cands:
        if cand and _balanced(cand):
            return cand
    return cands[0] or None


def _verbose_candidates(line: str) -> Iterator[tuple[str, str]]:
    """(id, status) pairs a ``<id> STATUS<tail>`` line may name, tail as pytest -v writes it."""
    for m in _VERBOSE_AT.finditer(line):
        if m.start() > 0 and _VERBOSE_TAIL.match(line[m.end():]):
            yield line[:m.start()], m.group(1)


def parse_report_line(
    line: str, zone: str, listed: Collection[str]
) -> tuple[str, str, str] | None:
    """``(status, test_id, style)`` of one cleaned line in ``zone``, or ``None``.

    A listed id named exactly by the line wins (the longest one); otherwise the line's own
    node id: the summary form's id (see :func:`_natural_summary_id`), or for the verbose
    form the text before the status when it holds ``::`` (a node id).
    """
    options: list[tuple[str, str, str]] = []  # (test_id, status, style)
    summary = None
    if zone in (_REPORT, _SUMMARY_ZONE, _PROGRESS):
        summary = _SUMMARY.match(line)
        if summary and zone == _PROGRESS and not summary.group(1):
            summary = None  # in the progress lines only xdist writes the status first
        if summary:
            options += [(c, summary.group(2), "summary")
                        for c in _summary_candidates(summary.group(3))]
    verbose = list(_verbose_candidates(line)) if zone in (_REPORT, _PROGRESS) else []
    options += [(c, s, "verbose") for c, s in verbose]
    hits = [o for o in options if o[0] in listed]
    if hits:
        test_id, status, style = max(hits, key=lambda o: len(o[0]))
        return status, test_id, style
    if summary:
        natural = _natural_summary_id(summary.group(2), summary.group(3))
        return None if natural is None else (summary.group(2), natural, "summary")
    for cand, status in verbose:
        if "::" in cand and not cand[0].isspace():
            return status, cand, "verbose"
    return None


def read_report(text: str, listed: Collection[str] = ()) -> list[ReportLine]:
    """Every status pytest reported in ``text``, in log order (see the module docstring).

    Args:
        text: test output (the region between the harness markers), str.
        listed: test ids to recognise exactly (F2P + P2P); any characters allowed.

    Returns:
        ReportLine list, one per report line that names a test.
    """
    lines = [clean_line(ln) for ln in text.split("\n")]
    listed = frozenset(listed)
    out: list[ReportLine] = []
    pending: str | None = None  # a -v id line whose status follows a live log block
    for i, (line, (zone, session)) in enumerate(zip(lines, line_zones(lines), strict=True)):
        if zone == _LIVE_STATUS and pending is not None:
            out.append(ReportLine(i, line.split()[0], pending, "verbose", session, line))
            pending = None
        if zone in (_SKIP, _LIVE_STATUS) or not line:
            continue
        parsed = parse_report_line(line, zone, listed)
        if parsed is not None:
            status, test_id, style = parsed
            out.append(ReportLine(i, status, test_id, style, session, line))
        elif zone == _PROGRESS:
            pending = line if "::" in line else None
    return out


def fold_statuses(entries: Iterable[tuple[str, str, int]]) -> dict[str, str]:
    """``(key, status, session)`` in log order -> ``key -> status``.

    The last session that observed a key decides; within a session the last failing status
    (FAILED/ERROR) wins when there is one, else the last status. On an honest log this is
    swebench's last-wins map (pytest prints a test's failing phase after its passing ones).
    """
    best: dict[str, tuple[int, str]] = {}
    for key, status, session in entries:
        prev = best.get(key)
        if (prev is None or session > prev[0] or status in FAILING
                or prev[1] not in FAILING):
            best[key] = (session, status)
    return {k: v[1] for k, v in best.items()}
