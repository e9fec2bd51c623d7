"""Generation engines side by side: transformers ``generate`` vs vLLM on the same model.

For each model — the embedded policy (``ensure_default_policy``) and a larger random model of
a TRL family (``--family``, default qwen3, built locally with
``ecredit_trl.policy.families.build_family_model`` at ``--hidden`` / ``--layers``: about
26 M parameters by default) — and each batch size (``--batch`` 1 8 32), greedy, float32:

* **tokens/s**: ``B`` prompts of ``--prompt-tokens`` random ids, ``--new-tokens`` new ids
  each (EOS ignored); generated tokens / wall seconds of the one call.
* **episode s**: the wall seconds of ``B`` synthetic episodes run together, as the batched
  rollout loop runs them: ``--turns`` rounds of one generate call over every episode, each
  turn's ``--new-tokens`` ids and ``--tool-tokens`` ids of a stand-in tool result appended
  to the episode's context before the next round (so the context grows as in a rollout).
* **engine start**, reported apart: transformers ``from_pretrained`` + ``.eval()``; vLLM
  ``LLM(...)`` (eager mode, as ``--use-vllm``; ``--compile`` lets vLLM compile).

vLLM's settings are the evaluation engine's (:func:`ecredit_trl.agent.vllm_engine.engine_kwargs`;
on a CPU host ``VLLM_CPU_KVCACHE_SPACE`` defaults to 2 GiB and thread binding off here). One
run, no repeats: on a shared host the figures move with its load (printed with the table).

    python benchmarks/generation_engines.py [--batch 1 8 32] [--new-tokens 32] [--turns 3]
        [--prompt-tokens 256] [--tool-tokens 64] [--family qwen3] [--hidden 512]
        [--layers 8] [--which both|embedded|family] [--model PATH ...] [--compile]
        [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sandbox.bounds import ArgumentParser, Choice, InDir, Int, OutFile, Text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def family_model(template: str, hidden: int, layers: int, out: Path) -> Path:
    """A random ``template``-family model of width ``hidden`` and depth ``layers`` in ``out``."""
    from ecredit_trl.policy.families import build_family_model, build_family_tokenizer, family

    fam = family(template)
    tok = build_family_tokenizer(fam)
    heads = max(1, hidden // 64)
    shape = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                 num_key_value_heads=max(1, heads // 2), intermediate_size=3 * hidden,
                 head_dim=64)
    build_family_model(fam, tok, seed=0, shape=shape).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """``batch`` prompts of ``length`` ids drawn from ``[3, vocab)`` (fixed by ``seed``)."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(batch)]


class HFEngine:
    """Greedy batched ``generate`` over equal-length contexts (no padding needed)."""

    name = "transformers"

    def __init__(self, path: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        t0 = time.perf_counter()
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.start_s = time.perf_counter() - t0
        self.vocab = self.model.config.vocab_size

    def generate(self, contexts: list[list[int]], new: int) -> list[list[int]]:
        import torch

        ids = torch.tensor(contexts)
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=new, min_new_tokens=new, eos_token_id=None,
                                      pad_token_id=0)
        return out[:, ids.shape[1]:].tolist()


class VLLMBench:
    """Greedy ``LLM.generate`` on token-id prompts (EOS ignored)."""

    name = "vllm"

    def __init__(self, path: str, max_model_len: int, eager: bool) -> None:
        import vllm
        from vllm.platforms import current_platform

        from ecredit_trl.agent.vllm_engine import engine_kwargs  # after the env defaults

        kw = engine_kwargs(path, dtype="auto", policy_dtype="float32", max_model_len=max_model_len,
                           on_cpu=current_platform.is_cpu(), enforce_eager=eager)
        t0 = time.perf_counter()
        self.llm = vllm.LLM(**kw)
        self.start_s = time.perf_counter() - t0
        self.vllm = vllm

    def generate(self, contexts: list[list[int]], new: int) -> list[list[int]]:
        from vllm.inputs import TokensPrompt

        sp = self.vllm.SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True,
                                      detokenize=False)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=c) for c in contexts], sp,
                                 use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def close(self) -> None:
        del self.llm
        gc.collect()


def measure(engine, vocab: int, batches: list[int], a) -> list[dict]:
    """Rows ``{batch, tokens_per_s, episode_s}`` of ``engine`` (one warm-up call first)."""
    engine.generate(prompts(1, 16, vocab, 0), 4)
    rows = []
    for b in batches:
        ctx = prompts(b, a.prompt_tokens, vocab, b)
        t0 = time.perf_counter()
        out = engine.generate(ctx, a.new_tokens)
        tps = sum(len(o) for o in out) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for turn in range(a.turns):
            out = engine.generate(ctx, a.new_tokens)
            tool = prompts(b, a.tool_tokens, vocab, 1000 + turn)
            ctx = [c + o + t for c, o, t in zip(ctx, out, tool, strict=True)]
        rows.append({"batch": b, "tokens_per_s": round(tps, 1),
                     "episode_s": round(time.perf_counter() - t0, 2)})
    return rows


