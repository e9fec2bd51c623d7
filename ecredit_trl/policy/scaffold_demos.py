"""Gold-patch demonstrations in a scaffold's own format (design page, "Generation engines and scaffolds").

The built-in demonstrations (:mod:`ecredit_trl.policy.demos`: view → str_replace → submit →
"Done.", with their variants) are rendered for the ``mini-swe-agent`` scaffold, call by
call, as bash commands run for real in a fresh checkout of the task (their outputs shown
through the scaffold's observation template):

* ``view(path, line)`` → ``nl -ba PATH | sed -n 'A,Bp'`` (the same window as the editor's);
* ``str_replace(path, old, new)`` → a ``python3`` heredoc that replaces the occurrence
  (raw triple-quoted strings when the text allows, so the edit's characters are written as
  the built-in call's JSON arguments write them; ``repr`` otherwise); that the text occurs
  exactly once, as the built-in tool requires, is checked before it runs;
* ``submit()`` → ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff`` (the stop signal);
* the closing message is kept: TRL's tool loop asks for one more turn after every result.

The prompt is the scaffold's (:meth:`~ecredit_trl.agent.scaffolds.base.Scaffold.prompt`),
the tools its schemas. Every command must exit 0 and every edit's text occur exactly once
(checked), so the checkout ends where the built-in calls leave it.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from ecredit_trl.agent.editor import SNIPPET_LINES
from ecredit_trl.agent.env import _clone_at
from ecredit_trl.agent.scaffolds.mini_swe_agent import STOP_SIGNAL
from ecredit_trl.policy.demos import DemoError, demo_conversations
from sandbox.workspace.session import truncate

__all__ = ["edit_command", "mini_swe_agent_demos", "view_command"]

#: Bump when the rendering changes (part of the scaffold warm start's cache key).
SCAFFOLD_DEMO_VERSION = "mswea-demos-v2"
MAX_OUTPUT_CHARS = 2000  # AgentContext.max_output_chars: the sandbox's cut


def _literal(text: str) -> str:
    """A Python literal of ``text``: raw triple-quoted when that is exact, else ``repr``."""
    if "'''" not in text and not text.endswith("\\") and "\nEOF" not in text \
            and not text.startswith("EOF") and "'" != text[-1:]:
        return f"r'''{text}'''"
    return repr(text)


def edit_command(path: str, old: str, new: str) -> str:
    """The bash command that replaces the first occurrence of ``old`` in ``path`` by ``new``
    (the shortest such heredoc: the policy generates every token of it; that ``old`` occurs
    exactly once is checked by :func:`render_demo` before the command runs)."""
    return (f"python3 - <<'EOF'\nfrom pathlib import Path\np = Path({path!r})\n"
            f"p.write_text(p.read_text().replace({_literal(old)}, {_literal(new)}, 1))\nEOF")


def view_command(path: str, line: int) -> str:
    """The bash command that shows ``path`` with line numbers (around ``line`` when > 0)."""
    if line > 0:
        lo, hi = max(1, line - SNIPPET_LINES), line + SNIPPET_LINES
        return f"nl -ba {path} | sed -n '{lo},{hi}p'"
    return f"nl -ba {path}"


def _command(name: str, args: dict) -> str:
    if name == "view":
        return view_command(args["path"], int(args.get("line") or 0))
    if name == "str_replace":
        return edit_command(args["path"], args["old_str"], args["new_str"])
    if name == "submit":
        return f"echo {STOP_SIGNAL} && git diff"
    raise DemoError(f"no {name!r} call in the scaffold's demonstrations")


def _bash_call(command: str) -> dict:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {
                "name": "bash", "arguments": json.dumps({"command": command},
                                                        ensure_ascii=False)}}]}


def render_demo(demo: dict, task, scaffold, workroot: str | None = None) -> dict:
    """``demo`` (a built-in demonstration of ``task``) in ``scaffold``'s format (module
    docstring). Raises: DemoError naming the task when a command exits non-zero."""
    iid = demo["instance_id"]
    messages = scaffold.prompt(task)
    with tempfile.TemporaryDirectory(prefix="ecredit-sdemo-", dir=workroot) as tmp:
        root = Path(tmp) / "repo"
        _clone_at(task.repo_dir, task.base_commit, root)
        for m in demo["messages"]:
            if m["role"] == "assistant" and not m.get("tool_calls"):
                messages.append({"role": "assistant", "content": m["content"]})
            for c in m.get("tool_calls") or []:
                fn = c["function"]
                args = json.loads(fn["arguments"])
                if fn["name"] == "str_replace":  # the built-in tool's rule: exactly once
                    n = (root / args["path"]).read_text(encoding="utf-8").count(args["old_str"])
                    if n != 1:
                        raise DemoError(f"task {iid}: str_replace text occurs {n} times")
                command = _command(fn["name"], args)
                proc = subprocess.run(["bash", "-c", command], cwd=root, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT)
                out = truncate(proc.stdout.decode("utf-8", errors="replace"), MAX_OUTPUT_CHARS)
                if proc.returncode != 0:
                    raise DemoError(f"task {iid}: {fn['name']} as bash exited "
                                    f"{proc.returncode}: {out[-300:]}")
                obs = scaffold.observation({"output": out, "returncode": 0,
                                            "exception_info": ""})
                messages += [_bash_call(command), {"role": "tool", "name": "bash",
                                                   "content": obs}]
    return {"instance_id": iid, "messages": messages, "tools": json.dumps(scaffold.tools()),
            "variant": demo.get("variant", "plain")}


def mini_swe_agent_demos(tasks, scaffold, *, variants=None, harmful=None, log=print) -> list[dict]:
    """The built-in demonstrations of ``tasks`` (:func:`ecredit_trl.policy.demos.demo_conversations`,
    same variants) rendered for ``scaffold``; a task whose rendering fails is skipped with a
    line. Raises: DemoError when no task yields one."""
    by_id = {t.instance_id: t for t in tasks}
    out = []
    for d in demo_conversations(tasks, log=log, variants=variants, harmful=harmful):
        try:
            out.append(render_demo(d, by_id[d["instance_id"]], scaffold))
        except DemoError as exc:
            if log:
                log(f"warmstart: skipped {exc}")
    if not out:
        raise DemoError("no task yields a scaffold demonstration")
    return out
