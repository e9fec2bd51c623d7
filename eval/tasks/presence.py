"""Task images present before a run starts.

``train.py``, ``eval.run`` and ``eval.controls`` call :func:`require_task_images` right after
loading their tasks: a run whose task images are not in local Podman storage is refused with
one line naming how many are missing and the exact command that pulls them, instead of every
trial ending as an infra error. The same listing gives the image digests the run records.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from sandbox.images import image_digest
from sandbox.images.pull import local_image_ids


class ImagesMissing(ValueError):
    """Task images are not in local Podman storage; the one-line message says how many and
    the command that pulls (or, for ``localhost/`` images, builds) them."""


def runtime_kind(runtime) -> str:
    """``"podman"`` or ``"local"`` for a runtime name or object (a ``LocalRuntime`` is local)."""
    if isinstance(runtime, str):
        return runtime
    return "local" if type(runtime).__name__ == "LocalRuntime" else "podman"


def pull_command(split: str) -> str:
    """The exact command that pulls ``split``'s task images."""
    return f"python -m sandbox.images pull --split {shlex.quote(split)}"


def missing_message(missing: Sequence[str], total: int, split: str) -> str:
    """One line: how many of ``total`` images are missing, the first one, and the command.
    ``localhost/`` images come from no registry: the line names the build commands."""
    first = sorted(missing)[0]
    line = (f"{len(missing)} of {total} task image(s) not in local Podman storage (first: "
            f"{first}); ")
    if all(m.startswith("localhost/") for m in missing):
        return line + ("they are built on this machine, not pulled: python -m sandbox.images "
                       "build-offline / python -m eval.build_tasks --image-tasks")
    return line + f"pull them with: {pull_command(split)}"


def task_image_digests(images: Sequence[str], runtime) -> dict[str, str | None]:
    """Image name → digest (``sandbox.images.image_digest``; on the Ray backend the sandbox
    nodes', ``runtime.image_ids``); None for a local runtime or an image absent."""
    if runtime_kind(runtime) != "podman":
        return dict.fromkeys(sorted(set(images)))
    if hasattr(runtime, "image_ids"):
        return runtime.image_ids(images)

    return {name: image_digest(name) for name in sorted(set(images))}


def require_task_images(tasks: Sequence, split: str, runtime="podman") -> dict[str, str | None]:
    """Check that every task's image is in local Podman storage; return image → digest.

    Args:
        tasks: tasks with an ``image`` attribute (``eval.tasks.schema.Task``).
        split: the task source as the user gave it (goes into the pull command).
        runtime: ``"podman"``/``"local"`` or a runtime object; a local runtime uses no
            image, so nothing is checked and every digest is None; a runtime with an
            ``image_ids`` method (the Ray backend) answers for its sandbox nodes' storage
            (None: on no node yet, pulled on first use).

    Returns: ``{image: "sha256:..."}`` for every distinct task image (sorted by name).

    Raises: ImagesMissing (a ValueError) with :func:`missing_message`.
    """
    images = sorted({t.image for t in tasks})
    if runtime_kind(runtime) != "podman":
        return dict.fromkeys(images)
    if hasattr(runtime, "image_ids"):
        # a cluster backend (sandbox_backend=ray): what counts is the sandbox nodes' storage,
        # not this machine's; an image no node holds is pulled on the chosen node on first
        # use (counted), so it is recorded as None rather than refused
        return runtime.image_ids(images)

    ids = local_image_ids(images)
    missing = [name for name, image_id in ids.items() if image_id is None]
    if missing:
        raise ImagesMissing(missing_message(missing, len(images), split))
    return ids
