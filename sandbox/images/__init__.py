"""Sandbox images: the offline Debian build, the online Containerfile, SWE-bench names.

* :func:`build_offline` debootstraps a minimal Debian (python3, pytest, git, patch)
  from the host's own apt mirror, imports it with ``podman import`` and tags it with
  the recipe hash, so an image is rebuilt only when its recipe changes.
* ``Containerfile`` (beside this file) builds the same contents online.
* :func:`swebench_image` gives the fully-qualified name of a SWE-bench instance
  image (Podman refuses short names).
* :mod:`sandbox.images.pull` pulls task images (mirrors, space estimate, retries, summary);
  ``python -m sandbox.images pull`` is its command line.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sandbox.runtimes.podman_runtime import podman_env

IMAGE_REPO = "localhost/ecredit-sandbox"
RECIPE_VERSION = 1


class ImageBuildError(RuntimeError):
    """The offline image could not be built; the message names the step."""


@dataclass(frozen=True)
class OfflineRecipe:
    """What goes into the offline sandbox image. Its hash is the image tag."""

    suite: str = "bookworm"
    variant: str = "minbase"
    packages: tuple[str, ...] = ("python3", "python3-pytest", "git", "patch")
    recipe_version: int = RECIPE_VERSION
    extra: dict = field(default_factory=dict)

    def digest(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def image(self) -> str:
        return f"{IMAGE_REPO}:{self.digest()}"


DEFAULT_RECIPE = OfflineRecipe()


def _env() -> dict[str, str]:
    return podman_env()


def default_image() -> str:
    """Fully-qualified name of the default offline sandbox image (``localhost/...:<hash>``)."""
    return DEFAULT_RECIPE.image


def swebench_image(instance_id: str, arch: str = "x86_64", namespace: str = "swebench") -> str:
    """Registry-qualified SWE-bench instance image name.

    Source: swebench's image naming (``sweb.eval.<arch>.<id>`` with ``__`` written
    as ``_1776_``) on Docker Hub; Podman needs the ``docker.io/`` prefix.
    """
    if not instance_id or "/" in instance_id:
        raise ValueError(f"instance_id: not a SWE-bench instance id: {instance_id!r}")
    key = instance_id.replace("__", "_1776_").lower()
    return f"docker.io/{namespace}/sweb.eval.{arch}.{key}:latest"


def host_debian_mirror(sources_dirs=("/etc/apt/sources.list", "/etc/apt/sources.list.d")) -> str:
    """The Debian mirror URI the host's apt uses (never hard-coded).

    Reads one-line (``deb URI suite ...``) and deb822 (``URIs:``) sources and
    returns the first ``debian`` archive that is not the security archive.

    Raises: ImageBuildError when no Debian mirror is configured.
    """
    files: list[Path] = []
    for entry in sources_dirs:
        p = Path(entry)
        if p.is_dir():
            files.extend(sorted(p.glob("*.list")) + sorted(p.glob("*.sources")))
        elif p.exists():
            files.append(p)
    uris: list[str] = []
    for f in files:
        for line in f.read_text(errors="replace").splitlines():
            line = line.strip()
            if line.startswith("deb "):
                parts = [x for x in line.split() if not x.startswith("[")]
                if len(parts) >= 2:
                    uris.append(parts[1])
            elif line.startswith("URIs:"):
                uris.extend(line.split(":", 1)[1].split())
    for uri in uris:
        if re.search(r"/debian/?$", uri) and "security" not in uri:
            return uri.rstrip("/")
    raise ImageBuildError(
        f"no Debian mirror found in {', '.join(map(str, files)) or 'apt sources'}; "
        "configure apt or build with sandbox/images/Containerfile")


def image_exists(name: str) -> bool:
    return subprocess.run(["podman", "image", "exists", name], env=_env()).returncode == 0


def build_offline(recipe: OfflineRecipe = DEFAULT_RECIPE, *, mirror: str | None = None,
                  force: bool = False, log=print) -> str:
    """Build (or reuse) the offline sandbox image and return its name.

    debootstrap (``--variant=minbase``) into a temporary directory, then
    ``tar | podman import`` with ``WORKDIR /testbed``. Skipped when an image with
    the recipe hash exists. Takes about a minute on first build (network-bound).

    Raises: ImageBuildError naming the failed step (debootstrap, import).
    """
    name = recipe.image
    if not force and image_exists(name):
        log(f"image {name} exists (recipe {recipe.digest()}); skipping build")
        return name
    for tool in ("debootstrap", "podman", "tar"):
        if shutil.which(tool) is None:
            raise ImageBuildError(f"{tool} not found on PATH (apt-get install podman runc debootstrap)")
    mirror = mirror or host_debian_mirror()
    with tempfile.TemporaryDirectory(prefix="ecredit-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        cmd = ["debootstrap", f"--variant={recipe.variant}",
               f"--include={','.join(recipe.packages)}", recipe.suite, str(root), mirror]
        log("$ " + " ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-2000:]
            raise ImageBuildError(f"debootstrap failed (exit {proc.returncode}):\n{tail}")
        (root / "testbed").mkdir(exist_ok=True)
        # Shrink the image: docs and apt lists are never used inside a trial.
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc",
                     "usr/share/man", "usr/share/locale"):
            shutil.rmtree(root / junk, ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        imp = subprocess.run(
            ["podman", "import", "--change", "WORKDIR=/testbed",
             "--change", "ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "--change", "CMD=/bin/bash", "-", name],
            stdin=tar.stdout, capture_output=True, text=True, env=_env())
        tar.stdout.close()
        tar.wait()
        if imp.returncode != 0 or tar.returncode != 0:
            raise ImageBuildError(f"podman import failed: {imp.stderr.strip()[-2000:]}")
    log(f"built {name}")
    return name


def image_digest(name: str) -> str | None:
    """Image id/digest (``sha256:...``) of a local image, or None when absent."""
    proc = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", name],
                          capture_output=True, text=True, env=_env())
    if proc.returncode != 0:
        return None
    return "sha256:" + proc.stdout.strip().removeprefix("sha256:")



