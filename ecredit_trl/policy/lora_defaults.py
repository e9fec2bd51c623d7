"""LoRA defaults per architecture: which modules ``--lora_r R``
adapts when ``--lora_target_modules`` is left at ``auto``, and the resolved record a run's
manifest keeps.

Targets are the ``nn.Linear`` projections of attention and MLP (and of the recurrent mixers of
hybrid families: Qwen3.5's gated-delta-net ``in_proj_*``/``out_proj``, Nemotron-H's Mamba
``in_proj``, LFM2's short-conv ``in_proj``/``out_proj``), as the models in transformers 5.24
name them (checked on the tiny models of :mod:`.families`). Seen with peft 0.21 here:
Nemotron-H's Mamba ``out_proj`` is refused ("incompatible with Mamba-based models"); on
GLM-4-MoE the MLP names are redirected to the fused routed experts and the dense / shared-expert
MLPs are left out, so GLM-4-MoE and gpt-oss (fused 3-D expert parameters, not ``nn.Linear``)
adapt attention only, the common practice for these MoE models.

``modules_to_save`` is empty for every family: each TRL template writes only tokens the
family's released vocabulary already has (trained embeddings), and Gemma 4 / LFM2 tie the
input and output embeddings, so a saved embedding copy would also replace the output layer
and grow the adapter by the whole vocabulary. Alpha defaults to 2 x r (the LoRA paper's and
peft examples' usual ratio; equal to this project's former fixed 16 at r = 8).

Stdlib only (reads ``config.json``), so the manifest can record it before torch loads.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["LORA_TARGETS", "resolve_lora"]

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")

#: ``config.model_type`` -> LoRA target module names.
LORA_TARGETS: dict[str, tuple[str, ...]] = {
    "llama": _ATTN + _MLP, "qwen2": _ATTN + _MLP, "qwen3": _ATTN + _MLP,
    "gemma4_text": _ATTN + _MLP,
    "gpt_oss": _ATTN,
    "glm4_moe": _ATTN,
    "qwen3_5_text": _ATTN + _MLP + ("in_proj_qkv", "in_proj_z", "out_proj"),
    "nemotron_h": _ATTN + ("up_proj", "down_proj", "in_proj"),
    "lfm2": ("q_proj", "k_proj", "v_proj", "out_proj", "in_proj", "w1", "w2", "w3"),
}


def _model_type(model_dir: str | Path) -> str | None:
    cfg = Path(model_dir) / "config.json"
    if not cfg.is_file():
        return None
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"model config {cfg}: not valid JSON ({exc.msg})") from None
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else None
    return (text or data).get("model_type") or data.get("model_type")


def resolve_lora(model_dir: str | Path, r: int, alpha: int | None,
                 target_modules: list[str]) -> dict | None:
    """The LoRA settings a run uses, as recorded in its manifest (None when ``r == 0``).

    Args:
        model_dir: the base model directory (its ``config.json`` names the architecture).
        r: LoRA rank (0: full fine-tuning, no LoRA).
        alpha: LoRA alpha; None means ``2 * r``.
        target_modules: ``["auto"]`` (the architecture's :data:`LORA_TARGETS`, else
            ``all-linear``), ``["all-linear"]``, or module names as given.

    Returns: ``{"r", "alpha", "dropout"-free fields: "target_modules" (a list, or the string
        "all-linear"), "modules_to_save" (list), "model_type", "source"}`` with ``source``
        ``"architecture default"``, ``"all-linear (architecture without a default)"`` or
        ``"--lora_target_modules"``.

    Raises: ValueError naming ``lora_r`` / ``lora_alpha`` for negative values, ``model config``
        for an unreadable ``config.json``.
    """
    if r < 0:
        raise ValueError(f"lora_r: must be >= 0, got {r}")
    if r == 0:
        return None
    if alpha is not None and alpha <= 0:
        raise ValueError(f"lora_alpha: must be > 0, got {alpha}")
    model_type = _model_type(model_dir)
    targets: str | list[str]
    if list(target_modules) == ["auto"]:
        if model_type in LORA_TARGETS:
            targets, source = list(LORA_TARGETS[model_type]), "architecture default"
        else:
            targets, source = "all-linear", "all-linear (architecture without a default)"
    elif list(target_modules) == ["all-linear"]:
        targets, source = "all-linear", "--lora_target_modules"
    else:
        targets, source = list(target_modules), "--lora_target_modules"
    return {"r": int(r), "alpha": int(alpha if alpha is not None else 2 * r),
            "target_modules": targets, "modules_to_save": [], "model_type": model_type,
            "source": source}
