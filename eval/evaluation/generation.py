"""Generation stage of an evaluation: the rollouts come from ``python -m
ecredit_trl.agent.rollouts`` run as a *subprocess* (the process boundary keeps ``eval`` free
of TRL / peft imports) or from a given JSONL file; :class:`RolloutTail` reads complete rows
as they are appended, so trials start while the subprocess is still generating. The subprocess
keeps ``--batch-size`` episodes in flight and writes each row when its episode ends
(``ecredit_trl.agent.batched``), so a slot's trial starts while other episodes generate."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from eval.evaluation.modelref import ModelRef
from eval.evaluation.slots import EvalInputError, read_rows, text_sha256
from sandbox.backend import Runtime, SandboxOptions


def rollouts_source(path: Path) -> str:
    """``"file:<sha256>"`` over the (task, rollout index, artifact sha256, model sha256) of
    every row of a rollouts file (the binding's ``rollouts_source``)."""
    rows = read_rows(path)
    key = sorted((r.get("task_id"), r.get("rollout_index"), r.get("artifact_sha256")
                  or text_sha256(r.get("artifact") or ""), r.get("model_sha256")) for r in rows)
    return "file:" + hashlib.sha256(json.dumps(key).encode()).hexdigest()


class RolloutTail:
    """Reads complete new lines appended to a JSONL file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        rows = []
        for line in data[: end + 1].splitlines():
            if line.strip():
                rows.append(json.loads(line.decode("utf-8", "surrogateescape")))
        return rows


def rollouts_command(*, python: str | None, model: str, split: str, n: int, rpath: Path,
                     seed: int, runtime: Runtime | SandboxOptions, binding: str, overrides: dict, device: str | None,
                     todo_tasks: list[str], n_tasks: int, batch_size: int = 8,
                     agent_concurrency: int = 4, use_vllm: bool = False) -> list[str]:
    """The argv of the rollout subprocess; ``--task-id`` flags only when ``todo_tasks`` is a
    strict subset of the split's ``n_tasks`` tasks. ``batch_size`` (episodes in flight; 1 =
    one at a time), ``agent_concurrency`` (tool-call threads) and ``use_vllm`` are passed as
    ``--batch-size`` / ``--agent-concurrency`` / ``--use-vllm``: the first two change
    throughput, not the binding (seeded rows are the same in every batch size); vLLM samples
    other tokens, so it is bound through ``overrides["engine"]`` (rows carry
    ``engine.name == "vllm"``)."""
    cmd = [python or sys.executable, "-m", "ecredit_trl.agent.rollouts", "--model", model,
           "--tasks", split, "--n", str(n), "--out", str(rpath), "--seed", str(seed),
           *runtime.argv(), "--binding", binding]
    for k, flag in (("max_turns", "--max-turns"), ("max_new_tokens", "--max-new-tokens"),
                    ("temperature", "--temperature"), ("chat_template", "--chat-template"),
                    ("scaffold", "--scaffold"), ("scaffold_config", "--scaffold-config")):
        if k in overrides:
            cmd += [flag, str(overrides[k])]
    if device:
        cmd += ["--device", device]
    cmd += ["--batch-size", str(batch_size), "--agent-concurrency", str(agent_concurrency)]
    if use_vllm:
        cmd.append("--use-vllm")
    if len(todo_tasks) < n_tasks:
        for t in todo_tasks:
            cmd += ["--task-id", t]
    return cmd


def start_rollouts(cmd: list[str], stderr_path: Path, say):
    """Start the rollout subprocess (stdout discarded, stderr appended to ``stderr_path``,
    this checkout first on ``PYTHONPATH``). Returns ``(process, open stderr file)``; the
    caller closes both."""
    say("eval: $ " + " ".join(cmd[:12]) + (" ..." if len(cmd) > 12 else ""))
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                else "")
    errf = open(stderr_path, "ab")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf, env=env)
    return proc, errf


def rollout_origin(rollouts, ref: ModelRef | None, out: Path) -> tuple[Path, str, str]:
    """Where the rollouts come from: ``(rollouts path, rollouts_source, model sha256)``.

    Raises: FileNotFoundError (no ``--rollouts`` file), EvalInputError (rows of another
    model, or of several models without ``--model``).
    """
    if rollouts is None:
        return out / "rollouts.jsonl", "subprocess", ref.sha256
    rpath = Path(rollouts)
    if not rpath.is_file():
        raise FileNotFoundError(f"--rollouts: no such file {rpath}")
    source = rollouts_source(rpath)
    shas = {r.get("model_sha256") for r in read_rows(rpath)} - {None}
    if ref is not None and shas - {ref.sha256}:
        raise EvalInputError(f"--rollouts {rpath}: rows were generated by model(s) "
                             f"{sorted(s[:12] for s in shas)}, not --model "
                             f"{ref.model_dir} ({ref.sha256[:12]})")
    if ref is None and len(shas) > 1:
        raise EvalInputError(f"--rollouts {rpath}: rows of {len(shas)} different models")
    model_sha = ref.sha256 if ref else (next(iter(shas)) if shas else "unknown")
    return rpath, source, model_sha
