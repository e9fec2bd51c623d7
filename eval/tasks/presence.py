"""Task images present before a run starts.

``train.py``, ``eval.run`` and ``eval.controls`` call :func:`require_task_images` right after
loading their tasks: a run whose task images are not in local Podman storage is refused with
one line naming how many are missing and the exact command that pulls them, instead of every
trial ending as an infra error. The same listing gives the image digests the run records.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from sandbox.backend import DEFAULTS, Runtime, SandboxOptions
from sandbox.runtimes.podman_store import local_image_ids


class ImagesMissing(ValueError):
    """Task images are not in local Podman storage; the one-line message says how many and
    the command that pulls (or, for ``localhost/`` images, builds) them."""


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


def _image_ids(images: Sequence[str], runtime: Runtime | SandboxOptions) -> dict[str, str | None]:
    """image → id where ``runtime``'s trials find their images: the runtime's own lookup
    (``Runtime.image_ids``), or, for options not opened yet, this machine's Podman storage
    (the local backend; the ``ray`` backend's nodes are asked through its opened runtime).

    Raises: ValueError for ``ray`` options (no cluster to ask), ImagePullError when podman
    cannot list its images."""
    if not isinstance(runtime, SandboxOptions):
        return runtime.image_ids(images)
    if runtime.backend != "local":
        raise ValueError("sandbox_backend: ray: image presence needs the opened runtime "
                         "(sandbox.backend.make_runtime), which asks the sandbox nodes")
    return local_image_ids(images)


def task_image_digests(images: Sequence[str],
                       runtime: Runtime | SandboxOptions = DEFAULTS) -> dict[str, str | None]:
    """Image name → digest where ``runtime``'s trials find their images (this machine's
    Podman; on the Ray backend the sandbox nodes'); None for a local runtime or an image
    absent."""
    if runtime.kind != "podman":
        return dict.fromkeys(sorted(set(images)))
    return _image_ids(sorted(set(images)), runtime)


def require_task_images(tasks: Sequence, split: str,
                        runtime: Runtime | SandboxOptions = DEFAULTS) -> dict[str, str | None]:
    """Check that every task's image is where trials will look for it; return image → digest.

    Args:
        tasks: tasks with an ``image`` attribute (``eval.tasks.schema.Task``).
        split: the task source as the user gave it (goes into the pull command).
        runtime: a :class:`sandbox.backend.Runtime` or the options of one; a local runtime
            (``kind="local"``) uses no image, so nothing is checked and every digest is None;
            on the ``ray`` backend the sandbox nodes' storage answers (None: on no node yet,
            pulled on first use, so not refused).

    Returns: ``{image: "sha256:..."}`` for every distinct task image (sorted by name).

    Raises: ImagesMissing (a ValueError) with :func:`missing_message`.
    """
    images = sorted({t.image for t in tasks})
    if runtime.kind != "podman":
        return dict.fromkeys(images)
    ids = _image_ids(images, runtime)
    if runtime.backend == "ray":
        # a cluster backend: what counts is the sandbox nodes' storage, not this machine's;
        # an image no node holds is pulled on the chosen node on first use (counted), so it
        # is recorded as None rather than refused
        return ids
    missing = [name for name, image_id in ids.items() if image_id is None]
    if missing:
        raise ImagesMissing(missing_message(missing, len(images), split))
    return ids
