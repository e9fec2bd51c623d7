"""Git snapshots of an agent's working tree, taken through a private git directory.

Each agent turn ends with :meth:`Snapshotter.snapshot`, which records the working
tree as a git *tree object* (S_k, design page "Trajectory and snapshots"). The agent's tree is
hostile (design page, "Threat model"): it may hold a ``.git`` whose config names programs
(``core.fsmonitor``, ``filter.<x>.clean``, ``diff.<x>.textconv``), hooks, excludes,
alternates or forged objects, and in-tree ``.gitattributes`` / ``.gitignore`` files.
So host-side git never reads the agent's ``.git`` after construction:

* every command runs with ``--git-dir`` = a **private git directory** (a temporary
  directory outside the agent's mount, or a store only the caller writes) and
  ``--work-tree`` = the agent's tree; our own config is written there
  (``core.fsmonitor=false``, ``core.hooksPath=/dev/null``, ``core.autocrlf=false``,
  ``core.fileMode=true``, no filter/textconv drivers, no untracked cache), the
  environment drops every ``GIT_*`` variable and global/system config and attributes;
* ``$GIT_DIR/info/attributes`` resets ``text eol crlf ident filter diff merge
  working-tree-encoding`` for every path; it has precedence over in-tree
  ``.gitattributes``, so no attribute the agent writes converts bytes or picks a driver:
  a snapshot stores the bytes on disk;
* the private store's objects are its own, plus (through ``objects/info/alternates``)
  the object store of the task repository (``objects_from``): never the agent's;
* new files are found with ``git ls-files --others --exclude-from=<ours>`` where
  *ours* = the base commit's ``.gitignore`` rules, read once from the base tree (the
  agent's edits of ``.gitignore``, ``.git/info/exclude`` or ``core.excludesFile`` change
  nothing); generated files (``__pycache__/``, ``*.pyc``, caches, see
  :data:`DEFAULT_SNAPSHOT_IGNORE`) are never recorded and are reported per snapshot;
* files under a nested repository (a directory with its own ``.git``, committed or
  not) are recorded as ordinary files, never as a gitlink (git does not descend into a
  new nested repository, so its files are listed here and only the generated-file
  patterns apply to them, not the base's ``.gitignore``);
* a symlink is recorded as a link (mode 120000, its target as text) and never followed:
  paths under a symlinked directory, FIFOs, sockets and devices are not recorded.

The private index (``GIT_INDEX_FILE``) is kept between snapshots of one rollout, so
unchanged files are only ``stat``-ed. It is seeded at construction (before the agent
runs) from the working tree's own index when that index describes the base.

Tree helpers (:func:`changed_paths`, :func:`restore_paths`, :func:`artifact`,
:func:`read_blob`) take ``repo`` = a private store (:attr:`Snapshotter.git_dir`) or a
working tree whose ``.git`` only we write; they never touch a working tree.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sandbox.snapshots.gitsafe import (
    ATTRIBUTE_RESETS,
    DEFAULT_SNAPSHOT_IGNORE,
    SnapshotError,
    check_patterns,
    init_store,
    is_generated,
    run_git,
    run_git_together,
    store_of,
    translate_ignore,
    trusted_git_dir,
    write_private_config,
)

__all__ = [
    "ATTRIBUTE_RESETS", "DEFAULT_SNAPSHOT_IGNORE", "EMPTY_TREE", "ChangedPath", "SnapshotError",
    "Snapshotter", "artifact", "changed_paths", "is_generated", "read_blob", "restore_paths",
    "store_of", "translate_ignore",
]

MAX_HINTED_PATHS = 4000
"""Above this many hinted paths (``changes``) a snapshot scans the whole tree (git's
pathspec matching is linear in their number)."""

_EXCLUDES: dict[str, bytes] = {}  # base tree id -> our exclude rules (its .gitignore files)

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
"""The id of git's empty tree (same in every SHA-1 repository)."""

