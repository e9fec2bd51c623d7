"""``--model HUB_ID`` with ``HF_HUB_OFFLINE=1`` loads a model from the local hub
cache layout; an absent one is one line saying where it was looked for."""

import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A hub cache holding ``tiny-org/tiny-qwen`` as huggingface_hub lays it out."""
    from ecredit_trl.policy.families import ensure_family_model

    cache = tmp_path / "hf" / "hub"
    repo = cache / "models--tiny-org--tiny-qwen"
    shutil.copytree(ensure_family_model("qwen2_5"), repo / "snapshots" / REV)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_a_cached_hub_model_loads(hub):
    from ecredit_trl.agent.generation import load_rollout_policy
    from ecredit_trl.policy.preflight import model_location
    from eval.evaluation.modelref import resolve_model

    snap = hub / "models--tiny-org--tiny-qwen" / "snapshots" / REV
    assert model_location("tiny-org/tiny-qwen") == str(snap)
    ref = resolve_model("tiny-org/tiny-qwen")
    assert ref.model_dir == str(snap.resolve()) and ref.given == "tiny-org/tiny-qwen"
    policy = load_rollout_policy("tiny-org/tiny-qwen", device="cpu")
    assert policy.model.config.model_type == "qwen2"
    # the layout is the one huggingface_hub itself reads offline (fresh process: it reads
    # HF_HOME at import)
    code = ("from transformers import AutoModelForCausalLM as M; "
            "print(M.from_pretrained('tiny-org/tiny-qwen').config.model_type)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))
    assert proc.returncode == 0 and proc.stdout.split()[-1] == "qwen2", proc.stderr[-2000:]


def test_an_absent_hub_model_is_one_line(hub, tmp_path):
    where = hub / "models--tiny-org--absent"
    line = (f"--model tiny-org/absent: not in the local hub cache (looked for {where}/refs/main"
            f" -> snapshots/<commit>/config.json; HF_HUB_OFFLINE=1, so nothing is downloaded);"
            f" fetch it with `hf download tiny-org/absent` (set HF_HOME or HF_HUB_CACHE to the "
            f"cache it went to) or pass a model directory")
    runs = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "ecredit_trl/train.py", "--arm", "M", "--model",
                           "tiny-org/absent", "--runtime", "local", "--runs_dir", str(runs)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))
    assert proc.returncode == 2
    assert [ln for ln in proc.stderr.splitlines() if ln.strip()][-1] == f"train.py: error: {line}"
    assert not runs.exists() or list(runs.iterdir()) == []

    from eval.evaluation.modelref import resolve_model

    with pytest.raises(FileNotFoundError) as err:
        resolve_model("tiny-org/absent")
    assert str(err.value) == line
