"""--use-vllm without vLLM: the settings → SamplingParams mapping, per-turn
request seeds, the request building and EOS/limit cutting against a stand-in LLM, the clear
error when vLLM is missing, and the flags eval.run passes to the rollout subprocess. vLLM
itself cannot run here (not installed, no GPU): VLLMEngine.from_policy is untested."""

from __future__ import annotations

import importlib.util
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