class Snapshotter:
    """Snapshots one working tree into git tree objects, turn after turn.

    Args:
        workdir: the agent's working tree; read through ``--work-tree`` only.
        base: tree-ish of the start state S_0 (default ``HEAD``), resolved once at
            construction in ``objects_from``.
        objects_from: repository (working tree or git dir) whose object store seeds
            the private one, read at construction. Default: ``workdir`` itself, which
            is only right for a tree no one else writes; agent environments pass the
            task repository (the donor), never the agent's clone.
        store: ``None`` (default): a new private git directory in a temporary
            directory, removed by :meth:`close`. Or a git directory that only the
            caller writes (a replay clone's ``.git``): used in place, its config,
            ``info/attributes`` and hooks replaced by ours, kept after close.
        ignore: generated-file patterns never recorded (:data:`DEFAULT_SNAPSHOT_IGNORE`).
        index_from: an index file describing ``base`` with the stat data of this tree's
            files (a per-task cache, :func:`sandbox.workspace.imagetree.base_cache`), copied as the
            private index so the first snapshot only ``stat`` s unchanged files; used only
            when it describes ``base``. Default: the working tree's own index.
        changes: a function returning every path (tree-relative; a directory stands for
            all below it) that can differ from ``base`` now, or None when it cannot tell:
            snapshots then look only at those paths (plus those it returned before)
            instead of the whole tree. Only for trees where it is exact: an overlay's upper
            layer (:meth:`sandbox.workspace.imagetree.ImageTree.changes`), which every write goes
            through. Default None: the whole tree, every snapshot.

    Raises:
        SnapshotError: ``workdir`` / ``objects_from`` is not a git repository or
            ``base`` is unknown there.
        ValueError: ``ignore`` is not a list of non-empty strings.

    Attributes:
        git_dir: the store holding every snapshot tree (pass it as ``repo`` to the
            tree helpers and :mod:`ecredit_trl.credit.blocks`).
        generated_new: generated paths that appeared since the previous snapshot
            (not recorded; reported so a turn that only made them can be named).
    """

    def __init__(self, workdir: str | os.PathLike, base: str = "HEAD", *,
                 objects_from: str | os.PathLike | None = None,
                 store: str | os.PathLike | None = None,
                 ignore: Iterable[str] = DEFAULT_SNAPSHOT_IGNORE,
                 index_from: str | os.PathLike | None = None,
                 changes: Callable[[], list[str] | None] | None = None) -> None:
        self.workdir = Path(workdir).resolve()
        self.ignore = check_patterns(ignore)
        if not self.workdir.is_dir():
            raise SnapshotError(f"{self.workdir} is not a git working tree (no such directory)")
        src_git = trusted_git_dir(Path(objects_from).resolve() if objects_from
                                   else self.workdir)
        base_tree = run_git(src_git, ["rev-parse", "--verify", "-q", f"{base}^{{tree}}"],
                         check=False).stdout.decode().strip()
        if not base_tree:
            raise SnapshotError(f"unknown tree-ish {base!r} in {objects_from or self.workdir}")
        own_git = (trusted_git_dir(self.workdir)
                   if index_from is None and (self.workdir / ".git").exists() else None)
        self._tmp = Path(tempfile.mkdtemp(prefix="ecredit-snap-"))
        self._own_store = store is None
        try:
            if store is None:
                self.git_dir = self._tmp / "git"
                objects = run_git(src_git, ["rev-parse", "--git-path", "objects"]).stdout
                objects_dir = (src_git / objects.decode().strip()).resolve()
                init_store(self.git_dir, [objects_dir])
            else:
                self.git_dir = Path(store).resolve()
                write_private_config(self.git_dir)
            self.index_file = self._tmp / "index"
            self.exclude_file = self._tmp / "exclude"
            self.base_tree = self.tree_of(base_tree)
            self._write_excludes()
            self._seed_index(Path(index_from) if index_from is not None
                             else own_git / "index" if own_git else None)
        except BaseException:
            self.close()
            raise
        self.generated: set[str] = set()
        self.generated_new: list[str] = []
        self._is_gen: dict[str, bool] = {}  # memo: untracked paths repeat across snapshots
        self._changes = changes
        self._touched: set[str] = set()

    # -- lifecycle -----------------------------------------------------------
    def close(self) -> None:
        """Remove the private index and (when created here) the private store."""
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> Snapshotter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- core ----------------------------------------------------------------
    def _index_opts(self) -> list[str]:
        """A split private index in a store of our own: ``add -u`` and ``write-tree`` then
        write only the entries that changed, not all of them (-3 to -6 ms a snapshot at 5k
        files, ``benchmarks/snapshot_cost.py``). Not in a caller's store: its index file is
        copied elsewhere (:mod:`sandbox.workspace.imagetree`) and must stand alone."""
        return ["-c", "core.splitIndex=true"] if self._own_store else []

    def _run(self, args: list[str], **kw) -> subprocess.CompletedProcess:
        return run_git(self.git_dir, [*self._index_opts(), *args], work_tree=self.workdir,
                       index_file=self.index_file, **kw)

    def _run_together(self, calls: list[tuple[list[str], bytes | None, bool]]):
        """:meth:`_run` for commands that run at once (:func:`~sandbox.snapshots.gitsafe.run_git_together`)."""
        opts = self._index_opts()
        return run_git_together(self.git_dir, [([*opts, *args], data, check)
                                               for args, data, check in calls],
                                work_tree=self.workdir, index_file=self.index_file)

    def tree_of(self, treeish: str) -> str:
        """Tree id (40 hex) of ``treeish`` in the private store. Raises SnapshotError."""
        out = run_git(self.git_dir, ["rev-parse", "--verify", "-q", f"{treeish}^{{tree}}"],
                   check=False).stdout.decode().strip()
        if not out:
            raise SnapshotError(f"unknown tree-ish {treeish!r} in {self.workdir}")
        return out

    def _write_excludes(self) -> None:
        """Our ignore rules: the base commit's ``.gitignore`` files, read once per base tree
        in this process (a tree id names its content)."""
        cached = _EXCLUDES.get(self.base_tree)
        if cached is not None:
            self.exclude_file.write_bytes(cached)
            return
        listing = run_git(self.git_dir, ["ls-tree", "-r", "-z", "--full-tree",
                                      self.base_tree]).stdout
        lines: list[str] = []
        for rec in listing.split(b"\0"):
            if not rec.endswith(b"/.gitignore") and not rec.endswith(b"\t.gitignore"):
                continue
            meta, path = rec.split(b"\t", 1)
            mode, kind, sha = meta.decode().split()
            if kind != "blob" or mode == "120000":
                continue
            text = run_git(self.git_dir, ["cat-file", "blob", sha]).stdout.decode(
                "utf-8", errors="surrogateescape")
            parent = str(PurePosixPath(path.decode("utf-8", errors="surrogateescape")).parent)
            lines += translate_ignore(text, "" if parent == "." else parent)
        data = ("\n".join(lines) + "\n").encode("utf-8", errors="surrogateescape")
        if len(_EXCLUDES) > 256:
            _EXCLUDES.clear()
        _EXCLUDES[self.base_tree] = data
        self.exclude_file.write_bytes(data)

    def _seed_index(self, own_index: Path | None) -> None:
        if own_index is not None and own_index.is_file():
            shutil.copyfile(own_index, self.index_file)
            probe = run_git(self.git_dir, ["write-tree"], index_file=self.index_file, check=False)
            if probe.returncode == 0 and probe.stdout.decode().strip() == self.base_tree:
                return
        # The tree's index does not describe the base: start from the base tree (one
        # re-hash on the first snapshot; only when the clone was not fresh at base).
        self.index_file.unlink(missing_ok=True)
        run_git(self.git_dir, ["read-tree", self.base_tree], index_file=self.index_file)
        self._run(["update-index", "-q", "--refresh"], check=False)

    def _expand(self, directory: str) -> list[str]:
        """Files and symlinks under a nested repository ``directory/`` (its ``.git`` skipped)."""
        found = []
        top = self.workdir / directory
        for root, dirs, files in os.walk(top):
            rel = Path(root).relative_to(self.workdir).as_posix()
            keep = []
            for d in dirs:
                if d == ".git":
                    continue
                if (Path(root) / d).is_symlink():
                    found.append(f"{rel}/{d}")
                else:
                    keep.append(d)
            dirs[:] = keep
            found += [f"{rel}/{f}" for f in files if f != ".git"]
        return found

    def _update_tracked_one_by_one(self) -> None:
        """Slow path when ``git add -u`` refuses a tracked path (a FIFO, socket or device
        where a file was): such paths, and paths under a symlinked directory, are
        recorded as deleted; regular files and symlinks are updated."""
        out = self._run(["ls-files", "-z", "-m", "-d"]).stdout
        keep, drop = [], []
        for raw in sorted(set(out.split(b"\0")) - {b""}):
            path = raw.decode("utf-8", errors="surrogateescape")
            parents = [self.workdir / q for q in PurePosixPath(path).parents if str(q) != "."]
            try:
                mode = os.lstat(self.workdir / path).st_mode
            except OSError:
                mode = 0
            ok = (stat.S_ISREG(mode) or stat.S_ISLNK(mode)) and not any(
                q.is_symlink() for q in parents)
            (keep if ok else drop).append(path)
        for flags, paths in ((["--add", "--remove"], keep), (["--force-remove"], drop)):
            if paths:
                data = ("\0".join(paths) + "\0").encode("utf-8", errors="surrogateescape")
                self._run(["update-index", *flags, "-z", "--stdin"], input=data)

    def _pathspec(self) -> list[str] | None:
        """Paths that may differ from the index (from ``changes``, accumulated over the
        rollout so a path changed earlier is looked at again), or None: the whole tree."""
        if self._changes is None:
            return None
        found = self._changes()
        if found is None:
            return None
        self._touched.update(found)
        return None if len(self._touched) > MAX_HINTED_PATHS else sorted(self._touched)

    def snapshot(self) -> str:
        """Record the working tree as a tree object and return its id (40 hex).

        Created, modified, deleted, mode-changed and new files not ignored by our
        rules (the base's ``.gitignore``, :attr:`ignore`) are included as the bytes
        on disk; regular files and symlinks only (sockets, FIFOs and devices are
        not files git can hold, and are skipped). Cost: one ``stat`` per tracked
        file plus hashing of changed files (``benchmarks/snapshot_cost.py``).

        Raises:
            SnapshotError: git could not read the working tree.
        """
        spec = self._pathspec()
        if spec == []:  # nothing can differ from the last snapshot's index
            self.generated_new = []
            return self._run(["write-tree"]).stdout.decode().strip()
        lit = [] if spec is None else ["--literal-pathspecs"]
        tail = ["--", "."] if spec is None else ["--", *spec]
        tracked = ["."]
        if spec is not None:  # `add -u` refuses a pathspec that matches no tracked file
            out = self._run([*lit, "ls-files", "-z", "--cached", *tail]).stdout
            tracked = sorted({p.decode("utf-8", errors="surrogateescape")
                              for p in out.split(b"\0") if p})
        others = [*lit, "ls-files", "-z", "--others", f"--exclude-from={self.exclude_file}",
                  *tail]
        if tracked:
            data = ("\0".join(tracked) + "\0").encode("utf-8", errors="surrogateescape")
            add = [*lit, "add", "-u", "--pathspec-from-file=-", "--pathspec-file-nul"]
            added, listed = self._run_together([(add, data, False), (others, None, True)])
            if added.returncode != 0:
                self._update_tracked_one_by_one()
        else:
            listed = self._run(others)
        out = listed.stdout
        new: list[str] = []
        generated: set[str] = set()
        for raw in out.split(b"\0"):
            if not raw:
                continue
            path = raw.decode("utf-8", errors="surrogateescape")
            for p in self._expand(path.rstrip("/")) if path.endswith("/") else [path]:
                gen = self._is_gen.get(p)
                if gen is None:
                    gen = self._is_gen[p] = is_generated(p, self.ignore)
                if gen:
                    generated.add(p)
                    continue
                try:
                    mode = os.lstat(self.workdir / p).st_mode
                except OSError:
                    continue
                if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
                    new.append(p)
        if new:
            data = ("\0".join(new) + "\0").encode("utf-8", errors="surrogateescape")
            self._run(["update-index", "--add", "-z", "--stdin"], input=data)
        self.generated_new = sorted(generated - self.generated)
        self.generated = generated
        return self._run(["write-tree"]).stdout.decode().strip()


