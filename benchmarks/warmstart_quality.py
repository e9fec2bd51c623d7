"""Quality of the warm-started default policy on its training tasks (real episodes, CPU).

For every task, episodes are played the way TRL 1.16's GRPO tool loop plays them:
prompt = ``task_prompt(task)`` rendered with the tool schemas and TRL's training chat
template (what GRPO switches to for qwen3), ``model.generate`` until ``<|im_end|>``,
``trl.chat_template_utils.parse_response`` (with the tool schemas) on the completion, the tool
executed on a real ``SWEAgentEnv`` (local checkout, no container: ``bash`` answers with an
error), the tool-result tokens appended exactly as ``GRPOTrainer._get_tool_suffix_ids`` builds
them, and the next turn generated, until a turn has no tool call or ``--max-turns``.

Reported per decoding mode (greedy: 1 episode/task; sampling at ``--temperature``,
top-k 0 and top-p 1 as in GRPOConfig's defaults: ``--samples`` episodes/task):

* ``call@k``: fraction of episodes whose k-th assistant turn has a parseable tool call;
* ``valid@k``: ... whose k-th call ran without an error (known tool, good arguments);
* ``gold``: episodes whose final tree holds exactly the gold fix (every patched file
  equals the gold-patched file and nothing else changed);
* ``submit``: episodes that called ``submit``; ``stop``: episodes that ended with a turn
  without a tool call (as the demonstrations do after ``submit``);
* ``mixed``: tasks whose sampled episodes are neither all gold nor all non-gold (a GRPO
  group with a non-constant reward);
* completion tokens (generated + tool-result tokens, what GRPO's ``max_completion_length``
  must hold) and prompt tokens.

    python benchmarks/warmstart_quality.py [--tasks bundled:train] [--steps N]
        [--policy DIR] [--site-demos N [--site-max-shift L]] [--samples 4]
        [--temperature 1.0[,0.7...]] [--limit N] [--json OUT]

Without ``--policy``, the policy comes from ``ensure_default_policy`` (trained once, cached
under ``$ECREDIT_CACHE/policy``); the warm-start time is printed when it trains here.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ecredit_trl.agent.env import TOOL_NAMES, AgentContext, SWEAgentEnv  # noqa: E402
from ecredit_trl.agent.prompts import policy_tools, task_prompt  # noqa: E402
from sandbox.bounds import ArgumentParser, Int, OutDir, OutFile, Source, Text


class Player:
    """Plays episodes of one policy the way TRL's GRPO tool loop does (see module doc)."""

    def __init__(self, model, tokenizer, *, max_new_tokens: int = 256, max_turns: int = 5):
        from trl.chat_template_utils import add_response_schema, get_training_chat_template

        self.model, self.tok = model, tokenizer
        add_response_schema(tokenizer)
        # GRPO with tools replaces a non-prefix-preserving template (qwen3) by its training one
        self.template = get_training_chat_template(tokenizer) or tokenizer.chat_template
        self.tools = policy_tools()
        self.max_new_tokens, self.max_turns = max_new_tokens, max_turns
        self._suffix_cache: dict[tuple, list[int]] = {}

    def prompt_ids(self, task) -> list[int]:
        return self.tok.apply_chat_template(task_prompt(task), tools=self.tools,
                                            add_generation_prompt=True, tokenize=True,
                                            return_dict=False, chat_template=self.template)

    def suffix_ids(self, tool_messages: list[dict]) -> list[int]:
        """``GRPOTrainer._get_tool_suffix_ids`` (TRL 1.16), reproduced."""
        calls = [{"type": "function", "function": {"name": tool_messages[0]["name"],
                                                   "arguments": {}}}]
        dummy = [{"role": "user", "content": "dummy"},
                 {"role": "assistant", "content": "", "tool_calls": calls}]
        prefix = self.tok.apply_chat_template(dummy, tokenize=True, return_dict=False,
                                              chat_template=self.template)
        full = self.tok.apply_chat_template(dummy + tool_messages, add_generation_prompt=True,
                                            tokenize=True, return_dict=False,
                                            chat_template=self.template)
        eos = [i for i, t in enumerate(prefix) if t == self.tok.eos_token_id]
        if eos:
            prefix = prefix[: eos[-1] + 1]
        assert full[: len(prefix)] == prefix
        return full[len(prefix):]

    def generate(self, contexts: list[list[int]], *, do_sample: bool, temperature: float
                 ) -> list[list[int]]:
        """One turn for a batch of contexts (left-padded); completions end at EOS inclusive."""
        import torch

        pad = self.tok.pad_token_id
        width = max(len(c) for c in contexts)
        ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
        mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
        kw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if do_sample \
            else dict(do_sample=False)
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=mask,
                                      max_new_tokens=self.max_new_tokens,
                                      eos_token_id=self.tok.eos_token_id, pad_token_id=pad, **kw)
        comps = []
        for row in out[:, width:].tolist():
            if self.tok.eos_token_id in row:
                row = row[: row.index(self.tok.eos_token_id) + 1]
            else:
                row = [t for t in row if t != pad]
            comps.append(row)
        return comps

    def play(self, task, n: int, *, do_sample: bool, temperature: float = 1.0,
             workroot: str) -> list[dict]:
        """``n`` episodes of ``task`` played in lockstep; one result dict per episode."""
        from trl.chat_template_utils import parse_response

        ctx = AgentContext(tasks={task.instance_id: task}, workroot=workroot)
        envs = [SWEAgentEnv(ctx) for _ in range(n)]
        for e in envs:
            e.reset(instance_id=task.instance_id)
        prompt = self.prompt_ids(task)
        state = [{"ids": list(prompt), "turns": [], "completion_tokens": 0, "done": False}
                 for _ in range(n)]
        for _turn in range(self.max_turns):
            live = [i for i in range(n) if not state[i]["done"]]
            if not live:
                break
            comps = self.generate([state[i]["ids"] for i in live], do_sample=do_sample,
                                  temperature=temperature)
            for i, comp in zip(live, comps, strict=True):
                s, env = state[i], envs[i]
                parsed = parse_response(self.tok, comp, prefix=s["ids"], tools=self.tools)
                calls = parsed.get("tool_calls") or []
                s["ids"] = s["ids"] + comp
                s["completion_tokens"] += len(comp)
                turn = {"call": bool(calls), "valid": False, "names": [],
                        "text": self.tok.decode(comp)}
                s["turns"].append(turn)
                if not calls:
                    s["done"] = True
                    continue
                tool_msgs, ok = [], True
                for c in calls:
                    fn = c["function"]
                    name = fn["name"]
                    turn["names"].append(name)
                    try:
                        if name not in TOOL_NAMES:
                            raise ValueError(f"Tool {name} not found.")
                        result = getattr(env, name)(**fn["arguments"])
                        ok = ok and env.calls[-1].ok
                    except Exception as exc:  # what TRL's tool loop does
                        result, ok = {"error": str(exc)}, False
                    tool_msgs.append({"role": "tool", "name": name, "content": str(result)})
                turn["valid"] = ok
                suffix = self.suffix_ids(tool_msgs)
                s["ids"] = s["ids"] + suffix
                s["completion_tokens"] += len(suffix)
        gold = gold_files(task, workroot)
        results = []
        for s, env in zip(state, envs, strict=True):
            results.append({
                "turns": s["turns"], "completion_tokens": s["completion_tokens"],
                "prompt_tokens": len(prompt), "gold": tree_is_gold(env.workdir, gold),
                "submitted": env.submitted, "stopped": bool(s["turns"]) and not s["turns"][-1]["call"],
            })
            _close_env(env)
        return results


