"""Rollout trees of image-held tasks: the image's ``/testbed``, copy-on-write.

A SWE-bench task's repository, with its untracked build outputs (compiled extensions, a
generated ``_version.py``, ``*.egg-info``) and its environment, lives inside the task
image. A rollout's tree is therefore the image's own ``workdir``, never a clone:

* :func:`open_tree` creates a *tree container* from the task image (never started) and
  ``podman mount`` s it (root only). Its root filesystem is an overlay whose upper layer
  belongs to that container alone, so ``<mountpoint>/<workdir>`` is a private, writable
  view of the image's tree on the host at once: nothing is copied, and writes land in
  the container's upper layer. The agent's container bind-mounts that directory at
  ``workdir`` (:class:`sandbox.workspace.session.PodmanSession`); the editor tools and the
  snapshots read it on the host. :meth:`ImageTree.close` removes the container (and
  with it the mount and the upper layer).
* :func:`base_cache` makes, once per (image id, workdir, ignore patterns), the base of
  the snapshots: a bare git store holding **S_0 = the tree at reset** (the image repo's
  tracked files as they are on disk + its untracked files that its ``.gitignore`` does
  not ignore; generated files as in :mod:`sandbox.snapshots.snapshot`) as one root commit, and a
  git index of S_0 with the ``stat`` data of the image's files. The image is read
  through ``podman image mount`` (read-only, no container runs, no agent ever sees it).
  A rollout's :class:`~sandbox.snapshots.snapshot.Snapshotter` borrows the store's objects and
  starts from a copy of that index: files of a tree container that nobody wrote keep
  the inode and ctime of the image layer, so that index holds for every rollout.
* :meth:`ImageTree.show_only_s0` replaces, before the agent runs, the tree's ``.git`` by a
  new one holding S_0 as its only commit, objects borrowed from the base cache's store
  (mounted read-only in the agent's container), index = the cache's S_0 index: the agent
  sees none of the image's history (how: :mod:`sandbox.workspace.imagegit`).
* :meth:`ImageTree.changes` lists what the container's overlay upper layer holds: every
  write to the tree goes through it, so snapshots look at those paths only, not at the
  whole tree (``benchmarks/rollout_setup.py``: setup + first snapshot of a 1 GB / 50k-file
  tree in well under a second), and the disk budget counts that layer.

S_0 holds exactly what a fresh container of the same image holds at ``workdir`` (minus
ignored files, which snapshots never record), so the artifact S_0 → S_K applies there the
way the SWE-bench harness applies a prediction (``git apply`` at ``/testbed``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sandbox.runtimes.podman_runtime import ROLE_LABEL, podman_env
from sandbox.snapshots.gitsafe import (
    DEFAULT_SNAPSHOT_IGNORE,
    SnapshotError,
    check_patterns,
    git_env,
    init_store,
    run_git,
    trusted_git_dir,
)
from sandbox.snapshots.snapshot import Snapshotter
from sandbox.trials.trial import CHECKOUT_HELP, check_branch
from sandbox.workspace.agent_repo import BASE_IDENTITY, CONTAINER_OBJECTS, write_git_dir
from sandbox.workspace.imagegit import (
    is_mounted,
    opacity_leak,
    plan_upper,
    remove_entry,
    survey,
    write_upper,
)

TREE_ROLE = "tree"
"""``ecredit.role`` label value of tree containers (never started)."""
S0_REF = "refs/heads/s0"
BASE_CACHE_VERSION = 2
"""Part of a base cache's key; 2: the cache also records where the image keeps git data."""


class ImageTreeError(RuntimeError):
    """A tree container or the base cache of an image could not be made; the message
    names the image, the workdir and the podman/git step that failed."""


