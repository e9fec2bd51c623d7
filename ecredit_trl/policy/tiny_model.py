"""The embedded default policy's tokenizer and model, built locally (no hub download).

A byte-level BPE trained with ``tokenizers`` on the demonstration corpus, wrapped in a
``PreTrainedTokenizerFast`` whose chat template is TRL's own ``qwen3.jinja`` (a byte-for-byte
copy in ``ecredit_trl/templates/``: TRL's ``add_response_schema`` and
``get_training_chat_template`` recognise only their exact templates, and both SFT with
``assistant_only_loss=True`` and GRPO with tools switch to ``qwen3_training.jinja`` from it),
and a tiny Llama (hidden 192, 4 layers, 4 heads, FFN 512, tied embeddings, fp32): 2.2M
parameters with a 2.4k vocabulary, 2.54M with the warm start's 4k one.

Source of the shape: a CPU probe made while developing it (an embedded demo policy that
produces real edits on CPU).
"""

from __future__ import annotations

from pathlib import Path

TEMPLATE_PATH = Path(__file__).resolve().parent / "templates" / "qwen3.jinja"

#: Chat tokens of the qwen3 template. ``special=True`` ones are control tokens (skipped by
#: ``decode(skip_special_tokens=True)``); the tags are added tokens that are never split but
#: stay in decoded text, as in Qwen3's own tokenizer.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TAG_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
              "<think>", "</think>")
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

#: GPT-2's word-splitting regex before BPE. Off: merges may span spaces and punctuation, so
#: the JSON tool schemas of the system prompt (identical in every episode) shrink from ~715 to
#: ~33 tokens and a whole demonstration from ~1550 to ~510 (2.4k vocabulary, bundled tasks),
#: which makes SFT and GRPO ~3x cheaper. Digits are still split one by one.
USE_REGEX = False

#: Model shape (from that CPU probe). ``num_key_value_heads = num_attention_heads`` (plain MHA).
MODEL_SHAPE = dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=3,
                   num_key_value_heads=3, intermediate_size=512, max_position_embeddings=4096)


def chat_template() -> str:
    """The qwen3 chat template text (identical to ``trl/chat_templates/qwen3.jinja``)."""
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def build_tokenizer(corpus: list[str], vocab_size: int = 2400):
    """Train a byte-level BPE on ``corpus`` and wrap it for transformers / TRL.

    Pre-tokenization: digits are split one by one (as in Qwen/Llama-3 tokenizers, so line
    numbers are copied digit by digit), then bytes are mapped to GPT-2's byte alphabet without
    its word-splitting regex (:data:`USE_REGEX`). Every byte is in the alphabet, so any text
    round-trips (``decode(encode(s)) == s``); the chat tokens are added tokens, never split
    and never merged with their neighbours.

    Args:
        corpus: training texts (e.g. rendered demonstration conversations); may be empty
            (the vocabulary is then the 256 bytes plus the chat tokens).
        vocab_size: target vocabulary size including the 256 byte tokens and the 9 chat
            tokens; the result may be smaller when the corpus has fewer merges.

    Returns:
        ``PreTrainedTokenizerFast`` with ``eos_token="<|im_end|>"`` (ends an assistant turn,
        so generation stops there), ``pad_token="<|endoftext|>"``, no BOS, left padding off
        (``padding_side="left"`` for generation is the caller's choice), and
        ``chat_template`` = the qwen3 template.

    Raises:
        ValueError: ``vocab_size`` below 256 + the chat tokens, or ``corpus`` not a list of str.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AddedToken, PreTrainedTokenizerFast

    n_chat = len(SPECIAL_TOKENS) + len(TAG_TOKENS)
    if not isinstance(vocab_size, int) or vocab_size < 256 + n_chat:
        raise ValueError(f"vocab_size: must be an int >= {256 + n_chat}, got {vocab_size!r}")
    if not isinstance(corpus, (list, tuple)) or not all(isinstance(s, str) for s in corpus):
        raise ValueError("corpus: expected a list of strings")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=USE_REGEX),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS) + list(TAG_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # The chat tokens must not be learnt as merges of their bytes: strip them from the corpus.
    def _clean(text: str) -> str:
        for t in SPECIAL_TOKENS + TAG_TOKENS:
            text = text.replace(t, "\n")
        return text
    tok.train_from_iterator((_clean(s) for s in corpus), trainer=trainer, length=len(corpus))

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=AddedToken(EOS_TOKEN, special=True, normalized=False),
        pad_token=AddedToken(PAD_TOKEN, special=True, normalized=False),
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    fast.add_special_tokens({"additional_special_tokens": [
        AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]})
    fast.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    fast.chat_template = chat_template()
    return fast


def build_model(tokenizer, seed: int = 0):
    """A freshly initialised tiny Llama for ``tokenizer`` (fp32, on CPU).

    Shape: :data:`MODEL_SHAPE` (hidden 192, 4 layers, 4 attention / 4 KV heads, FFN 512,
    RoPE, up to 4096 positions), ``vocab_size = len(tokenizer)``, tied input/output
    embeddings; about 2.2M parameters for a 2.4k vocabulary. ``eos_token_id`` /
    ``pad_token_id`` come from the tokenizer (also set on ``generation_config``).

    Args:
        tokenizer: from :func:`build_tokenizer` (needs ``eos_token_id`` and ``pad_token_id``).
        seed: seeds torch's RNG for the initialisation (deterministic for a given seed).

    Returns: ``LlamaForCausalLM`` in train mode; forward on ``input_ids`` (B, T) int64 gives
        ``logits`` (B, T, vocab_size) float32.

    Raises: ValueError when the tokenizer lacks an EOS or PAD token.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
        raise ValueError("tokenizer: needs eos_token and pad_token (use build_tokenizer)")
    config = LlamaConfig(
        vocab_size=len(tokenizer), **MODEL_SHAPE, tie_word_embeddings=True,
        rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu",
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, use_cache=True, dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model
