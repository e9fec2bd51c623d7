"""Agent sandboxes on Ray: a rollout's workspace lives on one sandbox node.

The object is the local one, :class:`sandbox.workspace.rollout.RolloutWorkspace` (tree, container,
snapshotter, budget, release), made by the same constructors; only its place differs:

* :class:`WorkspaceHost` — **one actor per sandbox node (per trainer rank)**, hard-pinned to
  that node, threaded (``max_concurrency``), holding every workspace the rank has there.
  Per node rather than per rollout because what rollouts of a node share lives in one
  process: the per-task base stores and the per-image S_0 caches
  (:class:`~sandbox.workspace.rollout.WorkspaceSite`: a per-rollout actor would rebuild an image's
  base cache in every rollout), one Podman service, and no Python worker start (~1 s and
  ~100 MB here) per rollout. What a per-rollout actor would isolate — one rollout's
  crash — cannot happen in that process (every workspace call's error is returned as data),
  and a node loss ends all its rollouts either way.
* :class:`~sandbox.cluster.workspace_proxy.RayWorkspaces` — the trainer-side factory, sharing the trials' dispatcher
  (:class:`sandbox.cluster.trials.RayTrials`): each workspace holds one slot of the run's
  cluster-wide cap (``sandbox_max_in_flight``, trials and sandboxes together) from its
  start until its container is released, and is placed by the same node → images index
  (:func:`sandbox.cluster.dispatch.choose_node`: a node holding the task image, least loaded,
  trials and sandboxes counted; none: the least loaded node, which pulls the image, counted).
* :class:`~sandbox.cluster.workspace_proxy.RemoteWorkspace` — the proxy with the workspace's interface that
  ``ecredit_trl.agent.env`` talks to. Every tool call is one actor call (plus one for the
  snapshot after it): arguments and the tool's text output cross, never files.

What the trainer needs back crosses as data (``RemoteWorkspace.snapshot_repo``): at the
episode's end, one git pack of the objects of every snapshot tree (``git pack-objects`` on
the node; for a ``repo_dir`` task without the base's objects, which the trainer's own copy
of the task repository provides through alternates), unpacked into a local private store.
Per-turn trees, changed paths, blobs for planning, the final and the ablated artifacts are
then computed by the trainer's unchanged code on that store.

A node lost mid-episode (the actor died, or a call outlived its deadline) makes every
later call of its workspaces raise :class:`WorkspaceLost`; the environment records it as a
sandbox failure whose diagnosis names the node (``failure_class`` None: the trainer
excludes the rollout as infrastructure, ``sandbox_error``, never a zero) and the run goes on.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

from sandbox.cluster.dispatch import _import_ray
from sandbox.cluster.node import ensure_image, node_runtime
from sandbox.runtimes.tempdirs import mark_owner
from sandbox.snapshots.gitsafe import init_store, run_git
from sandbox.workspace.rollout import RolloutWorkspace, WorkspaceSite

TASK_FIELDS = ("instance_id", "repo_dir", "base_commit", "image", "workdir", "checkout_base")
"""What of a task crosses to the node (no problem statement, no test lists)."""
SITE_FIELDS = ("max_file_bytes", "tree_budget_bytes", "snapshot_ignore", "limits")
CALL_MARGIN_S = 60.0
"""Seconds a call may take beyond its own limit before its node counts as lost."""
OPEN_DEADLINE_S = 1800.0
"""Seconds a workspace's setup may take (a first base cache of a large image, a pull)."""


class WorkspaceLost(RuntimeError):
    """The node that held this workspace was lost (its actor died or stopped answering);
    the message names the node and the Ray error."""


class TaskView:
    """The fields of a task a workspace constructor reads (:data:`TASK_FIELDS`)."""

    def __init__(self, fields: dict) -> None:
        for name in TASK_FIELDS:
            setattr(self, name, fields.get(name))
        self.workdir = self.workdir or "/testbed"
        self.checkout_base = bool(self.checkout_base)


def task_fields(task) -> dict:
    """The plain fields of ``task`` that cross to the node (:data:`TASK_FIELDS`)."""
    return {name: getattr(task, name, None) for name in TASK_FIELDS}


def snapshot_pack(git_dir, trees: list[str], exclude: list[str]) -> bytes:
    """A git pack (bytes) of every object reachable from ``trees`` and not from ``exclude``
    (tree ids) in ``git_dir`` (``git rev-list --objects | git pack-objects --stdout``).
    Raises: SnapshotError naming the command."""
    wanted = sorted(set(trees) - set(exclude))
    if not wanted:
        return b""
    listing = run_git(Path(git_dir), ["rev-list", "--objects", *wanted,
                                      *[f"^{t}" for t in sorted(set(exclude))]]).stdout
    if not listing.strip():
        return b""
    return run_git(Path(git_dir), ["pack-objects", "--stdout", "-q"], input=listing).stdout


def load_pack(pack: bytes, dest: Path, alternates: list[Path]) -> Path:
    """A new private store at ``dest`` holding ``pack``'s objects, falling back on
    ``alternates`` (object directories). Returns ``dest``. Raises: SnapshotError."""
    init_store(dest, alternates)
    if pack:
        run_git(dest, ["index-pack", "--stdin"], input=pack)
    return dest


