"""The agent environment: SWE-agent tools over one rollout's sandbox, for TRL.

:class:`SWEAgentEnv` is an ``environment_factory`` class for TRL 1.16's
``GRPOTrainer``: TRL calls ``reset(**row)`` at the start of each rollout and
exposes every public method as a tool (schema from signature + docstring).
Tools: ``bash``, the ``str_replace_editor`` commands (``view``, ``create``,
``str_replace``, ``insert``) and ``submit``.

The sandbox side of a rollout (tree, container, snapshots, disk budget, release) is one
object, :class:`sandbox.workspace.rollout.RolloutWorkspace`, made by :meth:`AgentContext.open_workspace`
on this host or, with the ``ray`` backend, on a sandbox node of the cluster
(:mod:`sandbox.cluster.workspace_host`); this module keeps the tool surface over it and the record of
every call. Each rollout gets its own working tree (``sandbox.workspace.agent_repo.agent_clone``: one
root commit holding the base tree, objects in a per-task base store) and, with
the Podman runtime, its own container with that tree mounted at ``/testbed`` and
the base store's objects mounted read-only at the (container) path the clone's
alternates name, so git works inside (status, diff, stash, checkout) and the agent can
neither see history beyond the base nor write what other rollouts share. After every tool call
the tree is snapshotted through a private git directory outside the agent's mount
(``sandbox.snapshots.snapshot``): nothing the agent writes in its ``.git`` reaches host-side
git. The trainer groups those snapshots into turns with the assistant messages of
the completion (one turn = one assistant message); trees live in
:attr:`SWEAgentEnv.snapshot_repo`.

Every tool call is recorded and followed by a snapshot, whatever it raised:
an editor error is the policy's (``status="error"``); anything else
(the runtime could not start the exec, an API error, a snapshot error) ends the
episode (:attr:`SWEAgentEnv.failure`); who caused it is :attr:`SWEAgentEnv.failure_class`
(:mod:`ecredit_trl.agent.failures`): the infrastructure (None: the trainer excludes the
rollout with its reason) or the policy (``agent_pids`` / ``agent_oom``: its own processes
filled its container's limits; ``agent_disk_budget``: growth past ``tree_budget_bytes`` or a
file over ``max_file_bytes``, the rollout's files removed), scored with the failure value
(:mod:`eval.integrity.agent`). The container is released as soon
as the episode ends (submit, failure, or :func:`release_sandbox` from the trainer).

Image-held tasks (no ``repo_dir``): the tree is the image's ``workdir`` with
everything in it, copy-on-write per rollout (:mod:`sandbox.workspace.imagetree`), in a container of the
task image running ``bash -lc``; S_0 is the tree at reset, so the artifact applies in a fresh
container of the image as the SWE-bench harness applies a prediction.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ecredit_trl.agent import editor
from ecredit_trl.agent.failures import FAILURE_REASONS, EpisodeFailures  # noqa: F401 - re-exported
from sandbox.runtimes.tempdirs import mark_owner
from sandbox.snapshots.snapshot import DEFAULT_SNAPSHOT_IGNORE
from sandbox.workspace.rollout import DEFAULT_TREE_BUDGET_BYTES, WorkspaceSite
from sandbox.workspace.session import DEFAULT_MAX_FILE_BYTES

TOOL_NAMES = ("bash", "view", "create", "str_replace", "insert", "submit")

CALL_STATUSES = ("ok", "error", "infra", "after_submit", "ended")
"""ToolCall.status: ran; refused by the editor/tool (the policy's error); failed in the
sandbox (infra); refused because the patch was submitted; refused because the episode
had ended on a failure or the disk budget."""



@dataclass
class ToolCall:
    """One tool call that reached the environment: name, arguments, whether it was valid
    (``ok``), seconds, the tree after it, the turn that made it, its error text, its
    ``status`` (one of :data:`CALL_STATUSES`) and the generated files (not recorded,
    see ``sandbox.snapshots.snapshot``) that appeared."""

    name: str
    arguments: dict
    ok: bool
    seconds: float
    tree: str
    turn: int
    error: str | None = None
    status: str = "ok"
    generated: list[str] = field(default_factory=list)
    submits: bool = False  # this call ended the episode as a submission (a scaffold's stop signal)


@dataclass
class AgentContext:
    """What every environment of a run shares.

    Attributes:
        tasks: instance_id → task (``eval.tasks.schema.Task``-like: ``repo_dir``,
            ``base_commit``, ``image``, ``workdir``).
        runtime: a sandbox runtime (Podman or local) for agent sessions.
        bash_timeout_s: wall-clock limit of one ``bash`` call (seconds).
        max_output_chars: tool output is truncated to this many characters.
        workroot: where rollout working trees are made (default: a fresh
            ``ecredit-rollouts-*`` temp directory marked with this process as owner,
            removed by :meth:`close`).
        turn: the assistant generation now running (1-based), advanced by the
            trainer before each generation; tool calls record it as their turn.
        max_file_bytes: per-file size limit in agent containers (``fsize`` ulimit) and
            in snapshots (bytes).
        tree_budget_bytes: growth of one rollout's tree + snapshot store over its size
            at reset (bytes) before the episode ends with ``disk_budget``.

        snapshot_ignore: generated-file patterns never recorded in snapshots
            (``ECreditConfig.snapshot_ignore``; not agent-writable).
        limits: memory / pids / CPU limits of each agent container
            (:class:`sandbox.trials.trial.Limits`; None: its defaults).
        scaffold: the scaffold adapter whose actions a
            :class:`~ecredit_trl.agent.scaffolds.base.ScaffoldEnv` runs
            (:mod:`ecredit_trl.agent.scaffolds`; None: the built-in tools only).

    Raises: ValueError naming the field for a non-positive limit.
    """

    tasks: dict
    runtime: object | None = None
    bash_timeout_s: float = 30.0
    max_output_chars: int = 2000
    workroot: str | None = None
    turn: int = 0
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    tree_budget_bytes: int = DEFAULT_TREE_BUDGET_BYTES
    snapshot_ignore: tuple[str, ...] = DEFAULT_SNAPSHOT_IGNORE
    limits: object | None = None
    scaffold: object | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _owns_workroot: bool = False
    _image_bases: dict = field(default_factory=dict)  # (image, workdir) -> BaseCache, + locks

    def __post_init__(self) -> None:
        for name in ("max_file_bytes", "tree_budget_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name}: expected an int > 0 (bytes), got {v!r}")
        if self.workroot is None:
            self.workroot = tempfile.mkdtemp(prefix="ecredit-rollouts-")
            mark_owner(self.workroot)
            self._owns_workroot = True
        Path(self.workroot).mkdir(parents=True, exist_ok=True)

    def site(self) -> WorkspaceSite:
        """This context's :class:`sandbox.workspace.rollout.WorkspaceSite` (its runtime, limits and
        working root; the per-task bases shared through ``_lock`` / ``_image_bases``)."""
        return WorkspaceSite(runtime=self.runtime, workroot=self.workroot,
                             max_file_bytes=self.max_file_bytes,
                             tree_budget_bytes=self.tree_budget_bytes,
                             snapshot_ignore=tuple(self.snapshot_ignore), limits=self.limits,
                             lock=self._lock, image_bases=self._image_bases)

    def open_workspace(self, task):
        """The workspace of one rollout of ``task``, where the runtime opens it
        (``Runtime.open_workspace``: on a sandbox node of the Ray cluster on the ``ray``
        backend, else here); with no runtime (editor tools only) here
        (:meth:`WorkspaceSite.open_here`). Raises: what those raise."""
        if self.runtime is None:
            return self.site().open_here(task)
        return self.runtime.open_workspace(task, self.site())

    def close(self) -> None:
        """Remove the temp working root this context made (a given ``workroot`` is kept)."""
        if self._owns_workroot and self.workroot:
            shutil.rmtree(self.workroot, ignore_errors=True)


class AgentEnvBase(EpisodeFailures):
    """One rollout's environment without tools (reused across rollouts by TRL's pool;
    ``reset`` starts anew): the workspace (``ws``), the record of every call with a snapshot
    after it (:meth:`_record`) and what the trainer reads afterwards. A scaffold's tool
    surface is a subclass whose public methods are its tools (:class:`SWEAgentEnv`, the
    built-in one; :mod:`ecredit_trl.agent.scaffolds`). No public method here but ``reset``:
    TRL exposes every public function of the class as a tool.
    """

    context: AgentContext | None = None

    def __init__(self, context: AgentContext | None = None) -> None:
        self.ctx = context or type(self).context
        self.task = None
        self.row: dict = {}
        self.ws = None  # sandbox.workspace.rollout.RolloutWorkspace (or its Ray proxy)
        self.base_tree = ""
        self.calls: list[ToolCall] = []
        self.submitted = False
        self.setup_error: str | None = None
        self.failure: tuple[str, str] | None = None  # (reason, detail): episode ended on it
        self.failure_class: str | None = None  # who caused it (ecredit_trl.agent.failures)
        self.failure_evidence: dict | None = None
        self._generated: list[str] = []
        self.started = 0.0

    # -- the workspace's parts, for callers that look (read-only) ----------------
    workdir = property(lambda self: getattr(self.ws, "workdir", None),
                       doc="Host path of the working tree (None before reset / after release).")
    session = property(lambda self: getattr(self.ws, "session", None),
                       doc="The rollout's session (None when released or on a Ray node).")
    snapshotter = property(lambda self: getattr(self.ws, "snapshotter", None),
                           doc="The rollout's Snapshotter (None when released or remote).")
    image_tree = property(lambda self: getattr(self.ws, "image_tree", None),
                          doc="The image-held task's tree (sandbox.workspace.imagetree.ImageTree).")
    usage_at_reset = property(lambda self: getattr(self.ws, "usage_at_reset", 0),
                              doc="Bytes of tree + stores at reset (the budget's zero).")

    # -- lifecycle -------------------------------------------------------------
    def reset(self, **row) -> None:
        """Start a rollout on ``row["instance_id"]``: fresh working tree, sandbox, snapshots
        (:meth:`RolloutWorkspace.for_repo_dir` / :meth:`~RolloutWorkspace.for_image`, on this
        host or, with the ``ray`` backend, on a sandbox node).

        Returns None (the prompt already carries the problem statement).
        Raises: KeyError naming the instance id when the task is unknown; what the
        workspace constructor raises for a broken task (see there).
        """
        self._close()
        self.row = row
        iid = row.get("instance_id")
        if iid not in self.ctx.tasks:
            raise KeyError(f"instance_id: unknown task {iid!r} in the agent context")
        self.task = self.ctx.tasks[iid]
        self.calls = []
        self.submitted = False
        self.setup_error = None
        self.failure = self.failure_class = self.failure_evidence = None
        self.exec_retries = 0  # garbled read-only execs re-run (RolloutWorkspace.run)
        self.started = time.monotonic()
        self.ws = self.ctx.open_workspace(self.task)
        self.base_tree = self.ws.base_tree
        if self.ws.setup_error is not None:  # an infra failure of this rollout, not the policy's
            self.setup_error = self.ws.setup_error
            self.failure = ("sandbox_setup", self.setup_error)
        return None

    def _close_session(self) -> None:
        if self.ws is not None:
            self.ws.release_container()

    def _close(self) -> None:
        """Stop the sandbox and remove the working tree. Private: TRL exposes every
        public method as a tool, so only tools are public here (see :func:`release`)."""
        if self.ws is not None:
            ws, self.ws = self.ws, None
            ws.release()

    def _record(self, name: str, arguments: dict, fn) -> str:
        """Run one tool call, then snapshot and record it, whatever it raised."""
        t0 = time.monotonic()
        turn = max(1, self.ctx.turn)
        if self.failure is not None:  # ended: setup failed, sandbox error, disk budget
            reason, detail = self.failure
            msg = f"The episode has ended ({reason}: {detail}); no more actions are taken."
            self.calls.append(ToolCall(name, arguments, False, 0.0, self._last_tree(), turn,
                                       msg, "ended"))
            return f"ERROR: {msg}"
        if self.submitted and name != "submit":
            msg = "The patch was already submitted; no more actions are taken."
            self.calls.append(ToolCall(name, arguments, False, 0.0, self._last_tree(), turn,
                                       msg, "after_submit"))
            return f"ERROR: {msg}"
        ok, error, status = True, None, "ok"
        try:
            out = fn()
        except editor.EditorError as exc:
            ok, error, status, out = False, str(exc), "error", f"ERROR: {exc}"
        except Exception as exc:  # noqa: BLE001 - the sandbox failed, not the policy
            error = f"{type(exc).__name__}: {exc}"
            ok, status = False, "infra"
            out = f"ERROR: the sandbox failed ({error}); the episode has ended."
            self._exec_failed(error, exc)  # who caused it: ecredit_trl.agent.failures
        self._generated = []
        tree = self._snapshot_after()
        generated = list(self._generated)
        self.calls.append(ToolCall(name, arguments, ok, time.monotonic() - t0, tree, turn,
                                   error, status, generated))
        if self.failure is not None and status == "ok":
            out = f"{out}\nERROR: the episode has ended ({self.failure[0]}: {self.failure[1]})."
        return out

    def _edit(self, fn, *args):
        """An editor operation where the tree is (:meth:`RolloutWorkspace.edit`)."""
        if self.ws is None or self.ws.workdir is None:
            raise editor.EditorError(f"The working tree is not available: {self.setup_error}")
        return self.ws.edit(fn, *args)

    # -- what the trainer reads after the rollout (properties: not tools) -------
    @property
    def trees(self) -> list[str]:
        """Tree after each tool call, in call order (S after call i)."""
        return [c.tree for c in self.calls]

    @property
    def snapshot_repo(self) -> Path | None:
        """The private git directory holding every snapshot tree of this rollout (the
        ``repo`` of ``sandbox.snapshots.snapshot`` / ``credit.blocks`` / ``plan_query``); None
        before ``reset`` and after release. With the ``ray`` backend a local copy of the
        node's store (:meth:`sandbox.cluster.workspace_proxy.RemoteWorkspace.snapshot_repo`)."""
        return self.ws.snapshot_repo if self.ws is not None else None

    @property
    def final_tree(self) -> str:
        """S_K: the tree after the last call (the base tree when no call ran)."""
        return self.calls[-1].tree if self.calls else self.base_tree

    @property
    def valid_calls(self) -> int:
        """Number of tool calls the environment accepted."""
        return sum(1 for c in self.calls if c.ok)


