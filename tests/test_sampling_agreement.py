"""Sampling and training agree: the log-probability the sampler gave each generated token
against the one the trainer computes before the update (design page, "Sampling and training
agree").

1. The sampler's log-probabilities on the transformers path are those of the distribution
   the token was drawn from (after temperature / top-k / top-p / min-p): equal to
   ``log_softmax(output_scores)`` of a real ``generate`` call, which they do not perturb.
2. The statistics: token-weighted over ranks, NaN and masked tokens left out.
3. Real training steps (``ecredit_trl.train.main``, the embedded warm policy, local runtime,
   one step, 4 rollouts): a healthy fp32 run stays below
   :data:`~ecredit_trl.trainer.agreement.HEALTHY_FP32_MEAN`, in the ledger, ``metrics.jsonl``
   and the console line; three broken variants each push the mean past 10× that bound:
   a tool turn re-tokenized before the next turn is sampled, a chat template that differs
   between sampling and training, and dropout active in the training forward. The default
   (``disable_dropout``) turns the last one healthy again.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from ecredit_trl.trainer.agreement import (
    DIFF_MAX,
    DIFF_MEAN,
    HEALTHY_FP32_MEAN,
    METRICS,
    RATIO_MAX,
    RATIO_MEAN,
    RATIO_MIN,
    combine,
    disable_dropout,
    token_sums,
)
from ecredit_trl.trainer.sampled_logprobs import record_sampled_logprobs

BROKEN = 10 * HEALTHY_FP32_MEAN


def _left_padded(tok, texts):
    prompts = [tok.encode(t) for t in texts]
    width = max(map(len, prompts))
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@pytest.mark.parametrize("warpers", [
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.05},
])
def test_recorded_logprobs_are_those_of_the_warped_distribution(tiny_policy, warpers):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(tiny_policy)
    model = AutoModelForCausalLM.from_pretrained(tiny_policy).eval()
    ids, mask = _left_padded(tok, ["Fix the bug", "Fix the bug in the repository.", "<tool_call>"])
    cfg = GenerationConfig(do_sample=True, max_new_tokens=24, pad_token_id=tok.pad_token_id,
                           eos_token_id=tok.eos_token_id, output_scores=True,
                           return_dict_in_generate=True, **warpers)
    torch.manual_seed(3)
    with record_sampled_logprobs(model) as recorders:
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
    assert "_get_logits_processor" not in vars(model)  # the model is left as it was
    gen = out.sequences[:, ids.shape[1]:]
    # rows cut after their first EOS, as TRL keeps them
    rows = []
    for row in gen.tolist():
        cut = row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
        rows.append(row[:cut])
    got = recorders[-1].row_logprobs(rows)
    want = torch.stack([torch.log_softmax(s, -1) for s in out.scores], 1)
    want = want.gather(2, gen[:, :, None]).squeeze(2)
    assert [len(r) for r in got] == [len(r) for r in rows]
    for i, r in enumerate(got):
        assert torch.allclose(torch.tensor(r), want[i, :len(r)], atol=1e-6)
    if warpers.get("top_k"):  # the warpers acted: tokens outside top-k have -inf scores
        assert all(torch.isinf(s).any() for s in out.scores)
    # the recorder changes nothing that is sampled
    torch.manual_seed(3)
    again = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
    assert torch.equal(again.sequences, out.sequences)


def test_the_statistics_are_token_weighted_and_skip_masked_and_missing_tokens():
    sampling = torch.tensor([[-1.0, -2.0, float("nan"), -9.0], [-0.5, -0.5, 0.0, 0.0]])
    trainer = torch.tensor([[-1.1, -1.8, -3.0, 0.0], [-0.5, -0.2, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    rank0 = token_sums(sampling[:1], trainer[:1], mask[:1])  # 2 tokens: |Δ| 0.1, 0.2
    rank1 = token_sums(sampling[1:], trainer[1:], mask[1:])  # 2 tokens: |Δ| 0, 0.3
    got = combine(torch.stack([rank0, rank1]))
    deltas = torch.tensor([-0.1, 0.2, 0.0, 0.3], dtype=torch.float64)
    assert got[DIFF_MEAN] == pytest.approx(0.15)
    assert got[DIFF_MAX] == pytest.approx(0.3)
    assert got[RATIO_MEAN] == pytest.approx(float(deltas.exp().mean()))
    assert got[RATIO_MIN] == pytest.approx(math.exp(-0.1))
    assert got[RATIO_MAX] == pytest.approx(math.exp(0.3))
    empty = token_sums(sampling, trainer, torch.zeros_like(mask))
    assert combine(torch.stack([empty, empty])) is None
    assert combine(torch.stack([empty, rank1]))[DIFF_MAX] == pytest.approx(0.3)


def test_disable_dropout_zeroes_modules_and_the_rates_attention_reads(tiny_policy):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_policy, attention_dropout=0.3)
    model.model.layers[0].mlp.add_module("drop", torch.nn.Dropout(0.2))
    changed = disable_dropout(model)
    assert "model.layers.0.mlp.drop.p" in changed
    assert "model.layers.0.self_attn.attention_dropout" in changed
    assert all(m.attention_dropout == 0.0 for m in model.modules()
               if hasattr(m, "attention_dropout") and isinstance(m.attention_dropout, float))
    assert model.model.layers[0].mlp.drop.p == 0.0


# -- real training steps ------------------------------------------------------------------

def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _one_step(tmp_path: Path, model: Path, *extra: str) -> tuple[dict, dict]:
    """One real step (arm O, local runtime); returns its ledger row and logged metrics."""
    from ecredit_trl.train import main

    runs = tmp_path / "runs"
    rc = main(["--arm", "O", "--model", str(model), "--max_steps", "1", "--runs_dir", str(runs),
               "--runtime", "local", "--save_strategy", "no", "--seed", "7", *extra])
    assert rc == 0
    (run,) = list(runs.iterdir())
    (row,) = _jsonl(run / "ledger.jsonl")
    logged = [r for r in _jsonl(run / "metrics.jsonl") if "loss" in r]
    return row, logged[0]


def _split_into_bytes(tok, ids: list[int]) -> list[int]:
    """The same text, other ids: each byte-level BPE token split into its single-byte
    tokens (special and added tokens kept whole)."""
    keep = set(tok.all_special_ids) | set(tok.added_tokens_decoder)
    out = []
    for i in ids:
        pieces = [] if i in keep else [tok.convert_tokens_to_ids(c)
                                       for c in tok.convert_ids_to_tokens(i)]
        out += pieces if pieces and None not in pieces and tok.unk_token_id not in pieces else [i]
    return out


def _sampling_contexts(monkeypatch, change):
    """Every later generation call samples from ``change(tokenizer, turn, contexts)``
    instead of the contexts the trainer trains on."""
    from ecredit_trl.trainer import ECreditGRPOTrainer

    real = ECreditGRPOTrainer._generate_single_turn

    def generate(self, prompt_ids, *args, **kwargs):
        turn = self.agent_ctx.turn + 1
        return real(self, change(self._tokenizer, turn, prompt_ids), *args, **kwargs)

    monkeypatch.setattr(ECreditGRPOTrainer, "_generate_single_turn", generate)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory, warm_policy):
    return _one_step(tmp_path_factory.mktemp("healthy"), warm_policy)


def test_a_healthy_fp32_step_agrees_and_logs_the_figures_everywhere(healthy):
    row, logged = healthy
    print("healthy:", row["sampling_logp_diff_mean"], row["sampling_logp_diff_max"])
    assert 0 <= row["sampling_logp_diff_mean"] < HEALTHY_FP32_MEAN
    assert row["sampling_logp_diff_mean"] <= row["sampling_logp_diff_max"] < 10 * HEALTHY_FP32_MEAN
    assert row["importance_ratio_min"] <= row["importance_ratio_mean"] <= row["importance_ratio_max"]
    assert abs(math.log(row["importance_ratio_min"])) <= row["sampling_logp_diff_max"] * 1.01
    assert set(METRICS) <= set(logged)
    assert logged[DIFF_MEAN] == pytest.approx(row["sampling_logp_diff_mean"], rel=1e-3)


def test_the_console_line_shows_the_difference(healthy, capsys):
    from types import SimpleNamespace

    from ecredit_trl.runs.callbacks import ProgressLines

    _, logged = healthy
    state = SimpleNamespace(is_world_process_zero=True, global_step=1, max_steps=1)
    ProgressLines(".").on_log(None, state, None, logs=logged)
    line = capsys.readouterr().out
    want = (f"logp-diff {logged[DIFF_MEAN]:.1e} mean / "
            f"{logged[DIFF_MAX]:.1e} max")
    assert line.startswith("[ecredit] step 1/1") and want in line


def test_a_re_tokenized_tool_turn_breaks_agreement(tmp_path, monkeypatch, warm_policy, healthy):
    # from turn 2 on, the sampler saw the tool result (the contexts' tails) re-tokenized
    _sampling_contexts(monkeypatch, lambda tok, turn, ctx: ctx if turn == 1 else [
        c[:-48] + _split_into_bytes(tok, c[-48:]) for c in ctx])
    row, logged = _one_step(tmp_path, warm_policy)
    print("re-tokenized tool turn:", row["sampling_logp_diff_mean"], row["sampling_logp_diff_max"])
    assert row["sampling_logp_diff_mean"] > BROKEN > healthy[0]["sampling_logp_diff_mean"]
    assert logged[DIFF_MEAN] > BROKEN


def _replace(ids: list[int], old: list[int], new: list[int]) -> list[int]:
    out, i = [], 0
    while i < len(ids):
        if ids[i:i + len(old)] == old:
            out, i = out + new, i + len(old)
        else:
            out, i = out + [ids[i]], i + 1
    return out


def test_a_different_chat_template_breaks_agreement(tmp_path, monkeypatch, warm_policy, healthy):
    # the sampler's template names the assistant's role as another family's does ("model"),
    # so every assistant header it rendered differs from the training template's. A system
    # turn prepended to the prompt was the first variant tried: how far it moves a policy
    # depends on the policy (one warm start moved 0.0008 nats per token, another past 0.01),
    # while a changed header right before each generated turn moves every one of them
    def other_role(tok, turn, ctx):
        a, m = tok.encode("<|im_start|>assistant\n"), tok.encode("<|im_start|>model\n")
        return [_replace(c, a, m) for c in ctx]

    _sampling_contexts(monkeypatch, other_role)
    row, _ = _one_step(tmp_path, warm_policy)
    print("other template:", row["sampling_logp_diff_mean"], row["sampling_logp_diff_max"])
    assert row["sampling_logp_diff_mean"] > BROKEN > healthy[0]["sampling_logp_diff_mean"]


def test_dropout_in_the_training_forward_breaks_agreement_and_the_default_removes_it(
        tmp_path, warm_policy):
    from transformers import AutoConfig

    model = tmp_path / "with-dropout"
    model.mkdir()
    for f in Path(warm_policy).iterdir():
        if f.is_file():
            (model / f.name).write_bytes(f.read_bytes())
    cfg = AutoConfig.from_pretrained(model)
    cfg.attention_dropout = 0.3
    cfg.save_pretrained(model)
    row, _ = _one_step(tmp_path / "on", model, "--disable_dropout", "false")
    print("dropout on:", row["sampling_logp_diff_mean"], row["sampling_logp_diff_max"])
    assert row["sampling_logp_diff_mean"] > BROKEN
    row, _ = _one_step(tmp_path / "off", model)  # the default: dropout off in training
    print("dropout off (default):", row["sampling_logp_diff_mean"], row["sampling_logp_diff_max"])
    assert row["sampling_logp_diff_mean"] < HEALTHY_FP32_MEAN
