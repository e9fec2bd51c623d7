"""The agent's own git repository: a normal repository that shows nothing but the base.

Inside its container the agent gets a working tree whose ``.git`` works like any
SWE-bench checkout (``git status``, ``diff``, ``stash``, ``checkout -- f``, commit), yet:

* it cannot see anything beyond the base state: its history is **one root commit** whose
  tree is the task's base tree (a task repository may hold the fix itself, e.g. a bundled
  task's base commit is a mutation whose parent is the pristine source; a ``--shared``
  clone of it would hand the agent ``HEAD^`` and every other ref);
* it cannot corrupt what other rollouts share: the objects live in a **base store** (a
  bare repository per (task repository, base commit), made once, packed, with no
  alternates), which the container mounts **read-only** at :data:`CONTAINER_OBJECTS`,
  the path the clone's ``objects/info/alternates`` names (no host path is visible
  inside). Root in the container cannot write a read-only bind mount (capabilities are
  dropped), unlike a hardlinked object store.

* it holds nothing else git could show: :func:`write_git_dir` writes its
  ``.git`` file by file, so there is no ``origin`` remote, no other branch, tag, reflog,
  ``packed-refs``, stash, notes, ``ORIG_HEAD``/``FETCH_HEAD`` or shallow/graft file, and no
  object but those of the base (borrowed from the store). Image-held tasks get the same
  ``.git`` in place of the image's own (:meth:`sandbox.workspace.imagetree.ImageTree.show_only_s0`).

Host-side snapshots never use this repository (see :mod:`sandbox.snapshots.snapshot`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from sandbox.snapshots.gitsafe import SnapshotError, git_env
from sandbox.trials.trial import check_branch

BASE_IDENTITY = {
    "GIT_AUTHOR_NAME": "ecredit", "GIT_AUTHOR_EMAIL": "ecredit@sandbox",
    "GIT_AUTHOR_DATE": "1700000000 +0000", "GIT_COMMITTER_NAME": "ecredit",
    "GIT_COMMITTER_EMAIL": "ecredit@sandbox", "GIT_COMMITTER_DATE": "1700000000 +0000",
}
"""Fixed identity and date of the base commit (its SHA depends only on the base tree)."""

CONTAINER_OBJECTS = "/ecredit-base/objects"
"""Where the agent's container sees the base store's objects (read-only)."""

AGENT_BRANCH = "main"
"""The branch of a ``repo_dir`` task's agent repository."""

AGENT_CONFIG = """\
[core]
\trepositoryformatversion = 0
\tfilemode = true
\tbare = false
\tlogallrefupdates = true
[user]
\tname = agent
\temail = agent@sandbox
"""
"""The agent repository's config: a plain non-bare repository (no remote, no branch
tracking) with an identity, so ``git stash`` and ``git commit`` work inside."""


