"""Sources: the pinned sdists (fetch, sha256 check, unpack) and the git repositories with
fixed metadata that hold pristine and mutant commits (pipeline step 1 of :mod:`eval.tasks.bundled`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from eval.tasks.bundled.recipe import BuildError, ProjectRecipe

_GIT_DATE = "2000-01-01T00:00:00+0000"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "ecredit-trl builder", "GIT_AUTHOR_EMAIL": "builder@ecredit-trl.invalid",
    "GIT_COMMITTER_NAME": "ecredit-trl builder",
    "GIT_COMMITTER_EMAIL": "builder@ecredit-trl.invalid",
    "GIT_AUTHOR_DATE": _GIT_DATE, "GIT_COMMITTER_DATE": _GIT_DATE,
    "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C",
}


class GitRepo:
    """A git repository written with fixed identities and dates (reproducible SHAs)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def git(self, *args: str, input: bytes | None = None, env: dict | None = None) -> str:
        proc = subprocess.run(["git", "-C", str(self.path), *args], input=input,
                              capture_output=True, env={**os.environ, **_GIT_ENV, **(env or {})})
        if proc.returncode != 0:
            raise BuildError(f"git {' '.join(args[:3])} in {self.path} failed: "
                             f"{proc.stderr.decode(errors='replace').strip()[:500]}")
        return proc.stdout.decode("utf-8", errors="surrogateescape")

    def init_pristine(self, message: str) -> str:
        """Commit the working tree as the root commit on ``main``; returns its SHA."""
        self.git("init", "-q")
        self.git("symbolic-ref", "HEAD", "refs/heads/main")
        self.git("add", "-A", "-f", ".")
        tree = self.git("write-tree").strip()
        sha = self.git("commit-tree", tree, "-m", message).strip()
        self.git("update-ref", "refs/heads/main", sha)
        return sha

    def commit_file(self, parent: str, path: str, content: bytes, message: str, ref: str) -> str:
        """A commit = ``parent`` with ``path`` replaced by ``content``; ref'd at ``ref``."""
        return self.commit_files(parent, {path: content}, message, ref)

    def commit_files(self, parent: str, contents: dict[str, bytes], message: str,
                     ref: str) -> str:
        """One commit = ``parent`` with each path of ``contents`` replaced by its bytes
        (existing paths only: their mode is kept); ref'd at ``ref``."""
        tag = hashlib.sha256(ref.encode()).hexdigest()[:12]
        index = self.path / ".git" / f"ecredit-index-{os.getpid()}-{tag}"
        env = {"GIT_INDEX_FILE": str(index)}
        try:
            self.git("read-tree", parent, env=env)
            for path, content in sorted(contents.items()):
                mode = self.git("ls-tree", parent, "--", path).split()[0]
                blob = self.git("hash-object", "-w", "--no-filters", "--stdin",
                                input=content).strip()
                self.git("update-index", "--cacheinfo", f"{mode},{blob},{path}", env=env)
            tree = self.git("write-tree", env=env).strip()
        finally:
            index.unlink(missing_ok=True)
        sha = self.git("commit-tree", tree, "-p", parent, "-m", message).strip()
        self.git("update-ref", ref, sha)
        return sha

    def diff(self, a: str, b: str) -> str:
        """``git diff --full-index a b`` (binary-safe text patch from tree a to tree b)."""
        return self.git("diff", "--no-color", "--no-ext-diff", "--full-index", "--binary", a, b)

    def archive(self, sha: str) -> bytes:
        proc = subprocess.run(["git", "-C", str(self.path), "archive", "--format=tar", sha],
                              capture_output=True, env={**os.environ, **_GIT_ENV})
        if proc.returncode != 0:
            raise BuildError(f"git archive {sha} failed: {proc.stderr.decode()[:300]}")
        return proc.stdout


# ---------------------------------------------------------------------------
# sources
# ---------------------------------------------------------------------------

def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_sdist(project: ProjectRecipe, cache: Path, log=print) -> Path:
    """The project's sdist in ``cache/sdists`` (``pip download`` when absent), sha256-checked.

    Raises: BuildError when pip fails, the file name differs from the recipe, or the
    sha256 does not match (the bad download is deleted).
    """
    dest = cache / "sdists" / project.sdist
    if dest.is_file() and _sha256_file(dest) == project.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ecredit-sdist-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "-q", "-d", tmp,
               f"{project.name}=={project.version}"]
        log(f"[{project.name}] pip download {project.name}=={project.version}")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / project.sdist
        if proc.returncode != 0 or not got.is_file():
            raise BuildError(f"{project.name}: pip download failed (exit {proc.returncode}; "
                             f"files {os.listdir(tmp)}): {(proc.stdout + proc.stderr)[-800:]}")
        digest = _sha256_file(got)
        if digest != project.sha256:
            raise BuildError(f"{project.name}: sha256 of {project.sdist} is {digest}, the recipe "
                             f"pins {project.sha256}")
        tmp_dest = dest.with_name(dest.name + f".tmp-{os.getpid()}")
        shutil.copyfile(got, tmp_dest)
        os.replace(tmp_dest, dest)
    return dest


def unpack_sdist(sdist: Path, dest: Path) -> None:
    """Unpack ``sdist`` (.tar.gz) into ``dest`` without its top folder, ``__pycache__`` and
    ``*.pyc``; regular files and folders only.

    Raises: BuildError for a member outside the top folder or an unsafe path.
    """
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist, "r:*") as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if len(parts) < 2:
                continue
            rel = Path(*parts[1:])
            if rel.is_absolute() or ".." in rel.parts:
                raise BuildError(f"{sdist.name}: unsafe member {member.name!r}")
            if "__pycache__" in rel.parts or rel.suffix == ".pyc":
                continue
            target = dest / rel
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif member.isfile():
                target.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
                os.chmod(target, 0o755 if member.mode & 0o100 else 0o644)
