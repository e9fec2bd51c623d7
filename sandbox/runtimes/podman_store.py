"""This machine's Podman image storage, read through the ``podman`` CLI: the environment of
every CLI call (our containers.conf), image names in canonical form, and which images are
present with their ids.

Below both the runtime (:meth:`sandbox.runtimes.podman_runtime.PodmanRuntime.image_ids`) and
the image tools (:mod:`sandbox.images`), which is why it holds these few functions and
nothing else.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

CONTAINERS_CONF = Path(__file__).resolve().parents[1] / "containers.conf"


def podman_env() -> dict[str, str]:
    """Environment for ``podman`` CLI calls: our containers.conf unless the user set one."""
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return env


class ImagePullError(RuntimeError):
    """Pulling cannot start (not enough disk space, bad registry, no Podman); the message
    says which and how much."""


def split_name(image: str) -> tuple[str, str, str]:
    """``(domain, path, tag)`` of an image name; ``docker.io`` when the name has no registry
    domain (a first component with ``.``/``:`` or ``localhost`` is one), tag ``latest`` when
    absent. Digest references (``@sha256:``) keep ``@...`` in ``tag``.

    Raises: ValueError naming the image when it is empty or holds a transport prefix.
    """
    if not image or not isinstance(image, str) or "://" in image:
        raise ValueError(f"image: not an image name: {image!r}")
    if "@" in image:
        rest, digest = image.split("@", 1)
        tag = "@" + digest
    else:
        rest, tag = image, ""
    first, _, remainder = rest.partition("/")
    if remainder and ("." in first or ":" in first or first == "localhost"):
        domain, path = first, remainder
    else:
        domain, path = "docker.io", rest
    if not tag:
        last = path.rsplit("/", 1)[-1]
        if ":" in last:
            path, tag = path.rsplit(":", 1)
        else:
            tag = "latest"
    if not path:
        raise ValueError(f"image: not an image name: {image!r}")
    if domain == "docker.io" and "/" not in path:
        path = "library/" + path  # Docker Hub's official images, as podman lists them
    return domain, path, tag


def canonical(image: str) -> str:
    """Fully-qualified ``domain/path:tag`` (the form ``podman images`` lists)."""
    domain, path, tag = split_name(image)
    return f"{domain}/{path}{tag if tag.startswith('@') else ':' + tag}"


def local_names() -> set[str]:
    """Every ``domain/path:tag`` in local Podman storage (one ``podman images`` call).

    Raises: ImagePullError when podman cannot list its images.
    """
    proc = subprocess.run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"],
                          capture_output=True, text=True, env=podman_env(), timeout=120)
    if proc.returncode != 0:
        raise ImagePullError(f"podman images failed: {proc.stderr.strip()[-500:]}")
    return {line.strip() for line in proc.stdout.splitlines()
            if line.strip() and "<none>" not in line}


def local_image_ids(images: Iterable[str]) -> dict[str, str | None]:
    """image name → image id (``sha256:...``, the digest ``podman image inspect`` calls
    ``Id``) for each of ``images``, None when not in local storage; one ``podman images``
    call for any number of names (names compared in canonical form).

    Raises: ImagePullError when podman cannot list its images.
    """
    proc = subprocess.run(["podman", "images", "--no-trunc", "--format",
                           "{{.Repository}}:{{.Tag}} {{.ID}}"],
                          capture_output=True, text=True, env=podman_env(), timeout=120)
    if proc.returncode != 0:
        raise ImagePullError(f"podman images failed: {proc.stderr.strip()[-500:]}")
    ids = {}
    for line in proc.stdout.splitlines():
        name, _, image_id = line.strip().rpartition(" ")
        if name and "<none>" not in name:
            ids[canonical(name)] = "sha256:" + image_id.removeprefix("sha256:")
    return {n: ids.get(canonical(n)) for n in sorted(set(images))}