def _run(args: list[str], *, env: dict | None = None, what: str) -> str:
    proc = subprocess.run(["git", *args], capture_output=True, env={**git_env(), **(env or {})})
    if proc.returncode != 0:
        raise SnapshotError(f"{what} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode().strip()


def base_store(repo_dir: str | os.PathLike, commit: str, cache_dir: str | os.PathLike) -> Path:
    """The bare base store of ``commit`` in ``repo_dir`` under ``cache_dir`` (made once).

    It holds one root commit (fixed identity and date) whose tree is ``commit``'s tree, on
    ``refs/heads/main``, and exactly the objects that commit reaches, in its own pack.

    Returns: the store's path (``<cache_dir>/<16 hex>.git``).
    Raises: SnapshotError when ``commit`` is unknown in ``repo_dir`` or git fails.
    """
    repo_dir = Path(repo_dir).resolve()
    key = hashlib.sha256(f"{repo_dir}\0{commit}".encode()).hexdigest()[:16]
    dest = Path(cache_dir) / f"{key}.git"
    if dest.is_dir():
        return dest
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    src_git = _run(["-C", str(repo_dir), "rev-parse", "--absolute-git-dir"],
                   what=f"repo_dir {repo_dir}")
    tree = _run([f"--git-dir={src_git}", "rev-parse", "--verify", "-q", f"{commit}^{{tree}}"],
                what=f"base_commit {commit!r} in {repo_dir}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache_dir))
    try:
        _run(["init", "-q", "--bare", "--template=", str(tmp)], what="git init of a base store")
        (tmp / "objects" / "info").mkdir(parents=True, exist_ok=True)
        alternates = tmp / "objects" / "info" / "alternates"
        alternates.write_text(str(Path(src_git) / "objects") + "\n")
        g = [f"--git-dir={tmp}"]
        sha = _run([*g, "commit-tree", tree, "-m", "base"], env=BASE_IDENTITY,
                   what="commit-tree of the base")
        _run([*g, "update-ref", "refs/heads/main", sha], what="update-ref")
        _run([*g, "symbolic-ref", "HEAD", "refs/heads/main"], what="symbolic-ref")
        # -a without -l also packs the objects borrowed from the alternate: a real copy
        _run([*g, "repack", "-a", "-d", "-q"], what="repack of the base store")
        alternates.unlink()
        _run([*g, "fsck", "--connectivity-only", "--no-dangling"], what="fsck of the base store")
        try:
            tmp.rename(dest)
        except OSError:  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def write_git_dir(git_dir: str | os.PathLike, commit: str, *, branch: str | None,
                  alternates: str, index: str | os.PathLike | None = None,
                  exclude: Iterable[str] = (), owner: tuple[int, int] | None = None) -> None:
    """Write the agent's ``.git`` at ``git_dir``: S_0 as its only commit, nothing else.

    Files written (no git process runs, so this also works on an overlay's upper layer
    while it is not mounted): ``HEAD`` (``ref: refs/heads/<branch>``, or ``commit``
    itself when ``branch`` is None: a detached HEAD, as the image had it), the loose ref
    ``refs/heads/<branch>`` = ``commit``, an empty ``refs/tags``, :data:`AGENT_CONFIG`,
    ``objects/info/alternates`` = ``alternates`` (the path *where git runs* of the store
    holding ``commit`` and exactly the objects it reaches), ``info/exclude`` = ``exclude``
    (the generated-file patterns, so ``git status`` is as clean as the snapshots), and a
    copy of ``index`` when given (an index of S_0 with the tree's stat data, so the first
    ``git status`` only ``stat`` s). ``git_dir`` may exist (empty); ``owner`` = (uid, gid)
    of every entry written (the image's ``.git`` owner; default: ours).

    Raises: ValueError naming ``branch`` (not a plain branch name) or ``commit`` (not 40
    hex); OSError from the file system.
    """
    if not (isinstance(commit, str) and len(commit) == 40
            and all(c in "0123456789abcdef" for c in commit)):
        raise ValueError(f"commit: expected 40 lowercase hex digits, got {commit!r}")
    root = Path(git_dir)
    files = {"config": AGENT_CONFIG, "objects/info/alternates": f"{alternates}\n",
             "info/exclude": "".join(f"{p}\n" for p in exclude)}
    if branch is None:
        files["HEAD"] = f"{commit}\n"
    else:
        files["HEAD"] = f"ref: refs/heads/{check_branch(branch, 'branch')}\n"
        files[f"refs/heads/{branch}"] = f"{commit}\n"
    root.mkdir(parents=True, exist_ok=True)
    for d in ("refs/heads", "refs/tags", "objects/pack", "objects/info", "info"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    if index is not None:
        shutil.copyfile(index, root / "index")
    if owner is not None:
        for path in (root, *root.rglob("*")):
            os.chown(path, *owner, follow_symlinks=False)


def agent_clone(repo_dir: str | os.PathLike, commit: str, dest: str | os.PathLike,
                cache_dir: str | os.PathLike, *,
                alternates: str | None = CONTAINER_OBJECTS) -> list[tuple[str, str]]:
    """Make ``dest`` the agent's working tree on the base store's one commit.

    Its ``.git`` is written by :func:`write_git_dir` (branch :data:`AGENT_BRANCH`, a local
    identity), then the base tree is checked out with ``git read-tree --reset -u`` (no
    reflog, no ``ORIG_HEAD``). Its alternates then name ``alternates`` (default
    :data:`CONTAINER_OBJECTS`, where the container mounts the store; ``None``: the store's
    host path, for a local session that runs commands on the host). Host-side snapshots
    never use this repository.

    Returns: ``[(host objects dir, container path)]`` to mount read-only.
    Raises: SnapshotError when git fails (the message names the step).
    """
    store = base_store(repo_dir, commit, cache_dir)
    head = _run([f"--git-dir={store}", "rev-parse", "--verify", "refs/heads/main^{commit}"],
                what=f"base commit of the store {store}")
    host_objects = str((store / "objects").resolve())
    Path(dest).mkdir(parents=True, exist_ok=True)
    write_git_dir(Path(dest) / ".git", head, branch=AGENT_BRANCH, alternates=host_objects)
    _run(["-C", str(dest), "read-tree", "--reset", "-u", "HEAD"],
         what=f"checkout of the base in {dest}")
    target = alternates or host_objects
    (Path(dest) / ".git" / "objects" / "info" / "alternates").write_text(target + "\n")
    return [(host_objects, target)]