HOST_METHODS = ("run", "edit", "diagnose", "after_call", "release_container", "remove_files",
                "release")
"""Workspace methods a host runs for the proxy (nothing else is reachable by name)."""


class WorkspaceHost:
    """Every workspace of one trainer rank on one sandbox node (the body of the actor
    :func:`host_class` makes; module docstring). Each workspace error comes back as data,
    ``("raise", exception)``, never as an actor failure: only a lost node is one."""

    def __init__(self, run_id: str, podman_url: str, registry: str | None) -> None:
        import ray

        self.run_id, self.podman_url, self.registry = run_id, podman_url, registry
        self.workroot = tempfile.mkdtemp(prefix="ecredit-rollouts-")
        mark_owner(self.workroot)  # `python -m sandbox gc` keeps it while we live
        self.lock = threading.Lock()
        self.bases: dict = {}
        self.spaces: dict = {}
        self.node = ray.get_runtime_context().get_node_id()

    def _failed_setup(self, exc: BaseException) -> tuple[str, dict]:
        return "ok", {"node": self.node, "base_tree": "", "usage_at_reset": 0, "workdir": None,
                      "has_session": False, "image_pull": None,
                      "setup_error": f"node {self.node[:12]}: {type(exc).__name__}: {exc}"}

    def open(self, ws_id: str, fields: dict, site_fields: dict) -> tuple[str, object]:
        """Set up a workspace (the task image made present first, a pull counted):
        ``("ok", info)`` or ``("raise", exception)`` for a broken task."""
        task = TaskView(fields)
        try:
            rt = node_runtime(self.run_id, self.podman_url)
            pulled = ensure_image(rt, task.image, self.registry) if task.image else None
        except Exception as exc:  # noqa: BLE001 - no Podman / no image here: infrastructure
            return self._failed_setup(exc)
        site = WorkspaceSite(runtime=rt, workroot=self.workroot, lock=self.lock,
                             image_bases=self.bases, **site_fields)
        make = RolloutWorkspace.for_repo_dir if task.repo_dir else RolloutWorkspace.for_image
        try:
            ws = make(task, site)
        except Exception as exc:  # noqa: BLE001 - re-raised on the trainer
            return "raise", portable(exc)
        self.spaces[ws_id] = ws
        return "ok", {"node": self.node, "base_tree": ws.base_tree,
                      "usage_at_reset": ws.usage_at_reset,
                      "workdir": str(ws.workdir) if ws.workdir else None,
                      "has_session": ws.has_session, "setup_error": ws.setup_error,
                      "image_pull": pulled}

    def call(self, ws_id: str, method: str, args: tuple, kwargs: dict):
        """``getattr(workspace, method)(*args, **kwargs)`` for a method of
        :data:`HOST_METHODS`: ``("ok", result)`` or ``("raise", exception)``."""
        ws = self.spaces.get(ws_id)
        if ws is None or method not in HOST_METHODS:
            return "raise", KeyError(f"no workspace {ws_id!r} / method {method!r} on node "
                                     f"{self.node[:12]}")
        try:
            out = getattr(ws, method)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the proxy re-raises it
            return "raise", portable(exc)
        if method == "release":
            self.spaces.pop(ws_id, None)
        return "ok", out

    def export(self, ws_id: str, trees: list[str], exclude: list[str]):
        """``("ok", pack bytes)`` of ``trees`` minus ``exclude`` (:func:`snapshot_pack`),
        or ``("raise", exception)``."""
        ws = self.spaces.get(ws_id)
        try:
            if ws is None or ws.snapshot_repo is None:
                raise KeyError(f"workspace {ws_id!r} has no snapshot store on node "
                               f"{self.node[:12]}")
            return "ok", snapshot_pack(ws.snapshot_repo, trees, exclude)
        except Exception as exc:  # noqa: BLE001 - the proxy re-raises it
            return "raise", portable(exc)

    def count(self) -> int:
        """Workspaces open here now."""
        return len(self.spaces)

    def close(self) -> int:
        """Release every workspace left here and remove the working root; how many there
        were."""
        spaces, self.spaces = dict(self.spaces), {}
        for ws in spaces.values():
            try:
                ws.release()
            except Exception:  # noqa: BLE001 - best effort: the run's gc takes the rest
                pass
        shutil.rmtree(self.workroot, ignore_errors=True)
        return len(spaces)


def portable(exc: Exception) -> Exception:
    """``exc`` when it survives pickling, else a RuntimeError carrying its type and text (an
    API error holding a live response object must still reach the trainer as data, or Ray
    would report a serialisation failure that reads as a lost node)."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any pickling failure
        return RuntimeError(f"{type(exc).__name__}: {exc}")


_HOST = None
_HOST_LOCK = threading.Lock()


def host_class():
    """:class:`WorkspaceHost` as a Ray actor class: ``num_cpus=0`` (its containers do the
    work under their own limits), threaded (``max_concurrency=256``: calls of different
    rollouts overlap; one rollout's calls come one at a time), never restarted (a restarted
    host would have lost its workspaces: the rollouts are lost either way). Made on first
    use, so ``sandbox`` imports without Ray."""
    global _HOST
    with _HOST_LOCK:
        if _HOST is None:
            _HOST = _import_ray().remote(num_cpus=0, max_restarts=0,
                                         max_concurrency=256)(WorkspaceHost)
        return _HOST
