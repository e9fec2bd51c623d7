"""The policy as the rollout loop sees it (:mod:`ecredit_trl.agent.rollouts`): episode and
sampling settings, the per-rollout sampling seed, and a loaded model + tokenizer that renders
prompts, samples one assistant turn and parses its tool calls the way ``GRPOTrainer`` does
(TRL's ``add_response_schema`` / ``parse_response`` / tool-suffix construction).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GenerationSettings", "Policy", "TRL_SAMPLING_DEFAULTS", "cpu_threads",
           "load_rollout_policy", "rollout_seed"]

#: GRPOConfig's sampling defaults (TRL 1.16), used when a bare model dir is given.
TRL_SAMPLING_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": None,
                         "repetition_penalty": 1.0}


@dataclass
class GenerationSettings:
    """Episode and sampling settings of a rollout.

    Attributes:
        max_turns: assistant turns per episode (>= 1); TRL's ``max_tool_calling_iterations``
            is ``max_turns - 1``.
        max_new_tokens: completion budget of the whole episode in tokens (TRL's
            ``max_completion_length``), generated and tool-result tokens together.
        temperature, top_p, top_k, min_p, repetition_penalty: sampling (GRPOConfig meaning;
            ``top_k=0`` disables top-k).
        bash_timeout_s: wall-clock limit of one ``bash`` tool call, seconds.
    """

    max_turns: int = 4
    max_new_tokens: int = 640
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    bash_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_turns, int) or self.max_turns < 1:
            raise ValueError(f"max_turns: must be an int >= 1, got {self.max_turns!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: must be an int >= 1, got {self.max_new_tokens!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature: must be > 0 (sampling), got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p!r}")
        if self.bash_timeout_s <= 0:
            raise ValueError(f"bash_timeout_s: must be > 0, got {self.bash_timeout_s!r}")

    def to_json(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def rollout_seed(seed: int, task_id: str, rollout_index: int) -> int:
    """The sampling seed of one rollout: first 8 bytes of ``sha256(f"{seed}:{task_id}:{i}")``
    as an int below 2**63 (independent of the order rollouts run in)."""
    d = hashlib.sha256(f"{seed}:{task_id}:{rollout_index}".encode()).digest()
    return int.from_bytes(d[:8], "big") & ((1 << 63) - 1)


class Policy:
    """A causal LM + tokenizer ready for TRL-style multi-turn tool calling.

    Attributes:
        model: the LM in eval mode (peft adapters merged).
        tokenizer: with a response template/schema (TRL's ``add_response_schema``).
        chat_template: ``None`` (the tokenizer's own) or TRL's training template, chosen as
            ``GRPOTrainer`` does (``is_chat_template_prefix_preserving``).
        tools: tool schemas in TRL's order (:func:`ecredit_trl.agent.prompts.policy_tools`).
        eos_token_ids: token ids that end an assistant turn.
        max_model_len: the model's context (``max_position_embeddings``), tokens.
        ref: the :class:`eval.modelref.ModelRef` it came from.
    """

    def __init__(self, model, tokenizer, ref) -> None:
        from trl.chat_template_utils import (
            add_response_schema,
            get_training_chat_template,
            is_chat_template_prefix_preserving,
        )

        from ecredit_trl.agent.prompts import policy_tools

        self.model = model
        self.tokenizer = tokenizer
        self.ref = ref
        self.tools = policy_tools()
        if getattr(tokenizer, "response_template", None) is None and getattr(
                tokenizer, "response_schema", None) is None:
            try:
                add_response_schema(tokenizer)
            except ValueError as exc:
                raise ValueError(f"model {ref.model_dir}: tokenizer chat template: {exc}") from None
        self.chat_template = (None if is_chat_template_prefix_preserving(tokenizer)
                              else get_training_chat_template(tokenizer))
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_token_ids = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in self.eos_token_ids:
            self.eos_token_ids.append(tokenizer.eos_token_id)
        self.max_model_len = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.device = next(model.parameters()).device

    def render_prompt(self, messages: list[dict]) -> list[int]:
        """Token ids of ``messages`` with the tool schemas and the generation prompt (as
        ``GRPOTrainer._tokenize_prompts`` renders an ``environment_factory`` prompt)."""
        out = self.tokenizer.apply_chat_template(
            conversation=[messages], tools=self.tools or None, chat_template=self.chat_template,
            add_generation_prompt=True, tokenize=True, return_dict=True)
        return list(out["input_ids"][0])

    def tool_suffix_ids(self, tool_messages: list[dict]) -> list[int]:
        """Token ids appended after an assistant turn for ``tool_messages`` (tool results +
        the next generation prompt): ``GRPOTrainer._get_tool_suffix_ids``'s construction.

        Raises: ValueError when the template does not render the dummy prefix as a prefix.
        """
        dummy_calls = [{"type": "function",
                        "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
        dummy = [{"role": "user", "content": "dummy"},
                 {"role": "assistant", "content": "", "tool_calls": dummy_calls}]
        kw = dict(tokenize=True, chat_template=self.chat_template, return_dict=False)
        prefix = list(self.tokenizer.apply_chat_template(dummy, add_generation_prompt=False, **kw))
        full = list(self.tokenizer.apply_chat_template(dummy + tool_messages,
                                                       add_generation_prompt=True, **kw))
        eos_pos = [i for i, t in enumerate(prefix) if t == self.tokenizer.eos_token_id]
        if eos_pos:
            prefix = prefix[: eos_pos[-1] + 1]
        if full[: len(prefix)] != prefix:
            raise ValueError("chat template: the EOS-trimmed prefix ids are not a prefix of the "
                             "full ids (template not prefix-preserving)")
        return full[len(prefix):]

    def parse(self, ids: list[int], prefix: list[int]) -> dict:
        """TRL's ``parse_response`` of one assistant turn (falls back to plain text)."""
        from trl.chat_template_utils import parse_response

        return parse_response(self.tokenizer, ids, prefix=prefix, tools=self.tools)

    def generate(self, input_ids: list[int], max_new_tokens: int, settings: GenerationSettings,
                 seed: int | None) -> list[int]:
        """Sample one assistant turn; returns the new ids up to and including the first EOS
        (GRPOTrainer keeps exactly those). ``seed`` reseeds torch first (None: continue)."""
        import torch
        from transformers import GenerationConfig

        if seed is not None:
            torch.manual_seed(seed)
        gc = GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=True,
            pad_token_id=self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
            else self.eos_token_ids[0],
            bos_token_id=self.tokenizer.bos_token_id, eos_token_id=self.eos_token_ids,
            temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
            min_p=settings.min_p, repetition_penalty=settings.repetition_penalty,
            disable_compile=True)
        ids = torch.tensor([input_ids], dtype=torch.long, device=self.device)
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      generation_config=gc)
        new = out[0, len(input_ids):].tolist()
        for i, t in enumerate(new):
            if t in self.eos_token_ids:
                return new[: i + 1]
        return new


