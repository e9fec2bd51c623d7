"""Generation and training cost per token of long episodes on this CPU.

For each completion length L (default 4096 / 8192 / 16384 tokens), with the embedded policy
(the cached warm-started tiny model, :func:`ecredit_trl.policy.warmstart.ensure_default_policy`):

* **generation**: one sequence, the rendered task prompt of a bundled training task, then
  exactly L new tokens sampled at T = 1.0 (``min_new_tokens = L`` keeps EOS away, so every
  length is reached; KV cache on, as ``Policy.generate``) -> seconds per generated token;
* **train step**: forward + backward of TRL's token-level GRPO loss (``ratio · A`` with the
  per-token advantages the trainer injects, no KL: ``beta = 0``, the default) on one row of
  prompt + L completion tokens, gradient checkpointing off -> seconds per completion token.

Times are given as wall seconds and as the child process's CPU seconds (``process_time``):
on the shared 2-core machine other work stretches the wall time, the CPU time much less.
Generation cost per token grows with the context (every step attends to, and the KV cache
copies, all earlier tokens), so longer episodes cost more per token, not only in total.

Each measurement runs in a fresh child process, so its peak RSS (``ru_maxrss``) is its own;
the table gives the peak, the child's RSS before the measured work (model loaded), and the
growth per token ``(peak - before) / L`` (KiB). A long episode is one row here; a step of B
rows costs about B times the train column (attention is not the bulk at this size).

**Position limit.** The embedded model is a Llama with RoPE and ``max_position_embeddings =
4096``; TRL's tool loop stops a row at that length. For L past it the benchmark loads the
*same weights* with a larger ``max_position_embeddings`` (prompt + L + 16): RoPE has no
position table, so the weights and the per-token compute are the same, but the model never
saw such positions in its warm start; the numbers are cost, not quality. The table marks
those rows.

    python benchmarks/long_episodes.py [--lengths 4096 8192 16384] [--threads 1]

One run here (2 shared cores, one torch thread) spent about 6 minutes of CPU, 10.5 minutes of
wall time at a load of 6-7 (other work on the machine); most of it is the 16k generation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from sandbox.bounds import ArgumentParser, Int, Text

ROOT = Path(__file__).resolve().parents[1]


def _rss_mib() -> float:
    """This process's peak resident set so far (Linux ``ru_maxrss`` is KiB), MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _current_rss_mib() -> float:
    """This process's resident set now (``/proc/self/statm``), MiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _load(length: int, prompt_len: int):
    """The embedded policy; ``max_position_embeddings`` raised when prompt + ``length`` passes
    it (same weights, see the module docstring). Returns (model, tokenizer, limit, raised)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from ecredit_trl.policy.warmstart import ensure_default_policy, load_policy
    from eval.tasks.splits import load_tasks

    path = ensure_default_policy(load_tasks("bundled:train", purpose="train"), log=None)
    model, tok = load_policy(path)
    limit = int(model.config.max_position_embeddings)
    need = prompt_len + length + 16
    if need <= limit:
        return model, tok, limit, False
    cfg = AutoConfig.from_pretrained(path, max_position_embeddings=need)
    model = AutoModelForCausalLM.from_pretrained(path, config=cfg, dtype="float32").eval()
    return model, tok, limit, True


def _prompt_ids() -> list[int]:
    """The rendered prompt of the first bundled training task, as a rollout starts."""
    from ecredit_trl.agent.generation import Policy
    from ecredit_trl.agent.prompts import task_prompt
    from ecredit_trl.policy.warmstart import ensure_default_policy, load_policy
    from eval.evaluation.modelref import resolve_model
    from eval.tasks.splits import load_tasks

    tasks = load_tasks("bundled:train", purpose="train")
    path = ensure_default_policy(tasks, log=None)
    model, tok = load_policy(path)
    return Policy(model, tok, resolve_model(path)).render_prompt(task_prompt(tasks[0]))


def _generate(model, prompt: list[int], length: int) -> tuple[float, float]:
    """(wall, CPU) seconds to sample exactly ``length`` tokens after ``prompt`` (one
    sequence)."""
    import torch
    from transformers import GenerationConfig

    torch.manual_seed(0)
    gc = GenerationConfig(max_new_tokens=length, min_new_tokens=length, do_sample=True,
                          temperature=1.0, top_p=1.0, top_k=0, pad_token_id=0,
                          eos_token_id=model.config.eos_token_id, disable_compile=True)
    ids = torch.tensor([prompt])
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             generation_config=gc)
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    if out.shape[1] - len(prompt) != length:
        raise RuntimeError(f"generated {out.shape[1] - len(prompt)} tokens, expected {length}")
    return dt, dc