# -- tree helpers ------------------------------------------------------------

def _tree_git(repo, args: list[str], **kw) -> subprocess.CompletedProcess:
    return run_git(store_of(repo), args, **kw)


@dataclass(frozen=True)
class ChangedPath:
    """One path that differs between two trees.

    ``status``: ``A`` created, ``D`` deleted, ``M`` content changed, ``T`` type
    changed (file ↔ symlink), ``X`` mode only (exec bit). Modes are git's octal
    strings (``100644``, ``100755``, ``120000``; ``000000`` when absent).
    """

    path: str
    status: str
    old_mode: str
    new_mode: str


def changed_paths(repo: str | os.PathLike, tree_a: str, tree_b: str) -> list[ChangedPath]:
    """Paths whose content or mode differ between ``tree_a`` and ``tree_b``.

    Renames are reported as a delete plus a create (edit blocks are sets of
    paths, design page "Edit blocks and eligibility"). Binary files are compared by blob id
    like any other.

    Returns: the changed paths sorted by path.
    Raises: SnapshotError when a tree id is unknown in ``repo`` (see :func:`store_of`).
    """
    out = _tree_git(repo, ["diff-tree", "-r", "-z", "--no-renames", "--raw",
                           tree_a, tree_b]).stdout
    fields = out.split(b"\0")
    result: list[ChangedPath] = []
    i = 0
    while i + 1 < len(fields):
        meta = fields[i].decode()
        if not meta.startswith(":"):
            i += 1
            continue
        old_mode, new_mode, old_sha, new_sha, status = meta[1:].split()
        path = fields[i + 1].decode("utf-8", errors="surrogateescape")
        i += 2
        if status == "M" and old_sha == new_sha:
            status = "X"
        result.append(ChangedPath(path, status[0], old_mode, new_mode))
    return sorted(result, key=lambda c: c.path)