def bench_model(label: str, path: str, a) -> dict:
    """Both engines on ``path``: their start seconds and rows."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    res = {"model": label, "path": path}
    hf = HFEngine(path)
    res["params_m"] = round(sum(p.numel() for p in hf.model.parameters()) / 1e6, 2)
    res["transformers"] = {"start_s": round(hf.start_s, 2), "rows": measure(hf, hf.vocab,
                                                                            a.batch, a)}
    vocab = hf.vocab
    del hf
    gc.collect()
    need = a.prompt_tokens + a.turns * (a.new_tokens + a.tool_tokens) + 16
    vl = VLLMBench(path, max_model_len=max(need, 512), eager=not a.compile)
    res["vllm"] = {"start_s": round(vl.start_s, 2), "rows": measure(vl, vocab, a.batch, a)}
    vl.close()
    return res


def table(results: list[dict]) -> str:
    """The markdown table printed (and pasted into docs/benchmarks.md)."""
    lines = ["| model | params (M) | batch | HF tokens/s | vLLM tokens/s | HF episode s | "
             "vLLM episode s |", "|---|---|---|---|---|---|---|"]
    for r in results:
        for h, v in zip(r["transformers"]["rows"], r["vllm"]["rows"], strict=True):
            lines.append(f"| {r['model']} | {r['params_m']} | {h['batch']} | "
                         f"{h['tokens_per_s']} | {v['tokens_per_s']} | {h['episode_s']} | "
                         f"{v['episode_s']} |")
    lines += ["", "| model | HF start s | vLLM engine start s |", "|---|---|---|"]
    lines += [f"| {r['model']} | {r['transformers']['start_s']} | {r['vllm']['start_s']} |"
              for r in results]
    return "\n".join(lines)


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=Int(ge=1), nargs="+", default=[1, 8, 32],
                    help="batch sizes (prompts per generate call)")
    ap.add_argument("--new-tokens", dest="new_tokens", type=Int(ge=1), default=32,
                    help="ids generated per turn")
    ap.add_argument("--turns", type=Int(ge=1), default=3, help="turns of a synthetic episode")
    ap.add_argument("--prompt-tokens", dest="prompt_tokens", type=Int(ge=1), default=256,
                    help="prompt ids per episode")
    ap.add_argument("--tool-tokens", dest="tool_tokens", type=Int(ge=0), default=64,
                    help="ids of the stand-in tool result appended after each turn")
    ap.add_argument("--family", type=Text(), default="qwen3",
                    help="TRL template family of the larger random model")
    ap.add_argument("--hidden", type=Int(ge=32), default=512, help="its hidden size")
    ap.add_argument("--layers", type=Int(ge=1), default=8, help="its layers")
    ap.add_argument("--model", type=InDir(), nargs="*", default=None,
                    help="model dirs to run instead of the two built ones (e.g. a real model)")
    ap.add_argument("--which", type=Choice("both", "embedded", "family"), default="both",
                    help="the built models to run (each starts vLLM once: ~35 s on 2 cores)")
    ap.add_argument("--compile", action="store_true", help="vLLM without enforce_eager")
    ap.add_argument("--json", type=OutFile(), default=None, help="also write the rows here")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--label", type=Text(), default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.model:
        models = [(a.label or Path(m).name, m) for m in a.model]
    else:
        from ecredit_trl.policy.warmstart import ensure_default_policy
        from eval.tasks.splits import load_tasks

        models = []
        if a.which in ("both", "embedded"):
            embedded = ensure_default_policy(load_tasks("bundled:train", purpose="train"))
            models.append(("embedded", str(embedded)))
        if a.which in ("both", "family"):
            fam_dir = family_model(a.family, a.hidden, a.layers,
                                   Path(tempfile.mkdtemp(prefix="gen-engines-")))
            models.append((f"{a.family} random", str(fam_dir)))
    if a.one:  # a child: one model, its result as one line
        print("GEN_ENGINES " + json.dumps(bench_model(models[0][0], models[0][1], a)), flush=True)
        return
    results = []
    for label, path in models:  # each model in its own process: vLLM's shutdown kills its group
        child = [sys.executable, __file__, "--one", "--model", path, "--label", label,
                 *sys.argv[1:]]
        proc = subprocess.run(child, capture_output=True, text=True)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("GEN_ENGINES ")]
        if proc.returncode != 0 or not lines:
            print(f"{label}: failed (exit {proc.returncode}): {proc.stderr[-2000:]}", flush=True)
            continue
        results.append(json.loads(lines[-1][len("GEN_ENGINES "):]))
        print(json.dumps(results[-1]), flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\n{table(results)}\n\n(load average {load:.1f}; {a.turns} turns x "
          f"{a.new_tokens} new + {a.tool_tokens} tool tokens, prompt {a.prompt_tokens})")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