def _train_step(model, prompt: list[int], length: int, vocab: int) -> tuple[float, float]:
    """(wall, CPU) seconds of one forward + backward of the token-level GRPO loss on prompt + ``length``
    completion tokens (the loss of TRL's ``_compute_loss`` with ``beta = 0``: per-token
    ratio times advantage, masked mean over the completion)."""
    import torch

    g = torch.Generator().manual_seed(0)
    comp = torch.randint(3, vocab, (1, length), generator=g)
    ids = torch.cat([torch.tensor([prompt]), comp], dim=1)
    adv = torch.randn(1, length, generator=g)  # (B, T) per-token advantages A + C
    model.train()
    t0, c0 = time.perf_counter(), time.process_time()
    logits = model(input_ids=ids, logits_to_keep=length + 1).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, comp[..., None]).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    loss = -(ratio * adv).sum() / length
    loss.backward()
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    model.zero_grad(set_to_none=True)
    return dt, dc


def _child(kind: str, length: int, prompt: list[int], threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    model, tok, limit, raised = _load(length, len(prompt))
    model.config.use_cache = kind == "gen"
    before = _current_rss_mib()
    dt, dc = (_generate(model, prompt, length) if kind == "gen"
              else _train_step(model, prompt, length, len(tok)))
    return {"kind": kind, "length": length, "seconds": dt, "cpu_seconds": dc,
            "peak_mib": _rss_mib(),
            "before_mib": before, "limit": limit, "raised": raised}


def _run_child(kind: str, length: int, prompt_file: Path, threads: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1",
               HF_HUB_DISABLE_TELEMETRY="1")
    proc = subprocess.run([sys.executable, __file__, "--child", kind, str(length),
                           str(prompt_file), "--threads", str(threads)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} at {length} tokens failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _machine(threads: int) -> str:
    import torch

    cpu = next((ln.split(":", 1)[1].strip() for ln in
                Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")),
               platform.processor())
    return (f"{cpu}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; torch "
            f"{torch.__version__}, {threads} thread(s); Python {platform.python_version()}")


def _table(rows: dict[tuple[str, int], dict], lengths: list[int], prompt_len: int) -> list[str]:
    out = ["| completion tokens | generation s/token (CPU s/token) | train step s/token "
           "(CPU s/token) | gen peak RSS MiB (KiB/token) | train peak RSS MiB (KiB/token) | "
           "positions |",
           "|---:|---:|---:|---:|---:|---|"]
    for n in lengths:
        g, t = rows[("gen", n)], rows[("train", n)]
        per = [(r["peak_mib"] - r["before_mib"]) * 1024 / n for r in (g, t)]
        pos = (f"raised to {prompt_len + n + 16} (model limit {g['limit']})" if g["raised"]
               else f"within the model's {g['limit']}")
        out.append(f"| {n} | {g['seconds'] / n:.2e} ({g['cpu_seconds'] / n:.2e}) | "
                   f"{t['seconds'] / n:.2e} ({t['cpu_seconds'] / n:.2e}) | "
                   f"{g['peak_mib']:.0f} ({per[0]:.1f}) | {t['peak_mib']:.0f} ({per[1]:.1f}) | "
                   f"{pos} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=Int(ge=1), nargs="+", default=[4096, 8192, 16384])
    ap.add_argument("--threads", type=Int(ge=1), default=1,
                    help="torch intra-op threads (1: the machine is shared)")
    ap.add_argument("--child", type=Text(), nargs=3, metavar=("KIND", "LENGTH", "PROMPT_FILE"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        kind, length, pfile = args.child
        prompt = json.loads(Path(pfile).read_text())
        print(json.dumps(_child(kind, int(length), prompt, args.threads)))
        return 0
    if any(n < 1 for n in args.lengths):
        ap.error("--lengths: every length must be >= 1")
    import tempfile

    print("command: python benchmarks/long_episodes.py " + " ".join(sys.argv[1:]))
    print("machine: " + _machine(args.threads))
    t_all = time.perf_counter()
    prompt = _prompt_ids()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="long-episodes-") as tmp:
        pfile = Path(tmp) / "prompt.json"
        pfile.write_text(json.dumps(prompt))
        for n in args.lengths:
            for kind in ("gen", "train"):
                rows[(kind, n)] = r = _run_child(kind, n, pfile, args.threads)
                print(f"  {kind:<5} {n:>6} tokens: {r['seconds']:.1f} s wall, "
                      f"{r['cpu_seconds']:.1f} s CPU, peak RSS "
                      f"{r['peak_mib']:.0f} MiB", flush=True)
    print(f"embedded policy (LlamaForCausalLM 2.2M params, fp32), prompt {len(prompt)} tokens, "
          "one sequence")
    print("\n".join(_table(rows, args.lengths, len(prompt))))
    print(f"total {time.perf_counter() - t_all:.0f} s; load at the end "
          f"{os.getloadavg()[0]:.2f} (wall seconds grow with other work on the machine, "
          "CPU seconds much less)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
