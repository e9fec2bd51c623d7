"""Adapters from SWE-bench-like training sets to :class:`eval.tasks.schema.Task` rows.

Each adapter reads that project's own rows (its field names kept), fills what the
:mod:`eval.tasks.schema` schema needs, and hands the row to :func:`eval.tasks.schema.task_from_row`, so
the validation and error messages are the same as for SWE-bench rows:

- :mod:`eval.tasks.adapters.swegym`: ``SWE-Gym/SWE-Gym`` (source ``swegym:PATH``).
- :mod:`eval.tasks.adapters.swesmith`: ``SWE-bench/SWE-smith`` (source ``swesmith:PATH``).

:func:`parser_or_fallback` is the rule both share: swebench's parser for the repository
when it has one, else the generic ``parse_log_pytest`` with ``log_parser_fallback: true``.
"""

from __future__ import annotations

from eval.tasks.schema import read_rows, tasks_from_rows

#: swebench's generic pytest parser (``swebench.harness.log_parsers.python``).
GENERIC_PARSER = "parse_log_pytest"


def parser_or_fallback(repo: str) -> tuple[str, bool]:
    """``(log_parser, fallback)``: swebench's ``MAP_REPO_TO_PARSER`` entry for ``repo``
    (``fallback=False``), or :data:`GENERIC_PARSER` with ``fallback=True`` when swebench
    has none for it."""
    from eval.grading.log_parsing import parser_for_repo  # start-up: swebench, ~1 s

    try:
        return parser_for_repo(repo)[0], False
    except ValueError:
        return GENERIC_PARSER, True


def require(row: dict, names, where: str) -> None:
    """Raise ``ValueError("<where>: field '<name>' missing")`` for the first absent field."""
    for name in names:
        if name not in row or row[name] is None:
            raise ValueError(f"{where}: field {name!r} missing")


def as_row(row, where: str) -> dict:
    """A plain dict copy of a mapping row (HF rows, dicts); ValueError for anything else."""
    if hasattr(row, "keys") and not isinstance(row, dict):
        row = dict(row)
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object, got {type(row).__name__}")
    return dict(row)


def extra_of(row: dict, where: str) -> dict:
    """A copy of the row's ``extra`` object (``{}`` when absent); ValueError otherwise."""
    extra = row.get("extra")
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise ValueError(f"{where}: field 'extra' must be an object")
    return dict(extra)


def load_rows(path, source: str, to_row) -> list:
    """Tasks of a local export (``.jsonl`` / ``.json`` / ``.parquet``): each row through
    ``to_row(row, row_no, source)`` (an adapter's row mapping), then
    :func:`eval.tasks.schema.tasks_from_rows`.

    Raises: FileNotFoundError, ValueError (a malformed row, naming the row and field;
    duplicate ids).
    """
    rows, nums = read_rows(path)
    rows = [to_row(r, n, source) for r, n in zip(rows, nums, strict=True)]
    return tasks_from_rows(rows, source=source, row_numbers=nums)
