"""``python -m ecredit_trl.runs.audit``: full weights and LoRA adapters of a tiny real model."""

from __future__ import annotations

import json

import pytest
import torch

from ecredit_trl.runs.audit import AuditError, audit, main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    base = tmp_path_factory.mktemp("base")
    model.save_pretrained(base)
    return model, base


def test_full_weights_changed_and_nonfinite(tiny, tmp_path, capsys):
    model, base = tiny
    same = audit(base, base)
    n = same["tensors"]
    assert n > 5 and same["changed_tensors"] == 0 and same["nonfinite_elements"] == 0
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    q = next(k for k in sd if "q_proj" in k)
    sd[q][0, :3] += 0.5
    norm = next(k for k in sd if k.endswith("norm.weight"))
    sd[norm][1] = float("nan")
    sd[norm][2] = float("inf")
    model.load_state_dict(sd)
    ck = tmp_path / "checkpoint-1"
    model.save_pretrained(ck)
    r = audit(ck, base)
    assert r["kind"] == "full" and r["tensors"] == n
    assert r["changed_tensors"] == 2 and r["changed_elements"] == 3 + 2
    assert r["nonfinite_tensors"] == 1 and r["nonfinite_elements"] == 2
    assert r["nonfinite_names"] == [norm]
    assert main([str(ck), "--base", str(base)]) == 1  # non-finite → exit 1
    out = capsys.readouterr().out.splitlines()
    assert json.loads(out[0])["changed_elements"] == 5
    assert out[1].endswith(f"2 non-finite values in 1 tensors (e.g. {norm})")
    assert "2 tensors changed vs base (5 elements" in out[1]


def test_lora_adapter_delta_and_errors(tiny, tmp_path, capsys):
    from peft import LoraConfig, get_peft_model

    model, base = tiny
    peft_model = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj",
                                                                                  "v_proj"]))
    fresh = tmp_path / "adapter-0"
    peft_model.save_pretrained(fresh)
    r = audit(fresh)
    assert r["kind"] == "lora" and r["adapted_modules"] == 2
    assert r["changed_tensors"] == 0 and r["changed_elements"] == 0  # B starts at zero
    for name, p in peft_model.named_parameters():
        if "q_proj.lora_B" in name:
            with torch.no_grad():
                p[0, 0] = 1.0
    trained = tmp_path / "adapter-1"
    peft_model.save_pretrained(trained)
    r = audit(trained, base)
    assert r["changed_tensors"] == 1
    row = r["changed_elements"]
    assert 0 < row <= 16  # one output row of q_proj: scale * B[0, 0] * A[0, :]
    assert r["nonfinite_elements"] == 0
    assert main([str(trained)]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert "LoRA adapter" in line and "1 modules changed vs base" in line
    # adapter vs adapter: tensor by tensor
    r = audit(trained, fresh)
    assert r["changed_tensors"] == 1 and r["changed_elements"] == 1
    with pytest.raises(AuditError, match="no model.safetensors"):
        audit(tmp_path)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(AuditError, match=r"bad/model\.safetensors: unreadable"):
        audit(tmp_path / "bad")
    assert main([str(tmp_path / "bad")]) == 2
