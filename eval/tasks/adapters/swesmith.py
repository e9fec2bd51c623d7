"""SWE-smith rows (``SWE-bench/SWE-smith``, split ``train``) as :class:`eval.tasks.schema.Task` rows.

A SWE-smith row holds ``instance_id``, ``repo``, ``patch``, ``FAIL_TO_PASS``,
``PASS_TO_PASS`` (lists), ``image_name`` and ``problem_statement`` (HF dataset card); no
``base_commit``, ``test_patch`` or ``version``. What the adapter makes of it follows the
SWE-smith package itself (``swesmith`` 0.0.9 on PyPI, read 2026-11-30: ``profiles/base.py``,
``profiles/python.py``, ``harness/utils.py``, ``harness/eval.py``):

- **One image per repository** (``image_name``, e.g.
  ``swebench/swesmith.x86_64.<owner>_1776_<repo>.<commit8>``; ``RepoProfile.image_name``),
  registry-qualified for Podman. ``repo`` is the mirror name
  ``swesmith/<owner>__<repo>.<commit8>`` and ``instance_id`` is
  ``<owner>__<repo>.<commit8>.<suffix>`` (``RepoProfile.get_test_cmd`` asserts
  ``instance_id.rsplit(".", 1)[0] == repo_name``).
- **One branch per instance**: the instance's base is the branch named ``instance_id``
  (``RepoProfile.get_container`` runs ``git checkout <instance_id>`` in ``/testbed``), so
  ``base_commit = instance_id`` and ``checkout_base: true``. The branch holds two commits,
  the bug and the removal of the FAIL_TO_PASS test files ("Key assumption ... each branch has
  two commits", ``harness/utils.py``); the agent starts from the tip. Both the agent's reset
  (``sandbox.workspace.imagetree.checkout_branch``, S_0 cached per image and branch) and the verifier
  (``sandbox.trials.trial.TrialSpec.checkout``, set by ``eval.tasks.trialspec.task_trial_spec``) run ``git
  checkout <instance_id>`` in ``/testbed`` of a container of the image first. The published
  images do not hold the instance branches: SWE-smith runs ``git fetch`` in the container
  first, which a network-less sandbox cannot do, so the branches must be fetched into a
  derived image before use (nothing here fetches); an image without the branch fails the
  reset (``ImageTreeError``) and the trial (``infra_error``, ``checkout: no local branch
  ...``) with that remedy in the message, never grading the image's default tree.
- **patch** is the *bug* (SWE-smith grades its gold with ``git apply --reverse``):
  ``Task.patch`` (the fix) is :func:`reverse_patch` of it; the row's patch is kept as
  ``extra["bug_patch"]``.
- **Eval script** (``run_patch_in_container`` with ``is_eval``): SWE-smith checks out the
  branch, then ``HEAD~1`` (the tests come back), applies the prediction, reverts the
  FAIL_TO_PASS / PASS_TO_PASS test files (``PythonProfile.get_test_files``: the part of each
  id before ``::``) and runs ``PythonProfile.test_cmd`` (``source
  /opt/miniconda3/bin/activate; conda activate testbed; pytest --disable-warnings
  --color=no --tb=no --verbose``) on those files (the ``min_testing`` path; profiles without
  it run the whole suite, which grades the same listed tests more slowly). Here the artifact
  is applied to the branch tip by the verifier, then :func:`swesmith_eval_script` restores
  the test files from ``<instance_id>~1`` (the same tree: the tip differs from ``~1`` only by
  the removed test files) and runs that command on those files with ``-rA`` added, so
  swebench's generic ``parse_log_pytest`` reads the summary lines (SWE-smith's own parser
  reads the ``--verbose`` lines instead). swebench's ``make_test_spec`` then records the
  test exit code as for every row. ``eval_script_source: "swesmith.harness"``.
- **Log parser**: swebench has none for ``swesmith/...`` repositories: ``parse_log_pytest``
  with ``log_parser_fallback: true``. Only Python (pytest) rows are accepted.
"""

from __future__ import annotations

import re
import shlex

from eval.tasks.adapters import as_row, extra_of, load_rows, parser_or_fallback, require
from eval.tasks.schema import Task, _test_list, docker_hub_name

HUB_ID = "SWE-bench/SWE-smith"
#: Fields a SWE-smith row must carry (SWE-smith's names).
REQUIRED = ("instance_id", "repo", "patch", "FAIL_TO_PASS", "PASS_TO_PASS", "image_name",
            "problem_statement")
