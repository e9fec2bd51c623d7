"""vLLM colocate mode on this CPU host, with TRL's real trainer and a real ``vllm.LLM``
(:mod:`ecredit_trl.policy.vllm_sync`): the weights reach the engine before every generation
round (vLLM's greedy tokens equal HF's on the trained weights after the sync and differ before
it), a LoRA run pushes the merged weights, and TRL's importance-sampling correction composes
with per-token advantages (the gradient equals the HF-generation path's on the same batch).

One engine start per trainer (``enforce_eager`` on CPU: ~11 s each); the model is a random
Qwen2 of the qwen2_5 family with head size 32 (vLLM's CPU attention takes 32, 64, 80, ...).
"""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig
from trl import GRPOConfig, GRPOTrainer

from datasets import Dataset
from ecredit_trl.policy.sft import DIST_ENV
from ecredit_trl.policy.vllm_sync import (
    colocate_engine,
    colocate_llm_kwargs,
    install_weight_route,
    weight_route,
)

pytestmark = pytest.mark.slow

PROMPT = list(range(40, 60))
GREEDY_TOKENS = 24
def test_the_route_and_engine_options_follow_the_device():
    assert weight_route("cpu", "colocate") == "reload"
    assert weight_route("cuda", "colocate") == "trl"  # TRL's own push on CUDA
    assert weight_route("cpu", "server") == "trl"
    assert colocate_llm_kwargs("cpu", torch.float32) == {"dtype": "float32", "enforce_eager": True}
    assert colocate_llm_kwargs("cuda", torch.bfloat16) == {}  # TRL's engine as it is


class _Trainer(GRPOTrainer):
    """TRL's trainer with this project's colocate hooks (as ECreditGRPOTrainer installs them);
    every sync is spied on: greedy tokens of both engines before and after it."""

    def __init__(self, *, model, args, **kw):
        with colocate_engine(args, model):
            super().__init__(model=model, args=args, **kw)
        self.vllm_weight_route = install_weight_route(self)
        self.syncs: list[tuple[bool, bool]] = []
        real = self.vllm_generation.sync_weights

        def spy():
            before = vllm_greedy(self) == hf_greedy(self)
            real()
            self.syncs.append((before, vllm_greedy(self) == hf_greedy(self)))
        self.vllm_generation.sync_weights = spy


def vllm_greedy(trainer) -> list[int]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS, ignore_eos=True)
    out = trainer.vllm_generation.llm.generate([TokensPrompt(prompt_token_ids=PROMPT)], sp,
                                               use_tqdm=False)
    return list(out[0].outputs[0].token_ids)


def hf_greedy(trainer) -> list[int]:
    model = trainer.model
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([PROMPT]), max_new_tokens=GREEDY_TOKENS,
                             min_new_tokens=GREEDY_TOKENS, do_sample=False, disable_compile=True)
    return out[0, len(PROMPT):].tolist()


def _reward(completions, **kw):
    return [float(len(set(c))) / (1 + len(c)) for c in completions]


@pytest.fixture(autouse=True)
def _rendezvous(monkeypatch):
    """A free MASTER_PORT for this test's engine; TRL's colocate mode writes RANK, WORLD_SIZE,
    MASTER_ADDR, ... into this process's environment, and monkeypatch restores them after the
    test, so later tests' subprocesses (a vLLM server, a trainer) never inherit one port."""
    import socket

    for name in DIST_ENV:
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("MASTER_PORT", str(s.getsockname()[1]))


