"""``python -m eval.build_tasks [--recipe datasets/bundled.yaml] [--out DIR] [--concurrency 2]
[--force] [--no-record] [--write-record] [--image-tasks]``: build (or find in the cache) the bundled tasks of a recipe and
print a summary. ``--image-tasks`` builds them (first) and then their stand-in image-held
tasks (:mod:`eval.tasks.bundled.imagetasks`; split ``bundled-image``), ``--out`` then naming the
image tasks' folder.

The pipeline lives in :mod:`eval.tasks.bundled` (recipe, sources, mutations, scripts, screening,
build); this module is its command line.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from eval.tasks.bundled.cache import ensure_built
from eval.tasks.bundled.imagetasks import ensure_image_tasks, image_built_dir
from eval.tasks.bundled.recipe import BuildError, load_recipe
from sandbox.bounds import ArgumentParser, InFile, Int, OutDir


def main(argv=None) -> int:
    ap = ArgumentParser(prog="python -m eval.build_tasks",
                                 description="Build (or load from cache) the bundled tasks.")
    ap.add_argument("--recipe", type=InFile("yaml"), default=None, help="recipe YAML (default datasets/bundled.yaml)")
    ap.add_argument("--out", type=OutDir(), default=None, help="output folder (default: the cache folder "
                    "$ECREDIT_CACHE/bundled/<recipe hash>)")
    ap.add_argument("--concurrency", type=Int(ge=1), default=2, help="verifier trials at once")
    ap.add_argument("--force", action="store_true", help="rebuild even when built")
    ap.add_argument("--no-record", action="store_true",
                    help="screen every candidate: ignore the screening record beside the recipe "
                    "(<recipe stem>.screening.json; rejections of the reference build, which a "
                    "build otherwise takes without running their trials)")
    ap.add_argument("--write-record", action="store_true",
                    help="write this build's screening rejections to the record beside the "
                    "recipe (with --force --no-record: a new reference record)")
    ap.add_argument("--image-tasks", action="store_true",
                    help="also build the stand-in image-held tasks (one Podman image per task, "
                    "no repo_dir; split bundled-image) into $ECREDIT_CACHE/bundled-image/<tag>")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    if args.image_tasks:
        return _image_tasks(args, t0)
    try:
        tasks = ensure_built(args.recipe, out=args.out, concurrency=args.concurrency,
                             force=args.force, use_record=not args.no_record,
                             write_record=args.write_record)
    except (BuildError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t.extra.get("project", t.repo)] = counts.get(t.extra.get("project", t.repo), 0) + 1
    print(json.dumps({"tasks": len(tasks), "per_project": counts,
                      "dir": str(Path(tasks[0].repo_dir).parent.parent) if tasks else None,
                      "seconds": round(time.monotonic() - t0, 1)}))
    return 0


def _image_tasks(args, t0: float) -> int:
    try:
        tasks = ensure_image_tasks(args.recipe, out=args.out, concurrency=args.concurrency,
                                   force=args.force)
        out = args.out or str(image_built_dir(load_recipe(args.recipe)))
    except (BuildError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t.extra["project"]] = counts.get(t.extra["project"], 0) + 1
    print(json.dumps({"image_tasks": len(tasks), "per_project": counts, "dir": out,
                      "images": len({t.image for t in tasks}),
                      "seconds": round(time.monotonic() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
