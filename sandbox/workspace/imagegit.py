"""What of an image's git the agent may see: only S_0 (design page, "Threat model").

A task image's repository carries history, and real images carry the answer in it: future
commits, branches, tags, remote-tracking refs (SWE-bench images built before SWE-bench#465
was fixed; SWE-bench Pro), ``HEAD~1`` = the unbroken code (a SWE-smith instance), reflogs,
stashes, notes, unreachable objects. A rollout's tree therefore gets, at reset, a new
``.git`` in place of the image's (:func:`sandbox.workspace.agent_repo.write_git_dir`: one branch on
the S_0 commit of the per-image base cache, objects borrowed read-only from that cache's
store, the cache's S_0 index), written into the tree container's overlay **upper layer
while it is not mounted** as an *opaque* directory: overlayfs(5) then shows nothing of the
lower (image) ``.git`` below it, whatever it held, and no per-rollout ``rm -rf`` / ``gc`` of
the image's history runs (that would cost a whiteout per file: seconds on a big history;
this kernel has ``redirect_dir`` off, so a lower directory cannot be renamed away either).

What else could lead to the image's history, and what is done with it:

* nested ``.git`` entries below the workdir (a second clone, a submodule's gitfile, a
  linked worktree inside the tree): found once per image (:func:`survey`) and hidden by a
  whiteout each (snapshots never record ``.git`` entries, so S_0 does not change);
* a ``.git`` *file* naming a git directory elsewhere, that directory's ``commondir``, its
  ``objects/info/alternates`` (recursively) and its linked worktrees
  (``worktrees/*/gitdir``): when outside the workdir they are in the image's root
  filesystem, which the agent's container shows read-only, so :func:`survey` lists them
  and the agent's container bind-mounts an empty directory read-only over each
  (:meth:`sandbox.workspace.imagetree.ImageTree.show_only_s0`); the agent has no capability to
  unmount it.

The verifier is unchanged: a fresh container of the image keeps the image's own ``.git``
(tests that read git metadata at test time still see it, as under the SWE-bench harness).
Pure functions here read files; the mount/unmount around :func:`write_upper` is
:meth:`sandbox.workspace.imagetree.ImageTree.show_only_s0`.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

_MAX_ALTERNATE_DEPTH = 5  # git's own limit on chained alternates (sha1-file.c)


@dataclass(frozen=True)
class ImageGit:
    """Where an image's repository keeps git data (:func:`survey`).

    Attributes:
        branch: the branch ``HEAD`` names (``refs/heads/<branch>``), None when detached.
        nested: tree-relative POSIX paths of ``.git`` entries below the workdir (not the
            top one), sorted.
        outside: absolute container paths of directories outside the workdir that hold
            git data of the repository (git dirs, common dirs, alternate object stores,
            linked worktrees) and exist in the image, sorted, none an ancestor of the workdir.
    """

    branch: str | None
    nested: tuple[str, ...]
    outside: tuple[str, ...]


def _container(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


def _resolve(base: str, text: str) -> str:
    """Container path ``text`` (absolute, or relative to container dir ``base``), normalised."""
    return posixpath.normpath(posixpath.join(base, text))


def _git_dirs(root: Path, workdir: str) -> list[str]:
    """The container paths of the repository's git dir and common dir."""
    top = _container(root, workdir) / ".git"
    if top.is_dir() and not top.is_symlink():
        git_dir = posixpath.join(workdir, ".git")
    else:
        text = _read(top)
        git_dir = (_resolve(workdir, text[len("gitdir:"):].strip())
                   if text.startswith("gitdir:") else posixpath.join(workdir, ".git"))
    dirs = [git_dir]
    common = _read(_container(root, git_dir) / "commondir")
    if common:
        dirs.append(_resolve(git_dir, common))
    return dirs


def _alternates(root: Path, objects: str, depth: int = 0) -> list[str]:
    """Object stores ``objects`` borrows from (container paths), transitively."""
    if depth >= _MAX_ALTERNATE_DEPTH:
        return []
    out = []
    for line in _read(_container(root, objects) / "info" / "alternates").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            alt = _resolve(objects, line)
            out += [alt, *_alternates(root, alt, depth + 1)]
    return out