SCRIPT_SOURCE = "swesmith.harness"
#: ``PythonProfile.test_cmd`` of swesmith 0.0.9, plus ``-rA`` (see the module docstring).
TEST_CMD = ("source /opt/miniconda3/bin/activate; conda activate testbed; "
            "pytest --disable-warnings --color=no --tb=no --verbose -rA")
_REPO_RE = re.compile(r"swesmith/(?P<owner>[A-Za-z0-9-]+)__(?P<name>[A-Za-z0-9._-]+)"
                      r"\.(?P<commit>[0-9a-f]{8})")


def test_files(test_ids) -> list[str]:
    """Sorted unique files of pytest ids (the part before ``::``;
    ``PythonProfile.get_test_files``)."""
    return sorted({t.split("::", 1)[0] for t in test_ids})


def swesmith_eval_script(instance_id: str, test_ids, workdir: str = "/testbed") -> str:
    """The eval script of a SWE-smith instance (see the module docstring for the source).

    Args:
        instance_id: the instance branch; its parent commit holds the removed tests.
        test_ids: FAIL_TO_PASS + PASS_TO_PASS pytest ids.
    """
    files = " ".join(shlex.quote(f) for f in test_files(test_ids))
    return "\n".join([
        "#!/bin/bash", "set -uxo pipefail", f"cd {shlex.quote(workdir)}",
        f"git checkout {shlex.quote(instance_id + '~1')} -- {files}",
        ": '>>>>> Start Test Output'", f"{TEST_CMD} {files}", ": '>>>>> End Test Output'",
    ]) + "\n"


def _test_ids(row: dict, where: str) -> list[str]:
    ids = []
    for name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        row[name] = _test_list(row[name], name, where)
        ids += row[name]
    bad = [t for t in ids if not t.split("::", 1)[0].endswith(".py")]
    if bad:
        raise ValueError(f"{where}: field 'FAIL_TO_PASS'/'PASS_TO_PASS': only Python (pytest) "
                         f"SWE-smith rows are supported; not a pytest id: {bad[0]!r}")
    return ids


def swesmith_row(row, row_no: int, source: str = "swesmith") -> dict:
    """One SWE-smith row as an :mod:`eval.tasks.schema` row (see the module docstring).

    Raises: ValueError ``"<source> row <n>: field '<name>' ..."`` for a missing field, a
    ``repo`` not shaped ``swesmith/<owner>__<repo>.<commit8>``, an ``instance_id`` not of that
    repository, non-pytest test ids, a patch that cannot be reversed.
    """
    where = f"{source} row {row_no}"
    out = as_row(row, where)
    require(out, REQUIRED, where)
    for name in ("instance_id", "repo", "patch", "image_name"):
        if not isinstance(out[name], str) or not out[name].strip():
            raise ValueError(f"{where}: field {name!r} must be a non-empty string")
    m = _REPO_RE.fullmatch(out["repo"])
    if not m:
        raise ValueError(f"{where}: field 'repo' must look like "
                         f"'swesmith/<owner>__<repo>.<commit8>', got {out['repo']!r}")
    repo_name = out["repo"].split("/", 1)[1]
    if out["instance_id"].rsplit(".", 1)[0] != repo_name:
        raise ValueError(f"{where}: field 'instance_id' {out['instance_id']!r} is not an "
                         f"instance of {repo_name!r} (expected '{repo_name}.<suffix>')")
    ids = _test_ids(out, where)
    try:
        fix = reverse_patch(out["patch"])
    except ValueError as exc:
        raise ValueError(f"{where}: field 'patch': {exc}") from None
    parser, fallback = parser_or_fallback(out["repo"])
    extra = extra_of(out, where)
    extra.update(dataset=HUB_ID, bug_patch=out["patch"],
                 upstream_repo=f"{m['owner']}/{m['name']}", image_name=out["image_name"])
    workdir = out.get("workdir") or "/testbed"
    return {
        **{k: v for k, v in out.items() if k not in ("image_name",)},
        "base_commit": out["instance_id"], "patch": fix, "test_patch": "",
        "version": m["commit"], "environment_setup_commit": m["commit"],
        "image": docker_hub_name(out.get("image") or out["image_name"]),
        "eval_script": swesmith_eval_script(out["instance_id"], ids, workdir),
        "eval_script_source": SCRIPT_SOURCE, "log_parser": out.get("log_parser") or parser,
        "log_parser_fallback": fallback if not out.get("log_parser") else False,
        "checkout_base": True, "workdir": workdir, "extra": extra,
    }


