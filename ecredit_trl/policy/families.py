"""Tiny local models of every family TRL can parse tool calls for.

For each chat template ``trl.chat_template_utils.add_response_schema`` maps to a tool-call
parser (:data:`eval.evaluation.templatecheck.TOOL_TEMPLATES`) a :class:`Family` names the architecture
class of the real models that ship it, the control and tag tokens its template writes, its
end-of-turn tokens and its LoRA defaults (:mod:`.lora_defaults`). :func:`ensure_family_model`
builds the model directory on first use and caches it under
``$ECREDIT_CACHE/families/<template>-<key>/`` (never committed): random weights of that
class, small enough for CPU (hidden 64, 2 layers, ~0.1-0.3M parameters), a byte-level BPE
trained here that carries the family's tokens as added tokens, and TRL's template byte for
byte. They exist to test the plumbing (rendering, parsing, turn maps, LoRA), not to learn.

Token lists: read off each TRL template (``trl/chat_templates/<name>.jinja``) and the
family's public tokenizer configs (which markers are special tokens, which end a turn).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ecredit_trl.agent.prompts import policy_tools
from eval.evaluation.templatecheck import trl_template

__all__ = ["FAMILIES", "Family", "build_family_model", "ensure_family_model", "family",
           "family_config"]

_QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_QWEN_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
              "<think>", "</think>")
_QWEN_VISION = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
_LLAMA_SPECIAL = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>")
_GPTOSS_SPECIAL = ("<|startoftext|>", "<|endoftext|>", "<|start|>", "<|end|>", "<|message|>",
                   "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
_GLM_SPECIAL = ("<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
                "<|observation|>")
_GLM_TAGS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
             "<arg_value>", "</arg_value>", "<tool_response>", "</tool_response>")
_LFM_SPECIAL = ("<|startoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>",
                "<|tool_list_start|>", "<|tool_list_end|>", "<|tool_call_start|>",
                "<|tool_call_end|>", "<|tool_response_start|>", "<|tool_response_end|>")
_GEMMA_SPECIAL = ("<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>", "<|tool>", "<tool|>",
                  "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
                  "<|channel>", "<channel|>", "<|\"|>", "<|think|>", "<|image|>", "<|audio|>",
                  "<|video|>")

#: Model shape shared by every family: small enough that build + one forward/backward take
#: well under a second on CPU.
_SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, max_position_embeddings=4096, head_dim=16)


@dataclass(frozen=True)
class Family:
    """One chat template and the architecture that ships it.

    Attributes:
        template: TRL template name (``trl/chat_templates/<template>.jinja``).
        arch: transformers ``*ForCausalLM`` class name of that family's text models.
        special: control tokens (``special=True``: skipped by ``skip_special_tokens``).
        tags: added tokens that stay in decoded text (tool-call / thinking tags).
        eos: end-of-turn tokens; the first is the tokenizer's ``eos_token``, all of them are
            the model's ``generation_config.eos_token_id`` (generation stops on any).
        pad: padding token. bos: the tokenizer's ``bos_token`` the template writes, or None.
        arch_kwargs: config fields of the architecture beyond :data:`_SHAPE` (experts,
            layer types) so that the tiny model has every kind of layer the real one has.
    """

    template: str
    arch: str
    special: tuple[str, ...]
    tags: tuple[str, ...]
    eos: tuple[str, ...]
    pad: str
    bos: str | None = None
    arch_kwargs: dict = field(default_factory=dict)

    def tokens(self) -> tuple[str, ...]:
        """Every added token, special first (vocabulary order)."""
        return self.special + self.tags


def _qwen(template: str, arch: str, vision: bool = False, **kw) -> Family:
    return Family(template, arch, _QWEN_SPECIAL + (_QWEN_VISION if vision else ()), _QWEN_TAGS,
                  ("<|im_end|>", "<|endoftext|>"), "<|endoftext|>", arch_kwargs=kw)


_QWEN3_5 = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"])
_NEMOTRON = dict(mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=1,
                 hybrid_override_pattern="M*",
                 # today's names; "mamba" / "attention" are remapped only from transformers 5.2x
                 layers_block_type=["linear_attention", "full_attention"])
_LFM2 = dict(layer_types=["conv", "full_attention"])
_GEMMA4 = dict(sliding_window=64, vocab_size_per_layer_input=None,
               hidden_size_per_layer_input=16, layer_types=["sliding_attention",
                                                            "full_attention"])


def _nemotron(template: str) -> Family:
    return _qwen(template, "NemotronHForCausalLM", **_NEMOTRON)


def _lfm(template: str) -> Family:
    return Family(template, "Lfm2ForCausalLM", _LFM_SPECIAL, ("<think>", "</think>"),
                  ("<|im_end|>",), "<|pad|>", "<|startoftext|>", _LFM2)


def _gemma(template: str) -> Family:
    return Family(template, "Gemma4ForCausalLM", _GEMMA_SPECIAL, (),
                  ("<eos>", "<turn|>", "<|tool_response>"), "<pad>", "<bos>", _GEMMA4)


#: Every template of :data:`eval.evaluation.templatecheck.TOOL_TEMPLATES`, by name. Qwen3-VL and the
#: Qwen3.5+ templates belong to vision-language checkpoints; their text decoders are the
#: Qwen3 / Qwen3.5 causal LMs used here.
FAMILIES: dict[str, Family] = {f.template: f for f in [
    Family("glm4moe", "Glm4MoeForCausalLM", _GLM_SPECIAL, _GLM_TAGS,
           ("<|endoftext|>", "<|user|>", "<|observation|>"), "<|endoftext|>", None,
           dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                first_k_dense_replace=1, n_shared_experts=1, n_group=1, topk_group=1)),
    Family("gptoss", "GptOssForCausalLM", _GPTOSS_SPECIAL, (),
           ("<|return|>", "<|call|>", "<|endoftext|>"), "<|endoftext|>", None,
           dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=64)),
    *(Family(t, "LlamaForCausalLM", _LLAMA_SPECIAL, (), ("<|eot_id|>", "<|eom_id|>",
                                                       "<|end_of_text|>"),
             "<|end_of_text|>", "<|begin_of_text|>") for t in ("llama3_1", "llama3_2")),
    _qwen("qwen2_5", "Qwen2ForCausalLM"),
    _qwen("qwen3", "Qwen3ForCausalLM"),
    _qwen("qwen3_instruct_2507", "Qwen3ForCausalLM"),
    _qwen("qwen3_vl", "Qwen3ForCausalLM", vision=True),
    *(_qwen(t, "Qwen3_5ForCausalLM", vision=True, **_QWEN3_5)
      for t in ("qwen3_5_nothink", "qwen3_5_think", "qwen3_6", "qwen3_8")),
    *(_nemotron(t) for t in ("nemotron_3_nano", "nemotron_3_super", "nemotron_3_ultra",
                             "nemotron_3_5_lightning")),
    *(_lfm(t) for t in ("lfm2_v2", "lfm2_2_5", "lfm2_2_5_v2", "lfm2_2_5_vl")),
    *(_gemma(t) for t in ("gemma4", "gemma4_v2", "gemma4_v3", "gemma4_v4", "gemma4_v5")),
]}


def family(template: str) -> Family:
    """The :class:`Family` of TRL template ``template``. Raises: KeyError naming it."""
    try:
        return FAMILIES[template]
    except KeyError:
        raise KeyError(f"family: no tiny model for template {template!r}; known: "
                       f"{', '.join(FAMILIES)}") from None


def _corpus(fam: Family, template: str) -> list[str]:
    """Texts the BPE learns merges from: TRL's template itself (its literal text is what the
    renders repeat) and the tool schemas, with the family's tokens removed."""
    texts = [template, json.dumps(policy_tools()), "def f(x):\n    return x + 1\n" * 4]
    return [_strip_tokens(fam, t) for t in texts]


