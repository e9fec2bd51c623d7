"""Decode speed of the rollout sampler against plain transformers ``generate``.

One model (``--model``: ``auto`` = the warm-started embedded policy when its cache holds one,
else ``random``: a random model of the embedded policy's shape, built locally; ``embedded``
builds the embedded policy when it is not cached; or a model directory), one run. For each
``--batch`` size and each ``--engines`` entry, ``B`` prompts of ``--prompt-tokens`` random ids
decode ``--new-tokens`` ids each, sampling at temperature 1 (no top-p / top-k), EOS never
drawn (an id outside the vocabulary stands for it, so every row decodes every step):

* ``plain``: ``model.generate(do_sample=True)`` - one global generator, the floor the rollout
  sampler is held to;
* ``sampler``: the rollout sampler, ``Policy.generate_batch`` (one ``torch.Generator`` per
  row, per-row token limits), as evaluation and batched rollouts call it;
* ``plain-static`` / ``sampler-static``: the same with a static KV cache
  (``cache_implementation="static"``) - compiled by ``generate`` on CUDA, eager on CPU.

Figures per (engine, batch): **ms per decode step** = (wall of an ``N``-token call - wall of a
1-token call) / (N - 1), so the prompt's prefill is left out, in wall and in this process's
CPU seconds (the steadier one on a shared CPU machine); **tokens/s** = B * N / wall of the
``N``-token call. ``--repeats`` rounds interleave the engines (a shared machine's load hits them
alike); the medians are printed, the sampler's ratio to ``plain`` beside them. On CUDA the
**weight-read floor** is printed too: the parameters' bytes / the memory bandwidth
(``--bandwidth-gbs``, else a table of known devices), the time one decode step needs at least
when it reads every weight once.

    python benchmarks/generation_speed.py [--batch 1 4 8 32] [--engines plain sampler]
        [--new-tokens 64] [--prompt-tokens 64] [--repeats 3] [--model auto|embedded|random|DIR]
        [--device auto|cpu|cuda] [--dtype auto|float32|bfloat16] [--bandwidth-gbs 4800]
        [--json OUT]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sandbox.bounds import ArgumentParser, Choice, Float, Int, OutFile, Text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

ENGINES = ("plain", "sampler", "plain-static", "sampler-static")

#: Memory bandwidth in GB/s (vendor figures) by a substring of ``torch.cuda.get_device_name``;
#: the first match wins, so the longer names come first.
BANDWIDTH_GBS = {"H200": 4800, "H100 NVL": 3900, "H100 PCIe": 2000, "H100": 3350,
                 "GH200": 4000, "B200": 8000, "A100-SXM4-80GB": 2039, "A100 80GB PCIe": 1935,
                 "A100": 1555, "L40S": 864, "L40": 864, "A10G": 600, "A10": 600, "L4": 300,
                 "RTX 4090": 1008, "RTX 3090": 936, "V100": 900, "T4": 320}


def device_bandwidth(name: str) -> float | None:
    """GB/s of the first :data:`BANDWIDTH_GBS` key found in ``name``; None when unknown."""
    return next((v for k, v in BANDWIDTH_GBS.items() if k in name), None)


def weight_floor_ms(param_bytes: int, bandwidth_gbs: float) -> float:
    """Milliseconds to read ``param_bytes`` once at ``bandwidth_gbs`` (1 GB = 1e9 bytes)."""
    return param_bytes / (bandwidth_gbs * 1e9) * 1e3


def random_model(out: Path) -> Path:
    """A random model of the embedded policy's shape (``ecredit_trl.policy.tiny_model``) and a
    small BPE tokenizer with its chat template, saved in ``out``."""
    from ecredit_trl.policy.tiny_model import build_model, build_tokenizer

    corpus = ["Fix the bug in the repository.", '<tool_call>\n{"name": "submit", '
              '"arguments": {}}\n</tool_call>', "def f(x):\n    return x + 1\n"] * 20
    tok = build_tokenizer(corpus, vocab_size=600)
    build_model(tok, seed=0).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def cached_embedded() -> Path | None:
    """The newest warm-started embedded policy in the cache (``<cache>/policy/*`` with
    ``warmstart.json``), any recipe: its shape is what decode speed depends on."""
    from ecredit_trl.policy.warmstart import cache_root

    done = [p for p in (cache_root() / "policy").glob("*/warmstart.json")
            if (p.parent / "config.json").is_file()]
    return max(done, key=lambda p: p.stat().st_mtime).parent if done else None


