#!/usr/bin/env bash
# GPU readiness check, for a CUDA machine: set up with scripts/setup.sh and a CUDA build of
# torch (TORCH_SPEC is one pip requirement: PyPI's plain torch==2.13.0 wheel for Linux x86-64 is
# a CUDA build when pip is not pointed at a CPU-only wheel source), or the host's own Python
# with the pure-Python dependencies installed offline from a wheel folder (docs/benchmarks.md,
# "GPU check"); no Podman needed (GPU_CHECK_RUNTIME=local).
#
#   scripts/gpu_check.sh            # on the GPU host: everything, at most 9 minutes
#   scripts/gpu_check.sh --dry-run  # anywhere: lists the steps; flags parse, test ids exist
#   scripts/gpu_check.sh --cpu      # no GPU: the same steps on CPU at toy size
#
# Steps, in this order (each under `timeout`; a step the budget - GPU_CHECK_BUDGET_S, default
# 540 s, 1200 s with --cpu - can no longer hold is skipped and said so, so the first ones are
# what users ask):
#   1. device: torch version, CUDA device name, bf16 support;
#   1b. caches: the bundled tasks and the warm-started embedded policy (built on first use on a
#      fresh host: minutes; reused after), so the timed steps measure training, not the builds;
#   2. main job: the embedded policy, arm M, 2 GRPO steps, bf16 + LoRA (r 8) + gradient
#      checkpointing, in-process so the peak CUDA memory (torch.cuda.max_memory_allocated) is read;
#      step time = the ledger rows' wall_s;
#   3. real size: benchmarks/real_size_step.py, random weights of the Qwen2.5-1.5B and
#      Qwen2.5-7B shapes (no download), arm M, LoRA r 16, bf16, gradient checkpointing,
#      4 rollouts x 1,024 generated tokens, one step: peak CUDA memory and step time
#      (--cpu: the toy shape, 4 x 16 tokens); the 7B model stays for step 4;
#   4. generation speed: benchmarks/generation_speed.py on that 7B model, ms per decode step and
#      tokens/s of plain generate and the rollout sampler at batch 1 / 4 / 8 / 32 beside the
#      weight-read floor, then their static-cache (compiled) variants at batch 4
#      (--cpu: a random model of the embedded shape, batch 1 / 4);
#   5. trainer tests on the device (Podman only): tests/test_train.py (arm M),
#      tests/test_train_lora.py;
#   6. benchmarks/step_pipeline.py, 2 steps, verifier/agent concurrency 8 (the host's cores),
#      on the check's runtime (every step that runs trials takes GPU_CHECK_RUNTIME);
#   7. family end to end in bf16 (--cpu: llama3_2 only): for each of GPU_CHECK_FAMILIES (default "llama3_2 gptoss
#      qwen2_5") benchmarks/family_e2e.py warm-starts the tiny family model, trains 2 GRPO steps
#      of arm M (bf16, LoRA r 8, gradient checkpointing) and grades its adapter with eval.run;
#   8. benchmarks/generation_engines.py (when vllm imports): transformers generate vs vLLM.
# Then a summary: device, each step's status and seconds, the main job's and each real-size
# step's time and peak memory. Env: PY (python, default .venv/bin/python, else python3),
# GPU_CHECK_OUT (work dir, default a temp dir; the 7B model, 15 GB, is removed at the end),
# GPU_CHECK_RUNTIME (podman | local; default podman when `podman` runs, else local, and the
# Podman-marked tests are skipped), GPU_CHECK_BUDGET_S. Exit status: 0 all steps passed or
# skipped, 1 a step failed, 2 no CUDA device (without --cpu / --dry-run).
set -uo pipefail
cd "$(dirname "$0")/.."

MODE=gpu
case "${1:-}" in
  --dry-run) MODE=dry ;;
  --cpu) MODE=cpu ;;
  "") ;;
  *) echo "usage: $0 [--dry-run | --cpu]" >&2; exit 2 ;;
