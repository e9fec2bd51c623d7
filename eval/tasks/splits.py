"""Split loader: a task list by source name, dispatching to official loading, bundled
building and sealed-manifest checks (design page, "Evaluation").

Sources accepted by :func:`load_tasks`:

``official500``
    SWE-bench Verified through HF ``datasets`` (hub id ``SWE-bench/SWE-bench_Verified``,
    split ``test``: swebench-5-format rows that carry ``image``, ``eval_script`` and
    ``log_parser``, all kept; set ``HF_HUB_OFFLINE=1`` to forbid downloads). Exactly 500
    unique ``instance_id`` s are required; anything else is refused with what was found.
``official500:PATH`` (or ``load_tasks("official500", path=PATH)``)
    The same from a local ``.parquet`` / ``.jsonl`` / ``.json`` file with the same fields.
    Rows without ``eval_script`` (older ``princeton-nlp`` exports) load with
    ``eval_script_source: "missing"`` and cannot be verified (:mod:`eval.tasks.schema`).
``holdout100``
    The sealed manifest ``datasets/holdout100.json`` (written by ``python -m eval.holdout
    seal``): a user-given list (``--from``) loads from the rows file sealed next to it, a
    drawn one from the manifest's pool source; the sha256 of the ids (and rows) is checked.
``swegym:PATH`` / ``swesmith:PATH``
    Training sets through :mod:`eval.tasks.adapters.swegym` / :mod:`eval.tasks.adapters.swesmith`
    (local ``.jsonl`` / ``.json`` / ``.parquet`` exports of ``SWE-Gym/SWE-Gym`` /
    ``SWE-bench/SWE-smith``).
``bundled`` / ``bundled:train`` / ``bundled:holdout``
    Tasks built from real PyPI projects by :mod:`eval.tasks.bundled` (built on first use,
    then cached). ``:train`` drops every sealed id, ``:holdout`` keeps only the ids of
    ``datasets/bundled_holdout.json``.
``procedural`` / ``procedural:train`` / ``procedural:heldout``
    The procedural world (``datasets/procedural.yaml``): every validated mutation of the
    recipe's projects, built like ``bundled`` (same builder, trials and grading) and split
    by unit of code (:mod:`eval.tasks.bundled.world`): ``:train`` and ``:heldout`` keep the
    instances whose ``extra["split"]`` says so.
``procedural-localized`` / ``procedural-localized:train`` / ``procedural-localized:heldout``
    The same world (same instances, same sides; ids ``localized__...``) whose problem
    statements also quote each mutated line as a traceback's library frame
    (``datasets/procedural_localized.yaml``, the recipe's ``locate``).
``bundled-image`` / ``bundled-image:train`` / ``bundled-image:holdout``
    The same tasks (same ids, same partition) held in Podman images, SWE-bench style
    (:mod:`eval.tasks.bundled.imagetasks`: no ``repo_dir``, ``/testbed`` in the image; built on
    first use, then cached).
any ``*.jsonl`` / ``*.json`` / ``*.parquet`` path
    Rows in the SWE-bench format (:mod:`eval.tasks.schema`). A ``.json`` file holding a sealed
    manifest (a dict with ``"sealed": true``) loads that manifest's tasks.

Training guard: ``load_tasks(..., purpose="train")`` refuses any id listed in a sealed
manifest under ``datasets/`` (:func:`eval.tasks.sealed.check_not_sealed`) and any held-out
instance of a world (:func:`check_not_heldout`: by its row's split and by its id).
"""

from __future__ import annotations

import functools
import json
import tempfile
from collections import Counter
from pathlib import Path

from eval.files import datasets_dir
from eval.tasks.adapters.swegym import load_swegym
from eval.tasks.adapters.swesmith import load_swesmith
from eval.tasks.bundled.cache import ensure_built
from eval.tasks.bundled.imagetasks import ensure_image_tasks
from eval.tasks.bundled.recipe import cache_dir, load_recipe
from eval.tasks.bundled.sources import fetch_sdist, unpack_sdist
from eval.tasks.bundled.world import heldout_ids
from eval.tasks.schema import Task, read_rows, tasks_from_rows
from eval.tasks.sealed import (
    SealedTaskError,
    check_not_sealed,
    file_sha256,
    ids_sha256,
    read_manifest,
    sealed_ids,
)

