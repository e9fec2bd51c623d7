"""One GRPO step of a real-size model: peak memory and step time, no download.

Random weights of a public model's shape (``--shape``: Qwen2.5-1.5B or Qwen2.5-7B, from their
``config.json`` on the Hugging Face Hub, with their real vocabulary size; ``toy``: 2 layers of
64 and the tokenizer's vocabulary, for a CPU run) and the qwen2_5 family's tokenizer
(``ecredit_trl.policy.families``; a small BPE, so ids past it decode to nothing), built on the
device in the training dtype and saved for ``train.py``. Then ``train.py`` in this process:
arm M, LoRA r 16 (alpha 32), bf16, gradient checkpointing, ``--rollouts`` rollouts of
``--completion-tokens`` generated tokens (one turn: a random model makes no tool call), one
step, on ``bundled:train``. Prints one ``REAL_SIZE {json}`` line per shape: parameters, the
ledger's step ``wall_s`` and generated tokens, the whole ``train.main`` call, the build + save
seconds, the peak CUDA memory (``torch.cuda.max_memory_allocated``; None on CPU).
``scripts/gpu_check.sh`` runs it per shape.

    python benchmarks/real_size_step.py --shape 1.5B 7B [--rollouts 4] [--completion-tokens 1024]
        [--device cuda] [--runtime local] [--keep DIR] [--out DIR] [--dry-run]
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from sandbox.bounds import ArgumentParser, Choice, Int, OutDir

#: Config fields of each shape (Qwen/Qwen2.5-1.5B-Instruct and Qwen/Qwen2.5-7B-Instruct
#: ``config.json``); ``layer_types`` is sized to the layer count (a shorter list raises
#: IndexError in the decoder layers).
SHAPES = {
    "1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, head_dim=128,
                 vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768,
                 rope_theta=1e6, rms_norm_eps=1e-6),
    "7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, head_dim=128, vocab_size=152064,
               tie_word_embeddings=False, max_position_embeddings=32768, rope_theta=1e6,
               rms_norm_eps=1e-6),
    # the tokenizer's own vocabulary: a 152k-row head made the CPU step take over 15 minutes
    # on 2 busy cores
    "toy": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                tie_word_embeddings=True, max_position_embeddings=32768),
}
#: Where each shape comes from (only named: nothing is downloaded).
HUB_IDS = {"1.5B": "Qwen/Qwen2.5-1.5B-Instruct", "7B": "Qwen/Qwen2.5-7B-Instruct",
           "toy": "Qwen/Qwen2.5-1.5B-Instruct"}
for _s in SHAPES.values():
    _s["layer_types"] = ["full_attention"] * _s["num_hidden_layers"]


def train_argv(model: str, runs: str, runtime: str, rollouts: int, tokens: int,
               bf16: bool) -> list[str]:
    """``train.py`` arguments of the step (one turn, one step, ``rollouts`` rows of
    ``tokens``)."""
    return ["--arm", "M", "--model", model, "--max_steps", "1", "--bf16", str(bf16).lower(),
            "--lora_r", "16", "--lora_alpha", "32", "--gradient_checkpointing", "true",
            "--num_generations", str(rollouts), "--per_device_train_batch_size", str(rollouts),
            "--gradient_accumulation_steps", "1", "--max_completion_length", str(tokens),
            "--max_turns", "1", "--runs_dir", runs, "--save_strategy", "no",
            "--runtime", runtime]


def build(shape: str, out: Path, device: str, dtype) -> int:
    """Random ``shape`` weights (seed 0) made on ``device`` in ``dtype`` and saved with the
    family tokenizer in ``out``; returns the parameter count."""
    import torch
    import transformers

    from ecredit_trl.policy.families import build_family_tokenizer, family, family_config

    fam = family("qwen2_5")
    tok = build_family_tokenizer(fam)
    config = family_config(fam, tok, SHAPES[shape])
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it trains: a 7B in fp32 on CPU takes minutes
        model = getattr(transformers, fam.arch)._from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return n


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=Choice(*SHAPES), nargs="+", required=True,
                    help="model shapes, run in this order")
    ap.add_argument("--rollouts", type=Int(ge=1, le=256), default=4,
                    help="rollouts of the step (one group)")
    ap.add_argument("--completion-tokens", dest="completion_tokens", type=Int(ge=1, le=1 << 17),
                    default=1024, help="generated tokens per rollout (max_completion_length)")
    ap.add_argument("--device", type=Choice("auto", "cpu", "cuda"), default="auto",
                    help="auto: cuda when torch sees one")
    ap.add_argument("--runtime", type=Choice("podman", "local"), default="podman",
                    help="sandbox runtime of the step's trials")
    ap.add_argument("--keep", type=OutDir(), default=None,
                    help="keep each built model in KEEP/<shape> (e.g. for "
                         "benchmarks/generation_speed.py); default: removed after its step")
    ap.add_argument("--out", type=OutDir(), default=None, help="work folder (default: a temp dir)")
    ap.add_argument("--dry-run", action="store_true",
                    help="check the shape and train.py flags only; build nothing")
    a = ap.parse_args(argv)

    import torch

    from ecredit_trl.train import parse_args

    out = Path(a.out or (Path(tempfile.gettempdir()) / "real-size-dry-run" if a.dry_run
                         else tempfile.mkdtemp(prefix="real-size-")))
    device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    for shape in a.shape:  # every shape's flags first, then the runs
        # the shape's hub id stands for the directory built later
        cfg, margs = parse_args(train_argv(HUB_IDS[shape], str(out / shape / "runs"), a.runtime,
                                           a.rollouts, a.completion_tokens, bf16=True))
        assert (cfg.bf16 and cfg.gradient_checkpointing and margs.lora_r == 16
                and cfg.max_steps == 1 and cfg.num_generations == a.rollouts)
        s = SHAPES[shape]
        vocab = s.get("vocab_size", "of the tokenizer")
        print(f"shape {shape}: {s['num_hidden_layers']} layers, hidden {s['hidden_size']}, "
              f"vocab {vocab}; {a.rollouts} rollouts x {a.completion_tokens} tokens, "
              f"1 step, arm M, LoRA r 16, bf16, gradient checkpointing, on {device}", flush=True)
    if a.dry_run:
        return 0
    failed = 0
    for shape in a.shape:
        row = run_shape(shape, out / shape, Path(a.keep) / shape if a.keep else None, device, a)
        print("REAL_SIZE " + json.dumps(row), flush=True)
        failed += row["exit"] != 0
    return 1 if failed else 0


def run_shape(shape: str, out: Path, keep: Path | None, device: str, a) -> dict:
    """Build ``shape`` (in ``keep``, else in ``out`` and removed after), train its step; the
    ``REAL_SIZE`` figures."""
    import torch

    from ecredit_trl.train import main as train_main

    model_dir = keep or out / "model"
    argv = train_argv(str(model_dir), str(out / "runs"), a.runtime, a.rollouts,
                      a.completion_tokens, bf16=True)
    print(f"train.py {' '.join(argv)}", flush=True)
    t0 = time.monotonic()
    n = build(shape, model_dir, device, torch.bfloat16)
    build_s = time.monotonic() - t0
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t1 = time.monotonic()
    rc = train_main(argv)
    job_s = time.monotonic() - t1
    (run,) = [p for p in (out / "runs").iterdir() if p.is_dir()]
    ledger = [json.loads(x) for x in (run / "ledger.jsonl").read_text().splitlines() if x]
    if keep is None:
        shutil.rmtree(model_dir, ignore_errors=True)
    return {"shape": shape, "exit": rc, "params_m": round(n / 1e6, 2), "device": device,
            "rollouts": a.rollouts, "completion_tokens": a.completion_tokens,
            "step_s": [r["wall_s"] for r in ledger],
            "generated_tokens": [r.get("generated_tokens") for r in ledger],
            "train_s": round(job_s, 1), "build_s": round(build_s, 1),
            "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda
            else None}


if __name__ == "__main__":
    sys.exit(main())
