"""Training against a vLLM server on this host (``--use_vllm true --vllm_mode server``): the
server started by ``python -m ecredit_trl.agent.vllm_serve`` on 127.0.0.1, the file weight
route a CPU trainer takes (the server reloads each step's weights; afterwards its greedy tokens
equal transformers' on the pushed weights), the refusal of a server whose weights are not the
trainer's step, and the one-line refusal of an address nothing listens on. Needs vLLM
(vllm-cpu on a CPU host)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from conftest import REPO_ROOT

from ecredit_trl.policy.sft import without_dist_env

pytestmark = [pytest.mark.podman,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vllm is not installed")]

CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _env(**extra) -> dict:
    """This process's environment without the rendezvous variables, with ``extra``: a
    colocated engine earlier in the session (TRL sets them in the test process) must not hand
    its port to the server and the trainer, which would then both bind it (EADDRINUSE)."""
    return {**without_dist_env(), **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def warm_policy():
    from ecredit_trl.policy.warmstart import ensure_default_policy
    from eval.tasks.splits import load_tasks

    return ensure_default_policy(load_tasks("bundled:train", purpose="train"))


@pytest.fixture(scope="module")
def server(warm_policy, tmp_path_factory):
    """One server on the embedded policy (float32, eager) for the module; stopped after."""
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = _env(**{k: os.environ.get(k, v) for k, v in CPU_ENV.items()})
    with log.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "ecredit_trl.agent.vllm_serve",
                                 "--model", str(warm_policy), "--port", str(port),
                                 "--dtype", "float32"], cwd=REPO_ROOT, env=env, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 480
    try:
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.time() < deadline, log.read_text()[-3000:]
            time.sleep(2)
        yield {"url": url, "port": port, "model": str(warm_policy)}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _greedy(url: str, model: str, prompt: list[int], n: int = 12) -> list[int]:
    r = requests.post(f"{url}/v1/completions", timeout=120, json={
        "model": model, "prompt": prompt, "max_tokens": n, "temperature": 0,
        "return_token_ids": True, "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_a_fresh_server_reports_its_initial_weights_and_is_refused(server, tmp_path):
    """A server started on other weights (never reloaded by this trainer) is refused."""
    from ecredit_trl.agent.vllm_server import FileWeightRoute, StaleServerWeights

    route = FileWeightRoute(server["url"], tmp_path / "w")
    assert route.version() == "initial"
    with pytest.raises(StaleServerWeights, match="no weights pushed at trainer step 0"):
        route.require(0)
    route.pushed = (0, "step-0-0123456789abcdef")  # written, but the server never reloaded
    with pytest.raises(StaleServerWeights, match="holds weights 'initial'.*stale"):
        route.require(0)


def test_the_file_route_makes_the_server_compute_with_the_pushed_weights(server, tmp_path):
    """Perturbed weights pushed through the route: the server's greedy tokens change, and
    equal transformers' on the perturbed weights (float32 both)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ecredit_trl.agent.vllm_server import FileWeightRoute

    hf = AutoModelForCausalLM.from_pretrained(server["model"], dtype=torch.float32)
    prompt = [int(t) for t in torch.arange(5, 45, 3)]

    def hf_greedy():
        return hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                           eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()

    before = _greedy(server["url"], server["model"], prompt)
    assert before == hf_greedy()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    route = FileWeightRoute(server["url"], tmp_path / "w")
    version = route.push(hf.named_parameters(), 5, tie_word_embeddings=True)
    assert route.version() == version and version.startswith("step-5-")
    after = _greedy(server["url"], server["model"], prompt)
    assert after == hf_greedy() and after != before


def test_train_server_mode_reloads_each_step_and_refuses_stale_weights(server, tmp_path):
    """Two GRPO steps (arm O: no counterfactual trials, the cheapest) through the server:
    the trainer pushes the weights of steps 0 and 1 (the version names the file's sha256),
    the server's greedy tokens then equal transformers' on the pushed weights, and a trainer
    whose step moved on without a push (or whose push the server did not take) is refused."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from ecredit_trl.agent.vllm_server import FileWeightRoute, StaleServerWeights

    runs = tmp_path / "runs"
    cmd = [str(Path(sys.executable).with_name("accelerate")), "launch", "--num_processes", "1",
           "ecredit_trl/train.py", "--arm", "O", "--runs_dir", str(runs), "--max_steps", "2",
           "--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_host", "127.0.0.1",
           "--vllm_server_port", str(server["port"]), "--vllm_server_timeout", "30"]
    env = _env(**CPU_ENV)
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
                          env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (run,) = list(runs.iterdir())
    ledger = _jsonl(run / "ledger.jsonl")
    assert [r["step"] for r in ledger] == [1, 2]
    trajs = _jsonl(run / "trajectories.jsonl")
    assert len(trajs) == sum(r["rollouts"] for r in ledger) and trajs
    assert sum(r["trials_factual"] for r in ledger) == len(trajs)

    # the last push: step 1's weights (step 2 ended the run), the version is the file's
    (wdir,) = list((run / "vllm_weights").iterdir())
    assert wdir.name == "step-1"
    sha = hashlib.sha256((wdir / "model.safetensors").read_bytes()).hexdigest()
    route = FileWeightRoute(server["url"], run / "vllm_weights")
    assert route.version() == f"step-1-{sha[:16]}"

    # the server computes with the pushed weights: greedy tokens equal transformers' on them
    hf = AutoModelForCausalLM.from_pretrained(server["model"], dtype=torch.float32)
    pushed = load_file(str(wdir / "model.safetensors"))
    assert set(pushed) >= {n for n, _ in hf.named_parameters()} | {"lm_head.weight"}
    hf.load_state_dict(pushed, strict=False)
    prompt = [int(t) for t in torch.arange(5, 45, 3)]
    want = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                       eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert _greedy(server["url"], server["model"], prompt) == want

    # stale: the trainer at step 2 with no push of step 2, or a push the server did not take
    route.pushed = (1, f"step-1-{sha[:16]}")
    route.require(1)  # the server holds them
    with pytest.raises(StaleServerWeights, match="no weights pushed at trainer step 2"):
        route.require(2)
    route.pushed = (2, "step-2-0000000000000000")
    with pytest.raises(StaleServerWeights, match=f"holds weights 'step-1-{sha[:16]}'"):
        route.require(2)


def test_server_mode_with_nothing_listening_is_one_line_before_any_rollout(tmp_path):
    """Exit 2, one line naming the fields and the command that starts a server; no run
    directory (TRL alone would wait ``vllm_server_timeout`` and fail mid-setup)."""
    port = _free_port()
    cmd = [sys.executable, "ecredit_trl/train.py", "--arm", "O", "--runs_dir",
           str(tmp_path / "runs"), "--max_steps", "1", "--use_vllm", "true",
           "--vllm_mode", "server", "--vllm_server_host", "127.0.0.1",
           "--vllm_server_port", str(port)]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env=_env(**CPU_ENV))
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = [x for x in proc.stderr.splitlines() if "error" in x]
    assert err == [f"train.py: error: vllm_server_host/vllm_server_port: nothing listens on "
                   f"127.0.0.1:{port} (Connection refused); start the server first (python -m "
                   f"ecredit_trl.agent.vllm_serve --model M --host 127.0.0.1 --port {port}) or "
                   "use --vllm_mode colocate"], proc.stderr[-2000:]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert time.time() - t0 < 120
