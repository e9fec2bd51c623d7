"""The trainer side of agent sandboxes on Ray: :class:`RayWorkspaces` opens a
rollout's workspace on a sandbox node, :class:`RemoteWorkspace` is its proxy with the
interface of :class:`sandbox.workspace.rollout.RolloutWorkspace`. The design (one host actor per
node, the cap, placement, what crosses, a lost node) is in :mod:`sandbox.cluster.workspace_host`.
"""

from __future__ import annotations

import pickle
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

from sandbox.cluster.dispatch import choose_node
from sandbox.cluster.workspace_host import (
    CALL_MARGIN_S,
    OPEN_DEADLINE_S,
    SITE_FIELDS,
    WorkspaceLost,
    host_class,
    load_pack,
    task_fields,
)
from sandbox.images.pull import canonical
from sandbox.snapshots.gitsafe import run_git, trusted_git_dir
from sandbox.workspace.rollout import AfterCall


class RemoteWorkspace:
    """A :class:`~sandbox.workspace.rollout.RolloutWorkspace` on a sandbox node, seen from the
    trainer: the same methods, each one actor call (module docstring).

    Attributes: ``node`` (id, hex), ``base_tree``, ``setup_error``, ``usage_at_reset``,
    ``workdir`` (the tree's path *on the node*), ``image_pull``, ``lost`` (the loss message
    or None), ``stats`` (``calls``, ``sent_bytes``, ``received_bytes`` (pickled payloads),
    ``call_s`` (seconds spent in actor calls), ``pack_bytes``). ``session``,
    ``snapshotter`` and ``image_tree`` are None: they live on the node.
    """

    session = snapshotter = image_tree = None

    def __init__(self, owner: RayWorkspaces, host, ws_id: str, node: str, info: dict,
                 task) -> None:
        self.owner, self.host, self.ws_id, self.node = owner, host, ws_id, node
        self.task = task
        self.base_tree = info["base_tree"]
        self.setup_error = info["setup_error"]
        self.usage_at_reset = info["usage_at_reset"]
        self.workdir = Path(info["workdir"]) if info["workdir"] else None
        self.has_session = bool(info["has_session"])
        self.image_pull = info.get("image_pull")
        self.lost: str | None = None
        self._trees: list[str] = []
        self._repo: Path | None = None
        self._slot = True
        self.stats = {"calls": 0, "sent_bytes": 0, "received_bytes": 0, "call_s": 0.0,
                      "pack_bytes": 0}

    def _lose(self, exc: BaseException) -> WorkspaceLost:
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        self.lost = self.lost or (f"ray: node {self.node[:12]} lost mid-episode "
                                  f"({type(exc).__name__}: {first})")
        self.has_session = False
        self._free_slot()
        return WorkspaceLost(self.lost)

    def _call(self, method: str, *args, deadline_s: float = 600.0, **kwargs):
        """One actor call; re-raises the workspace's own exception; a Ray failure or a
        call past ``deadline_s`` seconds marks the workspace lost. Raises WorkspaceLost."""
        if self.lost is not None:
            raise WorkspaceLost(self.lost)
        if self.host is None:  # setup never reached a node
            raise WorkspaceLost(f"no sandbox node holds this workspace: {self.setup_error}")
        ray = self.owner.ray
        t0 = time.perf_counter()
        try:
            ref = self.host.call.remote(self.ws_id, method, args, kwargs)
            status, out = ray.get(ref, timeout=deadline_s)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            raise self._lose(exc) from exc
        self.stats["calls"] += 1
        self.stats["call_s"] += time.perf_counter() - t0
        self.stats["sent_bytes"] += len(pickle.dumps((self.ws_id, method, args, kwargs)))
        self.stats["received_bytes"] += len(pickle.dumps((status, out)))
        if status == "raise":
            raise out
        return out

    # -- the workspace's interface ----------------------------------------------
    def run(self, command: str, *, timeout_s: float, max_output_chars: int) -> str:
        """:meth:`RolloutWorkspace.run` on the node. Raises: its errors, WorkspaceLost."""
        return self._call("run", command, timeout_s=timeout_s,
                          max_output_chars=max_output_chars,
                          deadline_s=timeout_s + CALL_MARGIN_S)

    def edit(self, fn, *args):
        """:meth:`RolloutWorkspace.edit` on the node (``fn`` travels by reference: the
        node imports it from the same checkout). Raises: ``fn``'s errors, WorkspaceLost."""
        return self._call("edit", fn, *args, deadline_s=CALL_MARGIN_S * 2)

    def diagnose(self) -> dict | None:
        """The node's diagnosis; for a lost node the evidence names it (infrastructure); on a
        node serving with doctor probes not held, ``node_unheld`` names them
        (:mod:`sandbox.doctor.gate`)."""
        if self.lost is not None:
            return {"failure_class": None, "node_lost": self.node, "error": self.lost}
        try:
            ev = self._call("diagnose", deadline_s=CALL_MARGIN_S)
        except WorkspaceLost:
            return {"failure_class": None, "node_lost": self.node, "error": self.lost}
        unheld = self.owner.trials.stats["unheld"].get(self.node)
        return {**ev, "node_unheld": list(unheld)} if ev is not None and unheld else ev

    def after_call(self) -> AfterCall:
        """:meth:`RolloutWorkspace.after_call` on the node; its tree is remembered for the
        pack. Raises: WorkspaceLost."""
        out = self._call("after_call", deadline_s=OPEN_DEADLINE_S)
        if out.tree is not None:
            self._trees.append(out.tree)
        return out

    @property
    def snapshot_repo(self) -> Path | None:
        """A local private store holding every snapshot tree of this rollout, fetched once
        as one pack (module docstring). None after release. Raises: WorkspaceLost,
        SnapshotError."""
        if self._repo is not None or not self.base_tree:
            return self._repo
        if self.lost is not None:
            raise WorkspaceLost(self.lost)
        donor = self.task.repo_dir if getattr(self.task, "repo_dir", None) else None
        alternates = []
        if donor and Path(donor).is_dir():  # the trainer holds S_0's objects itself

            git = trusted_git_dir(Path(donor).resolve())
            rel = run_git(git, ["rev-parse", "--git-path", "objects"]).stdout.decode().strip()
            alternates = [(git / rel).resolve()]
        exclude = [self.base_tree] if alternates else []
        ray = self.owner.ray
        t0 = time.perf_counter()
        try:
            status, pack = ray.get(self.host.export.remote(
                self.ws_id, [self.base_tree, *self._trees], exclude), timeout=OPEN_DEADLINE_S)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            raise self._lose(exc) from exc
        if status == "raise":
            raise pack
        self.stats["pack_bytes"] = len(pack)
        self.stats["pack_s"] = time.perf_counter() - t0
        dest = Path(tempfile.mkdtemp(prefix="ecredit-snap-")) / "git"
        self._repo = load_pack(pack, dest, alternates)
        return self._repo

    def _quiet(self, method: str) -> None:
        """A release step on the node; nothing to do when the workspace never reached a
        host or its node is lost, and never raises (release paths must not)."""
        if self.host is None or self.lost is not None:
            return
        try:
            self._call(method, deadline_s=CALL_MARGIN_S * 2)
        except Exception:  # noqa: BLE001 - WorkspaceLost, or a workspace the host never kept
            pass

    def _free_slot(self) -> None:
        if self._slot:
            self._slot = False
            self.owner.release_slot(self.ws_id)

    def release_container(self) -> None:
        """Stop the container on the node and give the cap's slot back. Never raises for
        a lost node."""
        if self.has_session:
            self._quiet("release_container")
        self.has_session = False
        self._free_slot()

    def remove_files(self) -> None:
        """Remove the tree and snapshots on the node (the container too). Never raises for
        a lost node."""
        self._quiet("remove_files")
        self.has_session = False
        self._free_slot()

    def release(self) -> None:
        """Release everything on the node and the local copy of the snapshots."""
        self._quiet("release")
        self.has_session = False
        self._free_slot()
        self.owner.forget(self)
        if self._repo is not None:
            shutil.rmtree(self._repo.parent, ignore_errors=True)
            self._repo = None
        self.workdir = None