def _podman(args: list[str], what: str, timeout_s: float = 120.0) -> str:
    try:
        proc = subprocess.run(["podman", *args], capture_output=True, env=podman_env(),
                              timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ImageTreeError(f"{what}: podman {args[0]} failed: {exc}") from None
    if proc.returncode != 0:
        raise ImageTreeError(f"{what}: podman {' '.join(args[:2])} failed: "
                             f"{proc.stderr.decode(errors='replace').strip()[-500:]}")
    return proc.stdout.decode().strip()


def _in_root(root: Path, workdir: str) -> Path:
    """``root`` joined with the absolute container path ``workdir`` (ValueError if relative)."""
    if not workdir.startswith("/") or ".." in PurePosixPath(workdir).parts:
        raise ValueError(f"workdir: expected an absolute container path, got {workdir!r}")
    return root / workdir.lstrip("/")


def image_id(image: str) -> str:
    """The local id (64 hex) of ``image``. Raises ImageTreeError when it is not present."""
    return _podman(["image", "inspect", "--format", "{{.Id}}", image],
                   f"image {image!r} (is it pulled?)")


_CHECKOUT_SH = ('G="git -c core.hooksPath=/dev/null -c advice.detachedHead=false"; '
                'if $G rev-parse -q --verify "refs/heads/$1^{commit}" >/dev/null; then '
                '$G checkout -q "$1" --; '
                'elif $G rev-parse -q --verify "refs/remotes/origin/$1^{commit}" >/dev/null; then '
                '$G checkout -q --no-track -b "$1" "refs/remotes/origin/$1" --; '
                'else echo "no local branch $1 in $PWD (nor origin/$1)" >&2; exit 3; '
                'fi && $G rev-parse HEAD')


def checkout_branch(image: str, host_tree: Path, workdir: str, branch: str, *,
                    labels: dict[str, str] | None = None) -> str:
    """Check out ``branch`` (local, else a new local one from ``origin/<branch>``) of
    the repository in ``host_tree`` (a tree container's
    mounted ``workdir``) with the image's own git, in a one-off container of ``image``
    (no network, tree bind-mounted at ``workdir``, removed after): the image's git config
    and hooks never run on the host. The same step as the verifier's (``sandbox.trials.script``).

    Returns: the commit id now at HEAD (40 hex).
    Raises: ValueError for a bad branch name; ImageTreeError naming image, workdir and
    branch when the image's repository has no such branch (with
    :data:`sandbox.trials.trial.CHECKOUT_HELP`) or git fails.
    """
    check_branch(branch, "checkout")
    label_args = []
    for k, v in (labels or {}).items():
        label_args += ["--label", f"{k}={v}"]
    what = f"checkout of branch {branch!r} at {workdir} of image {image!r}"
    try:
        out = _podman(["run", "--rm", "--network", "none", *label_args, "--memory", "2g",
                       "--pids-limit", "1024", "-v", f"{Path(host_tree).resolve()}:{workdir}",
                       "-w", workdir, "--entrypoint", "sh", image, "-c", _CHECKOUT_SH,
                       "checkout", branch], what)
    except ImageTreeError as exc:
        raise ImageTreeError(f"{exc} ({CHECKOUT_HELP})") from None
    return out.splitlines()[-1].strip()


def _commit_tree(store: Path, tree: str) -> str:
    """A root commit of ``tree`` with the fixed identity and date of base commits."""
    proc = subprocess.run(["git", f"--git-dir={store}", "commit-tree", tree, "-m",
                           "S_0: the tree at reset"], capture_output=True,
                          env={**git_env(), **BASE_IDENTITY})
    if proc.returncode != 0:
        raise SnapshotError(f"commit-tree of S_0 in {store} failed: "
                            f"{proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode().strip()


@dataclass(frozen=True)
class BaseCache:
    """The snapshot base of an image's tree (see module doc).

    Attributes:
        image_id: id of the image it was read from.
        workdir: container path of the tree (``/testbed``).
        store: bare git directory holding S_0's objects (own pack, no alternates).
        index: git index of S_0 with the stat data of the image's files.
        commit: the root commit of S_0 in ``store`` (fixed identity and date).
        tree: S_0's tree id.
        checkout: the branch checked out before S_0 was taken (SWE-smith), or None.
        branch: the branch the image's ``HEAD`` named at S_0 (None: detached); the agent's
            repository has this one branch.
        nested_git: ``.git`` entries below the workdir (tree-relative), hidden from the agent.
        outside_git: container paths outside the workdir holding the repository's git data
            (:class:`sandbox.workspace.imagegit.ImageGit`), masked in the agent's container by a
            read-only bind mount of the cache's empty directory (``<cache>/empty``).
    """

    image_id: str
    workdir: str
    store: Path
    index: Path
    commit: str
    tree: str
    checkout: str | None = None
    branch: str | None = None
    nested_git: tuple[str, ...] = ()
    outside_git: tuple[str, ...] = ()


def _load(dest: Path) -> BaseCache:
    meta = json.loads((dest / "meta.json").read_text())
    return BaseCache(meta["image_id"], meta["workdir"], dest / "git", dest / "s0.index",
                     meta["commit"], meta["tree"], meta["checkout"], meta["branch"],
                     tuple(meta["nested_git"]), tuple(meta["outside_git"]))


def _s0_store(src: Path, dest: Path, ignore: tuple[str, ...]) -> tuple[str, str]:
    """Write ``dest/git`` (S_0 of the tree ``src`` as one root commit, its objects in one
    pack of their own) and ``dest/s0.index``; returns (tree, commit). Raises SnapshotError."""
    src_git = trusted_git_dir(src)
    objects = run_git(src_git, ["rev-parse", "--git-path", "objects"]).stdout
    store = dest / "git"
    init_store(store, [(src_git / objects.decode().strip()).resolve()])
    snap = Snapshotter(src, base="HEAD", objects_from=src, store=store, ignore=ignore)
    try:
        tree = snap.snapshot()
        run_git(store, ["update-index", "-q", "--refresh"], work_tree=src,
                index_file=snap.index_file, check=False)
        shutil.copyfile(snap.index_file, dest / "s0.index")
    finally:
        snap.close()
    commit = _commit_tree(store, tree)
    run_git(store, ["update-ref", S0_REF, commit])
    run_git(store, ["symbolic-ref", "HEAD", S0_REF])
    # -a without -l packs the objects borrowed from the image too: a real copy
    # (no new delta search: deltas of the image's packs are reused as they are)
    run_git(store, ["repack", "-a", "-d", "-q", "--window=0"])
    (store / "objects" / "info" / "alternates").unlink()
    # the agent's container borrows these objects: none beyond what S_0 reaches
    run_git(store, ["prune", "--expire=now"])
    run_git(store, ["fsck", "--connectivity-only", "--no-dangling"])
    return tree, commit


def base_cache(image: str, workdir: str, cache_dir: str | Path, *,
               ignore: Iterable[str] = DEFAULT_SNAPSHOT_IGNORE,
               checkout: str | None = None) -> BaseCache:
    """S_0 of ``image``'s ``workdir`` as a git store + index under ``cache_dir`` (made once).

    The key is (image id, workdir, ignore patterns, ``checkout``): a rebuilt image gets a
    new cache. With ``checkout`` (a task whose base is a branch of the image's repository,
    SWE-smith), S_0 is the tree after :func:`checkout_branch` of that branch in a tree
    container (removed after), as every rollout's tree is at reset; otherwise the image's
    tree read through ``podman image mount``.
    Cost: hashing the tree's untracked files and packing S_0's objects (once per image).

    Returns: the :class:`BaseCache` (``<cache_dir>/<16 hex>/``).
    Raises:
        ImageTreeError: the image is absent or cannot be mounted, ``workdir`` there is
            not a git working tree (naming image and workdir), or it has no local branch
            ``checkout``.
        ValueError: a relative ``workdir`` or bad ``ignore`` patterns.
    """
    ignore = check_patterns(ignore)
    iid = image_id(image)
    ident = [iid, workdir, list(ignore), BASE_CACHE_VERSION] + (
        [checkout] if checkout is not None else [])
    key = hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:16]
    dest = Path(cache_dir) / key
    if (dest / "meta.json").is_file():
        return _load(dest)
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    holder = None
    if checkout is None:
        root = Path(_podman(["image", "mount", iid], f"image {image!r}"))
    else:
        holder = open_tree(image, workdir)
        root = holder.mountpoint
    tmp = None
    try:
        if holder is not None:
            checkout_branch(image, holder.path, workdir, checkout)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache_dir))
        src = _in_root(root, workdir)
        if not (src / ".git").exists():
            raise ImageTreeError(f"workdir {workdir} of image {image!r} is not a git working "
                                 "tree (no .git): image tasks need the repository there")
        try:
            where = survey(root, workdir)
        except ValueError as exc:
            raise ImageTreeError(f"image {image!r}: {exc}") from None
        try:
            tree, commit = _s0_store(src, tmp, ignore)
        except SnapshotError as exc:
            raise ImageTreeError(f"base of image {image!r} at {workdir}: {exc}") from None
        (tmp / "meta.json").write_text(json.dumps(
            {"image": image, "image_id": iid, "workdir": workdir, "commit": commit,
             "tree": tree, "ignore": list(ignore), "checkout": checkout,
             "branch": where.branch, "nested_git": list(where.nested),
             "outside_git": list(where.outside)}))
        try:
            tmp.rename(dest)
        except OSError:  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if holder is not None:
            holder.close()
        else:
            try:
                _podman(["image", "umount", iid], f"image {image!r}")
            except ImageTreeError:
                pass  # still mounted: harmless (read-only); podman image umount --all clears it
    return _load(dest)