def _close_env(env) -> None:
    import ecredit_trl.agent.env as agent

    if hasattr(agent, "release"):
        agent.release(env)
    else:
        (getattr(env, "_close", None) or env.close)()


def gold_files(task, workroot: str) -> dict[str, str | None]:
    """path -> content after the gold patch (None: deleted), for every path it touches."""
    from ecredit_trl.agent.env import _clone_at

    with tempfile.TemporaryDirectory(dir=workroot) as tmp:
        root = Path(tmp) / "g"
        _clone_at(task.repo_dir, task.base_commit, root)
        subprocess.run(["git", "-C", str(root), "apply", "-"], input=task.patch.encode(),
                       check=True, capture_output=True)
        out = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "-uall"],
                             check=True, capture_output=True, text=True).stdout
        paths = [line[3:] for line in out.splitlines()]
        return {p: (root / p).read_text() if (root / p).exists() else None for p in paths}


def tree_is_gold(workdir, gold: dict[str, str | None]) -> bool:
    out = subprocess.run(["git", "-C", str(workdir), "status", "--porcelain", "-uall"],
                         check=True, capture_output=True, text=True).stdout
    changed = {line[3:] for line in out.splitlines()}
    if changed != set(gold):
        return False
    for p, text in gold.items():
        f = Path(workdir) / p
        if (text is None) != (not f.exists()) or (text is not None and f.read_text() != text):
            return False
    return True


def summarize(results: dict[str, list[dict]], turns: int = 3) -> dict:
    eps = [r for rs in results.values() for r in rs]
    n = len(eps)
    row = {"episodes": n}
    for k in range(turns + 1):
        row[f"call@{k + 1}"] = sum(len(r["turns"]) > k and r["turns"][k]["call"] for r in eps) / n
        row[f"valid@{k + 1}"] = sum(len(r["turns"]) > k and r["turns"][k]["valid"] for r in eps) / n
    row["gold"] = sum(r["gold"] for r in eps) / n
    row["submit"] = sum(r["submitted"] for r in eps) / n
    row["stop"] = sum(r["stopped"] for r in eps) / n
    row["tasks_any_gold"] = sum(any(r["gold"] for r in rs) for rs in results.values())
    row["tasks_mixed"] = sum(0 < sum(r["gold"] for r in rs) < len(rs) for rs in results.values())
    ct = [r["completion_tokens"] for r in eps]
    row["completion_tokens_mean"] = statistics.mean(ct)
    row["completion_tokens_max"] = max(ct)
    row["prompt_tokens_max"] = max(r["prompt_tokens"] for r in eps)
    return row


