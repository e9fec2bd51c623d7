"""The entry points' console: our lines and TRL's log, not upstream deprecation notices.

:func:`quiet_upstream_warnings` is called first thing in the ``main`` of each entry point
(``ecredit_trl/train.py``, ``python -m eval.run``, ``python -m ecredit_trl.study``). It
ignores only the deprecation warnings listed in :data:`UPSTREAM_WARNINGS`, each matched by
category, message and the upstream module that warns, so any other warning (ours, or a new
upstream one) is still shown. Tests do not call it: a test run sees every warning.
"""

from __future__ import annotations

import warnings

__all__ = ["UPSTREAM_WARNINGS", "quiet_upstream_warnings"]

UPSTREAM_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    # transformers 5 TrainingArguments.__post_init__: TRL's GRPOConfig (and our defaults) set
    # the old field names; the value is carried over to activation_checkpointing.
    (FutureWarning,
     r"`gradient_checkpointing(_kwargs)?` is deprecated and will be removed in v6\. "
     r"Use `activation_checkpointing(_kwargs)?` instead\.",
     r"transformers\.training_args"),
    # transformers 5 PreTrainedModel.is_gradient_checkpointing: read by TRL
    # (trl/models/utils.py: disable_gradient_checkpointing, _unwrap_model_for_generation) at
    # every generation round.
    (FutureWarning,
     r"`is_gradient_checkpointing` is deprecated and will be removed in v6\. "
     r"Use `is_activation_checkpointing` instead\.",
     r"transformers\.modeling_utils"),
)
"""``(category, message regex, warning module regex)`` of each ignored upstream warning."""


def quiet_upstream_warnings() -> None:
    """Ignore the known upstream deprecation warnings of :data:`UPSTREAM_WARNINGS` in this
    process (idempotent; other warnings keep their default handling)."""
    for category, message, module in UPSTREAM_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
