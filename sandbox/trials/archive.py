"""One tar for everything a verifier trial puts into its container, and how it gets there.

The repository and the control files go in as a single archive extracted at ``/``. A copy
into a created container (Podman's ``put_archive``) costs the engine a mount and an unmount of
the container's root filesystem and a helper process: 0.13 s a trial on a quiet 2-core host,
0.2–0.3 s under load (``benchmarks/sandbox_overhead.py``). So the archive is written to a file
on this host instead, bind-mounted **read-only** at :data:`INPUTS_PATH`, and the container's
first command unpacks it (:data:`UNPACK_COMMAND`) before it runs the trial script: no copy
through the engine at all. The file holds nothing the trial's code could not read anyway
(the task's repository at its base, the trial's own control files) and the container cannot
write it. The image needs ``/bin/sh`` and ``tar``, as it needs ``bash`` for the trial script;
an image without them ends its trials as infrastructure errors naming the unpack step.
"""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
from pathlib import Path

from sandbox.trials.script import UNPACK_FAILED_EXIT

CONTROL_DIR = "/ecredit"
"""The trial's control files (``trial.sh``, ``eval.sh``, the artifact, the path lists) in its
container; the trial script's working files go there too."""

INPUTS_PATH = "/.ecredit-inputs.tar"
"""Where a trial's archive is mounted (read-only) in its container."""

UNPACK_COMMAND = [
    "/bin/sh", "-c",
    f"tar -xf {INPUTS_PATH} -C / --no-same-owner || "
    f"{{ echo '>>>>> ecredit unpack-failed'; exit {UNPACK_FAILED_EXIT}; }}; "
    f"exec /bin/bash {CONTROL_DIR}/trial.sh"]
"""The trial container's command: unpack the inputs at ``/`` (files owned by the container's
user: a container without capabilities cannot give them away), then the trial script."""


def write_inputs(directory: str | os.PathLike, name: str, data: bytes) -> Path:
    """Write one trial's archive (``data``, from :func:`combined`) to ``directory/name.tar``,
    readable by the container engine (mode 0644), and return its path. The caller removes it
    when the trial's container is gone. Raises OSError when it cannot be written."""
    path = Path(directory, f"{name}.tar")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


def control_volume(container: str) -> str:
    """The name of the Podman volume mounted at :data:`CONTROL_DIR` in trial container
    ``container`` (removed with it; ``python -m sandbox gc`` removes those of killed runs)."""
    return f"{container}-control"


def inputs_mount(path: str | os.PathLike) -> dict:
    """The podman-py ``mounts`` entry of a trial's archive: a read-only bind at
    :data:`INPUTS_PATH`."""
    return {"type": "bind", "source": str(path), "target": INPUTS_PATH, "read_only": True}


def combined(workdir: str, repo_archive: bytes | None, control: bytes) -> bytes:
    """One archive to extract at ``/``: the members of ``repo_archive`` (a tar whose names are
    relative to ``workdir``), each name and each hard link's target prefixed with ``workdir``,
    then the members of ``control`` (the control tar, names ``ecredit/...``) as they are.

    ``workdir``: an absolute container path (``/testbed``). No entry is added for ``workdir``
    itself, so an image's own directory keeps its owner and mode. Returns tar bytes;
    ``control`` unchanged when ``repo_archive`` is None.

    Raises:
        ValueError: ``workdir`` is not absolute, or a member name of ``repo_archive`` is
            absolute or leaves ``workdir`` (``..``).
    """
    if repo_archive is None:
        return control
    if not workdir.startswith("/"):
        raise ValueError(f"workdir: {workdir!r} is not an absolute path")
    root = posixpath.normpath(workdir).lstrip("/")
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst:
        with tarfile.open(fileobj=io.BytesIO(repo_archive)) as src:
            for member in src:
                member.name = _inside(root, member.name)
                if member.islnk():
                    member.linkname = _inside(root, member.linkname)
                dst.addfile(member, src.extractfile(member) if member.isreg() else None)
        with tarfile.open(fileobj=io.BytesIO(control)) as src:
            for member in src:
                dst.addfile(member, src.extractfile(member) if member.isreg() else None)
    return out.getvalue()


def _inside(root: str, name: str) -> str:
    """``name`` (relative to the directory ``root``, itself relative to ``/``) relative to
    ``/``; ValueError when it is absolute or leaves ``root``."""
    rel = posixpath.normpath(name)
    if name.startswith("/") or rel == ".." or rel.startswith("../"):
        raise ValueError(f"repo_archive: member {name!r} is not inside the workdir")
    if rel == ".":
        return root or "."
    return f"{root}/{rel}" if root else rel


__all__ = ["CONTROL_DIR", "INPUTS_PATH", "UNPACK_COMMAND", "combined", "control_volume",
           "inputs_mount", "write_inputs"]
