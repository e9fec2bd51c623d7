"""Grade one test log from the command line.

    python -m eval.grade --instance task.json --log test_output.txt [--control-log empty.txt]

``task.json`` is one SWE-bench-style row: ``FAIL_TO_PASS`` / ``PASS_TO_PASS`` (JSON strings
or lists) and ``repo`` (parser from swebench's ``MAP_REPO_TO_PARSER``) or ``log_parser``
(e.g. ``"pytest"`` or ``"parse_log_pytest"``; overrides ``repo``). Prints one JSON object
with the keys ``resolved, complete, utility, attributed, f2p, p2p, missing, duplicates,
classification, resolved_swebench_parser, parser_disagreements`` (see
:func:`eval.grading.grader.grade`; ``parser_disagreements`` lists every listed test swebench's own
parser grades differently on the same log, with the reason). Exit status 0 on success, 2 on bad input
(the message names the path or field).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from eval.files import read_json_object
from eval.grading.grader import grade, parser_for_repo, resolve_parser
from sandbox.bounds import ArgumentParser, InFile, Text
from sandbox.trials.trial import EXIT_CLASSES

OUTPUT_KEYS = (
    "resolved",
    "complete",
    "utility",
    "attributed",
    "f2p",
    "p2p",
    "missing",
    "duplicates",
    "classification",
    "resolved_swebench_parser",
    "parser_disagreements",
)


class InputError(Exception):
    """Bad CLI input; the message names the path or field."""


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot read: {exc.strerror or exc}") from exc


def _test_list(row: dict[str, Any], field: str, path: str) -> list[str]:
    if field not in row:
        raise InputError(f"{path}: field {field} is missing")
    value = row[field]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: field {field} is a string but not JSON: {exc}") from exc
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputError(f"{path}: field {field} must be a list of test id strings")
    return value


def load_instance(path: str) -> tuple[list[str], list[str], str]:
    """``(FAIL_TO_PASS, PASS_TO_PASS, parser name)`` from a SWE-bench-style row at ``path``.

    Raises:
        InputError: naming the path or field.
    """
    row = read_json_object(path, InputError, what="instance")
    f2p = _test_list(row, "FAIL_TO_PASS", path)
    p2p = _test_list(row, "PASS_TO_PASS", path)
    try:
        if row.get("log_parser"):
            name, _ = resolve_parser(row["log_parser"])
        elif "repo" in row:
            name, _ = parser_for_repo(row["repo"])
        else:
            raise InputError(f"{path}: field repo (or log_parser) is missing")
    except ValueError as exc:
        field = "log_parser" if row.get("log_parser") else "repo"
        raise InputError(f"{path}: field {field}: {exc}") from exc
    return f2p, p2p, name


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m eval.grade", description=__doc__.splitlines()[0])
    ap.add_argument("--instance", type=Text(), required=True, help="SWE-bench-style task row (JSON)")
    ap.add_argument("--log", type=InFile(), required=True, help="verifier test log (test_output.txt)")
    ap.add_argument("--control-log", type=InFile(), default=None, help="the task's empty-patch control log")
    ap.add_argument("--harness-exit", default=None,
                    choices=EXIT_CLASSES,
                    help="the trial's exit class (sandbox.trials.trial.EXIT_CLASSES)")
    ap.add_argument("--expected-resolved", choices=("true", "false"), default=None,
                    help="expected outcome of this slot (default: resolved)")
    args = ap.parse_args(argv)
    try:
        f2p, p2p, parser = load_instance(args.instance)
        log_text = _read_text(args.log, "log")
        control = None if args.control_log is None else _read_text(args.control_log, "control log")
        expected = None if args.expected_resolved is None else args.expected_resolved == "true"
        report = grade(log_text, f2p=f2p, p2p=p2p, parser=parser, control_log=control,
                       harness_exit=args.harness_exit, expected_resolved=expected)
    except (InputError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    full = report.to_json()
    print(json.dumps({k: full[k] for k in OUTPUT_KEYS}, sort_keys=False))
    if not report.complete:
        listed = len(f2p) + len(p2p)
        why = f"log rejected ({report.log_rejected})" if report.log_rejected else "log incomplete"
        verdict = ("utility attributed via the control" if report.attributed
                   else "utility unavailable")
        print(f"note: {why}; {len(report.missing)}/{listed} listed tests not observed; "
              f"{verdict}", file=sys.stderr)
    if report.parser_disagreements:
        print(f"note: {len(report.parser_disagreements)} listed tests graded differently by "
              f"swebench's own parser (parser_disagreements)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