esac
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
OUT=${GPU_CHECK_OUT:-$(mktemp -d -t gpu-check-XXXXXX)}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/sandbox/containers.conf}
if [ -z "${GPU_CHECK_RUNTIME:-}" ]; then
  if podman info >/dev/null 2>&1; then GPU_CHECK_RUNTIME=podman; else GPU_CHECK_RUNTIME=local; fi
fi
# --cpu runs the same steps at toy size on a CPU, which is slower than the GPU's 9 minutes: its
# own default budget (the GPU run's is the one users wait for)
if [ "$MODE" = cpu ]; then BUDGET_S=${GPU_CHECK_BUDGET_S:-1200}; else BUDGET_S=${GPU_CHECK_BUDGET_S:-540}; fi
START=$(date +%s)
declare -a SUMMARY=()
FAILED=0

left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }

# step NAME LIMIT_S CMD...: run CMD under `timeout LIMIT_S` (less when the budget is short);
# --dry-run lists it first
step() {
  local name=$1 limit=$2; shift 2
  [ "$MODE" = dry ] && echo "[gpu_check] step $name: $*"
  local have; have=$(left)
  if [ "$have" -lt 20 ]; then
    SUMMARY+=("$name: skipped (budget of ${BUDGET_S} s spent)"); return 0
  fi
  [ "$limit" -gt "$have" ] && limit=$have
  echo "[gpu_check] $name (limit ${limit} s): $*"
  local t0 rc; t0=$(date +%s)
  timeout --kill-after=15 "$limit" "$@" 2>&1 | tee "$OUT/$name.log" | tail -n 25
  rc=${PIPESTATUS[0]}
  local dt=$(( $(date +%s) - t0 ))
  if [ "$rc" -eq 0 ]; then SUMMARY+=("$name: ok in ${dt} s")
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then SUMMARY+=("$name: TIMEOUT after ${dt} s"); FAILED=1
  else SUMMARY+=("$name: FAILED (exit $rc) in ${dt} s; log $OUT/$name.log"); FAILED=1
  fi
  return 0
}

# 1. device
step device 60 "$PY" -c '
import json, torch
d = {"torch": torch.__version__, "cuda": torch.version.cuda,
     "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
     "bf16": bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())}
print(json.dumps(d))'
if [ "$MODE" = gpu ] && ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "[gpu_check] no CUDA device visible to torch: install a CUDA build (TORCH_SPEC=... scripts/setup.sh)," \
       "or run with --cpu / --dry-run" >&2
  exit 2
fi

# 0. caches (bundled tasks + the embedded policy's warm start; no-ops when cached)
if [ "$MODE" != dry ]; then
  step caches 200 "$PY" -c '
from eval.tasks.splits import load_tasks
from ecredit_trl.policy.warmstart import ensure_default_policy
print("policy:", ensure_default_policy(load_tasks("bundled:train", purpose="train")))'
fi

# 2. main job (in-process: peak CUDA memory; --dry-run only parses the flags)
step main-job 120 "$PY" - "$MODE" "$OUT/runs" "$GPU_CHECK_RUNTIME" <<'EOF'
import json, sys, time
from pathlib import Path
import torch
mode, runs, runtime = sys.argv[1:4]
steps = "1" if mode == "cpu" else "2"  # CPU: one step proves the flags run (bf16 on CPU is slow)
argv = ["--arm", "M", "--max_steps", steps, "--bf16", "true", "--lora_r", "8",
        "--lora_alpha", "16", "--gradient_checkpointing", "true", "--runs_dir", runs,
        "--runtime", runtime]
from ecredit_trl.train import main, parse_args
cfg, margs = parse_args(list(argv))
print(f"flags: bf16={cfg.bf16} gradient_checkpointing={cfg.gradient_checkpointing} "
      f"lora_r={margs.lora_r} max_steps={cfg.max_steps} use_cpu={cfg.use_cpu} runtime={cfg.runtime}")
