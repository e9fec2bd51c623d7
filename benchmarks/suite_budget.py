"""Suite budget: where the test suite's wall time goes, by area, read from a pytest log.

Reads the ``slowest N durations`` section pytest prints (``--durations=30`` is in
``pyproject.toml``'s ``addopts``, so every log has the 30 slowest phases; ``--durations=0``
logs list every phase) and the closing ``... passed ... in S s`` line. Each listed phase
(setup, call, teardown) is charged to the area of its test file (:data:`AREAS`, first match
wins; ``other`` otherwise). A fixture's one-off cost (a cache build, a cluster) lands in the
setup of whichever test ran first, so it is charged to that test's area.

It runs nothing and asserts nothing: the budget is read, not timed in a test.

    .venv/bin/python -m pytest -q 2>&1 | tee pytest.log
    python benchmarks/suite_budget.py pytest.log [--json OUT]

Columns: the tests listed, their seconds, the area's share of the listed seconds and of the
suite's wall (when the log has the closing line), and the area's slowest test. The row
``not listed`` is the wall minus the listed seconds (tests below the N slowest, collection,
start-up). A run on pytest-xdist workers (``-n``: ``pyproject.toml``'s addopts) has
workers x wall seconds of test time: the shares are then of that ("% of worker time"), and
the worker count is read from the log (``created: N/N workers``), or, in a ``-q`` log that
only says ``bringing up nodes``, from the addopts' ``-n``.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.bounds import ArgumentParser, InFile, Int, OutFile

ROOT = Path(__file__).resolve().parent.parent

#: (area, regex on the test's node id). Ordered: the first match names the area.
AREAS: tuple[tuple[str, str], ...] = (
    ("vLLM", r"tests/test_vllm_"),
    ("Ray", r"tests/test_ray_"),
    ("study", r"tests/test_study"),
    ("docs", r"tests/test_docs\.py"),
    ("warm starts", r"tests/test_(famil|lora_families|scaffold_train|tiny_model|hub_model)"),
    ("tasks", r"tests/test_(build_tasks|tasks|image_tasks|image_presence|images_pull|datasets"
              r"|adapters|swesmith)"),
    ("integrity", r"tests/test_(sandbox_integrity|verifier_integrity|integrity_package"
                  r"|history_leaks|host_layouts|reward_guard|reward_agent_failure"
                  r"|agent_failures|rollouts_failure|kill_cleanup|trial_limits)"),
    ("Podman", r"tests/test_(sandbox_podman|agent_containers|local_runtime|runtime_"
               r"|sandbox_endpoints|image_env|snapshot|toolpool|exec_garbled)"),
    ("training", r"tests/test_(train|resume|pipeline|step_pipeline|trainer_records"
                 r"|multiblock|long_episode|scaffold_episode)"),
    ("eval + pilot", r"tests/test_(eval_|pilot|attribution|rollouts|batched_rollouts"
                     r"|positive_control|grading)"),
)
OTHER = "other"

_HEADER = re.compile(r"=+ slowest (\d+ )?durations =+")
_ROW = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s+(setup|call|teardown)\s+(\S.*?)\s*$")
_WORKERS = re.compile(r"created: (\d+)/\d+ workers")
_XDIST = "bringing up nodes"
_ADDOPTS_N = re.compile(r"^addopts\s*=.*?(?:-n|--numprocesses)[ =](\d+)", re.M)
_TOTAL = re.compile(r"\b(?:passed|failed|errors?|skipped|deselected|xfailed|xpassed)\b"
                    r"[^\n]* in (\d+(?:\.\d+)?)s\b")


@dataclass
class Phase:
    """One listed phase: ``seconds`` (float, s), ``when`` (setup/call/teardown), ``nodeid``."""

    seconds: float
    when: str
    nodeid: str


@dataclass
class Area:
    """An area's sum: ``seconds`` (s) of its listed phases, the ``tests`` (node ids) they
    belong to, and the slowest test's id and seconds (its phases summed)."""

    name: str
    seconds: float = 0.0
    per_test: dict[str, float] = field(default_factory=dict)

    @property
    def tests(self) -> int:
        return len(self.per_test)

    @property
    def slowest(self) -> tuple[str, float]:
        return max(self.per_test.items(), key=lambda kv: kv[1]) if self.per_test else ("", 0.0)


