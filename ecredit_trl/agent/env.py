"""The agent environment: SWE-agent tools over one rollout's sandbox, for TRL.

:class:`SWEAgentEnv` is an ``environment_factory`` class for TRL 1.16's
``GRPOTrainer``: TRL calls ``reset(**row)`` at the start of each rollout and
exposes every public method as a tool (schema from signature + docstring).
Tools: ``bash``, the ``str_replace_editor`` commands (``view``, ``create``,
``str_replace``, ``insert``) and ``submit``.

Each rollout gets its own working tree (``sandbox.agent_repo.agent_clone``: one
root commit holding the base tree, objects in a per-task base store) and, with
the Podman runtime, its own container with that tree mounted at ``/testbed`` and
the base store's objects mounted read-only at the (container) path the clone's
alternates name, so git works inside (status, diff, stash, checkout) and the agent can
neither see history beyond the base nor write what other rollouts share. After every tool call
the tree is snapshotted through a private git directory outside the agent's mount
(``sandbox.snapshot``): nothing the agent writes in its ``.git`` reaches host-side
git. The trainer groups those snapshots into turns with the assistant messages of
the completion (one turn = one assistant message); trees live in
:attr:`SWEAgentEnv.snapshot_repo`.
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
from sandbox.agent_repo import agent_clone
from sandbox.local_runtime import LocalRuntime
from sandbox.session import open_session
from sandbox.snapshot import DEFAULT_SNAPSHOT_IGNORE, Snapshotter

TOOL_NAMES = ("bash", "view", "create", "str_replace", "insert", "submit")


@dataclass
class ToolCall:
    """One executed tool call: name, arguments, whether it was valid, seconds, tree after,
    and the generated files (not recorded, see ``sandbox.snapshot``) that appeared."""

    name: str
    arguments: dict
    ok: bool
    seconds: float
    tree: str
    turn: int
    error: str | None = None
    generated: list[str] = field(default_factory=list)


@dataclass
class AgentContext:
    """What every environment of a run shares.

    Attributes:
        tasks: instance_id → task (``eval.tasks.Task``-like: ``repo_dir``,
            ``base_commit``, ``image``, ``workdir``).
        runtime: a sandbox runtime (Podman or local) for agent sessions.
        bash_timeout_s: wall-clock limit of one ``bash`` call (seconds).
        max_output_chars: tool output is truncated to this many characters.
        workroot: where rollout working trees are made (temporary by default).
        turn: the assistant generation now running (1-based), advanced by the
            trainer before each generation; tool calls record it as their turn.
        snapshot_ignore: generated-file patterns never recorded in snapshots
            (``ECreditConfig.snapshot_ignore``; not agent-writable).
    """

    tasks: dict
    runtime: object | None = None
    bash_timeout_s: float = 30.0
    max_output_chars: int = 2000
    workroot: str | None = None
    turn: int = 0
    snapshot_ignore: tuple[str, ...] = DEFAULT_SNAPSHOT_IGNORE
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.workroot is None:
            self.workroot = tempfile.mkdtemp(prefix="ecredit-rollouts-")
        Path(self.workroot).mkdir(parents=True, exist_ok=True)


class SWEAgentEnv:
    """One rollout's environment (reused across rollouts by TRL's pool; ``reset`` starts anew).

    Construct through :func:`env_factory`, which binds the shared :class:`AgentContext`.
    """

    context: AgentContext | None = None

    def __init__(self, context: AgentContext | None = None) -> None:
        self.ctx = context or type(self).context
        self.task = None
        self.row: dict = {}
        self.workdir: Path | None = None
        self.session = None
        self.snapshotter: Snapshotter | None = None
        self.calls: list[ToolCall] = []
        self.submitted = False
        self.setup_error: str | None = None
        self.started = 0.0

    # -- lifecycle -------------------------------------------------------------
    def reset(self, **row) -> None:
        """Start a rollout on ``row["instance_id"]``: fresh working tree, sandbox, snapshots.

        Returns None (the prompt already carries the problem statement).
        Raises: KeyError naming the instance id when the task is unknown.
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
        self.started = time.monotonic()
        if not getattr(self.task, "repo_dir", None):
            raise ValueError(f"repo_dir: task {iid} has no local repository; agent sessions "
                             "need one (SWE-bench image tasks: extract /testbed first)")
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{iid}-", dir=self.ctx.workroot))
        with self.ctx._lock:  # one base store per task, made by the first rollout
            on_host = self.ctx.runtime is None or isinstance(self.ctx.runtime, LocalRuntime)
            object_dirs = agent_clone(self.task.repo_dir, self.task.base_commit, self.workdir,
                                      Path(self.ctx.workroot) / ".bases",
                                      **({"alternates": None} if on_host else {}))
        # before the agent runs: the private store borrows the donor's objects, never the clone's
        self.snapshotter = Snapshotter(self.workdir, base=self.task.base_commit,
                                       objects_from=self.task.repo_dir,
                                       ignore=self.ctx.snapshot_ignore)
        self.base_tree = self.snapshotter.base_tree
        if self.ctx.runtime is not None:
            try:
                self.session = open_session(self.ctx.runtime, self.task.image, self.workdir,
                                            workdir=getattr(self.task, "workdir", "/testbed"),
                                            labels={"ecredit.task": iid},
                                            ro_mounts=object_dirs)
            except Exception as exc:  # counted by the trainer as an infra error
                self.session = None
                self.setup_error = f"{type(exc).__name__}: {exc}"
        return None

    def _close(self) -> None:
        """Stop the sandbox and remove the working tree. Private: TRL exposes every
        public method as a tool, so only tools are public here (see :func:`release`)."""
        if self.session is not None:
            self.session.close()
            self.session = None
        if self.snapshotter is not None:
            self.snapshotter.close()
            self.snapshotter = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def _record(self, name: str, arguments: dict, fn) -> str:
        t0 = time.monotonic()
        ok, error = True, None
        try:
            if self.submitted and name != "submit":
                raise editor.EditorError("The patch was already submitted; no more actions are taken.")
            out = fn()
        except editor.EditorError as exc:
            ok, error, out = False, str(exc), f"ERROR: {exc}"
        tree = self.snapshotter.snapshot() if self.snapshotter else ""
        generated = list(self.snapshotter.generated_new) if self.snapshotter else []
        self.calls.append(ToolCall(name, arguments, ok, time.monotonic() - t0, tree,
                                   max(1, self.ctx.turn), error, generated))
        return out

    # -- tools (public methods are exposed to the model by TRL) ---------------
    def bash(self, command: str) -> str:
        """Run a bash command in the repository's sandbox and return its output.

        Args:
            command: the bash command to run in /testbed.
        """
        def run():
            if not isinstance(command, str) or not command.strip():
                raise editor.EditorError("The command parameter is required.")
            if self.session is None:
                raise editor.EditorError(f"The sandbox is not available: {self.setup_error}")
            return self.session.run(command, timeout_s=self.ctx.bash_timeout_s,
                                    max_output_chars=self.ctx.max_output_chars)
        return self._record("bash", {"command": command}, run)

    def view(self, path: str, line: int = 0) -> str:
        """Show a file with line numbers, or list a directory.

        Args:
            path: file or directory path in the repository.
            line: when positive, show only the lines around this line number.
        """
        return self._record("view", {"path": path, "line": line},
                            lambda: editor.view(self.workdir, path, int(line or 0)))

    def create(self, path: str, file_text: str) -> str:
        """Create a new file.

        Args:
            path: path of the new file.
            file_text: the content of the new file.
        """
        return self._record("create", {"path": path},
                            lambda: editor.create(self.workdir, path, file_text))

    def str_replace(self, path: str, old_str: str, new_str: str) -> str:
        """Replace the unique occurrence of old_str in a file by new_str.

        Args:
            path: file path in the repository.
            old_str: the exact text to replace; it must occur exactly once.
            new_str: the replacement text.
        """
        return self._record("str_replace", {"path": path},
                            lambda: editor.str_replace(self.workdir, path, old_str, new_str))

    def insert(self, path: str, insert_line: int, new_str: str) -> str:
        """Insert text after a line of a file.

        Args:
            path: file path in the repository.
            insert_line: the line number after which the text is inserted (0 for the top).
            new_str: the text to insert.
        """
        return self._record("insert", {"path": path, "insert_line": insert_line},
                            lambda: editor.insert(self.workdir, path, int(insert_line), new_str))

    def submit(self) -> str:
        """Submit the current state of the repository as the final patch."""
        def run():
            self.submitted = True
            return "Submitted. The repository's current state is the final patch."
        return self._record("submit", {}, run)

    # -- what the trainer reads after the rollout (properties: not tools) -------
    @property
    def trees(self) -> list[str]:
        """Tree after each tool call, in call order (S after call i)."""
        return [c.tree for c in self.calls]

    @property
    def snapshot_repo(self) -> Path | None:
        """The private git directory holding every snapshot tree of this rollout (the
        ``repo`` of ``sandbox.snapshot`` / ``credit.blocks`` / ``plan_query``); None
        before ``reset`` and after release."""
        return self.snapshotter.git_dir if self.snapshotter else None

    @property
    def final_tree(self) -> str:
        """S_K: the tree after the last call (the base tree when no call ran)."""
        return self.calls[-1].tree if self.calls else self.base_tree

    @property
    def valid_calls(self) -> int:
        """Number of tool calls the environment accepted."""
        return sum(1 for c in self.calls if c.ok)


def release(env: SWEAgentEnv) -> None:
    """Stop ``env``'s sandbox and remove its working tree."""
    env._close()


def env_factory(context: AgentContext):
    """A zero-argument factory for TRL's ``environment_factory`` bound to ``context``."""
    def make() -> SWEAgentEnv:
        return SWEAgentEnv(context)
    return make


def _clone_at(repo_dir: str, commit: str, dest: Path) -> None:
    """Shared, fast clone of ``repo_dir`` checked out at ``commit`` into ``dest`` (host-side
    reading only; agent sessions use ``sandbox.agent_repo.agent_clone``)."""
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