def _ls_tree(repo, tree: str, paths: list[str]) -> dict[str, tuple[str, str]]:
    if not paths:
        return {}
    out = _tree_git(repo, ["ls-tree", "-r", "-z", "--full-tree", tree, "--", *paths]).stdout
    entries: dict[str, tuple[str, str]] = {}
    for rec in out.split(b"\0"):
        if not rec:
            continue
        meta, path = rec.split(b"\t", 1)
        mode, _type, sha = meta.decode().split()
        entries[path.decode("utf-8", errors="surrogateescape")] = (mode, sha)
    return entries


def read_blob(repo: str | os.PathLike, tree: str, path: str) -> tuple[str, bytes]:
    """Mode and bytes of ``path`` in ``tree`` (a symlink's bytes are its target).

    Returns: ``(mode, data)``, mode one of git's octal strings (``100644``, ``100755``,
    ``120000``). Raises: SnapshotError when the path is not a blob of ``tree``.
    """
    entries = _ls_tree(repo, tree, [path])
    if path not in entries or entries[path][0] == "160000":
        raise SnapshotError(f"{path!r} is not a file of tree {tree} in {repo}")
    mode, sha = entries[path]
    return mode, _tree_git(repo, ["cat-file", "blob", sha]).stdout


def restore_paths(repo: str | os.PathLike, final_tree: str, source_tree: str,
                  paths: list[str] | set[str]) -> str:
    """Restore ``paths`` of ``final_tree`` to their state in ``source_tree``.

    Each path takes its blob and mode from ``source_tree``, or is removed when
    absent there (design page, "Selection and restore"). Other paths are untouched.

    Returns: the id of the resulting tree (may equal the base or the empty tree).
    Raises: SnapshotError when the result is not a valid tree (e.g. a restored
    file collides with a directory the final tree still holds): the block is
    then "not restorable".
    """
    paths = sorted(set(paths))
    source = _ls_tree(repo, source_tree, paths)
    with tempfile.TemporaryDirectory(prefix="ecredit-restore-") as tmp:
        index = Path(tmp) / "index"
        _tree_git(repo, ["read-tree", final_tree], index_file=index)
        lines = []
        for path in paths:
            if path in source:
                mode, sha = source[path]
                lines.append(f"{mode} {sha}\t{path}")
            else:
                lines.append(f"0 {'0' * 40}\t{path}")  # mode 0 removes the entry
        data = ("\0".join(lines) + "\0").encode("utf-8", errors="surrogateescape")
        _tree_git(repo, ["update-index", "-z", "--index-info"], index_file=index, input=data)
        tree = _tree_git(repo, ["write-tree"], index_file=index).stdout.decode().strip()
    # git resolves a file/directory clash by silently dropping the other side; a
    # restore may only change the block's own paths, so such a clash is refused.
    collateral = sorted({c.path for c in changed_paths(repo, final_tree, tree)} - set(paths))
    if collateral:
        raise SnapshotError(
            f"not restorable in {repo}: restoring {paths} would also change {collateral}")
    return tree


def artifact(repo: str | os.PathLike, base_tree: str, tree: str) -> str:
    """The patch from ``base_tree`` to ``tree``: what a verifier applies.

    ``git diff --binary --full-index`` with fixed ``a/``/``b/`` prefixes, no
    renames, no textconv and no external diff, so ``git apply`` (and SWE-bench's
    fallback chain) accepts it on a clean checkout of the base; binary files are
    included. Returns ``""`` when the trees are equal.

    Raises: SnapshotError when a tree id is unknown in ``repo`` (see :func:`store_of`).
    """
    out = _tree_git(repo, ["diff", "--binary", "--full-index", "--no-renames",
                           "--no-color", "--no-ext-diff", "--no-textconv", "--src-prefix=a/",
                           "--dst-prefix=b/", base_tree, tree]).stdout
    return out.decode("utf-8", errors="surrogateescape")