def parse_log(text: str) -> tuple[list[Phase], float | None]:
    """(the phases of the log's durations section, the suite's wall seconds or None).

    Raises: ValueError when the log has no ``slowest ... durations`` section.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _HEADER.search(line)), None)
    if start is None:
        raise ValueError("no 'slowest ... durations' section (run pytest with --durations=N)")
    phases = []
    for line in lines[start + 1:]:
        m = _ROW.match(line)
        if m:
            phases.append(Phase(float(m.group(1)), m.group(2), m.group(3)))
        elif line.startswith("=") or (line.strip() and not line.startswith("(")):
            break  # the next section (short summary, the closing line)
    totals = _TOTAL.findall(text)
    return phases, (float(totals[-1]) if totals else None)


def workers_of(text: str, addopts_n: int | None) -> int:
    """The pytest-xdist workers of the run that wrote ``text``: xdist's ``created: N/N
    workers`` line; else ``addopts_n`` (the ``-n`` of the project's addopts) when the log shows
    xdist starting without a count (``-q``); else 1 (no xdist)."""
    m = _WORKERS.search(text)
    if m:
        return int(m.group(1))
    return (addopts_n or 1) if _XDIST in text else 1


def addopts_workers(pyproject: Path) -> int | None:
    """The ``-n N`` of ``pyproject``'s pytest addopts, None when it has none or is missing."""
    try:
        m = _ADDOPTS_N.search(pyproject.read_text())
    except OSError:
        return None
    return int(m.group(1)) if m else None


def area_of(nodeid: str, areas: Iterable[tuple[str, str]] = AREAS) -> str:
    """The first area whose regex matches ``nodeid`` (``re.search``), else :data:`OTHER`."""
    return next((name for name, rx in areas if re.search(rx, nodeid)), OTHER)


def by_area(phases: Iterable[Phase]) -> list[Area]:
    """Areas with their summed phases, the most expensive first (only areas with phases)."""
    out: dict[str, Area] = {}
    for p in phases:
        a = out.setdefault(area_of(p.nodeid), Area(area_of(p.nodeid)))
        a.seconds += p.seconds
        a.per_test[p.nodeid] = a.per_test.get(p.nodeid, 0.0) + p.seconds
    return sorted(out.values(), key=lambda a: -a.seconds)


def table(areas: list[Area], wall: float | None, workers: int = 1) -> str:
    """The markdown table of :func:`by_area`'s areas, a ``not listed`` row and the total.
    With ``workers`` > 1 the shares are of the workers' time (``workers`` x ``wall`` s)."""
    listed = sum(a.seconds for a in areas)
    budget = wall * workers if wall is not None else None

    def share(s: float, of: float | None) -> str:
        return f"{100 * s / of:.0f} %" if of else "-"

    of = "% of wall" if workers == 1 else "% of worker time"
    rows = [f"| area | tests | s | % of listed | {of} | slowest test (s) |",
            "|---|---:|---:|---:|---:|---|"]
    for a in areas:
        test, s = a.slowest
        rows.append(f"| {a.name} | {a.tests} | {a.seconds:.0f} | {share(a.seconds, listed)} | "
                    f"{share(a.seconds, budget)} | `{test}` ({s:.0f}) |")
    if budget is not None:
        rows.append(f"| not listed | | {max(0.0, budget - listed):.0f} | | "
                    f"{share(max(0.0, budget - listed), budget)} | |")
    total = f"{wall:.0f} s wall ({wall / 60:.1f} min)" if wall is not None else "wall unknown"
    if workers > 1:
        total += f", {workers} workers"
    rows.append(f"| **total** | {sum(a.tests for a in areas)} | {listed:.0f} listed | | | "
                f"{total} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Print the area table of a pytest log. Returns 0, or 2 (one line) on a bad log."""
    ap = ArgumentParser(prog="python benchmarks/suite_budget.py",
                        description="The test suite's cost by area, from a pytest log with "
                                    "its durations section (--durations=30 or =0).")
    ap.add_argument("log", type=InFile(), help="a pytest output log (stdout + stderr)")
    ap.add_argument("--json", type=OutFile(), default=None, metavar="OUT",
                    help="also write the areas as JSON to OUT")
    ap.add_argument("--workers", type=Int(ge=1), default=None,
                    help="pytest-xdist workers of the run (default: read from the log, or "
                         "the -n of pyproject.toml's addopts when a -q log has no count)")
    args = ap.parse_args(argv)
    text = Path(args.log).read_text(errors="replace")
    try:
        phases, wall = parse_log(text)
    except ValueError as exc:
        print(f"suite_budget: error: {args.log}: {exc}", file=sys.stderr)
        return 2
    workers = args.workers or workers_of(text, addopts_workers(ROOT / "pyproject.toml"))
    areas = by_area(phases)
    print(table(areas, wall, workers))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "wall_s": wall, "workers": workers,
            "listed_s": round(sum(a.seconds for a in areas), 2),
            "areas": [{"area": a.name, "s": round(a.seconds, 2), "tests": a.tests,
                       "slowest": a.slowest[0], "slowest_s": round(a.slowest[1], 2)}
                      for a in areas]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