class SWEAgentEnv(AgentEnvBase):
    """The built-in tool surface (the ``ecredit`` scaffold): ``bash`` and the editor
    commands (``view``, ``create``, ``str_replace``, ``insert``) and ``submit``.

    Construct through :func:`env_factory`, which binds the shared :class:`AgentContext`.
    """

    # -- tools (public methods are exposed to the model by TRL) ---------------
    def bash(self, command: str) -> str:
        """Run a bash command in the repository's sandbox and return its output.

        Args:
            command: the bash command to run in /testbed.
        """
        def run():
            if not isinstance(command, str) or not command.strip():
                raise editor.EditorError("The command parameter is required.")
            if self.ws is None or not self.ws.has_session:
                raise editor.EditorError(f"The sandbox is not available: {self.setup_error}")
            return self.ws.run(command, timeout_s=self.ctx.bash_timeout_s,
                               max_output_chars=self.ctx.max_output_chars)
        return self._record("bash", {"command": command}, run)

    def view(self, path: str, line: int = 0) -> str:
        """Show a file with line numbers, or list a directory.

        Args:
            path: file or directory path in the repository.
            line: when positive, show only the lines around this line number.
        """
        return self._record("view", {"path": path, "line": line},
                            lambda: self._edit(editor.view, path, int(line or 0)))

    def create(self, path: str, file_text: str) -> str:
        """Create a new file.

        Args:
            path: path of the new file.
            file_text: the content of the new file.
        """
        return self._record("create", {"path": path},
                            lambda: self._edit(editor.create, path, file_text))

    def str_replace(self, path: str, old_str: str, new_str: str) -> str:
        """Replace the unique occurrence of old_str in a file by new_str.

        Args:
            path: file path in the repository.
            old_str: the exact text to replace; it must occur exactly once.
            new_str: the replacement text.
        """
        return self._record("str_replace", {"path": path},
                            lambda: self._edit(editor.str_replace, path, old_str, new_str))

    def insert(self, path: str, insert_line: int, new_str: str) -> str:
        """Insert text after a line of a file.

        Args:
            path: file path in the repository.
            insert_line: the line number after which the text is inserted (0 for the top).
            new_str: the text to insert.
        """
        return self._record("insert", {"path": path, "insert_line": insert_line},
                            lambda: self._edit(editor.insert, path, int(insert_line), new_str))

    def submit(self) -> str:
        """Submit the current state of the repository as the final patch."""
        def run():
            self.submitted = True
            return "Submitted. The repository's current state is the final patch."
        out = self._record("submit", {}, run)
        self._close_session()  # the episode is over: release the container now
        return out