def _opaque(directory: Path) -> bool:
    """Whether an upper-layer directory does not simply merge with the lower one at the
    same path: it hides the lower content (``overlay.opaque``) or takes it from another
    path (``overlay.redirect``, a renamed directory); overlayfs(5), ``trusted.`` or, on
    userxattr mounts, ``user.`` xattrs; fuse-overlayfs also ``user.fuseoverlayfs.opaque``).
    Such a directory counts as changed as a whole."""
    for ns in ("trusted.overlay", "user.overlay", "user.fuseoverlayfs"):
        for name, want in (("opaque", b"y"), ("redirect", None)):
            try:
                value = os.getxattr(directory, f"{ns}.{name}", follow_symlinks=False)
            except OSError:
                continue
            if want is None or value == want:
                return True
    return False


@dataclass
class ImageTree:
    """One rollout's copy-on-write tree: a tree container of the task image, mounted.

    Attributes:
        name: the tree container's name (labelled, never started).
        mountpoint: its root filesystem on the host.
        path: ``mountpoint`` + ``workdir``: the rollout's tree on the host.
    """

    name: str
    mountpoint: Path
    path: Path
    upper: Path | None = None

    def _find_upper(self) -> Path | None:
        """The container's overlay upper directory: only what the rollout wrote (new and
        copied-up files, whiteouts for deletions), or None (not an overlay)."""
        guess = self.mountpoint.parent / "diff"  # overlay driver: <layer>/{merged,diff}
        if self.mountpoint.name == "merged" and guess.is_dir():
            return guess
        try:
            out = _podman(["container", "inspect", "--format",
                           "{{.GraphDriver.Data.UpperDir}}", self.name], "inspect")
        except ImageTreeError:
            return None
        return Path(out) if out and Path(out).is_dir() else None

    def usage_dirs(self, workdir: str) -> tuple[list[Path], list[Path]]:
        """``(dirs, stores)`` for :func:`sandbox.workspace.disk.tree_usage`: the part of the upper
        layer under ``workdir`` (what this rollout added to the tree: its disk use, at
        the cost of a walk over the changes only) and the ``.git/objects`` there; the whole
        tree when there is no upper layer."""
        if self.upper is None:
            return [self.path], [self.path / ".git" / "objects"]
        top = _in_root(self.upper, workdir)
        return [top], [top / ".git" / "objects"]

    def changes(self, workdir: str) -> list[str] | None:
        """Every path under ``workdir`` (tree-relative, POSIX) that can differ from the
        image: what the overlay's upper layer holds (written, created, copied-up files and
        symlinks; whiteouts of deleted paths; an opaque directory stands for everything
        below it). Every write to the tree goes through the overlay, so no other path can
        have changed. ``.git`` directories are left out (snapshots never record them).

        Returns None when it cannot tell (no upper layer, or ``workdir`` itself opaque): the
        caller then scans the whole tree. Cost: a walk over the upper layer only.
        """
        if self.upper is None:
            return None
        top = _in_root(self.upper, workdir)
        if not top.exists():
            return []
        if _opaque(top):
            return None
        found: list[str] = []
        stack = [(top, "")]
        while stack:
            d, rel = stack.pop()
            with os.scandir(d) as it:
                for e in it:
                    if e.name == ".git":
                        continue
                    path = f"{rel}{e.name}"
                    if e.is_dir(follow_symlinks=False) and not _opaque(Path(e.path)):
                        stack.append((Path(e.path), f"{path}/"))
                    else:
                        found.append(path)
        return found

    def show_only_s0(self, base: BaseCache, exclude: Iterable[str] = ()) -> list[tuple[str, str]]:
        """Give the tree the agent's ``.git`` (S_0 only, :mod:`sandbox.workspace.imagegit`) in place of
        the image's, and hide the image's nested ``.git`` entries; before any agent runs.

        The tree is unmounted (``podman umount``), its upper layer edited
        (:func:`sandbox.workspace.imagegit.write_upper`: an opaque ``.git`` written by
        :func:`sandbox.workspace.agent_repo.write_git_dir` on ``base.commit`` and ``base.branch``,
        alternates :data:`~sandbox.workspace.agent_repo.CONTAINER_OBJECTS`, index ``base.index``,
        ``info/exclude`` = ``exclude``) and mounted again: two podman calls, no walk of the
        image's history. Without an upper layer the image's ``.git`` is removed through the
        mount instead (slow on a big history, still correct).

        Returns: ``[(host dir, container path)]`` to mount read-only in the agent's
        container: ``base.store``'s objects at the alternates path, and an empty directory
        over each of ``base.outside_git`` (a bind mount: a tmpfs would get the image's
        content copied up into it, podman's ``tmpcopyup`` default).
        Raises: ImageTreeError when the tree stays mounted elsewhere (an offline edit would
        be unsafe), when the merged view read after the remount still shows any of the
        image's ``.git`` or nested git entries (:func:`sandbox.workspace.imagegit.opacity_leak`:
        the file system did not honour the opaque mark), or podman / the file system fails.
        """
        workdir = base.workdir

        def write_git(git: Path, owner: tuple[int, int] | None) -> None:
            write_git_dir(git, base.commit, branch=base.branch, alternates=CONTAINER_OBJECTS,
                          index=base.index, exclude=exclude, owner=owner)

        what = f"agent git of tree container {self.name}"
        try:
            if self.upper is None:
                for rel in (*base.nested_git, ".git"):
                    remove_entry(self.path / rel)
                write_git(self.path / ".git", None)
            else:
                plan = plan_upper(self.mountpoint, workdir, base.nested_git)
                _podman(["umount", self.name], what)
                if is_mounted(self.mountpoint):
                    raise ImageTreeError(f"{what}: {self.mountpoint} is still mounted "
                                         "(another `podman mount`?); not editing it")
                write_upper(self.upper, workdir, plan, base.nested_git, write_git)
                self.mountpoint = Path(_podman(["mount", self.name], what))
                self.path = _in_root(self.mountpoint, workdir)
                # the merged view, read after the remount, decides: not the xattr we wrote
                leak = opacity_leak(self.path, _in_root(self.upper, workdir), base.nested_git)
                if leak is not None:
                    raise ImageTreeError(
                        f"{what}: the image's git data shows through the overlay at {leak} "
                        f"after the remount ({plan.fstype or 'unknown file system'}, "
                        f"{', '.join(plan.opaque_xattrs())}); not handing the tree to an agent")
        except OSError as exc:
            raise ImageTreeError(f"{what}: {exc}") from None
        empty = base.store.parent / "empty"
        empty.mkdir(mode=0o555, exist_ok=True)
        return [(str((base.store / "objects").resolve()), CONTAINER_OBJECTS),
                *((str(empty.resolve()), path) for path in base.outside_git)]

    def close(self) -> None:
        """Unmount and remove the tree container with its upper layer (idempotent;
        never raises)."""
        for args in (["umount", "--force", self.name], ["rm", "--force", "--volumes", self.name]):
            try:
                _podman(args, f"tree container {self.name}", timeout_s=60)
            except ImageTreeError:
                pass