#: Hub id and split of SWE-bench Verified.
OFFICIAL_HUB_ID = "SWE-bench/SWE-bench_Verified"
OFFICIAL_SPLIT = "test"
OFFICIAL_SIZE = 500
PURPOSES = ("eval", "train")
#: World sources: name -> recipe file under ``datasets/`` (a recipe with a ``heldout`` split).
WORLD_SOURCES = {"procedural": "procedural.yaml",
                 "procedural-localized": "procedural_localized.yaml"}
#: Training-set sources read through :mod:`eval.tasks.adapters` (``NAME:PATH``).
ADAPTER_SOURCES = ("swegym", "swesmith")


def _hub_rows(hub_id: str, split: str) -> list[dict]:
    try:
        from datasets import load_dataset

        ds = load_dataset(hub_id, split=split)
    except Exception as exc:
        raise RuntimeError(
            f"official500: could not load {hub_id} split {split!r} through HF datasets "
            f"({type(exc).__name__}: {str(exc)[:300]}). Offline? Pass a local copy as "
            "'official500:PATH' (parquet/jsonl/json with the SWE-bench fields).") from exc
    return [dict(r) for r in ds]


def check_official(tasks: list[Task], source: str = "official500") -> None:
    """Refuse anything but exactly 500 unique instance ids (SWE-bench Verified).

    Raises:
        ValueError: saying how many rows and unique ids were found and which ids repeat.
    """
    ids = [t.instance_id for t in tasks]
    counts = Counter(ids)
    dups = sorted(k for k, c in counts.items() if c > 1)
    if len(ids) != OFFICIAL_SIZE or dups:
        msg = (f"{source}: expected {OFFICIAL_SIZE} unique instance ids, found {len(ids)} rows "
               f"with {len(counts)} unique ids")
        if dups:
            msg += f"; duplicated: {', '.join(dups[:10])}" + (" ..." if len(dups) > 10 else "")
        raise ValueError(msg)


def load_official(path: str | Path | None = None) -> list[Task]:
    """SWE-bench Verified: from the hub (``path=None``) or a local file; 500 ids checked.

    Raises: ValueError (malformed row, wrong count/duplicates), RuntimeError (hub unreachable),
    FileNotFoundError.
    """
    if path is None:
        rows, nums, src = _hub_rows(OFFICIAL_HUB_ID, OFFICIAL_SPLIT), None, "official500"
    else:
        rows, nums = read_rows(path)
        src = f"official500 ({path})"
    tasks = tasks_from_rows(rows, source=src, official=True, row_numbers=nums)
    check_official(tasks, src)
    return tasks


# ---------------------------------------------------------------------------
# load_tasks
# ---------------------------------------------------------------------------

def _select(tasks: list[Task], ids: list[str], source: str) -> list[Task]:
    by_id = {t.instance_id: t for t in tasks}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise ValueError(f"{source}: {len(missing)} sealed id(s) not in the pool: "
                         f"{', '.join(missing[:10])}")
    return [by_id[i] for i in ids]


def _sealed_rows(manifest_path: Path, man: dict, source: str) -> list[Task]:
    """The tasks of the rows file sealed with a user-given list (``seal --from``), its
    sha256 checked against the manifest's ``rows_sha256``."""
    rows_path = manifest_path.parent / man["rows_file"]
    if not rows_path.is_file():
        raise FileNotFoundError(f"{source}: rows file {rows_path} of {manifest_path} is missing")
    if file_sha256(rows_path) != man.get("rows_sha256"):
        raise ValueError(f"{source}: {rows_path} changed since {manifest_path} was sealed "
                         "(rows sha256 differs)")
    rows, nums = read_rows(rows_path)
    tasks = tasks_from_rows(rows, source=str(rows_path), row_numbers=nums)
    if ids_sha256([t.instance_id for t in tasks]) != man["sha256"]:
        raise ValueError(f"{source}: {rows_path} holds other ids than {manifest_path}")
    return tasks