def main(argv=None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=Source(), default="bundled:train",
                    help="load_tasks source (purpose=train); default bundled:train")
    ap.add_argument("--policy", type=Text(), help="a saved policy dir (skips the warm start)")
    ap.add_argument("--steps", type=Int(ge=1), default=None, help="warm-start SFT steps")
    ap.add_argument("--site-demos", type=Int(ge=0), default=0,
                    help="site demonstrations per mutation site of the training functions "
                         "(a localized world's copy curriculum; 0: none)")
    ap.add_argument("--site-max-shift", type=Int(ge=0), default=None,
                    help="most padding lines a site demonstration's file is shifted by")
    ap.add_argument("--cache-dir", type=OutDir(), default=None)
    ap.add_argument("--samples", type=Int(ge=1), default=4)
    ap.add_argument("--temperature", type=Text(why="comma-separated numbers >= 0"), default="1.0",
                    help="sampling temperature(s), comma-separated (one table row each)")
    ap.add_argument("--max-new-tokens", type=Int(ge=1), default=256, help="per turn")
    ap.add_argument("--max-turns", type=Int(ge=1), default=5)
    ap.add_argument("--limit", type=Int(ge=1), default=None, help="first N tasks only")
    ap.add_argument("--seed", type=Int(ge=0, le=2**32 - 1, why="32-bit seeds"), default=0)
    ap.add_argument("--json", type=OutFile(), help="write the per-episode results here")
    a = ap.parse_args(argv)

    import torch

    from ecredit_trl.policy.warmstart import ensure_default_policy, load_policy
    from eval.tasks.splits import load_tasks

    tasks = load_tasks(a.tasks, purpose="train")
    t0 = time.monotonic()
    sites = {"site_demos": a.site_demos, "site_max_shift": a.site_max_shift}
    path = a.policy or ensure_default_policy(
        tasks, a.cache_dir, steps=a.steps, **{k: v for k, v in sites.items() if v is not None})
    t_ws = time.monotonic() - t0
    info = json.loads((Path(path) / "warmstart.json").read_text())
    model, tok = load_policy(path)
    torch.manual_seed(a.seed)
    player = Player(model, tok, max_new_tokens=a.max_new_tokens, max_turns=a.max_turns)
    trained = set(info["tasks"])
    tasks = [t for t in tasks if t.instance_id in trained][: a.limit]

    temps = [float(x) for x in str(a.temperature).split(",") if x.strip()]
    modes = [("greedy", 1, False, 1.0)] + [(f"T={t:g}", a.samples, True, t) for t in temps]
    table, dump = {}, {}
    workroot = tempfile.mkdtemp(prefix="ecredit-wsq-")
    try:
        for name, n, sample, temp in modes:
            t1 = time.monotonic()
            res = {t.instance_id: player.play(t, n, do_sample=sample,
                                              temperature=temp, workroot=workroot)
                   for t in tasks}
            table[name] = summarize(res) | {"seconds": time.monotonic() - t1}
            dump[name] = res
    finally:
        subprocess.run(["rm", "-rf", workroot], check=False)

    print(f"policy {path}")
    print(f"  warm start: {info['recipe']['steps']} steps x batch {info['recipe']['batch_size']}, "
          f"{len(info['tasks'])} tasks, train {info.get('train_s')} s "
          f"({info.get('s_per_step')} s/step), total {info.get('total_s')} s, final loss "
          f"{info.get('final_loss')}; this call {t_ws:.0f} s")
    cols = ["episodes", "call@1", "valid@1", "call@2", "valid@2", "call@3", "valid@3",
            "call@4", "gold", "submit", "stop", "tasks_any_gold", "tasks_mixed",
            "completion_tokens_mean", "completion_tokens_max", "prompt_tokens_max", "seconds"]
    print(f"{'mode':<8}" + "".join(f"{c:>9}" if len(c) < 9 else f" {c}" for c in cols))
    for name, row in table.items():
        cells = []
        for c in cols:
            v = row[c]
            cells.append(f"{v:>{max(9, len(c) + 1)}.2f}" if isinstance(v, float) and c not in (
                "completion_tokens_mean", "seconds") else f"{v:>{max(9, len(c) + 1)}.0f}"
                if isinstance(v, float) else f"{v:>{max(9, len(c) + 1)}}")
        print(f"{name:<8}" + "".join(cells))
    if a.json:
        Path(a.json).write_text(json.dumps({"policy": path, "info": info, "table": table,
                                            "episodes": dump}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
