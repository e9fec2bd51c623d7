"""Task schema and row validation: what one task is, and how a SWE-bench-format row becomes one.

A :class:`Task` is one SWE-bench instance plus what a verifier trial needs to run it
(image, eval script, log parser, and for bundled tasks the local git repository that
holds ``base_commit``). This module knows nothing of splits, building or sealing: the
split loader on top of it is :mod:`eval.tasks.splits` (``load_tasks``), the trial spec of a task
is :mod:`eval.tasks.trialspec`.

Row rules: ``FAIL_TO_PASS`` / ``PASS_TO_PASS`` may be JSON strings (SWE-bench files) or
lists. A malformed row raises :class:`ValueError` naming the source, the 1-based row number
(for jsonl: the line number) and the field.

Eval scripts and log parsers of SWE-bench instances come from the ``swebench`` package:
``swebench.harness.utils.make_test_spec`` turns the row's ``eval_script`` into the exact
script the official harness runs (swebench 5 ships eval scripts in the dataset rows rather
than deriving them from a per-repo table), and the parser is the row's ``log_parser`` or
swebench's ``MAP_REPO_TO_PARSER`` entry for the repo. A row without ``eval_script`` loads
(ids, patches and lists are usable; ``eval_script_source`` says ``"missing"``) but
:func:`eval.tasks.trialspec.task_trial_spec` refuses it. swebench 5.0.2 cannot make one:
its ``make_test_spec`` reads ``instance["eval_script"]`` and has no per-repo spec table
(the ``MAP_REPO_VERSION_TO_SPECS`` of swebench <= 4 is gone), so rows of older exports
(``princeton-nlp/SWE-bench_Verified``) need the scripts of ``SWE-bench/SWE-bench_Verified``;
this project writes no eval script of its own for SWE-bench rows.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from eval.files import write_jsonl
from eval.tasks.protection import check_protected_paths
from sandbox.images import swebench_image

REQUIRED_STR_FIELDS = (
    "instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
    "version", "environment_setup_commit",
)
LIST_FIELDS = ("FAIL_TO_PASS", "PASS_TO_PASS")


@dataclass
class Task:
    """One task = one SWE-bench-format instance plus how to verify it.

    Attributes:
        instance_id, repo, base_commit, problem_statement, patch (gold), test_patch,
        version, environment_setup_commit: as in SWE-bench.
        FAIL_TO_PASS, PASS_TO_PASS: fixed test-id lists (design page, "Utility and the
            missing-observation rule").
        image: fully-qualified image name the verifier trial runs in.
        eval_script: bash run in ``workdir`` after the artifact is applied; prints the test
            output between ``>>>>> Start Test Output`` / ``>>>>> End Test Output`` and the
            test command's status as ``>>>>> Test Exit Code: N``. ``""`` when the source row
            had none (then :func:`eval.tasks.trialspec.task_trial_spec` refuses the task).
        log_parser: swebench ``PARSER_REGISTRY`` key (e.g. ``parse_log_pytest``).
        repo_dir: local git repository holding ``base_commit`` (bundled tasks); ``None``
            when the image already holds the repository at base (SWE-bench images).
        workdir: repository path inside the sandbox.
        extra: everything else (source row fields we do not model, build metadata).
        protected_paths: how this task changes the verifier's default protected set:
            ``None`` (the default set) or ``{"add": [patterns],
            "remove": [patterns]}``; ``remove`` may only name patterns of
            :data:`sandbox.trials.protect.DEFAULT_PROTECTED`. Add ``setup.cfg`` /
            ``pyproject.toml`` to protect pytest config kept there. See
            :func:`protected_set`.
        eval_script_source: where ``eval_script`` came from:
            :data:`SCRIPT_FROM_ROW` (the row's own script, passed through swebench's
            ``make_test_spec``), :data:`SCRIPT_MISSING` (the row had none), an adapter's
            value (e.g. ``"swesmith.harness"``), or ``None`` (not recorded: tasks built here).
        log_parser_fallback: ``True`` when swebench has no parser for ``repo`` and the
            generic ``parse_log_pytest`` was chosen for it (adapters).
        checkout_base: ``True`` when the image's ``workdir`` is *not* at ``base_commit``
            and ``base_commit`` (then a branch name of the image's repository, e.g. a
            SWE-smith instance branch) must be checked out before the agent starts and
            before the artifact is applied. ``False`` for SWE-bench images (already at base).
    """

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str]
    version: str
    environment_setup_commit: str
    image: str
    eval_script: str
    log_parser: str
    repo_dir: str | None = None
    workdir: str = "/testbed"
    extra: dict = field(default_factory=dict)
    protected_paths: dict | None = None
    eval_script_source: str | None = None
    log_parser_fallback: bool = False
    checkout_base: bool = False

    def to_dict(self) -> dict:
        """JSON-ready dict (lists stay lists); :func:`task_from_row` reads it back.
        ``protected_paths``, ``eval_script_source``, ``log_parser_fallback`` and
        ``checkout_base`` are left out at their defaults, so task files written before the
        fields existed keep their bytes (the bundled cache is compared byte for byte)."""
        d = asdict(self)
        for name, default in _OMIT_AT_DEFAULT.items():
            if d[name] == default:
                del d[name]
        return d


_OMIT_AT_DEFAULT = {"protected_paths": None, "eval_script_source": None,
                    "log_parser_fallback": False, "checkout_base": False}
#: ``Task.eval_script_source`` values set by :func:`task_from_row`.
SCRIPT_FROM_ROW = "row"
SCRIPT_MISSING = "missing"


_TASK_FIELDS = {f.name for f in fields(Task)}


# ---------------------------------------------------------------------------
# row validation
# ---------------------------------------------------------------------------

def _where(source: str, row_no: int) -> str:
    return f"{source} row {row_no}"


def _test_list(value: Any, name: str, where: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: field {name!r} is a string but not JSON ({exc.msg})") from None
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{where}: field {name!r} must be a list of test ids (or its JSON "
                         f"string), got {type(value).__name__}")
    out = list(value)
    for i, item in enumerate(out):
        if not isinstance(item, str) or not item:
            raise ValueError(f"{where}: field {name!r} item {i} must be a non-empty string, "
                             f"got {item!r}")
    dup = [k for k, c in Counter(out).items() if c > 1]
    if dup:
        raise ValueError(f"{where}: field {name!r} lists test ids twice: {dup[:5]}")
    return out


def _default_parser(repo: str, where: str) -> str:
    from eval.grading.grader import parser_for_repo  # start-up: swebench, ~1 s

    try:
        return parser_for_repo(repo)[0]
    except ValueError:
        raise ValueError(f"{where}: field 'log_parser' missing and swebench has no parser "
                         f"for repo {repo!r} (MAP_REPO_TO_PARSER)") from None


def _official_eval_script(row: dict, image: str, log_parser: str, where: str) -> str:
    """The official harness script for ``row`` via ``swebench.harness.utils.make_test_spec``.

    Scripts that already record the test exit code (``>>>>> Test Exit Code``) are taken as
    they are, so a task written by :meth:`Task.to_dict` loads back unchanged.
    """
    script = row.get("eval_script")
    if script in (None, ""):
        return ""
    if not isinstance(script, str):
        raise ValueError(f"{where}: field 'eval_script' must be a string, got "
                         f"{type(script).__name__}")
    from swebench.harness.constants import TEST_EXIT_CODE
    from swebench.harness.utils import make_test_spec

    if TEST_EXIT_CODE in script:
        return script
    inst = {
        "instance_id": row["instance_id"], "image": image, "eval_script": script,
        "repo": row["repo"], "version": row["version"],
        "FAIL_TO_PASS": row["FAIL_TO_PASS"], "PASS_TO_PASS": row["PASS_TO_PASS"],
        "log_parser": log_parser, "eval_type": row.get("eval_type") or "pass_and_fail",
    }
    return make_test_spec(inst).eval_script


def docker_hub_name(image: str) -> str:
    """``image`` with ``docker.io/`` in front when its first path component names no
    registry (no ``.`` or ``:`` in it and not ``localhost``): Podman needs a
    registry-qualified name where Docker assumes Docker Hub (as the SWE-bench harness does).
    ``swebench/sweb.eval.x86_64.x:latest`` -> ``docker.io/swebench/sweb.eval.x86_64.x:latest``.
    """
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if sep else f"docker.io/library/{image}"


def _verifier_fields(row: dict, where: str, official: bool) -> tuple[str, str, str, str | None]:
    """``(image, log_parser, eval_script, eval_script_source)`` of a validated row.

    The row's own ``image`` wins (for ``official`` rows, Docker Hub names, it
    is registry-qualified with :func:`docker_hub_name`), else the swebench name. The row's
    ``log_parser`` wins, else swebench's parser for ``repo``. The eval script is the row's
    (see :func:`_official_eval_script`).
    """
    from eval.grading.grader import resolve_parser  # start-up: swebench, ~1 s

    image = row.get("image") or ""
    if image and official:
        image = docker_hub_name(image)
    image = image or swebench_image(row["instance_id"])
    log_parser = row.get("log_parser") or _default_parser(row["repo"], where)
    try:
        log_parser = resolve_parser(log_parser)[0]
    except ValueError as exc:
        raise ValueError(f"{where}: field 'log_parser': {exc}") from None
    _refuse_image_assets(row, where)
    eval_script = _official_eval_script(row, image, log_parser, where)
    src = row.get("eval_script_source")
    if src is not None and not isinstance(src, str):
        raise ValueError(f"{where}: field 'eval_script_source' must be a string or null")
    if src is None and not eval_script:
        src = SCRIPT_MISSING
    elif src is None and eval_script != row.get("eval_script"):
        src = SCRIPT_FROM_ROW  # the row's script, run through swebench's make_test_spec
    return image, log_parser, eval_script, src


def _refuse_image_assets(row: dict, where: str) -> None:
    """Refuse rows whose ``image_assets`` list files: swebench 5's harness fetches those
    binary test files by URL and copies them in before the tests run
    (``run_evaluation._stage_image_assets``, SWE-bench Multimodal); a network-less verifier
    that skipped them would grade against missing files."""
    raw = row.get("image_assets")
    if not raw:
        return
    try:
        assets = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        raise ValueError(f"{where}: field 'image_assets' is a string but not JSON") from None
    listed = [e for key in ("test_patch", "patch") for e in (assets or {}).get(key) or []
              if isinstance(e, dict) and e.get("path")] if isinstance(assets, dict) else [raw]
    if listed:
        raise ValueError(f"{where}: field 'image_assets' lists {len(listed)} binary test "
                         "file(s) that swebench's harness downloads at eval time; such rows "
                         "(SWE-bench Multimodal) are not supported")


def _flags(row: dict, where: str) -> dict[str, bool]:
    out = {}
    for name in ("log_parser_fallback", "checkout_base"):
        value = row.get(name, False)
        if not isinstance(value, bool):
            raise ValueError(f"{where}: field {name!r} must be true or false, got {value!r}")
        out[name] = value
    return out


def task_from_row(row: Any, row_no: int, *, source: str = "tasks",
                  official: bool = False, base_dir: Path | None = None) -> Task:
    """Validate one SWE-bench-format row and turn it into a :class:`Task`.

    Args:
        row: a mapping with at least the SWE-bench fields.
        row_no: 1-based row number used in error messages.
        source: name of the source used in error messages.
        official: a SWE-bench (Verified) row: its ``image`` is a Docker Hub name and gets
            registry-qualified (:func:`docker_hub_name`); without one the image is
            :func:`sandbox.images.swebench_image`.
        base_dir: the task file's folder: a relative ``repo_dir`` is resolved against it,
            and a ``repo_dir`` of a row read from a file must be a git repository.

    Raises:
        ValueError: ``"<source> row <n>: field '<name>' ..."`` for a missing or mistyped
            field, a non-list / non-JSON test list, an empty FAIL_TO_PASS, duplicate ids, a
            ``repo_dir`` (rows read from a file) that is not a git repository.
    """
    where = _where(source, row_no)
    if hasattr(row, "keys") and not isinstance(row, dict):
        row = dict(row)
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object, got {type(row).__name__}")
    row = dict(row)
    for name in REQUIRED_STR_FIELDS:
        if name not in row or row[name] is None:
            raise ValueError(f"{where}: field {name!r} missing")
        if not isinstance(row[name], str):
            raise ValueError(f"{where}: field {name!r} must be a string, got "
                             f"{type(row[name]).__name__} ({row[name]!r:.40})")
    for name in ("instance_id", "repo", "base_commit"):
        if not row[name].strip():
            raise ValueError(f"{where}: field {name!r} is empty")
    for name in LIST_FIELDS:
        if name not in row or row[name] is None:
            raise ValueError(f"{where}: field {name!r} missing")
        row[name] = _test_list(row[name], name, where)
    if not row["FAIL_TO_PASS"]:
        raise ValueError(f"{where}: field 'FAIL_TO_PASS' is empty (the utility divides by "
                         "|FAIL_TO_PASS|)")
    both = sorted(set(row["FAIL_TO_PASS"]) & set(row["PASS_TO_PASS"]))
    if both:
        raise ValueError(f"{where}: field 'PASS_TO_PASS' repeats FAIL_TO_PASS ids: {both[:5]}")
    for name in ("image", "eval_script", "log_parser", "workdir"):
        if row.get(name) is not None and not isinstance(row[name], str):
            raise ValueError(f"{where}: field {name!r} must be a string, got "
                             f"{type(row[name]).__name__}")
    if row.get("repo_dir") is not None and not isinstance(row["repo_dir"], str):
        raise ValueError(f"{where}: field 'repo_dir' must be a string or null")
    if row.get("extra") is not None and not isinstance(row["extra"], dict):
        raise ValueError(f"{where}: field 'extra' must be an object")

    protected_paths = check_protected_paths(row.get("protected_paths"), where)
    flags = _flags(row, where)
    extra = dict(row.get("extra") or {})
    for key, value in row.items():
        if key not in _TASK_FIELDS:
            extra[key] = value
    image, log_parser, eval_script, script_src = _verifier_fields(row, where, official)
    repo_dir = row.get("repo_dir")
    if repo_dir and base_dir is not None:
        given = repo_dir
        if not Path(repo_dir).is_absolute():  # relative to the folder of the task file
            repo_dir = str((base_dir / repo_dir).resolve())
        if not Path(repo_dir, ".git").exists() and not Path(repo_dir, "HEAD").is_file():
            # refused at load, not at the first rollout (a copied row keeps a relative path)
            raise ValueError(f"{where}: field 'repo_dir' {given!r} is not a git repository "
                             f"(resolved to {repo_dir}; a relative repo_dir is relative to the "
                             "folder of the task file)")
    return Task(
        instance_id=row["instance_id"], repo=row["repo"], base_commit=row["base_commit"],
        problem_statement=row["problem_statement"], patch=row["patch"],
        test_patch=row["test_patch"], FAIL_TO_PASS=row["FAIL_TO_PASS"],
        PASS_TO_PASS=row["PASS_TO_PASS"], version=row["version"],
        environment_setup_commit=row["environment_setup_commit"], image=image,
        eval_script=eval_script, log_parser=log_parser, repo_dir=repo_dir,
        workdir=row.get("workdir") or "/testbed", extra=extra, protected_paths=protected_paths,
        eval_script_source=script_src, **flags)


def tasks_from_rows(rows, *, source: str, official: bool = False,
                    base_dir: Path | None = None, row_numbers: list[int] | None = None
                    ) -> list[Task]:
    """Validate every row (see :func:`task_from_row`) and refuse duplicate instance ids.

    Raises:
        ValueError: the first malformed row, or ``"<source>: duplicate instance_id ..."``
            naming the ids and their row numbers.
    """
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    dups: list[str] = []
    for i, row in enumerate(rows):
        n = row_numbers[i] if row_numbers else i + 1
        t = task_from_row(row, n, source=source, official=official, base_dir=base_dir)
        if t.instance_id in seen:
            dups.append(f"{t.instance_id} (rows {seen[t.instance_id]} and {n})")
        seen.setdefault(t.instance_id, n)
        tasks.append(t)
    if dups and not official:
        raise ValueError(f"{source}: duplicate instance_id: {', '.join(dups[:10])}")
    return tasks


# ---------------------------------------------------------------------------
# file readers
# ---------------------------------------------------------------------------

def read_rows(path: str | Path) -> tuple[list[dict], list[int]]:
    """Rows of a ``.jsonl`` (one object a line; blank lines skipped), ``.json`` (a list of
    objects) or ``.parquet`` file (read with HF ``datasets``), with their 1-based numbers
    (jsonl: line numbers).

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown suffix, or an unparsable line / document (with its number), or
            a row that is not UTF-8 (jsonl: its number).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tasks file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows, nums = [], []
        with open(path, "rb") as fh:  # rows end at b"\n"; each decoded alone, so an error names its row
            for line_no, raw in enumerate(fh, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ValueError(f"{path} row {line_no}: not UTF-8 text ({exc.reason} at "
                                     f"byte {exc.start} of the row)") from None
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path} row {line_no}: not valid JSON ({exc.msg})") from None
                nums.append(line_no)
        return rows, nums
    if suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno})") from None
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        if isinstance(data, dict) and isinstance(data.get("tasks"), list):
            data = data["tasks"]
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of task rows, got {type(data).__name__}")
        return data, list(range(1, len(data) + 1))
    if suffix == ".parquet":
        from datasets import load_dataset

        ds = load_dataset("parquet", data_files=str(path), split="train")
        return [dict(r) for r in ds], list(range(1, len(ds) + 1))
    raise ValueError(f"{path}: unknown tasks file type {suffix!r} (expected .jsonl, .json or .parquet)")


def save_tasks(tasks: list[Task], path: str | Path) -> None:
    """Write tasks as jsonl (one :meth:`Task.to_dict` per line, UTF-8), atomically
    (:func:`eval.files.write_jsonl`)."""
    write_jsonl(path, (t.to_dict() for t in tasks), ensure_ascii=False)
