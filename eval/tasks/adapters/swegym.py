"""SWE-Gym rows (``SWE-Gym/SWE-Gym``, split ``train``) as :class:`eval.tasks.schema.Task` rows.

SWE-Gym rows carry the SWE-bench fields under the same names (``instance_id``, ``repo``,
``base_commit``, ``patch``, ``test_patch``, ``problem_statement``, ``version``,
``environment_setup_commit``, ``FAIL_TO_PASS``, ``PASS_TO_PASS``, ``hints_text``,
``created_at``); they are kept as they are and validated by :func:`eval.tasks.schema.task_from_row`.

Image (sources read 2026-11-30):
    ``docker.io/xingyaoww/sweb.eval.x86_64.<instance_id with "__" -> "_s_">:latest``,
    lower-cased. OpenHands ``evaluation/benchmarks/swe_bench/run_infer.py``
    (``get_instance_docker_image``: prefix ``EVAL_DOCKER_IMAGE_PREFIX``, default
    ``docker.io/xingyaoww/``; ``'sweb.eval.x86_64.' + instance_id``, ``replace('__', '_s_')``
    "to comply with docker image naming convention", ``.lower()``), and OpenHands
    ``evaluation/benchmarks/swe_bench/SWE-Gym.md`` ("pre-built docker images for each instance
    under xingyaoww/sweb.eval.x86_64 prefix"). The images are SWE-bench-harness builds: the
    repository at base in ``/testbed``. A row's own ``image`` (or ``image_name``) wins.

Log parser: the row's ``log_parser``, else swebench's parser for ``repo``, else the generic
``parse_log_pytest`` with ``log_parser_fallback: true``. SWE-Gym's repositories (moto,
pandas, mypy, dask, pydantic, MONAI, conan, dvc, modin, hydra, bokeh, ...) are not in
swebench 5's ``MAP_REPO_TO_PARSER``; SWE-Gym's own harness maps every one of them to
``parse_log_pytest`` (``swebench/harness/log_parsers.py`` of github:SWE-Gym/SWE-Bench-Fork at
242429c, e.g. ``parse_log_moto = parse_log_pytest``), so the fallback is SWE-Gym's choice too.

Eval script: the row's own ``eval_script`` (through swebench's ``make_test_spec``, like a
SWE-bench row). SWE-Gym publishes none: its "environment constants are ... saved at
SWE-Bench-Fork" (SWE-Gym.md): a swebench-2-style ``MAP_REPO_VERSION_TO_SPECS`` (e.g.
``getmoto/moto`` test_cmd ``pytest -n0 -rA``) and ``harness/test_spec.make_test_spec`` that
swebench 5.0.2 no longer has (and that cannot be installed beside it: both are the
``swebench`` package). A row without one loads with ``eval_script_source: "missing"`` and
:func:`eval.tasks.trialspec.task_trial_spec` refuses it; add ``eval_script`` =
``make_test_spec(row).eval_script`` computed with that fork (in its own environment) to
verify them. Its scripts start ``set -xo pipefail``; swebench 5's ``make_test_spec`` puts
its own ``set -uxo pipefail`` in front (not checked against a real image here).
"""

from __future__ import annotations

from eval.tasks.adapters import as_row, extra_of, load_rows, parser_or_fallback, require
from eval.tasks.schema import Task, docker_hub_name

HUB_ID = "SWE-Gym/SWE-Gym"
IMAGE_PREFIX = "docker.io/xingyaoww"
#: Fields a SWE-Gym row must carry (SWE-bench's names).
REQUIRED = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement",
            "version", "environment_setup_commit", "FAIL_TO_PASS", "PASS_TO_PASS")


def swegym_image(instance_id: str, prefix: str = IMAGE_PREFIX) -> str:
    """SWE-Gym's image of ``instance_id`` (see the module docstring for the source).

    ``getmoto__moto-5752`` -> ``docker.io/xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752:latest``.

    Raises: ValueError for an empty id or one holding ``/``.
    """
    if not instance_id or "/" in instance_id:
        raise ValueError(f"instance_id: not a SWE-Gym instance id: {instance_id!r}")
    name = ("sweb.eval.x86_64." + instance_id).replace("__", "_s_")
    return f"{prefix.rstrip('/')}/{name}".lower() + ":latest"


def swegym_row(row, row_no: int, source: str = "swegym") -> dict:
    """One SWE-Gym row as an :mod:`eval.tasks.schema` row (image, parser, flags filled in).

    Raises: ValueError ``"<source> row <n>: field '<name>' missing"`` (and every error of
    :func:`eval.tasks.schema.task_from_row` once the row is loaded).
    """
    where = f"{source} row {row_no}"
    out = as_row(row, where)
    require(out, REQUIRED, where)
    image = out.get("image") or out.get("image_name")
    if image is not None and not isinstance(image, str):
        raise ValueError(f"{where}: field 'image_name' must be a string")
    out["image"] = docker_hub_name(image) if image else swegym_image(str(out["instance_id"]))
    if not out.get("log_parser") and isinstance(out["repo"], str):
        out["log_parser"], out["log_parser_fallback"] = parser_or_fallback(out["repo"])
    out.setdefault("workdir", "/testbed")
    out["extra"] = {**extra_of(out, where), "dataset": HUB_ID}
    return out


def load_swegym(path, source: str | None = None) -> list[Task]:
    """Tasks of a local SWE-Gym export (``.jsonl`` / ``.json`` / ``.parquet``).

    Raises: FileNotFoundError, ValueError (a malformed row, naming the row and field;
    duplicate ids).
    """
    return load_rows(path, source or f"swegym:{path}", swegym_row)