def load_swesmith(path, source: str | None = None) -> list[Task]:
    """Tasks of a local SWE-smith export (``.jsonl`` / ``.json`` / ``.parquet``).

    Raises: FileNotFoundError, ValueError (a malformed row, naming the row and field;
    duplicate ids).
    """
    return load_rows(path, source or f"swesmith:{path}", swesmith_row)


# ---------------------------------------------------------------------------
# reversing a git diff (SWE-smith's gold is `git apply --reverse` of its patch)
# ---------------------------------------------------------------------------

_HUNK = re.compile(r"@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@(.*)", re.S)
_SWAP_PREFIX = {"new file mode ": "deleted file mode ", "deleted file mode ": "new file mode ",
                "old mode ": "new mode ", "new mode ": "old mode "}


def _swap_ab(path: str) -> str:
    if path.startswith("a/"):
        return "b/" + path[2:]
    if path.startswith("b/"):
        return "a/" + path[2:]
    return path


def _header_line(line: str, held: dict) -> list[str]:
    """The reversed form of one header line of a file diff (``held`` pairs from/to lines)."""
    body = line.rstrip("\r\n")
    nl = line[len(body):]
    if body.startswith("diff --git "):
        rest = body[len("diff --git "):]
        half = (len(rest) - 1) // 2
        if rest[:half] == "a/" + rest[half + 3:] or " b/" not in rest:
            return [line]  # same path both sides (or a shape we leave alone)
        old, new = rest.split(" b/", 1)
        return [f"diff --git a/{new} b/{old[2:]}{nl}"]
    for pre, swapped in _SWAP_PREFIX.items():
        if body.startswith(pre):
            return [swapped + body[len(pre):] + nl]
    if body.startswith("index ") and ".." in body:
        ids, sep, mode = body[len("index "):].partition(" ")
        a, b = ids.split("..", 1)
        return [f"index {b}..{a}{sep}{mode}{nl}"]
    for kind in ("--- ", "rename from ", "copy from "):
        if body.startswith(kind):
            if kind == "copy from ":
                raise ValueError("a copy cannot be reversed into a plain diff")
            held[kind] = body[len(kind):]
            return []
    for kind, first in (("+++ ", "--- "), ("rename to ", "rename from ")):
        if body.startswith(kind):
            old = held.pop(first, None)
            if old is None:
                raise ValueError(f"{kind.strip()!r} line without {first.strip()!r}")
            new = body[len(kind):]
            if kind == "+++ ":
                return [f"--- {_swap_ab(new)}{nl}", f"+++ {_swap_ab(old)}{nl}"]
            return [f"rename from {new}{nl}", f"rename to {old}{nl}"]
    if body.startswith("GIT binary patch") or body.startswith("Binary files "):
        raise ValueError("binary diffs are not supported")
    return [line]


def reverse_patch(diff: str) -> str:
    """The git diff that undoes ``diff`` (what ``git apply --reverse`` applies): old and new
    sides swapped in ``diff --git``, ``---``/``+++``, ``index``, modes, renames, hunk ranges
    and ``-``/``+`` lines. Pure text; ``\\ No newline at end of file`` stays with its line.

    Raises: ValueError for binary diffs, copies, a malformed hunk.
    """
    out: list[str] = []
    held: dict = {}
    old_left = new_left = 0
    for line in diff.splitlines(keepends=True):
        if old_left > 0 or new_left > 0:
            tag = line[:1]
            if tag in (" ", "\n", "\r"):
                old_left, new_left = old_left - 1, new_left - 1
                out.append(line)
            elif tag == "-":
                old_left -= 1
                out.append("+" + line[1:])
            elif tag == "+":
                new_left -= 1
                out.append("-" + line[1:])
            elif tag == "\\":
                out.append(line)
            else:
                raise ValueError(f"malformed hunk line {line[:60]!r}")
            continue
        m = _HUNK.match(line)
        if m:
            a, b, c, d, rest = m.groups()
            old_left = int(b[1:]) if b else 1
            new_left = int(d[1:]) if d else 1
            out.append(f"@@ -{c}{d or ''} +{a}{b or ''} @@{rest}")
        else:
            out.extend(_header_line(line, held))
    if old_left > 0 or new_left > 0 or held:
        raise ValueError("the diff ends inside a hunk or a file header")
    return "".join(out)