def open_tree(image: str, workdir: str = "/testbed", *, labels: dict[str, str] | None = None,
              name: str | None = None) -> ImageTree:
    """Create a tree container of ``image`` (no network, never started) and mount it.

    Args:
        image: the task image (present locally).
        workdir: container path of the repository (``/testbed``).
        labels: container labels (the runtime's run label, so ``python -m sandbox gc``
            removes what a killed process left).
        name: container name (default: ``ecredit-tree-<random>``).

    Returns: the :class:`ImageTree`; its ``path`` holds the image's tree, untracked and
    ignored files included.
    Raises: ImageTreeError (nothing is left behind) when podman fails or ``workdir`` is
    not a directory of the image.
    """
    name = name or f"ecredit-tree-{uuid.uuid4().hex[:12]}"
    label_args = []
    for k, v in {ROLE_LABEL: TREE_ROLE, **(labels or {})}.items():
        label_args += ["--label", f"{k}={v}"]
    _podman(["create", "--name", name, "--network", "none", *label_args, image, "true"],
            f"tree container of image {image!r}")
    tree = ImageTree(name, Path(), Path())
    try:
        tree.mountpoint = Path(_podman(["mount", name], f"tree container of image {image!r}"))
        tree.path = _in_root(tree.mountpoint, workdir)
        if not tree.path.is_dir() or tree.path.is_symlink():
            raise ImageTreeError(f"workdir {workdir} is not a directory in image {image!r}")
        tree.upper = tree._find_upper()
    except BaseException:
        tree.close()
        raise
    return tree


def prepare_tree(tree: ImageTree, image: str, base: BaseCache,
                 exclude: Iterable[str] = ()) -> list[tuple[str, str]]:
    """A fresh rollout tree as S_0 was taken: ``base.checkout`` checked out first
    (:func:`checkout_branch`, with the image's git), then :meth:`ImageTree.show_only_s0`.

    Returns / Raises: as :meth:`ImageTree.show_only_s0` and :func:`checkout_branch`.
    """
    if base.checkout is not None:
        checkout_branch(image, tree.path, base.workdir, base.checkout)
    return tree.show_only_s0(base, exclude)


__all__ = ["BaseCache", "ImageTree", "ImageTreeError", "S0_REF", "TREE_ROLE", "base_cache",
           "checkout_branch", "image_id", "open_tree", "prepare_tree"]
