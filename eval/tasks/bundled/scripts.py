"""What a bundled task shows: its eval script (restores the test files, runs pytest) and
its problem statement (failing test ids and their assertion lines, never the gold patch).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex

from eval.tasks.bundled.recipe import PYTEST_CMD, ProjectRecipe


def _restore_block(path: str, content: bytes) -> str:
    """Bash that rewrites ``path`` with ``content``: a quoted heredoc for plain text ending
    in a newline, base64 otherwise."""
    q = "'" + path.replace("'", "'\\''") + "'"
    d = os.path.dirname(path)
    mk = f"mkdir -p '{d}' && " if d else ""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    tag = "ECREDIT_EOF_" + hashlib.sha256(content).hexdigest()[:12]
    if text is not None and text.endswith("\n") and "\r" not in text and tag not in text:
        return f"{mk}cat > {q} <<'{tag}'\n{text}{tag}\n"
    import base64

    b64 = base64.encodebytes(content).decode()
    return f"{mk}base64 -d > {q} <<'{tag}'\n{b64}{tag}\n"


def make_eval_script(project: ProjectRecipe, tests: tuple[str, ...], files: dict[str, bytes],
                     *, setup_lines: tuple[str, ...] = ()) -> str:
    """Eval script of a bundled task: restore the listed test files (and the project's
    ``test_support`` files) to their base content, run pytest on ``tests`` between the
    SWE-bench markers, and record the test command's exit status like swebench 5 does
    (``>>>>> Test Exit Code: N`` after the end marker).

    ``setup_lines`` go before ``cd /testbed`` (image tasks activate their environment there,
    as swebench's scripts do with ``source /opt/miniconda3/bin/activate``); empty for
    bundled tasks, whose scripts keep their bytes."""
    lines = ["#!/bin/bash", f"# ecredit-trl bundled task: {project.name} {project.version}",
             "set -uo pipefail", *setup_lines, "cd /testbed", "export PYTHONDONTWRITEBYTECODE=1",
             "# fixed str hashing: set/dict orders in test output repeat from run to run",
             "export PYTHONHASHSEED=0"]
    for k, v in project.env.items():
        lines.append(f"export {k}={shlex.quote(v)}")
    lines.append("# test files are restored to their base content before the run")
    body = "\n".join(lines) + "\n"
    for path in dict.fromkeys((*project.test_support, *tests)):
        body += _restore_block(path, files[path])
    body += ("echo '>>>>> Start Test Output'\n"
             f"{PYTEST_CMD} {' '.join(shlex.quote(t) for t in tests)}\n"
             "SWEBENCH_TEST_EXIT_CODE=$?\n"
             "echo '>>>>> End Test Output'\n"
             "echo \">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE\"\n")
    return body


_HEADER = re.compile(r"^_{3,} (.+?) _{3,}$")
_ADDR = re.compile(r"0x[0-9a-fA-F]{6,}")
_NOISE = re.compile(r"^(Use -v to get more diff|Use -v to get the full diff|Omitting \d+ "
                    r"identical items, use -vv to show|Full diff:)$")


def failure_messages(log: str, ids: list[str], max_lines: int = 6) -> dict[str, list[str]]:
    """test id -> the ``E`` lines pytest printed in that test's failure section.

    Sections are matched by their header (``test_name``, ``Class.test_name`` or ``ERROR at
    setup of ...``). Memory addresses are scrubbed (``0x…``) so the text is reproducible.
    """
    want: dict[str, str] = {}
    for i in ids:
        tail = i.split("::", 1)[1] if "::" in i else i
        want.setdefault(tail.replace("::", "."), i)
    out: dict[str, list[str]] = {}
    current: str | None = None
    for line in log.splitlines():
        m = _HEADER.match(line)
        if m:
            name = re.sub(r"^ERROR at (setup|teardown) of ", "", m.group(1))
            current = want.get(name)
            continue
        if line.startswith("=") and line.endswith("="):
            current = None
            continue
        if current and line.startswith("E "):
            msgs = out.setdefault(current, [])
            msg = _ADDR.sub("0x…", line[1:].strip())[:200]
            if _NOISE.match(msg):
                continue
            if msg and len(msgs) < max_lines and (not msgs or msgs[-1] != msg):
                msgs.append(msg)
    return out


def make_problem_statement(project: ProjectRecipe, tests: tuple[str, ...], f2p: list[str],
                           messages: dict[str, list[str]], max_tests: int,
                           frames: tuple[tuple[str, int, str, str], ...] = ()) -> str:
    """Issue-style text from the failing tests' ids and assertion lines (never the patch).

    ``frames`` (a localized world, the recipe's ``locate``): ``(path, line, function,
    text)`` of each mutated line, quoted as a Python traceback prints a frame (``File
    "<path>", line <n>, in <function>`` and the line's text, stripped); it names where the
    bug is, not what the fix is. Without frames the text is as it always was."""
    env = " ".join(f"{k}={v}" for k, v in project.env.items())
    cmd = f"{env + ' ' if env else ''}python3 -m pytest {' '.join(tests)}"
    n = len(f2p)
    out = [f"{project.name} {project.version}: {n} test{'s' if n != 1 else ''} "
           f"fail{'s' if n == 1 else ''} after a recent change to the library code.", "",
           f"Reproduce from the repository root with `{cmd}`.", "", "Failing tests:"]
    for tid in f2p[:max_tests]:
        out.append(f"- {tid}")
        for msg in messages.get(tid, [])[:6]:
            out.append(f"    {msg}")
    if n > max_tests:
        out.append(f"- ... and {n - max_tests} more")
    if frames:
        out += ["", "The failures trace to this library code:"]
        for path, line, function, text in frames:
            out += [f'  File "{path}", line {line}, in {function or "<module>"}',
                    f"    {text.strip()}"]
    out += ["", "Fix the library so that these tests pass again without breaking the other "
            "tests; the tests themselves are correct."]
    return "\n".join(out) + "\n"
