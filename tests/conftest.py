"""Shared fixtures: a Podman runtime for the suite, tiny git repositories."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parent.parent


def make_tar(files: dict[str, str | bytes]) -> bytes:
    """Tar bytes holding ``files`` (path -> content)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            raw = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(raw))
    return buf.getvalue()


def git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@e", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()


@pytest.fixture(scope="session")
def podman_runtime():
    """One PodmanRuntime (own service) for the whole session; checks no container leaks."""
    from sandbox.images import build_offline
    from sandbox.runtimes.podman_runtime import PodmanRuntime, gc

    build_offline(log=lambda *_: None)
    rt = PodmanRuntime()
    yield rt
    rt.close()
    leftovers = gc(rt.run_id)
    assert leftovers == [], f"containers left after the suite: {leftovers}"


@dataclass
class AgentTask:
    """The fields of a task row an agent session needs (a stand-in for ``eval.tasks.schema.Task``)."""

    instance_id: str
    repo_dir: str
    base_commit: str
    image: str
    workdir: str = "/testbed"


@pytest.fixture
def calc_task(tmp_path):
    """A one-file repository whose ``add`` subtracts (the bug), as an :class:`AgentTask`."""
    from sandbox.images import default_image

    repo = tmp_path / "origin"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    return AgentTask("demo__calc-1", str(repo), git(repo, "rev-parse", "HEAD"), default_image())


def swebench_resolved(tmp_path: Path, log_text: str, f2p, p2p, parser_name: str) -> bool:
    """swebench's own end-to-end verdict (get_eval_report on a log file)."""
    from swebench.harness.grading import get_eval_report
    from swebench.types import TestSpec as SweTestSpec

    path = tmp_path / "swebench_test_output.txt"
    path.write_text(log_text)
    spec = SweTestSpec(
        instance_id="x__y-1", image="", eval_script_list=[], repo="x/y", version="0",
        FAIL_TO_PASS=list(f2p), PASS_TO_PASS=list(p2p), log_parser=parser_name,
        eval_type="pass_and_fail",
    )
    pred = {"instance_id": "x__y-1", "model_patch": "diff", "model_name_or_path": "m"}
    return get_eval_report(spec, pred, str(path), include_tests_status=False)["x__y-1"][
        "resolved"
    ]


def write_jsonl(path, rows) -> str:
    """Write ``rows`` as JSON lines to ``path``; returns the path as a string."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def ds_dir(tmp_path, monkeypatch):
    """An empty datasets folder (``ECREDIT_DATASETS_DIR``) for sealing tests."""
    d = tmp_path / "datasets"
    d.mkdir()
    monkeypatch.setenv("ECREDIT_DATASETS_DIR", str(d))
    return d


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    """A random tiny Llama + BPE with the qwen3 template: makes format errors, exercises all."""
    from ecredit_trl.policy.tiny_model import build_model, build_tokenizer

    out = tmp_path_factory.mktemp("policy")
    corpus = ["Fix the bug in the repository.", '<tool_call>\n{"name": "submit", '
              '"arguments": {}}\n</tool_call>'] * 10
    tok = build_tokenizer(corpus, vocab_size=300)
    build_model(tok, seed=0).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def warm_policy():
    """The embedded policy warm-started on ``bundled:train`` (built once, cached under
    ``$ECREDIT_CACHE``): its model directory."""
    from ecredit_trl.policy.warmstart import ensure_default_policy
    from eval.tasks.splits import load_tasks

    return ensure_default_policy(load_tasks("bundled:train", purpose="train"))


#: A random Qwen2 of the qwen2_5 family whose head size vLLM's CPU attention takes (32; the
#: family default 16 is not among its sizes).
VLLM_SHAPE = {"hidden_size": 128, "intermediate_size": 256, "head_dim": 32}


@pytest.fixture(scope="session")
def vllm_tiny_model(tmp_path_factory):
    """Directory of that model (weights, tokenizer with TRL's qwen2_5 template)."""
    from ecredit_trl.policy.families import build_family_model, build_family_tokenizer, family

    path = tmp_path_factory.mktemp("vllm-model")
    fam = family("qwen2_5")
    tok = build_family_tokenizer(fam)
    build_family_model(fam, tok, shape=VLLM_SHAPE).save_pretrained(path)
    tok.save_pretrained(path)
    return path