def _nested(tree: Path) -> list[str]:
    """``.git`` entries below ``tree`` (not its own), without descending into any."""
    found = []
    for top, dirs, files in os.walk(tree):
        rel = Path(top).relative_to(tree).as_posix()
        for name in (*dirs, *files):
            if name == ".git" and rel != ".":
                found.append(f"{rel}/.git")
        dirs[:] = [d for d in dirs if d != ".git"]
    return sorted(found)


def survey(root: Path, workdir: str) -> ImageGit:
    """Where the repository at container path ``workdir`` of the file system ``root`` (an
    image or tree container, mounted on the host) keeps git data (see :class:`ImageGit`).

    Reads git's files directly (``.git`` gitfile, ``commondir``, ``HEAD``,
    ``objects/info/alternates``, ``worktrees/*/gitdir``; gitrepository-layout(5)); runs
    nothing of the image. Cost: one walk of the tree (once per image).

    Raises: ValueError naming ``workdir`` when git data of the repository lies in an
    ancestor of the workdir (it cannot be hidden without hiding the tree).
    """
    dirs = _git_dirs(root, workdir)
    places = list(dirs)
    for d in dirs:
        places += _alternates(root, posixpath.join(d, "objects"))
        wt = _container(root, d) / "worktrees"
        if wt.is_dir():
            for entry in sorted(wt.iterdir()):
                gitfile = _read(entry / "gitdir")  # <worktree>/.git
                if gitfile:
                    places.append(posixpath.dirname(_resolve(posixpath.join(d, "worktrees",
                                                                            entry.name), gitfile)))
    outside = sorted({p for p in places if not _under(p, workdir)
                      and _container(root, p).is_dir()})
    for p in outside:
        if _under(workdir, p):
            raise ValueError(f"workdir: git data of the repository at {workdir} lies in {p}, "
                             "an ancestor of the workdir; the agent could not be kept from it")
    head = _read(_container(root, dirs[0]) / "HEAD")
    branch = head[len("ref: refs/heads/"):] if head.startswith("ref: refs/heads/") else None
    return ImageGit(branch, tuple(_nested(_container(root, workdir))), tuple(outside))


@dataclass(frozen=True)
class UpperPlan:
    """What :func:`write_upper` needs from the mounted tree, read before unmounting it.

    Attributes:
        dirs: ``(tree-relative dir, stat)`` of every directory the upper layer must hold
            (the workdir's ancestors, the parents of nested ``.git`` entries), parents
            first; the stat is the merged view's, so the directories look unchanged.
        git_owner: (uid, gid) of the image's ``.git``.
        xattr: the overlay's xattr namespace (``trusted``, or ``user`` on a ``userxattr``
            mount).
        fstype: the merged view's file system type (``overlay``, ``fuse.fuse-overlayfs``;
            ``""`` when not found in the mount table).
    """

    dirs: tuple[tuple[str, os.stat_result], ...]
    git_owner: tuple[int, int]
    xattr: str
    fstype: str = ""

    def opaque_xattrs(self) -> tuple[str, ...]:
        """The xattrs that make an upper-layer directory opaque for this mount: the kernel's
        overlay reads ``<ns>.overlay.opaque`` of its one namespace (``trusted.``, or
        ``user.`` with ``userxattr``; Documentation/filesystems/overlayfs.rst, "Whiteouts
        and opaque directories", "User xattr"); fuse-overlayfs reads ``trusted.`` as root
        and ``user.overlay.opaque`` / ``user.fuseoverlayfs.opaque`` otherwise
        (fuse-overlayfs.h), so it gets ``user.overlay.opaque`` too."""
        names = [f"{self.xattr}.overlay.opaque"]
        if self.fstype.startswith("fuse") and self.xattr != "user":
            names.append("user.overlay.opaque")
        return tuple(names)