def _load_manifest_tasks(manifest_path: Path, source: str) -> list[Task]:
    man = read_manifest(manifest_path)
    if man.get("rows_file"):
        return _select(_sealed_rows(manifest_path, man, source), man["ids"], source)
    pool = load_tasks(man["pool"], purpose="eval")
    pool_sha = ids_sha256([t.instance_id for t in pool])
    if man.get("pool_sha256") and man["pool_sha256"] != pool_sha:
        raise ValueError(f"{source}: pool {man['pool']!r} changed since {manifest_path} was "
                         f"sealed (pool sha256 {pool_sha[:12]} != sealed {man['pool_sha256'][:12]})")
    return _select(pool, man["ids"], source)


def load_tasks(source: str, *, purpose: str = "eval", path: str | Path | None = None,
               log=None) -> list[Task]:
    """Load a task list by source name (see the module docstring for the names).

    Args:
        source: ``official500[:PATH]``, ``holdout100``, ``bundled[:train|:holdout]``,
            ``bundled-image[:train|:holdout]``, ``swegym:PATH``, ``swesmith:PATH``, a
            sealed-manifest ``.json`` path, or a ``.jsonl`` / ``.json`` / ``.parquet`` path.
        purpose: ``"eval"`` or ``"train"``; ``"train"`` refuses sealed ids.
        path: local file for ``official500`` (same as ``official500:PATH``).
        log: progress printer for a bundled build (default: print to stderr).

    Returns: tasks in source order.

    Raises:
        ValueError: unknown source/purpose, malformed rows, wrong official count,
            sealed ids loaded for training (:class:`eval.tasks.sealed.SealedTaskError`).
        FileNotFoundError: a missing file or manifest.
    """
    if purpose not in PURPOSES:
        raise ValueError(f"purpose: expected one of {PURPOSES}, got {purpose!r}")
    if not isinstance(source, str) or not source:
        raise ValueError(f"source: expected a non-empty string, got {source!r}")
    name, _, arg = source.partition(":")
    if name not in (("official500", "holdout100", "bundled", "bundled-image") + ADAPTER_SOURCES
                    + tuple(WORLD_SOURCES)):
        name, arg = source, ""
    if name in ADAPTER_SOURCES:
        tasks = _load_adapter(name, arg, source)
    elif name == "official500":
        tasks = load_official(arg or path)
    elif name == "holdout100":
        if arg:
            raise ValueError(f"source: holdout100 takes no argument, got {source!r}")
        tasks = _load_manifest_tasks(datasets_dir() / "holdout100.json", "holdout100")
    elif name == "bundled":
        tasks = ensure_built(log=log)
        if arg in ("train", "holdout"):
            if arg == "holdout":
                tasks = _load_manifest_tasks(datasets_dir() / "bundled_holdout.json",
                                             "bundled:holdout")
            else:
                sealed = sealed_ids()
                tasks = [t for t in tasks if t.instance_id not in sealed]
        elif arg:
            raise ValueError(f"source: unknown bundled split {arg!r} (expected train or holdout)")
    elif name == "bundled-image":
        tasks = _bundled_image(arg, log)
    elif name in WORLD_SOURCES:
        tasks = load_world(name, arg, log=log)
    else:
        p = Path(source)
        if not p.suffix:
            raise ValueError(f"source: unknown task source {source!r} (expected official500, "
                             "holdout100, bundled[:train|:holdout], bundled-image[:train|:holdout], "
                             "procedural[:train|:heldout], "
                             "procedural-localized[:train|:heldout], "
                             "swegym:PATH, swesmith:PATH "
                             "or a .jsonl/.json/.parquet path)")
        if p.suffix == ".json" and p.is_file():
            try:
                head = json.loads(p.read_text(encoding="utf-8"))
            except json.JSONDecodeError:
                head = None
            if isinstance(head, dict) and head.get("sealed") is True:
                tasks = _load_manifest_tasks(p, str(p))
                return _guard(tasks, purpose)
        rows, nums = read_rows(p)
        tasks = tasks_from_rows(rows, source=str(p), base_dir=p.resolve().parent,
                                row_numbers=nums)
    return _guard(tasks, purpose)


def _load_adapter(name: str, path: str, source: str) -> list[Task]:
    if not path:
        raise ValueError(f"source: {name} needs a local file, e.g. '{name}:rows.parquet' "
                         f"(got {source!r})")
    if name == "swegym":
        return load_swegym(path, source)

    return load_swesmith(path, source)