def resolve(model: str) -> tuple[str, Path]:
    """(label, model dir) of ``--model``."""
    if model == "auto":
        found = cached_embedded()
        model = "random" if found is None else str(found)
        if found is not None:
            return "embedded (cached)", found
    if model == "random":
        return "random (embedded shape)", random_model(Path(tempfile.mkdtemp(prefix="genspeed-")))
    if model == "embedded":
        from ecredit_trl.policy.warmstart import ensure_default_policy
        from eval.tasks.splits import load_tasks

        return "embedded", Path(ensure_default_policy(load_tasks("bundled:train",
                                                                 purpose="train")))
    if not Path(model).is_dir():
        raise SystemExit(f"--model: {model}: not a directory (nor auto / embedded / random)")
    return Path(model).name, Path(model)


class Bench:
    """The model under test with its engines (see the module docstring)."""

    def __init__(self, policy, vocab: int) -> None:
        import torch

        from ecredit_trl.agent.generation import GenerationSettings

        self.policy, self.vocab, self.torch = policy, vocab, torch
        if policy.tokenizer.pad_token_id is None:  # padding keeps the model's own EOS id
            policy.tokenizer.pad_token_id = policy.eos_token_ids[0]
        policy.eos_token_ids = [vocab]  # outside the vocabulary: never drawn
        self.settings = GenerationSettings(temperature=1.0, top_p=1.0, top_k=0)

    def call(self, engine: str, contexts: list[list[int]], new: int,
             seed: int) -> tuple[float, float]:
        """(wall, process CPU) seconds of one ``engine`` call generating ``new`` ids per
        context."""
        torch = self.torch
        p = self.policy
        static = engine.endswith("-static")
        t0, c0 = time.perf_counter(), time.process_time()
        if engine.startswith("sampler"):
            p.cache_implementation = "static" if static else None
            out = p.generate_batch(contexts, [new] * len(contexts), self.settings,
                                   [p.row_sampler(seed + i) for i in range(len(contexts))])
            got = [len(o) for o in out]
        else:
            from transformers import GenerationConfig

            torch.manual_seed(seed)
            gc = GenerationConfig(max_new_tokens=new, do_sample=True, temperature=1.0, top_p=1.0,
                                  top_k=0, pad_token_id=p.pad_token_id, eos_token_id=[self.vocab],
                                  cache_implementation="static" if static else None,
                                  disable_compile=not (static and p.device.type == "cuda"))
            ids = torch.tensor(contexts, device=p.device)
            with torch.no_grad():
                o = p.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                     generation_config=gc)
            got = [len(r) for r in o[:, ids.shape[1]:].tolist()]  # the ids reach the host
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if got != [new] * len(contexts):
            raise RuntimeError(f"{engine}: expected {new} ids per row, got {got}")
        return dt, dc


def prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """``batch`` prompts of ``length`` ids in ``[3, vocab)`` (fixed by ``seed``)."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(batch)]


def measure(bench: Bench, engines: list[str], batches: list[int], new: int, prompt: int,
            repeats: int) -> list[dict]:
    """Median rows ``{engine, batch, ms_per_step, cpu_ms_per_step, tokens_per_s}`` over
    ``repeats`` interleaved rounds (one warm-up call of each engine and batch first, both
    lengths). ``cpu_ms_per_step``: the same difference in this process's CPU seconds, the
    steadier figure on a shared machine (with one torch thread it is the work done, not the
    wait for a core); on CUDA it includes the host's wait for the device."""
    samples: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for b in batches:
        ctx = prompts(b, prompt, bench.vocab, b)
        for e in engines:
            bench.call(e, ctx, 1, 0)
            bench.call(e, ctx, new, 0)
    for r in range(repeats):
        for b in batches:
            ctx = prompts(b, prompt, bench.vocab, b)
            for e in engines:
                (t1, c1), (tn, cn) = bench.call(e, ctx, 1, r), bench.call(e, ctx, new, r)
                samples.setdefault((e, b), []).append(((tn - t1) / (new - 1) * 1e3,
                                                       (cn - c1) / (new - 1) * 1e3, b * new / tn))
    rows = []
    for (e, b), s in samples.items():
        rows.append({"engine": e, "batch": b,
                     "ms_per_step": round(statistics.median(x[0] for x in s), 3),
                     "cpu_ms_per_step": round(statistics.median(x[1] for x in s), 3),
                     "tokens_per_s": round(statistics.median(x[2] for x in s), 1),
                     "ms_per_step_all": [round(x[0], 3) for x in s],
                     "cpu_ms_per_step_all": [round(x[1], 3) for x in s]})
    return rows


