"""LoRA defaults per architecture wrap the intended modules of each family, and one
forward/backward with gradient checkpointing trains only the adapters."""

from types import SimpleNamespace

import pytest

from ecredit_trl.policy.families import FAMILIES

#: One template per architecture (the others share its class).
BY_ARCH = {}
for _t, _f in FAMILIES.items():
    BY_ARCH.setdefault(_f.arch, _t)


@pytest.mark.parametrize("template", sorted(BY_ARCH.values()))
def test_lora_defaults_wrap_the_intended_modules(template):
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from ecredit_trl.policy.families import ensure_family_model
    from ecredit_trl.policy.lora_defaults import LORA_TARGETS, resolve_lora
    from ecredit_trl.policy.preflight import lora_config

    d = ensure_family_model(template)
    margs = SimpleNamespace(lora_r=4, lora_alpha=None, lora_dropout=0.0,
                            lora_target_modules=["auto"])
    rec = resolve_lora(d, 4, None, ["auto"])
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    assert rec["source"] == "architecture default" and rec["alpha"] == 8
    assert rec["target_modules"] == list(LORA_TARGETS[model.config.model_type])
    linear = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    wanted = {n for n in linear if n.rsplit(".", 1)[-1] in rec["target_modules"]}
    assert wanted and not any(n.endswith("lm_head") for n in wanted)

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    peft_model = get_peft_model(model, lora_config(margs, d))
    wrapped = {n.removeprefix("base_model.model.") for n, m in peft_model.named_modules()
               if hasattr(m, "lora_A") and len(getattr(m, "lora_A", {})) > 0}
    assert wrapped == wanted
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)

    peft_model.train()
    assert peft_model.base_model.model.is_gradient_checkpointing
    ids = torch.randint(0, len(peft_model.get_input_embeddings().weight), (2, 24))
    out = peft_model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad for n, p in peft_model.named_parameters() if p.requires_grad}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert any(g.abs().sum() > 0 for n, g in grads.items() if ".lora_B." in n)


def test_unknown_architecture_and_explicit_targets(tmp_path):
    from ecredit_trl.policy.lora_defaults import resolve_lora

    (tmp_path / "config.json").write_text('{"model_type": "mamba"}')
    assert resolve_lora(tmp_path, 8, 16, ["auto"])["target_modules"] == "all-linear"
    rec = resolve_lora(tmp_path, 8, None, ["q_proj", "v_proj"])
    assert rec == {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"],
                   "modules_to_save": [], "model_type": "mamba",
                   "source": "--lora_target_modules"}
    assert resolve_lora(tmp_path, 0, None, ["auto"]) is None
    with pytest.raises(ValueError, match="lora_r: must be >= 0, got -1"):
        resolve_lora(tmp_path, -1, None, ["auto"])


def test_the_manifest_records_the_resolved_lora():
    from ecredit_trl.policy.families import ensure_family_model
    from ecredit_trl.policy.lora_defaults import resolve_lora
    from ecredit_trl.runs.manifest import build_manifest

    lora = resolve_lora(ensure_family_model("gptoss"), 8, None, ["auto"])
    m = build_manifest(run_name="r", argv=[], config={"ecredit": {}, "model": {"lora": lora}},
                       tasks=[], task_source="x", images=[], world_size=1,
                       model={"path": "p"}, runtime="local")
    assert m["lora"]["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert m["lora"]["model_type"] == "gpt_oss" and m["lora"]["alpha"] == 16
