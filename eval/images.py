"""``python -m eval.images pull --split official500|holdout100|bundled[:...]|FILE [--registry
URL] [--concurrency N] ...`` and ``python -m eval.images list --split ...``.

The task-aware half of :mod:`sandbox.images` pull: tasks come from
:func:`eval.tasks.splits.load_tasks` (so every split name and task file the trainer and
``eval.run`` accept works here), their images (``Task.image``: the row's own ``image``, else
the swebench 5 name) are pulled by :func:`sandbox.images.pull.pull_images`.
``python -m sandbox.images pull`` hands split names to this module.
"""

from __future__ import annotations

import sys

from eval.tasks.splits import load_tasks
from sandbox.bounds import ArgumentParser, Source
from sandbox.images.cli import add_pull_arguments, run_pull


def split_images(split: str) -> list[str]:
    """The distinct images of the tasks of ``split`` (:func:`eval.tasks.splits.load_tasks`, purpose
    ``eval``), in task order.

    Raises: ValueError / FileNotFoundError from the loader (naming the field or file).
    """
    return list(dict.fromkeys(t.image for t in load_tasks(split, purpose="eval")))


def main(argv=None) -> int:
    ap = ArgumentParser(prog="python -m eval.images")
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_pull_arguments(sub.add_parser("pull", help="pull the task images local storage lacks"))
    ls = sub.add_parser("list", help="print the task images of a split, one a line")
    ls.add_argument("--split", type=Source(), required=True)
    args = ap.parse_args(argv)
    try:
        images = split_images(args.split)
    except (OSError, ValueError, RuntimeError) as exc:  # RuntimeError: the hub is unreachable
        print(f"error: --split {args.split}: {exc}", file=sys.stderr)
        return 2
    if args.cmd == "list":
        print("\n".join(images))
        return 0
    return run_pull(images, args)


if __name__ == "__main__":
    sys.exit(main())