def mount_of(mountpoint: Path) -> tuple[str, list[str]]:
    """``(fstype, super-block options)`` of the mount at ``mountpoint``
    (``/proc/self/mountinfo``, proc(5)); ``("", [])`` when nothing is mounted there."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] == str(mountpoint) and " - " in line:
            after = line.split(" - ", 1)[1].split()
            return (after[0] if after else ""), (after[-1].split(",") if len(after) > 2 else [])
    return "", []


def _mount_options(mountpoint: Path) -> list[str]:
    """Super-block options of the mount at ``mountpoint`` (``/proc/self/mountinfo``)."""
    return mount_of(mountpoint)[1]


def is_mounted(mountpoint: Path) -> bool:
    """Whether something is mounted at ``mountpoint`` (in this mount namespace)."""
    return any(len(f) > 4 and f[4] == str(mountpoint) for f in
               (line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()))


def plan_upper(mountpoint: Path, workdir: str, nested: Iterable[str]) -> UpperPlan:
    """Read (from the mounted tree at ``mountpoint``) what :func:`write_upper` needs."""
    rel_work = PurePosixPath(workdir.lstrip("/"))
    wanted = [rel_work, *rel_work.parents]
    for n in nested:
        wanted += [rel_work / q for q in PurePosixPath(n).parents if str(q) != "."]
    rels = sorted({str(p) for p in wanted if str(p) != "."}, key=lambda r: (r.count("/"), r))
    dirs = tuple((r, os.lstat(mountpoint / r)) for r in rels)
    st = os.lstat(mountpoint / rel_work / ".git")
    fstype, options = mount_of(mountpoint)
    xattr = "user" if "userxattr" in options else "trusted"
    return UpperPlan(dirs, (st.st_uid, st.st_gid), xattr, fstype)


def _ensure_dir(path: Path, st: os.stat_result) -> None:
    """``path`` in the upper layer as a directory with the merged view's mode, owner and
    times (what a copy-up makes); an existing upper directory is kept as it is."""
    if path.is_dir() and not path.is_symlink():
        return
    if path.exists() or path.is_symlink():
        raise FileExistsError(f"{path}: the upper layer holds a non-directory where the tree "
                              "has a directory")
    path.mkdir()
    os.chown(path, st.st_uid, st.st_gid)
    os.chmod(path, stat.S_IMODE(st.st_mode))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def remove_entry(path: Path) -> None:
    """Remove ``path`` (a directory tree, a file, a link; nothing if absent)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def write_upper(upper: Path, workdir: str, plan: UpperPlan, nested: Iterable[str],
                write_git: Callable[[Path, tuple[int, int]], None]) -> None:
    """Hide the image's git data in an overlay upper layer that is **not mounted**.

    ``<workdir>/.git`` becomes an opaque directory (``<ns>.overlay.opaque=y``) filled by
    ``write_git(path, owner)``; each ``nested`` entry becomes a whiteout (a 0/0 character
    device); what the upper layer held at those paths (a checkout's copied-up index and
    refs) is removed first. overlayfs(5): offline changes to the upper layer are allowed.

    Raises: OSError (e.g. EPERM without CAP_MKNOD / CAP_SYS_ADMIN for trusted xattrs),
    FileExistsError when the upper layer holds a file where a directory belongs.
    """
    for rel, st in plan.dirs:
        _ensure_dir(upper / rel, st)
    top = upper / workdir.lstrip("/")
    for n in nested:
        path = top / n
        remove_entry(path)
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(0, 0))
    git = top / ".git"
    remove_entry(git)
    git.mkdir()
    for name in plan.opaque_xattrs():
        os.setxattr(git, name, b"y", follow_symlinks=False)
    write_git(git, plan.git_owner)


def opacity_leak(merged: Path, upper: Path, nested: Iterable[str] = ()) -> str | None:
    """What of the image's git data the *mounted* tree still shows after :func:`write_upper`
    (read on the merged view, after the remount), or None when it shows none.

    ``merged`` / ``upper``: the workdir in the merged view and in the upper layer. An opaque
    directory shows exactly the upper layer's entries (overlayfs(5)), so every path below
    the merged ``.git`` must exist in the upper ``.git`` (names only: a file present in
    both is always the upper one), and each ``nested`` entry (tree-relative) must be gone.

    Returns: the first tree-relative path that shows through, or None. Cost: a walk of the
    agent's small ``.git`` (its objects are borrowed through alternates). Never raises
    on a missing path (a missing merged ``.git`` is reported as ``.git``).
    """
    for n in nested:
        if os.path.lexists(merged / n):
            return n
    top = merged / ".git"
    if not top.is_dir() or top.is_symlink():
        return ".git"
    stack = [PurePosixPath(".git")]
    while stack:
        rel = stack.pop()
        try:
            entries = list(os.scandir(merged / rel))
        except OSError:
            return str(rel)
        for e in entries:
            sub = rel / e.name
            if not os.path.lexists(upper / sub):
                return str(sub)
            if e.is_dir(follow_symlinks=False):
                stack.append(sub)
    return None


__all__ = ["ImageGit", "UpperPlan", "is_mounted", "mount_of", "opacity_leak", "plan_upper",
           "remove_entry", "survey", "write_upper"]
