"""One rollout's workspace: its tree, container, snapshots, disk budget and release.

A :class:`RolloutWorkspace` is everything one agent rollout owns in the sandbox layer, built
by one constructor per kind of task (two kinds of task, one path):

* :meth:`RolloutWorkspace.for_repo_dir` — a repository on this host (``task.repo_dir``):
  a clone holding one root commit of the base (:func:`sandbox.workspace.agent_repo.agent_clone`,
  objects in a per-task base store), and with a Podman runtime a container with that tree
  at ``task.workdir`` and the base store's objects mounted read-only;
* :meth:`RolloutWorkspace.for_image` — a repository inside the task image: a copy-on-write
  tree of the image's ``workdir`` (:mod:`sandbox.workspace.imagetree`), its ``.git`` replaced by one
  holding S_0 only, in a container of the task image running ``bash -lc``.

Both end up as the same object: a working tree, a :class:`~sandbox.snapshots.snapshot.Snapshotter`
over it (private git directory, never the agent's ``.git``), an optional session
(:mod:`sandbox.workspace.session`), and the disk budget measured from the size at reset
(:mod:`sandbox.workspace.disk`). The agent environment (``ecredit_trl.agent.env``) keeps only the tool
surface over it; the ``ray`` backend hosts the very same object on a sandbox node
(:mod:`sandbox.cluster.workspace_host`), so local and Ray are two places for one object.

Who caused a failure is not decided here (that is the trainer's rule, design page,
"Who caused a failure decides the reward"): this
module reports facts (a setup error, an over-budget measurement with its evidence, a
snapshot error, the session's diagnosis) and the caller classifies them.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.runtimes.local_runtime import LocalRuntime
from sandbox.runtimes.tempdirs import mark_owner
from sandbox.snapshots.snapshot import DEFAULT_SNAPSHOT_IGNORE, Snapshotter
from sandbox.workspace.agent_repo import agent_clone
from sandbox.workspace.disk import tree_usage
from sandbox.workspace.imagetree import base_cache, prepare_tree
from sandbox.workspace.session import (
    DEFAULT_MAX_FILE_BYTES,
    ExecOutputGarbled,
    close_image_tree,
    open_image_tree,
    open_session,
)

DEFAULT_TREE_BUDGET_BYTES = 2 * 2**30
"""Growth a rollout may add to its working tree + snapshot store (bytes) before the episode
ends with ``disk_budget``: room for build outputs of SWE-bench repositories (compiled
extensions, test caches), far below what 64 rollouts of a round may hold on one host."""


@dataclass
class WorkspaceSite:
    """What the workspaces made in one place (a trainer process, a Ray node) share.

    Attributes:
        runtime: a sandbox runtime (Podman or local) for sessions; None: no container
            (editor tools only).
        workroot: directory under which rollout trees and base stores are made.
        max_file_bytes: per-file limit in containers (``fsize`` ulimit) and in the
            budget check (bytes).
        tree_budget_bytes: growth of one rollout's tree + snapshot store over its size at
            reset (bytes) before :meth:`RolloutWorkspace.after_call` reports it over budget.
        snapshot_ignore: generated-file patterns never recorded in snapshots.
        limits: memory / pids / CPU limits of each container (:class:`sandbox.trials.trial.Limits`).
        lock: guards the per-task base stores and ``image_bases`` (first rollout makes them).
        image_bases: (image, workdir[, branch]) -> :class:`sandbox.workspace.imagetree.BaseCache`, plus
            one lock per key under ``("lock", *key)``.
    """

    runtime: object | None
    workroot: str
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    tree_budget_bytes: int = DEFAULT_TREE_BUDGET_BYTES
    snapshot_ignore: tuple[str, ...] = DEFAULT_SNAPSHOT_IGNORE
    limits: object | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    image_bases: dict = field(default_factory=dict)

    def open_here(self, task) -> RolloutWorkspace:
        """One rollout's workspace of ``task`` built on this machine: a ``repo_dir`` task gets
        :meth:`RolloutWorkspace.for_repo_dir`, an image-held one :meth:`RolloutWorkspace.for_image`
        (what a local runtime's ``open_workspace`` returns). Raises: what those raise."""
        if getattr(task, "repo_dir", None):
            return RolloutWorkspace.for_repo_dir(task, self)
        return RolloutWorkspace.for_image(task, self)


@dataclass
class AfterCall:
    """What :meth:`RolloutWorkspace.after_call` saw: the snapshot tree (None when none was
    taken), generated paths new since the last snapshot, and at most one of ``over_budget``
    (``(detail, evidence)``; the files are removed already) or ``snapshot_error`` (text);
    ``exec_retries``: execs re-run after a garbled output (:meth:`RolloutWorkspace.run`)."""

    tree: str | None
    generated: list[str] = field(default_factory=list)
    over_budget: tuple[str, dict] | None = None
    snapshot_error: str | None = None
    exec_retries: int = 0  # garbled read-only execs re-run since the last after_call


def _is_local(runtime) -> bool:
    return isinstance(runtime, LocalRuntime)


class RolloutWorkspace:
    """One rollout's sandbox: tree, container, snapshots, budget, release (module docstring).

    Build with :meth:`for_repo_dir` or :meth:`for_image`, never directly.

    Attributes:
        task_id: the task's instance id.
        workdir: the host path of the working tree (None before setup / after release).
        base_tree: S_0 (a git tree id, 40 hex).
        setup_error: ``"Type: message"`` when the container (or the image tree) could not
            be set up — an infrastructure failure of this rollout; None otherwise.
        usage_at_reset: bytes of tree + stores at setup (the budget's zero).
        snapshotter, session, image_tree: the parts (None when absent or released).
    """

    def __init__(self, site: WorkspaceSite, task_id: str, tree_workdir: str) -> None:
        self.site = site
        self.task_id = task_id
        self.tree_workdir = tree_workdir  # the repository's path inside the container
        self.workdir: Path | None = None
        self.base_tree = ""
        self.setup_error: str | None = None
        self.usage_at_reset = 0
        self.snapshotter: Snapshotter | None = None
        self.session = None
        self.image_tree = None
        self.last_tree: str | None = None  # the tree after the last call (None: S_0)
        self._exec_retries = 0
        self._generated_between: list[str] = []

    # -- constructors ------------------------------------------------------------
    @classmethod
    def for_repo_dir(cls, task, site: WorkspaceSite) -> RolloutWorkspace:
        """The workspace of a task whose repository is on this host (``task.repo_dir`` at
        ``task.base_commit``; container image ``task.image`` at ``task.workdir``).

        A container that cannot start is recorded in ``setup_error`` (infrastructure), the
        tree and snapshots stay usable. Raises: what the clone or the snapshotter raise
        (``sandbox.workspace.agent_repo`` errors, SnapshotError) — the task itself is broken.
        """
        iid = task.instance_id
        ws = cls(site, iid, getattr(task, "workdir", None) or "/testbed")
        ws.workdir = Path(tempfile.mkdtemp(prefix=f"{iid}-", dir=site.workroot))
        with site.lock:  # one base store per task, made by the first rollout
            on_host = site.runtime is None or _is_local(site.runtime)
            object_dirs = agent_clone(task.repo_dir, task.base_commit, ws.workdir,
                                      Path(site.workroot) / ".bases",
                                      **({"alternates": None} if on_host else {}))
        # before the agent runs: the private store borrows the donor's objects, never the clone's
        ws.snapshotter = Snapshotter(ws.workdir, base=task.base_commit,
                                     objects_from=task.repo_dir, ignore=site.snapshot_ignore)
        ws.base_tree = ws.snapshotter.base_tree
        store = getattr(ws.snapshotter, "_tmp", None)
        if store is not None:
            mark_owner(store)  # `python -m sandbox gc` keeps it while we live
        ws.usage_at_reset = ws.usage().total_bytes
        if site.runtime is not None:
            kw = {}
            if not _is_local(site.runtime):
                kw.update(max_file_bytes=site.max_file_bytes, limits=site.limits)
            try:
                ws.session = open_session(site.runtime, task.image, ws.workdir,
                                          workdir=getattr(task, "workdir", "/testbed"),
                                          labels={"ecredit.task": iid},
                                          ro_mounts=object_dirs, **kw)
            except Exception as exc:  # an infra failure of this rollout, not the policy's
                ws.session = None
                ws.setup_error = f"{type(exc).__name__}: {exc}"
        return ws

    @classmethod
    def for_image(cls, task, site: WorkspaceSite) -> RolloutWorkspace:
        """The workspace of an image-held task (no ``repo_dir``): the tree is
        the image's ``workdir``, copy-on-write (:mod:`sandbox.workspace.imagetree`), S_0 = that tree at
        reset (tracked + untracked non-ignored files, from a per-image cache; a
        ``checkout_base`` task's branch checked out first, S_0 per branch), its ``.git``
        replaced by one holding S_0 only; commands run as ``bash -lc`` in the
        task image's environment. A tree or container that cannot be set up is recorded in
        ``setup_error``.

        Raises: ValueError naming ``runtime`` (not Podman on local endpoints) or ``image``
        (none); ImageTreeError: no such image, or no git repository / ``checkout_base``
        branch there.
        """
        iid = task.instance_id
        runtime, image = site.runtime, getattr(task, "image", None)
        workdir = getattr(task, "workdir", None) or "/testbed"
        if not image:
            raise ValueError(f"image: task {iid} has neither a repo_dir nor an image")
        if not all(e.startswith("unix://") for e in getattr(runtime, "endpoints", ["local"])) \
                or _is_local(runtime):
            raise ValueError(f"runtime: task {iid} is held in image {image}; its rollouts need "
                             "the Podman runtime on local (unix://) endpoints")
        ws = cls(site, iid, workdir)
        branch = task.base_commit if task.checkout_base else None
        key = (image, workdir) if branch is None else (image, workdir, branch)
        with site.lock:  # one base per image (+ branch), made by its first rollout
            lock = site.image_bases.setdefault(("lock", *key), threading.Lock())
        with lock:
            base = site.image_bases.get(key)
            if base is None:
                base = site.image_bases[key] = base_cache(
                    image, workdir, Path(site.workroot) / ".images", checkout=branch,
                    ignore=site.snapshot_ignore)
        ws.base_tree = base.tree
        try:
            ws.image_tree = open_image_tree(runtime, image, workdir,
                                            labels={"ecredit.task": iid[:60]})
            # the tree S_0 was taken from (base_cache did the same); its .git: S_0 only
            mounts = prepare_tree(ws.image_tree, image, base, site.snapshot_ignore)
        except Exception as exc:  # an infra failure of this rollout, not the policy's
            ws.setup_error = f"{type(exc).__name__}: {exc}"
            return ws
        ws.workdir = ws.image_tree.path
        tree = ws.image_tree
        ws.snapshotter = Snapshotter(ws.workdir, base=base.commit, objects_from=base.store,
                                     index_from=base.index, ignore=site.snapshot_ignore,
                                     changes=lambda: tree.changes(workdir))
        mark_owner(ws.snapshotter._tmp)
        ws.usage_at_reset = ws.usage().total_bytes
        try:
            ws.session = open_session(runtime, image, ws.workdir, workdir=workdir,
                                      labels={"ecredit.task": iid[:60]}, login_shell=True,
                                      max_file_bytes=site.max_file_bytes,
                                      limits=site.limits, ro_mounts=mounts)
        except Exception as exc:  # an infra failure of this rollout, not the policy's
            ws.session = None
            ws.setup_error = f"{type(exc).__name__}: {exc}"
        return ws

    # -- tool calls --------------------------------------------------------------
    @property
    def has_session(self) -> bool:
        """Whether commands can run (a container, or the local runtime's shell, is open)."""
        return self.session is not None

    def run(self, command: str, *, timeout_s: float, max_output_chars: int) -> str:
        """Run ``command`` in the rollout's container (:meth:`PodmanSession.run`): its
        output with the exit status, truncated to ``max_output_chars`` characters;
        ``timeout_s`` seconds of wall clock at most (twice, when re-run).

        A garbled output (:class:`~sandbox.workspace.session.ExecOutputGarbled`) of a call
        that left the tree as the last snapshot recorded it is a read-only call: it is
        re-run once and counted (``exec_retries`` of the next :meth:`after_call`); a call
        that changed the tree is never re-run (design page, "Who caused a failure decides
        the reward").

        Raises: RuntimeError when no session is open; what the session raises
        (SandboxExecError, API errors: the sandbox failed).
        """
        if self.session is None:
            raise RuntimeError(f"no session is open for rollout {self.task_id}")
        try:
            return self.session.run(command, timeout_s=timeout_s,
                                    max_output_chars=max_output_chars)
        except ExecOutputGarbled as exc:
            if not self._tree_unchanged():
                raise ExecOutputGarbled(f"{exc}; not re-run: the call changed the working "
                                        "tree, or it could not be told") from exc
        self._exec_retries += 1  # read-only: re-run once; a second garbling raises
        return self.session.run(command, timeout_s=timeout_s, max_output_chars=max_output_chars)

    def _tree_unchanged(self) -> bool:
        """Whether the working tree is the one of the last snapshot (S_0 before any), by a
        snapshot now; False when it cannot be told. The generated files this snapshot sees
        are kept for the next :meth:`after_call`."""
        if self.snapshotter is None or self.workdir is None:
            return False
        try:
            tree = self.snapshotter.snapshot()
        except Exception:  # noqa: BLE001 - cannot tell: never re-run
            return False
        self._generated_between += list(self.snapshotter.generated_new)
        return tree == (self.last_tree or self.base_tree)

    def edit(self, fn, *args):
        """``fn(workdir, *args)``: an editor operation on the working tree, run where the
        tree is (the editor belongs to the agent layer; this layer only hands it the
        tree). Returns and raises what ``fn`` does."""
        return fn(self.workdir, *args)

    def diagnose(self) -> dict | None:
        """The session's diagnosis of a failed call (:meth:`PodmanSession.diagnose`: the evidence
        of whose processes filled the container's limits), or None when the session has none.
        Raises: what the diagnosis raises."""
        diagnose = getattr(self.session, "diagnose", None)
        return diagnose() if diagnose is not None else None

    # -- snapshots and budget ----------------------------------------------------
    def _stores(self) -> list[Path]:
        """Git object stores and snapshot directories of this rollout (counted in the
        budget; their compressed objects are not held to the per-file limit)."""
        out = []
        if self.workdir is not None:
            out.append(self.workdir / ".git" / "objects")
        store = getattr(self.snapshotter, "_tmp", None)
        if store is not None:
            out.append(Path(store))
        return out

    def usage(self):
        """:class:`sandbox.workspace.disk.TreeUsage` of the tree + stores now (for an image tree:
        the tree container's upper layer, i.e. the changes only)."""
        if self.image_tree is not None:
            dirs, stores = self.image_tree.usage_dirs(self.tree_workdir)
            snap = getattr(self.snapshotter, "_tmp", None)
            return tree_usage(dirs, stores + ([Path(snap)] if snap is not None else []))
        return tree_usage([self.workdir] if self.workdir is not None else [], self._stores())

    def over_budget(self) -> tuple[str, dict] | None:
        """``(detail, evidence)`` when the tree is over a disk limit of the site, else None.
        Evidence: ``tree_budget_bytes``, ``grown_bytes``, ``max_file_bytes``,
        ``largest_file_bytes`` (bytes) and ``largest_path`` (a file name) when one file is
        over the per-file limit."""
        site = self.site
        use = self.usage()
        grown = use.total_bytes - self.usage_at_reset
        ev = {"tree_budget_bytes": site.tree_budget_bytes, "grown_bytes": grown,
              "max_file_bytes": site.max_file_bytes, "largest_file_bytes": use.largest_bytes}
        if use.largest_bytes > site.max_file_bytes:
            ev["largest_path"] = Path(use.largest_path).name
            return (f"file {Path(use.largest_path).name!r} holds {use.largest_bytes} bytes, "
                    f"over the per-file limit of {site.max_file_bytes}"), ev
        if grown > site.tree_budget_bytes:
            return (f"the tree grew by {grown} bytes, over the rollout budget of "
                    f"{site.tree_budget_bytes}"), ev
        return None

    def after_call(self) -> AfterCall:
        """Measure, then snapshot the tree (what follows every tool call). Never raises:
        over budget → the rollout's files are removed at once and ``over_budget`` set; a
        snapshot that raises → ``snapshot_error``; nothing to snapshot → ``tree`` None."""
        if self.snapshotter is None or self.workdir is None:
            return AfterCall(None)
        try:
            over = self.over_budget()
        except Exception as exc:  # noqa: BLE001 - a measurement that fails is ours
            return AfterCall(None, snapshot_error=f"{type(exc).__name__}: {exc}")
        if over is not None:
            self.remove_files()
            return AfterCall(None, over_budget=over)
        retries, self._exec_retries = self._exec_retries, 0
        try:
            tree = self.snapshotter.snapshot()
        except Exception as exc:  # noqa: BLE001 - a rollout's records never stop the run
            return AfterCall(None, snapshot_error=f"{type(exc).__name__}: {exc}",
                             exec_retries=retries)
        self.last_tree = tree
        generated = [*self._generated_between, *self.snapshotter.generated_new]
        self._generated_between = []
        return AfterCall(tree, list(dict.fromkeys(generated)), exec_retries=retries)

    @property
    def snapshot_repo(self) -> Path | None:
        """The private git directory holding every snapshot tree (``repo`` of the tree
        helpers); None when released."""
        return self.snapshotter.git_dir if self.snapshotter else None

    # -- release -----------------------------------------------------------------
    def release_container(self) -> None:
        """Stop the rollout's container now (its episode has ended); the tree and the
        snapshots stay. Idempotent."""
        if self.session is not None:
            session, self.session = self.session, None
            session.close()

    def remove_files(self) -> None:
        """Release everything: the container, the snapshot store, the tree (an image
        tree's container and upper layer, or the clone). Idempotent."""
        self.release_container()
        if self.snapshotter is not None:
            self.snapshotter.close()
            self.snapshotter = None
        if self.image_tree is not None:  # removes the tree's container and upper layer
            tree, self.image_tree = self.image_tree, None
            close_image_tree(self.site.runtime, tree)
        elif self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def release(self) -> None:
        """Release everything (:meth:`remove_files`) and forget the tree's path."""
        self.remove_files()
        self.workdir = None