def _trainer(model_dir, out, *, lora: bool, steps: int = 2) -> _Trainer:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, report_to="none",
                      save_strategy="no", max_steps=steps, learning_rate=0.2 if lora else 0.05,
                      per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=16, logging_steps=1, use_vllm=True,
                      vllm_mode="colocate", vllm_max_model_length=256,
                      gradient_checkpointing=False, seed=0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = Dataset.from_list([{"prompt": f"task {i} fix the bug"} for i in range(8)])
    peft = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]) if lora else None
    return _Trainer(model=model, args=args, reward_funcs=[_reward], train_dataset=rows,
                    processing_class=tok, peft_config=peft)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_weights_reach_vllm_every_step(vllm_tiny_model, tmp_path, lora):
    trainer = _trainer(vllm_tiny_model, tmp_path, lora=lora)
    assert trainer.vllm_weight_route == "reload"  # the CPU route (TRL's push fails here)
    # the engine runs in float32 on CPU (TRL passes no dtype: it would be bfloat16)
    assert trainer.vllm_generation.llm.llm_engine.model_config.dtype == torch.float32
    before = [p.detach().clone() for p in trainer.model.parameters() if p.requires_grad]
    trainer.train()
    after = [p.detach() for p in trainer.model.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    # one sync per generation round (2 steps): the first on the weights the engine loaded,
    # the second after an optimizer step - the engine's tokens differed and then agreed
    assert trainer.syncs == [(True, True), (False, True)]
    # the final step's update has not been pushed yet (TRL pushes before generating)
    assert vllm_greedy(trainer) != hf_greedy(trainer)
    trainer.vllm_generation.sync_weights()
    assert trainer.syncs[-1] == (False, True)
    if lora:  # what reached vLLM is base + merged adapter: not the base weights alone
        with trainer.model.disable_adapter():
            assert vllm_greedy(trainer) != hf_greedy(trainer)


def test_importance_sampling_composes_with_per_token_credit(vllm_tiny_model, tmp_path):
    """TRL's default IS correction (sequence_mask, clip 3) with (B, T) advantages: the gradient
    is non-zero and equals the one without the correction (the HF-generation path's loss on
    the same batch) within 1e-4 relative, because vLLM in float32 samples the same
    distribution as the trainer (ratio 1 within 1e-4)."""
    trainer = _trainer(vllm_tiny_model, tmp_path, lora=False, steps=1)
    rows = [{"prompt": f"task {i} fix the bug"} for i in range(4)]
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by transformers' training loop
    batch = trainer._generate_and_score_completions(rows)
    ratio = batch["importance_sampling_ratio"]
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-4), ratio
    # (B, T) advantages of the form the trainer injects, (A[:, None] + C) * mask, with a C
    # that varies along the tokens (as on a selected turn)
    mask = batch["completion_mask"]
    C = 0.1 * torch.arange(mask.shape[1])[None, :].float() / mask.shape[1]
    batch["advantages"] = (batch["advantages"][:, None] + C) * mask

    def grads(correction: bool) -> torch.Tensor:
        trainer.model.zero_grad()
        trainer.vllm_importance_sampling_correction = correction
        loss = trainer.compute_loss(trainer.model, dict(batch))
        loss.backward()
        return torch.cat([p.grad.flatten() for p in trainer.model.parameters()
                          if p.grad is not None])

    g_is, g_hf = grads(True), grads(False)
    assert g_is.abs().sum() > 0
    assert torch.allclose(g_is, g_hf, rtol=1e-4, atol=1e-7)

    # The zero-gradient case (docs/vllm.md, "Importance sampling"): when vLLM reports logprob 0
    # for its tokens - what processed logprobs are for tokens a grammar forces
    # (vllm_structured_outputs_regex), the one allowed token having probability 1 - while the
    # trainer's model gives them log p < 0, the sequence ratio exp(sum(log p - 0)) underflows
    # to ~0 and multiplies every token's loss: the gradient vanishes though nothing is masked.
    real = trainer.vllm_generation.generate

    def forced(*a, **kw):
        prompt_ids, completion_ids, logprobs, token_ids = real(*a, **kw)
        return prompt_ids, completion_ids, [[[0.0] for _ in row] for row in logprobs], token_ids
    trainer.vllm_generation.generate = forced
    trainer.vllm_importance_sampling_correction = True
    batch = trainer._generate_and_score_completions(rows)
    assert batch["importance_sampling_ratio"].max() < 1e-6
    batch["advantages"] = (batch["advantages"][:, None] + 0.1) * batch["completion_mask"]
    g_forced = grads(True)
    assert g_forced.abs().max() < 1e-6 * g_hf.abs().max()