def release(env: AgentEnvBase) -> None:
    """Stop ``env``'s sandbox and remove its working tree (once its records are written)."""
    env._close()


def release_sandbox(env: AgentEnvBase) -> None:
    """Release ``env``'s container now (its episode has ended); the working tree stays for
    the records. Idempotent; never raises."""
    try:
        env._close_session()
    except Exception:  # noqa: BLE001 - close() swallows its own errors; be sure
        pass


def env_factory(context: AgentContext, env_class: type | None = None):
    """A zero-argument factory for TRL's ``environment_factory`` bound to ``context``:
    instances of ``env_class`` (a scaffold's tool surface; default :class:`SWEAgentEnv`)."""
    cls = env_class or SWEAgentEnv

    def make() -> AgentEnvBase:
        return cls(context)
    return make


def env_for(scaffold, context: AgentContext) -> AgentEnvBase:
    """A fresh environment of ``scaffold``'s tool surface (``scaffold.env_class``; None:
    :class:`SWEAgentEnv`) bound to ``context``."""
    cls = getattr(scaffold, "env_class", None) or SWEAgentEnv
    return cls(context)


def _clone_at(repo_dir: str, commit: str, dest: Path) -> None:
    """Shared, fast clone of ``repo_dir`` checked out at ``commit`` into ``dest`` (host-side
    reading only; agent sessions use ``sandbox.workspace.agent_repo.agent_clone``)."""
    env_cmd = ["git", "-c", "advice.detachedHead=false"]
    subprocess.run([*env_cmd, "clone", "-q", "--shared", "--no-checkout", str(repo_dir),
                    str(dest)], check=True, capture_output=True)
    subprocess.run([*env_cmd, "-C", str(dest), "checkout", "-q", commit], check=True,
                   capture_output=True)


def tool_schemas() -> list[dict]:
    """JSON schemas of the agent's tools, as TRL renders them in the chat template."""
    from transformers.utils import get_json_schema

    env = SWEAgentEnv(AgentContext(tasks={}, workroot=tempfile.gettempdir()))
    return [get_json_schema(getattr(env, name)) for name in TOOL_NAMES]


def tool_schemas_json() -> str:
    return json.dumps(tool_schemas())
