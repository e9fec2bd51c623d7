"""What the warm start trains on: demonstrations rendered as text (tokenizer corpus) and as
token ids with a loss mask (SFT examples).

Two renderings:

* :func:`render_corpus`: the embedded default policy's texts, TRL's ``qwen3_training.jinja``
  with the tool schemas (SFT then masks with ``assistant_only_loss=True``, the template's
  ``{% generation %}`` markers).
* :func:`episode_example`: any family's demonstration as the rollout loop assembles an
  episode: the prompt rendered by :meth:`Policy.render_prompt
  <ecredit_trl.agent.generation.Policy.render_prompt>`, then per assistant turn the ids the
  model must generate (up to and including its end-of-turn token) and the tool-result suffix
  of :meth:`Policy.tool_suffix_ids <ecredit_trl.agent.generation.Policy.tool_suffix_ids>`
  (TRL's ``_get_tool_suffix_ids``). The loss mask is 1 on generated ids only. TRL 1.16's
  ``get_training_chat_template`` has no ``{% generation %}`` template for ``llama3_1``,
  ``llama3_2``, ``gemma4*`` or ``lfm2_2_5*``, so the mask is made here from the product's own
  turn machinery, the same way for every family, and equal to what GRPO later trains on
  (``completion_mask * tool_mask``).
"""

from __future__ import annotations

import json

from ecredit_trl.policy.tiny_model import build_tokenizer

__all__ = ["EpisodeExample", "call_messages", "episode_example", "generated_turn_ids",
           "render_corpus"]


def render_corpus(demos: list[dict]) -> list[str]:
    """The texts the embedded tokenizer is trained on: each demonstration rendered with the
    qwen3 training template (tool schemas included)."""
    from trl.chat_template_utils import qwen3_training_chat_template

    bare = build_tokenizer([], vocab_size=265)
    return [bare.apply_chat_template(d["messages"], tools=json.loads(d["tools"]), tokenize=False,
                                     chat_template=qwen3_training_chat_template) for d in demos]


def call_messages(messages: list[dict]) -> list[dict]:
    """A copy of ``messages`` whose tool-call ``arguments`` are dicts.

    Demonstrations keep arguments as JSON strings (Arrow would merge dict keys across rows);
    qwen3's template prints a string as is, but others (llama3, gpt-oss) ``tojson`` it, which
    would quote the JSON a second time. Raises: ValueError naming the call when an argument
    string is not a JSON object."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c["function"])
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"tool call {fn.get('name')!r}: arguments are not "
                                         f"JSON ({exc.msg})") from None
                if not isinstance(fn.get("arguments"), dict):
                    raise ValueError(f"tool call {fn.get('name')!r}: arguments must be an object")
                calls.append({**c, "function": fn})
            m["tool_calls"] = calls
        out.append(m)
    return out


def _text(policy, msgs: list[dict], gen_prompt: bool) -> str:
    return policy.tokenizer.apply_chat_template(
        msgs, tools=policy.tools, chat_template=policy.chat_template, tokenize=False,
        add_generation_prompt=gen_prompt)


def generated_turn_ids(policy, msgs: list[dict], at: int) -> list[int]:
    """The ids a model emits for assistant message ``msgs[at]``: the template's rendering of
    that message minus what the generation prompt already wrote, up to and including the first
    end-of-turn id (where generation stops, ``policy.eos_token_ids``).

    A thinking template's prompt may open the reasoning (``<think>\\n``) that its history
    renders closed: the model continues after the common part. GLM-4 writes no end token after
    a call: the model stops on what the template writes next (``<|observation|>``, one of its
    end-of-turn ids).

    Raises: ValueError naming the message when it renders no end-of-turn id at all."""
    before = _text(policy, msgs[:at], False)
    prompt_tail = _text(policy, msgs[:at], True)[len(before):]
    block = _text(policy, msgs[: at + 1], False)[len(before):]
    n = 0
    while n < min(len(block), len(prompt_tail)) and block[n] == prompt_tail[n]:
        n += 1
    ids = policy.tokenizer(block[n:], add_special_tokens=False)["input_ids"]
    stops = [i for i, t in enumerate(ids) if t in policy.eos_token_ids]
    if stops:
        return ids[: stops[0] + 1]
    nxt = policy.tokenizer(_text(policy, msgs[: at + 2], False)[len(before) + len(block):],
                           add_special_tokens=False)["input_ids"][:1]
    if not nxt or nxt[0] not in policy.eos_token_ids:
        raise ValueError(f"message {at}: the template renders no end-of-turn token after it")
    return ids + nxt


class EpisodeExample(dict):
    """One SFT row: ``input_ids`` (prompt + completion, int token ids), ``completion_mask``
    (same length; 1 on generated ids, 0 on the prompt and tool-result suffixes) and
    ``turn_lengths`` (generated ids per assistant turn)."""


def _calls(parsed: dict) -> list[tuple[str, dict]]:
    return [((c.get("function") or c)["name"], (c.get("function") or c)["arguments"])
            for c in parsed.get("tool_calls") or []]


def episode_example(policy, messages: list[dict]) -> EpisodeExample:
    """``messages`` (a demonstration: user prompt, then assistant turns each followed by its
    tool results) as token ids, assembled as the rollout loop assembles an episode.

    Every generated turn is parsed back with ``policy.parse`` (TRL's ``parse_response``, the
    product's parser) and must give the demonstration's calls: a family whose format the
    parser cannot recover is refused here, before any training.

    Args:
        policy: an :class:`ecredit_trl.agent.generation.Policy` (its tokenizer, template and
            end-of-turn ids; the model is not run).
        messages: OpenAI-style messages; tool-call arguments as dicts (:func:`call_messages`).

    Returns: :class:`EpisodeExample`.
    Raises: ValueError naming the turn whose parse differs, or a message without an
        end-of-turn token.
    """
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    prompt = policy.render_prompt(messages[:first])
    completion: list[int] = []
    mask: list[int] = []
    lengths: list[int] = []
    at = first
    while at < len(messages):
        gen = generated_turn_ids(policy, messages, at)
        want = [(c["function"]["name"], c["function"]["arguments"])
                for c in messages[at].get("tool_calls") or []]
        got = _calls(policy.parse(gen, prompt + completion))
        if got != want:
            raise ValueError(f"turn {len(lengths) + 1}: the parser reads {got!r}, the "
                             f"demonstration has {want!r}")
        completion += gen
        mask += [1] * len(gen)
        lengths.append(len(gen))
        nxt = next((j for j in range(at + 1, len(messages))
                    if messages[j]["role"] == "assistant"), len(messages))
        tools = messages[at + 1: nxt]
        if tools and nxt < len(messages):
            suffix = policy.tool_suffix_ids(tools)
            completion += suffix
            mask += [0] * len(suffix)
        at = nxt
    return EpisodeExample(input_ids=prompt + completion,
                          completion_mask=[0] * len(prompt) + mask, turn_lengths=lengths)