def cpu_threads() -> int:
    """Intra-op torch threads for CPU generation: ``$ECREDIT_ROLLOUT_THREADS``, else
    ``cpu_count - round(1-minute load)`` (at least 1). On the 2-core reference machine, two
    threads competing with other work generated ~3 tokens/s, one thread ~350 tokens/s."""
    from ecredit_trl.policy.warmstart import torch_threads

    return torch_threads("ECREDIT_ROLLOUT_THREADS")


def load_rollout_policy(model: str | Path, *, device: str | None = None,
                        dtype: str = "auto") -> Policy:
    """Load a model dir or run dir (see :func:`eval.modelref.resolve_model`) for rollouts.

    A peft adapter (``adapter_config.json``) is loaded on its base model with
    ``peft.PeftModel.from_pretrained`` and merged. The tokenizer comes from the model dir
    (``train.py`` saves it in ``checkpoint-final``), else from the adapter's base.

    Args:
        device: ``"cpu"``, ``"cuda"``, ... (default: cuda when available).
        dtype: ``"auto"`` (float32 on CPU, bfloat16 on CUDA), ``"float32"``, ``"bfloat16"``,
            ``"float16"``.

    Raises: FileNotFoundError / ValueError naming the path (see ``resolve_model``), ValueError
        for an unknown ``dtype``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eval.modelref import resolve_model

    ref = resolve_model(model)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(cpu_threads())
    if dtype == "auto":
        torch_dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    elif dtype in ("float32", "bfloat16", "float16"):
        torch_dtype = getattr(torch, dtype)
    else:
        raise ValueError(f"dtype: expected auto, float32, bfloat16 or float16, got {dtype!r}")
    tok_dir = ref.model_dir
    if ref.adapter and not (Path(ref.model_dir) / "tokenizer_config.json").is_file():
        tok_dir = ref.base_model
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    if ref.adapter:
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(ref.base_model, dtype=torch_dtype)
        lm = PeftModel.from_pretrained(base, ref.model_dir).merge_and_unload()
    else:
        lm = AutoModelForCausalLM.from_pretrained(ref.model_dir, dtype=torch_dtype)
    lm.to(device)
    lm.eval()
    return Policy(lm, tokenizer, ref)