assert cfg.bf16 and cfg.gradient_checkpointing and margs.lora_r == 8 and cfg.max_steps == int(steps)
if mode == "dry":
    sys.exit(0)
cuda = torch.cuda.is_available() and mode == "gpu"
if cuda:
    torch.cuda.reset_peak_memory_stats()
t0 = time.time()
rc = main(argv)
wall = time.time() - t0
(run,) = [p for p in Path(runs).iterdir() if p.is_dir()]
ledger = [json.loads(x) for x in (run / "ledger.jsonl").read_text().splitlines() if x.strip()]
steps = [r["wall_s"] for r in ledger]
print("GPU_CHECK " + json.dumps({
    "exit": rc, "run": str(run), "job_s": round(wall, 1), "step_s": steps,
    "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None}))
sys.exit(rc)
EOF

# 3. real-size steps (random weights of real shapes; --cpu: the toy shape; --dry-run: flags)
mkdir -p "$OUT/models"
if [ "$MODE" = dry ]; then
  step real-size 90 "$PY" benchmarks/real_size_step.py --shape 1.5B 7B --dry-run \
    --runtime "$GPU_CHECK_RUNTIME"
elif [ "$MODE" = gpu ]; then
  step real-size-1.5B 180 "$PY" benchmarks/real_size_step.py --shape 1.5B --device cuda \
    --runtime "$GPU_CHECK_RUNTIME" --out "$OUT/real-1.5B"
  step real-size-7B 210 "$PY" benchmarks/real_size_step.py --shape 7B --device cuda \
    --runtime "$GPU_CHECK_RUNTIME" --out "$OUT/real-7B" --keep "$OUT/models"
else
  step real-size-toy 240 "$PY" benchmarks/real_size_step.py --shape toy --device cpu \
    --completion-tokens 16 --runtime "$GPU_CHECK_RUNTIME" --out "$OUT/real-toy"
fi

# 4. generation speed (the 7B of step 3 on a GPU; a random model of the embedded shape on CPU)
if [ "$MODE" = dry ]; then
  step generation-speed 60 "$PY" benchmarks/generation_speed.py --help
elif [ "$MODE" = gpu ] && [ -f "$OUT/models/7B/config.json" ]; then
  step generation-speed 120 "$PY" benchmarks/generation_speed.py --model "$OUT/models/7B" \
    --device cuda --batch 1 4 8 32 --new-tokens 32 --repeats 1 --engines plain sampler \
    --json "$OUT/generation_speed.json"
  step generation-speed-static 120 "$PY" benchmarks/generation_speed.py \
    --model "$OUT/models/7B" --device cuda --batch 4 --new-tokens 32 --repeats 1 \
    --engines plain plain-static sampler-static --json "$OUT/generation_speed_static.json"
elif [ "$MODE" = gpu ]; then
  SUMMARY+=("generation-speed: skipped (no 7B model: step real-size-7B did not finish)")
else
  step generation-speed 180 "$PY" benchmarks/generation_speed.py --model random --device cpu \
    --batch 1 4 --new-tokens 8 --repeats 1 --json "$OUT/generation_speed.json"
fi
rm -rf "$OUT/models"

# 5. trainer tests on the device
TESTS=("tests/test_train.py::test_each_arm_runs_two_steps[M]" tests/test_train_lora.py)
if [ "$MODE" = dry ]; then  # the test ids exist
  step trainer-tests 60 "$PY" -m pytest -q --collect-only "${TESTS[@]}"
elif [ "$GPU_CHECK_RUNTIME" = podman ]; then
  step trainer-tests 150 "$PY" -m pytest -q -x "${TESTS[@]}"
else
  SUMMARY+=("trainer-tests: skipped (they need Podman; none here)")
fi

# 6. the step pipeline benchmark (short: 2 steps; 16-core host: 8 trials / tool calls at once)
if [ -f benchmarks/step_pipeline.py ] && [ "$MODE" = dry ]; then
  step step-pipeline 60 "$PY" benchmarks/step_pipeline.py --help
elif [ -f benchmarks/step_pipeline.py ]; then
  step step-pipeline 200 "$PY" benchmarks/step_pipeline.py --steps 2 --verifier-concurrency 8 \
    --agent-concurrency 8 --runtime "$GPU_CHECK_RUNTIME"
else
  SUMMARY+=("step-pipeline: skipped (benchmarks/step_pipeline.py not in this checkout)")
fi

# 7. family end to end in bf16 (--dry-run: the flags and the family names only)
# --cpu: one family proves the flags run (three took over the step's 200 s on 2 loaded cores)
if [ "$MODE" = cpu ]; then FAMILIES_E2E=${GPU_CHECK_FAMILIES:-llama3_2}
else FAMILIES_E2E=${GPU_CHECK_FAMILIES:-llama3_2 gptoss qwen2_5}; fi
if [ "$MODE" = dry ]; then FAMILY_FLAGS=(--dry-run)
elif [ "$MODE" = gpu ]; then FAMILY_FLAGS=(--bf16 --device cuda)
else FAMILY_FLAGS=(--bf16 --device cpu)
fi
# shellcheck disable=SC2086  # one argument per family name
step family-e2e 200 "$PY" benchmarks/family_e2e.py --families $FAMILIES_E2E "${FAMILY_FLAGS[@]}" \
  --runtime "$GPU_CHECK_RUNTIME" --out "$OUT/family"

# 8. generation engines (vLLM installed only)
if ! "$PY" -c 'import vllm' >/dev/null 2>&1; then
  SUMMARY+=("generation-engines: skipped (vllm is not installed)")
elif [ "$MODE" = dry ]; then
  step generation-engines 60 "$PY" benchmarks/generation_engines.py --help
elif [ "$MODE" = gpu ]; then
  step generation-engines 180 "$PY" benchmarks/generation_engines.py --hidden 2048 --layers 16 \
    --json "$OUT/generation_engines.json"
else
  # --cpu: the embedded model at batches 1 and 8 (both models, or batch 32, took past the
  # step's limit on 2 loaded cores: vLLM's CPU start alone took 35-90 s a model)
  step generation-engines 300 "$PY" benchmarks/generation_engines.py --which embedded \
    --batch 1 8 --new-tokens 16 --json "$OUT/generation_engines.json"
fi

echo
echo "[gpu_check] summary ($MODE mode, runtime $GPU_CHECK_RUNTIME, $(( $(date +%s) - START )) s of ${BUDGET_S}; logs in $OUT)"
[ -f "$OUT/device.log" ] && echo "  device: $(tail -n 1 "$OUT/device.log")"
if [ -f "$OUT/main-job.log" ] && grep -q '^GPU_CHECK ' "$OUT/main-job.log"; then
  "$PY" - "$OUT/main-job.log" <<'EOF'
import json, sys
line = [x for x in open(sys.argv[1]) if x.startswith("GPU_CHECK ")][-1]
r = json.loads(line[len("GPU_CHECK "):])
steps = r["step_s"]
mean = sum(steps) / len(steps) if steps else float("nan")
mem = "n/a (no CUDA)" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']} GiB"
print(f"  main job: exit {r['exit']}, {r['job_s']} s, step time {mean:.1f} s "
      f"(per step {steps}), peak CUDA memory {mem}")
EOF
fi
for f in "$OUT"/real-size-*.log; do
  [ -f "$f" ] && grep '^REAL_SIZE ' "$f" | sed 's/^REAL_SIZE /  real size: /'
done
for f in "$OUT"/generation-speed*.log; do  # the benchmark's table (ms per decode step, floor)
  [ -f "$f" ] && grep -A 8 '^| batch |' "$f" | grep '^|' | sed 's/^/  /'
done
[ -f "$OUT/family-e2e.log" ] && grep '^FAMILY_E2E ' "$OUT/family-e2e.log" | sed 's/^FAMILY_E2E /  family: /'
for line in "${SUMMARY[@]}"; do echo "  $line"; done
exit $FAILED