def table(rows: list[dict], floor_ms: float | None) -> str:
    """Markdown table: one line per batch; per engine ms per step (wall / CPU) and tokens/s;
    each other engine's ms per step over plain's (wall / CPU)."""
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    by = {(r["engine"], r["batch"]): r for r in rows}
    head = (["batch"] + [f"{e} ms/step wall / CPU" for e in engines]
            + [f"{e} tok/s" for e in engines])
    ratios = [e for e in engines if e != "plain" and "plain" in engines]
    head += [f"{e} / plain wall / CPU" for e in ratios]
    if floor_ms is not None:
        head.append("weight-read floor ms")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in sorted({r["batch"] for r in rows}):
        cells = [str(b)] + [f"{by[e, b]['ms_per_step']:.2f} / {by[e, b]['cpu_ms_per_step']:.2f}"
                            for e in engines]
        cells += [f"{by[e, b]['tokens_per_s']:.1f}" for e in engines]
        cells += [f"{_ratio(by[e, b], by['plain', b], 'ms_per_step')} / "
                  f"{_ratio(by[e, b], by['plain', b], 'cpu_ms_per_step')}" for e in ratios]
        if floor_ms is not None:
            cells.append(f"{floor_ms:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ratio(a: dict, b: dict, key: str) -> str:
    return f"{a[key] / b[key]:.3f}" if b[key] > 0 else "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=Int(ge=1, le=4096), nargs="+", default=[1, 4, 8, 32],
                    help="batch sizes (rows per call)")
    ap.add_argument("--engines", type=Choice(*ENGINES), nargs="+", default=list(ENGINES[:2]),
                    help="what generates (module docstring)")
    ap.add_argument("--new-tokens", dest="new_tokens", type=Int(ge=2, le=1 << 16), default=64,
                    help="ids decoded per row (>= 2: the 1-token call is subtracted)")
    ap.add_argument("--prompt-tokens", dest="prompt_tokens", type=Int(ge=1, le=1 << 16),
                    default=64, help="prompt ids per row")
    ap.add_argument("--repeats", type=Int(ge=1, le=1000), default=3,
                    help="interleaved rounds; medians are printed")
    ap.add_argument("--model", type=Text(), default="auto",
                    help="auto, embedded, random or a model directory")
    ap.add_argument("--device", type=Choice("auto", "cpu", "cuda"), default="auto",
                    help="auto: cuda when torch sees one")
    ap.add_argument("--dtype", type=Choice("auto", "float32", "bfloat16"), default="auto",
                    help="auto: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--bandwidth-gbs", dest="bandwidth_gbs", type=Float(gt=0, nullable=True),
                    default=None, help="memory bandwidth, GB/s (default: the device table)")
    ap.add_argument("--json", type=OutFile(), default=None, help="also write the rows here")
    a = ap.parse_args(argv)

    import torch

    from ecredit_trl.agent.generation import cpu_threads, load_rollout_policy

    label, path = resolve(a.model)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    policy = load_rollout_policy(path, device=device, dtype=a.dtype)
    threads = cpu_threads() if device == "cpu" else None  # None: not set (a GPU run)
    if threads is not None:  # for the whole process, never restored (that is the SFT path's job)
        torch.set_num_threads(threads)
    vocab = policy.model.get_input_embeddings().weight.shape[0]
    params = sum(p.numel() for p in policy.model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in policy.model.parameters())
    floor, bw = None, None
    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        bw = a.bandwidth_gbs or device_bandwidth(name)
        floor = weight_floor_ms(param_bytes, bw) if bw else None
    else:
        name = "cpu"
    rows = measure(Bench(policy, vocab), a.engines, a.batch, a.new_tokens, a.prompt_tokens,
                   a.repeats)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    head = {"model": label, "path": str(path), "params_m": round(params / 1e6, 2),
            "param_gb": round(param_bytes / 1e9, 3), "device": name,
            "dtype": str(next(policy.model.parameters()).dtype), "threads": threads,
            "bandwidth_gbs": bw, "weight_floor_ms": floor and round(floor, 4),
            "new_tokens": a.new_tokens, "prompt_tokens": a.prompt_tokens, "repeats": a.repeats,
            "load_average": round(load, 1)}
    print("GEN_SPEED " + json.dumps({**head, "rows": rows}), flush=True)
    floor_note = ("" if device != "cuda" else
                  f"; weight-read floor {floor:.3f} ms at {bw} GB/s" if floor else
                  f"; weight-read floor unknown for {name} (pass --bandwidth-gbs)")
    print(f"\n{label}: {head['params_m']} M parameters ({head['dtype']}, {head['param_gb']} GB) "
          f"on {name}, {head['threads']} threads, {a.prompt_tokens} prompt + {a.new_tokens} new "
          f"tokens, median of {a.repeats}, load average {head['load_average']}{floor_note}\n")
    print(table(rows, floor))
    if a.json:
        Path(a.json).write_text(json.dumps({**head, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