class RayWorkspaces:
    """Opens rollout workspaces on the cluster's sandbox nodes for one trainer rank (module
    docstring), through the rank's :class:`~sandbox.cluster.trials.RayTrials` (its dispatcher,
    cap, node → images index and options).

    Args:
        trials: the rank's RayTrials.
        slot_wait_s: seconds a workspace waits for a slot of the cluster-wide cap before
            its rollout is set up as failed (``setup_error``: infrastructure). The cap must
            hold one generation round's rollouts of every rank, or resets would wait for
            slots that only those very rollouts can free.

    Thread-safe. ``stats``: ``opened``, ``by_node`` (node → workspaces), ``pulls``,
    ``lost`` (workspaces whose node was lost).
    """

    def __init__(self, trials, slot_wait_s: float = 900.0) -> None:
        self.trials = trials
        self.ray = trials.ray
        self.slot_wait_s = slot_wait_s
        self._hosts: dict[str, object] = {}
        self._open: dict[str, RemoteWorkspace] = {}
        self._lock = threading.Lock()
        self.stats = {"opened": 0, "by_node": {}, "pulls": 0, "lost": 0}

    def _host(self, node: str):
        """This rank's host actor on ``node`` (made on first use, hard-pinned there)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        with self._lock:
            host = self._hosts.get(node)
            if host is None:
                opts = self.trials.options
                host = self._hosts[node] = host_class().options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
                ).remote(self.trials.run_id, opts.podman_url, opts.registry)
            return host

    def _place(self, image: str | None, load: dict[str, int]) -> str:
        """The node for a workspace of ``image``: a live holder of the image, least loaded
        (:func:`~sandbox.cluster.dispatch.choose_node`), else the least loaded live node."""
        alive = self.trials.alive_nodes()
        if not alive:
            raise RuntimeError("no live Ray node offers the sandbox resource")
        with self.trials._lock:
            index = dict(self.trials._index)
            self.trials._turn += 1
            turn = self.trials._turn
        node = choose_node(image, alive, index, load, (), turn) if image else None
        return node or min(alive, key=lambda n: (load.get(n, 0), (alive.index(n) - turn)
                                                 % len(alive)))

    def open(self, task, site) -> RemoteWorkspace:
        """A workspace for one rollout of ``task`` with ``site``'s limits, on a sandbox node.

        Waits for a slot of the cluster-wide cap (at most ``slot_wait_s`` s; at once refused
        when this rank's own open sandboxes hold every slot). No slot, no live node, or a
        node lost during setup: a workspace whose
        ``setup_error`` says so (the rollout is infrastructure-excluded). Raises: what the
        workspace constructor raised on the node for a broken task.
        """
        ray, disp = self.ray, self.trials.dispatcher
        ws_id = f"ws-{task.instance_id[:40]}-{uuid.uuid4().hex[:8]}"
        node, info = "", None
        cap = self.trials.options.max_in_flight
        with self._lock:
            held = sum(1 for w in self._open.values() if w._slot)
        if held >= cap:  # this rank alone fills the cap: waiting could only deadlock
            ws = RemoteWorkspace(self, None, ws_id, "", {
                "base_tree": "", "usage_at_reset": 0, "workdir": None, "has_session": False,
                "setup_error": f"ray: sandbox_max_in_flight={cap} is held by this rank's "
                               f"{held} open sandboxes; raise it above the rollouts of a "
                               "round (all ranks) plus the trials"}, task)
            ws._slot = False
            return ws
        try:
            load = ray.get(disp.acquire_within.remote(ws_id, self.slot_wait_s))
        except ray.exceptions.RayError as exc:  # the dispatcher is gone
            load, info = None, {"setup_error": f"ray: dispatcher lost: {type(exc).__name__}"}
        if load is None and info is None:
            info = {"setup_error": f"ray: no sandbox slot within {self.slot_wait_s:.0f} s "
                                   f"(sandbox_max_in_flight too small for the rollouts in "
                                   "flight of every rank?)"}
        if info is None:
            try:
                node = self._place(getattr(task, "image", None), load)
                disp.started.remote(ws_id, node)
                fields = {k: getattr(site, k) for k in SITE_FIELDS}
                fields["snapshot_ignore"] = tuple(fields["snapshot_ignore"])
                status, info = ray.get(self._host(node).open.remote(
                    ws_id, task_fields(task), fields), timeout=OPEN_DEADLINE_S)
            except (ray.exceptions.RayError, TimeoutError, RuntimeError) as exc:
                status, info = "ok", {"setup_error": f"ray: node {node[:12] or '?'} lost "
                                                     f"during setup: {type(exc).__name__}: "
                                                     f"{str(exc).strip()[:300]}"}
            if status == "raise":
                disp.release.remote(ws_id)
                raise info
        info = {"node": node, "base_tree": "", "usage_at_reset": 0, "workdir": None,
                "has_session": False, **info}
        ws = RemoteWorkspace(self, self._hosts.get(node), ws_id, node, info, task)
        self._account(ws, task)
        if ws.setup_error is not None and ws.workdir is None:
            ws._free_slot()
        return ws

    def _account(self, ws: RemoteWorkspace, task) -> None:
        with self._lock:
            self._open[ws.ws_id] = ws
            self.stats["opened"] += 1
            by = self.stats["by_node"]
            by[ws.node] = by.get(ws.node, 0) + 1
            self.stats["pulls"] += ws.image_pull == "pulled"
        if ws.image_pull and ws.node and task.image:  # the node holds it now
            img = canonical(task.image)
            with self.trials._lock:
                known = self.trials._index.setdefault(ws.node, [])
                if img not in known:
                    self.trials._index[ws.node] = sorted({*known, img})
                    self.trials.dispatcher.add_image.remote(ws.node, img)

    def release_slot(self, ws_id: str) -> None:
        """Give ``ws_id``'s slot of the cap back (its container is gone)."""
        try:
            self.trials.dispatcher.release.remote(ws_id)
        except self.ray.exceptions.RayError:
            pass

    def forget(self, ws: RemoteWorkspace) -> None:
        with self._lock:
            if self._open.pop(ws.ws_id, None) is not None and ws.lost:
                self.stats["lost"] += 1

    def close(self) -> None:
        """Release every workspace left open, then end the host actors (their nodes'
        leftovers go with the run's gc, :meth:`RayTrials.close`)."""
        for ws in list(self._open.values()):
            ws.release()
        with self._lock:
            hosts, self._hosts = dict(self._hosts), {}
        for host in hosts.values():
            try:
                self.ray.get(host.close.remote(), timeout=120)
            except (self.ray.exceptions.RayError, TimeoutError):
                pass
            try:
                self.ray.kill(host)
            except self.ray.exceptions.RayError:
                pass
