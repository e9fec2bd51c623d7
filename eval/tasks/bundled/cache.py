"""The bundled build cache: ``$ECREDIT_CACHE/bundled/<recipe hash>``, its lock, and
:func:`ensure_built` (load a built folder with :func:`.build.load_built`, else build it now
with the screening record beside the recipe)."""

from __future__ import annotations

import contextlib
import fcntl
import sys
from pathlib import Path

from eval.tasks.bundled.build import build, load_built
from eval.tasks.bundled.recipe import (
    Recipe,
    cache_dir,
    default_recipe_path,
    load_recipe,
    recipe_hash,
)
from eval.tasks.bundled.record import load_record, record_path
from eval.tasks.schema import Task
from sandbox.images import default_image


@contextlib.contextmanager
def cache_lock(path: Path):
    """Exclusive ``flock`` on ``path`` (created) for the ``with`` block: one builder of a
    cache folder at a time; the others wait, then find it built."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def built_dir(recipe: Recipe, image: str | None = None) -> Path:
    """Cache folder of ``recipe``: ``$ECREDIT_CACHE/bundled/<recipe hash>``."""
    return cache_dir() / "bundled" / recipe_hash(recipe, image or default_image())


def build_log(msg: str) -> None:
    """The task builds' default progress printer (stderr, ``[build_tasks]`` prefix)."""
    print(f"[build_tasks] {msg}", file=sys.stderr, flush=True)


def ensure_built(recipe_path: str | Path | None = None, *, out: str | Path | None = None,
                 concurrency: int = 2, force: bool = False, log=None, runtime=None,
                 use_record: bool = True, write_record: bool = False) -> list[Task]:
    """Tasks of the recipe: loaded from ``out`` (default :func:`built_dir`) when built there,
    else built now (printing progress). A file lock serialises concurrent builders.

    Args:
        use_record: a build takes the screening record beside the recipe
            (:func:`.record.record_path`) when there is one.
        write_record: a build writes its screening rejections to that path.

    Raises: see :func:`build`, :func:`load_recipe` and :func:`.record.load_record`.
    """
    log = log or build_log
    path = Path(recipe_path) if recipe_path else default_recipe_path()
    recipe = load_recipe(path)
    out = Path(out) if out else built_dir(recipe)
    with cache_lock(out.with_name(out.name + ".lock")):
        if not force and (out / "tasks.jsonl").is_file():
            return load_built(out)
        record = load_record(record_path(path)) if use_record else None
        log(f"building bundled tasks of {path} into {out}")
        return build(recipe, out, concurrency=concurrency, runtime=runtime, log=log,
                     record=record, write_record=record_path(path) if write_record else None)