def _bundled_image(arg: str, log) -> list[Task]:
    """``bundled-image[:train|:holdout]``: the image tasks, split like ``bundled`` (same
    ids: the bundled holdout manifest is checked against the bundled pool it was sealed
    from, then its ids are selected)."""
    if arg not in ("", "train", "holdout"):
        raise ValueError(f"source: unknown bundled-image split {arg!r} (expected train or "
                         "holdout)")
    tasks = ensure_image_tasks(log=log)
    if arg == "train":
        sealed = sealed_ids()
        tasks = [t for t in tasks if t.instance_id not in sealed]
    elif arg == "holdout":
        path = datasets_dir() / "bundled_holdout.json"
        pool_ids = [t.instance_id for t in _load_manifest_tasks(path, "bundled:holdout")]
        tasks = _select(tasks, pool_ids, "bundled-image:holdout")
    return tasks


def load_world(name: str, split: str = "", *, recipe_path: str | Path | None = None,
               log=None) -> list[Task]:
    """The tasks of world ``name`` (:data:`WORLD_SOURCES`), all or one split.

    Args:
        split: ``""`` (every instance), ``"train"`` or ``"heldout"``.
        recipe_path: another recipe with a ``heldout`` field (tests build small worlds);
            default ``datasets/<WORLD_SOURCES[name]>``.

    Raises: ValueError for an unknown split or a recipe without a ``heldout`` field;
    see :func:`eval.tasks.bundled.cache.ensure_built` for the build.
    """
    if split not in ("", "train", "heldout"):
        raise ValueError(f"source: unknown {name} split {split!r} (expected train or heldout)")
    path = Path(recipe_path) if recipe_path else datasets_dir() / WORLD_SOURCES[name]
    if load_recipe(path).heldout is None:
        raise ValueError(f"{path}: a world recipe needs a 'heldout' field")
    tasks = ensure_built(path, log=log)
    return [t for t in tasks if not split or t.extra.get("split") == split]


@functools.lru_cache(maxsize=8)
def world_heldout_ids(recipe_path: str) -> frozenset[str]:
    """Every held-out candidate id of the world recipe at ``recipe_path``
    (:func:`eval.tasks.bundled.world.heldout_ids`), from the recipe and its projects' sdists
    alone (fetched into the cache if absent; no build, no trial).

    Raises: see :func:`eval.tasks.bundled.sources.fetch_sdist` (download, sha256).
    """
    recipe = load_recipe(recipe_path)
    texts: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="ecredit-world-") as tmp:
        for p in recipe.projects:
            dest = Path(tmp) / p.name
            unpack_sdist(fetch_sdist(p, cache_dir(), log=lambda *_: None), dest)
            texts[p.name] = {f: (dest / f).read_text(encoding="utf-8") for f in p.source_files}
    return frozenset(heldout_ids(recipe, texts))


def check_not_heldout(tasks: list[Task]) -> None:
    """Refuse training on a world's held-out instance (``tasks``: Task-like, anything with an
    ``instance_id``; ``extra`` may be absent): one a build marked held out
    (``extra["split"]``), or one whose id is a held-out candidate of a world recipe of
    :data:`WORLD_SOURCES` (whatever its row says; computed only when an id carries that
    world's prefix).

    Raises: SealedTaskError naming how many and a few ids.
    """
    held = {t.instance_id for t in tasks
            if (getattr(t, "extra", None) or {}).get("split") == "heldout"}
    for fname in WORLD_SOURCES.values():
        path = datasets_dir() / fname
        if not path.is_file():  # a datasets folder without this world (tests make such)
            continue
        prefix = load_recipe(path).id_prefix + "__"
        mine = {t.instance_id for t in tasks if t.instance_id.startswith(prefix)}
        if mine:
            held |= mine & world_heldout_ids(str(path))
    if held:
        raise SealedTaskError(
            f"{len(held)} held-out instance(s) of a world split loaded for training "
            f"(e.g. {', '.join(sorted(held)[:3])}): train on the ':train' split")


def _guard(tasks: list[Task], purpose: str) -> list[Task]:
    if purpose == "train":
        check_not_sealed([t.instance_id for t in tasks])
        check_not_heldout(tasks)
    return tasks
