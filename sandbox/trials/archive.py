"""One tar for everything a verifier trial copies into its container before it starts.

Each copy into a created container costs the container engine a mount and an unmount of the
container's root filesystem (0.1–0.2 s with Podman on a loaded 2-core host,
``benchmarks/sandbox_overhead.py``), so the repository and the control files go in as a
single archive extracted at ``/``.
"""

from __future__ import annotations

import io
import posixpath
import tarfile


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


__all__ = ["combined"]
