"""What a scaffold provides to the rollout machinery (design page, "Generation engines and scaffolds").

A scaffold is a tool surface and a prompt inside the same rollout machinery: TRL's tool
loop (``environment_factory``) in training, :mod:`ecredit_trl.agent.episode` in evaluation,
the same per-rollout workspace with a git snapshot after every action. So edit blocks,
eligibility, verifier-blind selection, restore and D are unchanged whatever the scaffold.

An adapter (:class:`Scaffold`) gives:

* **templates**: :meth:`Scaffold.prompt` (the conversation a rollout starts from) and
  :meth:`Scaffold.observation` (how one action's result is shown to the policy);
* **parse**: :meth:`Scaffold.parse` (one tool call's arguments → the action, or
  :class:`FormatError`: a malformed action, counted as a format error);
* **step**: :meth:`Scaffold.step` (run the action in the rollout's workspace);
* **stop**: :meth:`Scaffold.is_stop` (whether the result ends the episode as a submission);
* **config**: :attr:`Scaffold.config`, hashed into :attr:`Scaffold.config_hash`, named in
  the run records;
* **env_class**: an :class:`~ecredit_trl.agent.env.AgentEnvBase` subclass whose public
  methods are the scaffold's tools (TRL builds the tool schemas from their signatures and
  docstrings).

History is append-only (the tool loop only appends the rendered tool results), so the
tokens the policy generated stay a prefix of every later prompt; a scaffold rule that would
rewrite history (dropping a malformed turn, truncating old observations) is replaced by the
stated rule of its adapter, never applied by re-tokenising.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from ecredit_trl.agent import editor
from ecredit_trl.agent.env import AgentEnvBase

__all__ = ["FormatError", "Scaffold", "ScaffoldEnv", "config_hash"]


class FormatError(ValueError):
    """A malformed action (missing or empty argument): the policy's error, shown to it as
    the tool result and counted as a format error (``ToolCall.status == "error"``)."""


def config_hash(config: dict) -> str:
    """sha256 hex of ``config`` as canonical JSON (sorted keys): the scaffold config's
    identity in the run records."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class Scaffold:
    """One scaffold's adapter (module docstring). Subclasses override the methods.

    Attributes:
        name: the ``--scaffold`` value.
        config: the scaffold's configuration as loaded (templates, limits, environment).
        source: where ``config`` came from (a file path, a package path, ``"built-in"``).
        env_class: the tool surface (an ``AgentEnvBase`` subclass).
    """

    name: str
    config: dict = field(default_factory=dict)
    source: str = "built-in"
    env_class: type | None = None

    @property
    def config_hash(self) -> str:
        """:func:`config_hash` of :attr:`config`."""
        return config_hash(self.config)

    def record(self) -> dict:
        """What the run records say about the scaffold: ``{"name", "config_hash",
        "config_source"}``."""
        return {"name": self.name, "config_hash": self.config_hash, "config_source": self.source}

    def prompt(self, task) -> list[dict]:
        """The conversation a rollout of ``task`` starts from (chat messages).
        Raises: ValueError naming the task when it has no problem statement."""
        raise NotImplementedError

    def tools(self) -> list[dict]:
        """The tool schemas in the order TRL renders them (sorted by name: TRL lists an
        environment's methods with ``inspect.getmembers``)."""
        from transformers.utils import get_json_schema  # start-up cost: transformers

        cls = self.env_class
        names = sorted(n for n, v in vars(cls).items()
                       if callable(v) and not n.startswith("_") and n != "reset")
        return [get_json_schema(getattr(cls, n)) for n in names]

    def parse(self, name: str, arguments: dict):
        """The action of one tool call. Raises: FormatError for a malformed one."""
        raise NotImplementedError

    def step(self, ws, action, *, timeout_s: float, max_output_chars: int) -> dict:
        """Run ``action`` in the workspace ``ws``; returns the scaffold's output record."""
        raise NotImplementedError

    def observation(self, output: dict) -> str:
        """The tool result text the policy sees for ``output``."""
        raise NotImplementedError

    def is_stop(self, output: dict) -> bool:
        """Whether ``output`` ends the episode as a submission."""
        return False


class ScaffoldEnv(AgentEnvBase):
    """An environment whose tools are a scaffold adapter's actions: each tool method calls
    :meth:`_act`, which parses, steps, renders and stops through ``ctx.scaffold`` inside
    :meth:`AgentEnvBase._record` (so every action is recorded and followed by a snapshot,
    whatever it raised; a sandbox failure ends the episode as with the built-in tools)."""

    def _act(self, name: str, arguments: dict) -> str:
        sc = self.ctx.scaffold
        stopped = []

        def run() -> str:
            try:
                action = sc.parse(name, arguments)
            except FormatError as exc:  # the policy's malformed action
                raise editor.EditorError(str(exc)) from None
            if self.ws is None or not self.ws.has_session:
                raise editor.EditorError(f"The sandbox is not available: {self.setup_error}")
            output = sc.step(self.ws, action, timeout_s=self.ctx.bash_timeout_s,
                             max_output_chars=self.ctx.max_output_chars)
            if sc.is_stop(output):
                stopped.append(True)
            return sc.observation(output)

        out = self._record(name, dict(arguments), run)
        if stopped and self.calls and self.calls[-1].status == "ok":
            self.submitted = True
            self.calls[-1].submits = True
            self._close_session()  # the episode is over: release the container now
        return out
