"""Time the end-to-end family path per chat-template family.

For each family: warm-start its tiny model on the two default tasks
(:func:`ecredit_trl.policy.family_warmstart.ensure_family_policy`; cached, so pass a fresh
``--cache`` to time the warm start itself), train 2 GRPO steps of arm M with LoRA r 8 and
gradient checkpointing (``--bf16`` for a CUDA host), then ``eval.run`` on the adapter
(n = 1 per task). Prints one ``FAMILY_E2E {json}`` line per family: seconds of warm start,
training (the whole ``train.main`` call), each step (the ledger's ``wall_s``) and eval, the
eval's resolved / unknown slots, peak CUDA memory (GiB; None on CPU). Exit 1 when a family
did not train, did not produce an adapter, or left every eval slot unknown.
``scripts/gpu_check.sh`` runs it (step 5).

    python benchmarks/family_e2e.py [--families llama3_2 gptoss qwen2_5] [--bf16]
        [--device cuda] [--runtime podman] [--cache DIR] [--out DIR] [--dry-run]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from sandbox.bounds import ArgumentParser, Choice, OutDir, Text

DEFAULT_FAMILIES = ("llama3_2", "gptoss", "qwen2_5")


def train_argv(policy: str, split: str, runs: str, runtime: str, bf16: bool) -> list[str]:
    """``train.py`` arguments of the family run (as ``tests/test_family_e2e.py``)."""
    return ["--arm", "M", "--model", policy, "--tasks", split, "--max_steps", "2",
            "--bf16", str(bf16).lower(), "--lora_r", "8", "--gradient_checkpointing", "true",
            "--max_turns", "4", "--max_completion_length", "1024", "--runs_dir", runs,
            "--save_strategy", "no", "--runtime", runtime]


def run_family(fam: str, tasks, split: Path, out: Path, args) -> dict:
    """Warm start, train, evaluate one family; returns its figures."""
    import torch

    from ecredit_trl.policy.family_warmstart import ensure_family_policy
    from ecredit_trl.train import main as train_main
    from eval.evaluation.options import EvalOptions
    from eval.run import evaluate
    from sandbox.backend import SandboxOptions

    cuda = args.device.startswith("cuda")
    t0 = time.monotonic()
    policy = ensure_family_policy(fam, tasks, cache_dir=args.cache, log=None)
    t_warm = time.monotonic() - t0
    runs = out / fam / "runs"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t1 = time.monotonic()
    rc = train_main(train_argv(policy, str(split), str(runs), args.runtime, args.bf16))
    t_train = time.monotonic() - t1
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    ledger = [json.loads(x) for x in (run / "ledger.jsonl").read_text().splitlines() if x]
    t2 = time.monotonic()
    res = evaluate(EvalOptions(model=str(run / "checkpoint-final"), split=str(split), n=1,
                               out=out / fam / "eval", device=args.device, max_turns=4),
                   runtime=SandboxOptions(kind=args.runtime), log=lambda *_: None)
    t_eval = time.monotonic() - t2
    s = res["summary"]
    return {"family": fam, "exit": rc, "adapter": bool(res["model"].get("adapter")),
            "warmstart_s": round(t_warm, 1), "train_s": round(t_train, 1),
            "step_s": [r["wall_s"] for r in ledger], "eval_s": round(t_eval, 1),
            "eval_resolved": s["resolved"], "eval_unknown": s["unknown"],
            "eval_slots": s["denominator"]["slots"],
            "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda
            else None}


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, run each family, print its ``FAMILY_E2E`` line; exit status."""
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", type=Text(), nargs="+", default=list(DEFAULT_FAMILIES),
                    help="TRL template names (ecredit_trl.policy.families.FAMILIES)")
    ap.add_argument("--bf16", action="store_true", help="train in bf16 (CUDA)")
    ap.add_argument("--device", type=Text(), default="cpu", help="torch device of eval.run's rollouts")
    ap.add_argument("--runtime", type=Choice("podman", "local"), default="podman", help="podman | local")
    ap.add_argument("--cache", type=OutDir(), default=None,
                    help="cache root of the warm-started models (a fresh one times the warm start)")
    ap.add_argument("--out", type=OutDir(), default=None, help="work folder (default: a temp dir)")
    ap.add_argument("--dry-run", action="store_true",
                    help="check the family names and train.py flags only")
    args = ap.parse_args(argv)

    from ecredit_trl.policy.families import FAMILIES
    from ecredit_trl.train import parse_args

    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        print(f"--families: unknown template(s) {unknown}; known: {', '.join(FAMILIES)}",
              file=sys.stderr)
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="family-e2e-"))
    # the flags only: a task source that exists (the real split is written below)
    cfg, margs = parse_args(train_argv("PATH", "bundled:train", str(out / "runs"), args.runtime,
                                       args.bf16))
    assert cfg.gradient_checkpointing and margs.lora_r == 8 and cfg.bf16 == args.bf16
    print(f"flags ok; families {args.families}; work folder {out}", flush=True)
    if args.dry_run:
        return 0
    from ecredit_trl.policy.family_warmstart import default_tasks
    from eval.tasks.schema import save_tasks

    tasks = default_tasks()
    split = out / "tasks.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    save_tasks(tasks, split)
    failed = 0
    for fam in args.families:
        r = run_family(fam, tasks, split, out, args)
        failed += not (r["exit"] == 0 and r["adapter"] and r["eval_unknown"] < r["eval_slots"])
        print("FAMILY_E2E " + json.dumps(r), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