def _strip_tokens(fam: Family, text: str) -> str:
    """``text`` without ``fam``'s added tokens (they must not be learnt as merges)."""
    for tok in fam.tokens():
        text = text.replace(tok, "\n")
    return text


def build_family_tokenizer(fam: Family, vocab_size: int = 700, corpus: list[str] | None = None,
                           use_regex: bool = True):
    """A byte-level BPE (every byte in the alphabet, so any text round-trips) with ``fam``'s
    tokens as added tokens and TRL's template ``fam.template`` as ``chat_template``.

    Args:
        vocab_size: target vocabulary (bytes + merges + the family's tokens).
        corpus: texts to learn merges from (default: the template and the tool schemas); the
            family's tokens are removed from them first.
        use_regex: GPT-2's word-splitting regex before BPE. The warm start turns it off
            (merges may span spaces, as the embedded tokenizer's, so episodes are ~3x shorter).

    Returns: ``PreTrainedTokenizerFast``. Raises: OSError when TRL's template is missing.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AddedToken, PreTrainedTokenizerFast

    text = trl_template(fam.template)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=list(fam.tokens()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = _corpus(fam, text) if corpus is None else [_strip_tokens(fam, t) for t in corpus]
    tok.train_from_iterator(texts, trainer=trainer)
    special = {"eos_token": fam.eos[0], "pad_token": fam.pad}
    if fam.bos:
        special["bos_token"] = fam.bos
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=_SHAPE["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
        **{k: AddedToken(v, special=True, normalized=False) for k, v in special.items()})
    fast.add_special_tokens({"additional_special_tokens": [
        AddedToken(t, special=True, normalized=False) for t in fam.special]})
    fast.add_tokens([AddedToken(t, special=False, normalized=False) for t in fam.tags])
    fast.chat_template = text
    return fast


def family_config(fam: Family, tokenizer, shape: dict | None = None):
    """The ``fam.arch`` config of shape :data:`_SHAPE` + ``fam.arch_kwargs`` + ``shape`` for
    ``tokenizer`` (its vocabulary size unless ``shape`` gives ``vocab_size``; eos / pad / bos
    ids from it). Raises: AttributeError when transformers lacks ``fam.arch``."""
    import transformers

    cls = getattr(transformers, fam.arch)
    kw = {"vocab_size": len(tokenizer), **_SHAPE, **fam.arch_kwargs, **(shape or {})}
    if "vocab_size_per_layer_input" in kw:  # Gemma 4's per-layer embeddings: same vocabulary
        kw["vocab_size_per_layer_input"] = kw["vocab_size"]
    eos_ids = tokenizer.convert_tokens_to_ids(list(fam.eos))
    return cls.config_class(eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id,
                            bos_token_id=tokenizer.bos_token_id, **kw)


def build_family_model(fam: Family, tokenizer, seed: int = 0, shape: dict | None = None):
    """Random weights of ``fam.arch`` (:func:`family_config`: shape :data:`_SHAPE` +
    ``fam.arch_kwargs`` + ``shape``, the warm start's wider overrides) for ``tokenizer``; fp32,
    train mode. ``generation_config.eos_token_id`` is every id of ``fam.eos``.
    Raises: AttributeError when transformers lacks ``fam.arch``."""
    import torch
    import transformers

    config = family_config(fam, tokenizer, shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(transformers, fam.arch)(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def cache_root() -> Path:
    """``$ECREDIT_CACHE/families`` (default ``~/.cache/ecredit-trl/families``)."""
    base = os.environ.get("ECREDIT_CACHE") or Path.home() / ".cache" / "ecredit-trl"
    return Path(base) / "families"


def _key(fam: Family) -> str:
    import tokenizers
    import transformers

    blob = json.dumps({"fam": repr(fam), "shape": _SHAPE, "template": trl_template(fam.template),
                       "transformers": transformers.__version__,
                       "tokenizers": tokenizers.__version__}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def ensure_family_model(template: str, cache_dir: str | Path | None = None) -> Path:
    """The tiny model directory of ``template``, built on first use (temp dir + rename, so a
    killed build leaves nothing half-written) under ``cache_dir`` (default :func:`cache_root`).
    The key hashes the family spec, TRL's template text and the library versions.

    Returns: the directory (``config.json``, ``model.safetensors``, tokenizer files,
    ``chat_template.jinja``). Raises: KeyError for an unknown template.
    """
    fam = family(template)
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    final = root / f"{template}-{_key(fam)}"
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{final.name}.{os.getpid()}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tok = build_family_tokenizer(fam)
    build_family_model(fam, tok).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        tmp.rename(final)
    except OSError:  # another process built it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return final
