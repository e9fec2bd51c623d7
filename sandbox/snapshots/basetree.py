"""The verifier's base tree for host-side repositories: the agent's starting tree, byte for byte.

``git archive`` is not the tree the agent starts from when the repository
carries export attributes (``export-ignore`` drops files, ``export-subst`` expands
placeholders) or checkout conversions (``ident`` expands ``$Id$``, ``eol=crlf`` rewrites line
endings): a patch taken from the agent's tree then fails to apply or applies by fuzz.
The base is therefore made the way the agent's tree is made: a ``git clone --shared
--no-checkout`` of the repository with ``commit`` checked out (attributes of the commit
apply exactly as they do for the agent), then its files (not ``.git``) packed into a tar.

Git runs with no system/global config (``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL``), so a
user's ``core.autocrlf`` cannot change the base; the agent's checkout must use the same
environment (:func:`checkout` is the one to call).
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path

GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
           "GIT_TERMINAL_PROMPT": "0"}
"""Environment entries for host-side git: no system or user configuration."""


class BaseTreeError(ValueError):
    """The base tree could not be made; the message names ``repo_dir`` / ``base_commit``."""


def _git(args: list[str], cwd: str | None = None) -> None:
    proc = subprocess.run(["git", "-c", "advice.detachedHead=false", *args], cwd=cwd,
                          capture_output=True, env={**os.environ, **GIT_ENV})
    if proc.returncode != 0:
        raise BaseTreeError(f"repo_dir/base_commit: git {args[0]} failed: "
                            f"{proc.stderr.decode(errors='replace').strip()[:300]}")


def checkout(repo_dir: str | os.PathLike, commit: str, dest: str | os.PathLike) -> Path:
    """``git clone --shared --no-checkout repo_dir dest`` + ``git checkout --detach commit``.

    Returns ``dest``. Raises: BaseTreeError naming the failing step.
    """
    dest = Path(dest)
    _git(["clone", "-q", "--shared", "--no-checkout", str(repo_dir), str(dest)])
    _git(["-C", str(dest), "checkout", "-q", "--detach", commit])
    return dest


def tree_tar(root: str | os.PathLike) -> bytes:
    """Tar bytes of the files under ``root`` except the top-level ``.git``.

    Regular files keep their bytes and executable bit (mode 0755 or 0644), symlinks their
    target; owner root, sorted names, so equal trees give equal bytes.
    """
    root = Path(root)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = Path(dirpath).relative_to(root)
            if rel_dir == Path("."):
                dirnames[:] = [d for d in dirnames if d != ".git"]
                filenames = [f for f in filenames if f != ".git"]
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                path = Path(dirpath) / name
                rel = (rel_dir / name).as_posix()
                st = path.lstat()
                info = tarfile.TarInfo(rel)
                info.mtime = int(st.st_mtime)
                if path.is_symlink():
                    info.type = tarfile.SYMTYPE
                    info.linkname = os.readlink(path)
                    info.mode = 0o777
                    tar.addfile(info)
                elif path.is_dir():
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tar.addfile(info)
                else:
                    info.size = st.st_size
                    info.mode = 0o755 if st.st_mode & 0o100 else 0o644
                    with open(path, "rb") as fh:
                        tar.addfile(info, fh)
    return buf.getvalue()


def base_tree_tar(repo_dir: str | os.PathLike, commit: str) -> bytes:
    """The agent's starting tree of ``repo_dir`` at ``commit`` as tar bytes (see module doc).

    Raises: BaseTreeError (a ``ValueError``) when the clone or checkout fails.
    """
    with tempfile.TemporaryDirectory(prefix="ecredit-base-") as tmp:
        return tree_tar(checkout(repo_dir, commit, Path(tmp) / "tree"))


__all__ = ["GIT_ENV", "BaseTreeError", "base_tree_tar", "checkout", "tree_tar"]
