"""The ``mini-swe-agent`` scaffold: one ``bash`` tool, mini-swe-agent's own templates and
stop signal, in this project's rollout workspace (design page, "Generation engines and scaffolds").

mini-swe-agent 2.x (the scaffold of SWE-bench's bash-only leaderboard) with native tool
calls offers one tool, ``bash(command)``; each command runs in a fresh shell (its config's
``environment.interpreter``, ``bash -lc`` when it names none) at the repository root with
its ``environment.env`` variables; the result is shown through its
``model.observation_template`` (``output.output``, ``output.returncode``,
``output.exception_info``); an episode ends when a command's output starts with
``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` and it exits 0. Templates come from its shipped
SWE-bench config (``minisweagent/config/benchmarks/swebench.yaml``, read from the installed
package or from its wheel, :func:`shipped_config_path`; never copied here), a user's YAML
file of the same shape (``--scaffold_config``), or, for the embedded tiny policy, the compact
config of that shape shipped in this package (:data:`EMBEDDED_CONFIG`; which one a run uses
is decided by :func:`ecredit_trl.agent.scaffolds.default_scaffold_config`).

Stated rules where mini-swe-agent's own loop differs (history stays append-only, so the
policy's tokens stay a prefix of every later prompt):

* **malformed action**: a turn without a parseable tool call ends the episode as TRL's
  tool loop does (mini-swe-agent would drop the turn and append its format-error message:
  a history rewrite), counted as a format error; a ``bash`` call with a missing or empty
  command is refused with the config's ``format_error_template`` as the tool result, a
  format error too; a call to another tool name never reaches the environment (TRL's
  error result), a format error.
* **final patch**: the workspace's tree after the last action (a snapshot after every
  action, as for the built-in tools), not the text after the stop signal.
* **limits**: ``agent.step_limit`` ↔ the run's ``max_turns``; ``agent.cost_limit`` ↔
  ``max_completion_length`` (tokens, not dollars); ``environment.timeout`` ↔
  ``bash_timeout_s``. The run's values govern; the config's are recorded with it.
  The sandbox's ``max_output_chars`` cut applies before the observation template's own.
* **sandbox**: the same container, history boundary, disk budget, file-size limit and
  bash timeout as the built-in tools (``environment.cwd`` is the workspace root).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shlex
import uuid
import zipfile
from pathlib import Path

import yaml

from ecredit_trl.agent.scaffolds.base import FormatError, Scaffold, ScaffoldEnv

__all__ = ["EMBEDDED_CONFIG", "MINI_SWE_AGENT_VERSION", "STOP_SIGNAL", "MiniSweAgentEnv",
           "MiniSweAgentScaffold",
           "load_config", "shipped_config_path"]

MINI_SWE_AGENT_VERSION = "2.4.6"
STOP_SIGNAL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
CONFIG_IN_PACKAGE = "minisweagent/config/benchmarks/swebench.yaml"
#: The compact config of the embedded tiny policy: the shipped config's shape, action and stop
#: signal with short templates (docs/scaffolds.md, "The embedded default"). Chosen only by
#: :func:`ecredit_trl.agent.scaffolds.default_scaffold_config`.
EMBEDDED_CONFIG = str(Path(__file__).resolve().parent / "configs" / "mini_swe_agent_embedded.yaml")
DEFAULT_INTERPRETER = ["bash", "-lc"]
_TIMEOUT_NOTE = re.compile(r"\n<command timed out after ([0-9.]+) s>$")
_EXIT_NOTE = re.compile(r"\n<exit code (-?\d+)>$")


def shipped_config_path() -> str:
    """Where mini-swe-agent's shipped SWE-bench config is: the installed ``minisweagent``
    package (found without importing it), else its wheel
    ``mini_swe_agent-2.4.6-py3-none-any.whl`` in ``$ECREDIT_CACHE/wheels`` (default
    ``~/.cache/ecredit-trl/wheels``; ``pip download --no-deps mini-swe-agent==2.4.6 -d
    ...`` puts it there), as ``WHEEL!member``.

    Raises: FileNotFoundError (one line saying how to get it).
    """
    spec = importlib.util.find_spec("minisweagent")
    if spec is not None and spec.origin:
        path = Path(spec.origin).parent.parent / CONFIG_IN_PACKAGE
        if path.is_file():
            return str(path)
    root = Path(os.environ.get("ECREDIT_CACHE") or Path.home() / ".cache" / "ecredit-trl")
    for wheel in sorted((root / "wheels").glob(f"mini_swe_agent-{MINI_SWE_AGENT_VERSION}-*.whl")):
        with zipfile.ZipFile(wheel) as z:
            if CONFIG_IN_PACKAGE in z.namelist():
                return f"{wheel}!{CONFIG_IN_PACKAGE}"
    raise FileNotFoundError(
        "scaffold_config: mini-swe-agent's SWE-bench config was not found (install "
        f"mini-swe-agent=={MINI_SWE_AGENT_VERSION}, or `pip download --no-deps "
        f"mini-swe-agent=={MINI_SWE_AGENT_VERSION} -d {root / 'wheels'}`, or give "
        "--scaffold_config FILE)")


def _read(source: str) -> str:
    if "!" in source and source.split("!", 1)[0].endswith(".whl"):
        wheel, member = source.split("!", 1)
        with zipfile.ZipFile(wheel) as z:
            return z.read(member).decode("utf-8")
    return Path(source).read_text(encoding="utf-8")


def load_config(path: str | None = None) -> tuple[dict, str]:
    """``(config, source)``: the YAML at ``path`` or the shipped SWE-bench config.

    The config needs ``agent.system_template``, ``agent.instance_template`` and
    ``model.observation_template`` (strings); ``environment.interpreter`` (a list of
    strings) and ``environment.env`` (a mapping) are optional.

    Raises: FileNotFoundError (no config), ValueError naming the file and the key that is
    missing or of the wrong type, or a template that does not render.
    """
    source = str(path) if path else shipped_config_path()
    try:
        config = yaml.safe_load(_read(source))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"scaffold_config: {source}: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"scaffold_config: {source}: expected a mapping")
    for sec, key in (("agent", "system_template"), ("agent", "instance_template"),
                     ("model", "observation_template")):
        if not isinstance((config.get(sec) or {}).get(key), str):
            raise ValueError(f"scaffold_config: {source}: {sec}.{key} must be a string")
    env = config.get("environment") or {}
    interp = env.get("interpreter", DEFAULT_INTERPRETER)
    if not (isinstance(interp, list) and interp and all(isinstance(a, str) for a in interp)):
        raise ValueError(f"scaffold_config: {source}: environment.interpreter must be a "
                         "non-empty list of strings")
    if not isinstance(env.get("env", {}), dict):
        raise ValueError(f"scaffold_config: {source}: environment.env must be a mapping")
    return config, source


@functools.lru_cache(maxsize=64)
def _compiled(template: str):
    """The compiled Jinja template (compiling costs ~10 ms; rendering a compiled one ~0.1 ms)."""
    from jinja2 import StrictUndefined, Template  # start-up cost: only this scaffold renders

    return Template(template, undefined=StrictUndefined, keep_trailing_newline=True)


def _render(template: str, **variables) -> str:
    return _compiled(template).render(**variables)


class MiniSweAgentEnv(ScaffoldEnv):
    """mini-swe-agent's tool surface: one ``bash`` tool (its ``BASH_TOOL`` schema: the
    name, description and argument TRL renders from this method)."""

    def bash(self, command: str) -> str:
        """Execute a bash command

        Args:
            command: The bash command to execute
        """
        return self._act("bash", {"command": command})


class MiniSweAgentScaffold(Scaffold):
    """The adapter (module docstring for its rules).

    Args:
        config_path: a YAML file of mini-swe-agent's config shape; None: the shipped
            SWE-bench config (:func:`shipped_config_path`).

    Raises: what :func:`load_config` raises; ValueError when a template does not render
    with a sample task.
    """

    def __init__(self, config_path: str | None = None) -> None:
        config, source = load_config(config_path)
        super().__init__(name="mini-swe-agent", config=config, source=source,
                         env_class=MiniSweAgentEnv)
        env = config.get("environment") or {}
        self.interpreter = list(env.get("interpreter", DEFAULT_INTERPRETER))
        self.env_vars = {str(k): str(v) for k, v in (env.get("env") or {}).items()}
        self.cwd = env.get("cwd", "/testbed")
        try:  # a template naming a variable this adapter does not give fails now, not mid-run
            self.prompt(_Sample())
            self.observation({"output": "x", "returncode": 0, "exception_info": ""})
        except Exception as exc:  # noqa: BLE001 - jinja's errors: one line naming the file
            raise ValueError(f"scaffold_config: {source}: a template does not render: "
                             f"{type(exc).__name__}: {exc}") from None

    def _vars(self, task) -> dict:
        return {"task": task.problem_statement.strip(), "cwd": self.cwd,
                "step_limit": (self.config.get("agent") or {}).get("step_limit"),
                "cost_limit": (self.config.get("agent") or {}).get("cost_limit")}

    def prompt(self, task) -> list[dict]:
        """``[system, user]``: ``agent.system_template`` and ``agent.instance_template``
        rendered with ``task`` = the problem statement (and ``cwd``, ``step_limit``,
        ``cost_limit``). Raises: ValueError naming the task without a problem statement."""
        ps = getattr(task, "problem_statement", None)
        if not isinstance(ps, str) or not ps.strip():
            raise ValueError(f"problem_statement: task {getattr(task, 'instance_id', task)!r} "
                             "has no problem statement")
        agent = self.config["agent"]
        v = self._vars(task)
        return [{"role": "system", "content": _render(agent["system_template"], **v)},
                {"role": "user", "content": _render(agent["instance_template"], **v)}]

    def parse(self, name: str, arguments: dict) -> str:
        """The command of a ``bash`` call. Raises: FormatError (the config's
        ``format_error_template``, or a plain line) for a missing or empty command."""
        command = arguments.get("command")
        if name == "bash" and isinstance(command, str) and command.strip():
            return command
        error = "The bash tool needs a non-empty 'command' argument."
        template = (self.config.get("model") or {}).get("format_error_template")
        raise FormatError(_render(template, error=error).strip() if template else error)

    def wrap(self, command: str, marker: str) -> str:
        """The script the workspace runs for ``command``: the config's interpreter with its
        environment variables, then ``marker`` and the exit status on a line of their own."""
        envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env_vars.items())
        inner = " ".join(shlex.quote(a) for a in [*self.interpreter, command])
        return f"env {envs} {inner}\nprintf '\\n%s %d\\n' '{marker}' \"$?\""

    def step(self, ws, action: str, *, timeout_s: float, max_output_chars: int) -> dict:
        """Run one command; returns ``{"output", "returncode", "exception_info"}`` as
        mini-swe-agent's environments do (returncode -1 and an exception line when the
        bash timeout killed it). Raises: what ``ws.run`` raises (the sandbox failed)."""
        marker = f"@@mswea-rc-{uuid.uuid4().hex}@@"
        text = ws.run(self.wrap(action, marker), timeout_s=timeout_s,
                      max_output_chars=max_output_chars)
        return parse_output(text, marker)

    def observation(self, output: dict) -> str:
        return _render(self.config["model"]["observation_template"], output=output)

    def is_stop(self, output: dict) -> bool:
        """mini-swe-agent's rule: the output's first non-blank line is the stop signal and
        the command exited 0."""
        lines = output.get("output", "").lstrip().splitlines()
        return bool(lines) and lines[0].strip() == STOP_SIGNAL and output["returncode"] == 0


def parse_output(text: str, marker: str) -> dict:
    """The output record of one wrapped command from the workspace's text (the command's
    output, ``marker`` and its exit status, then the sandbox's own note when the wrapper
    itself did not finish: the timeout, or a kill)."""
    at = text.rfind(marker)
    if at >= 0:
        body = text[:at]
        body = body[:-1] if body.endswith("\n") else body
        m = re.match(r" (-?\d+)", text[at + len(marker):])
        return {"output": body, "returncode": int(m.group(1)) if m else -1,
                "exception_info": ""}
    m = _TIMEOUT_NOTE.search(text)
    if m:
        return {"output": text[:m.start()], "returncode": -1,
                "exception_info": "An error occurred while executing the command: the command "
                                  f"timed out after {m.group(1)} seconds"}
    m = _EXIT_NOTE.search(text)
    body = text[:m.start()] if m else text
    code = m.group(1) if m else "?"
    return {"output": body, "returncode": -1,
            "exception_info": f"An error occurred while executing the command: it was killed "
                              f"(exit status {code})"}


class _Sample:
    problem_statement = "sample problem statement"
    instance_id = "sample"
