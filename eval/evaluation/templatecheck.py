"""Is a policy's chat template one TRL can parse tool calls from?

TRL 1.16's ``trl.chat_template_utils.add_response_schema`` gives a tokenizer a tool-call
parser only when its chat template equals one of TRL's shipped templates character for
character; anything else raises "Unrecognized chat template" deep inside the trainer, after
the tasks, the sandbox service and the start receipt. This module checks the template text
up front and refuses in one line that names the model, says what is missing and gives the
fix (``--chat_template NAME``: use TRL's copy of that family's template).

Stdlib only (like :mod:`eval.evaluation.modelref`): ``eval.run`` uses it without importing TRL. TRL's
templates are read from the installed package's ``trl/chat_templates/`` folder, located with
``importlib.util.find_spec`` (the package is not imported).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from eval.evaluation.modelref import hub_snapshot, looks_like_hub_id

__all__ = ["CHAT_TEMPLATE_HELP", "NO_TOOL_TEMPLATES", "TOOL_TEMPLATES", "TemplateRefused", "check_template",
           "check_policy_template", "model_template_text", "resolve_template_option", "trl_template"]

#: The templates ``add_response_schema`` (TRL 1.16) maps to a response template, by the parser
#: it sets: the names accepted by ``--chat_template``. Source: the if/elif chain of
#: ``add_response_schema`` in ``trl/chat_template_utils.py``; ``tests/test_chat_templates.py``
#: checks this table against the installed TRL.
TOOL_TEMPLATES: dict[str, str] = {
    "glm4moe": "glm4moe", "gptoss": "gptoss",
    "llama3_1": "llama3", "llama3_2": "llama3",
    "qwen2_5": "qwen3", "qwen3": "qwen3", "qwen3_instruct_2507": "qwen3", "qwen3_vl": "qwen3",
    "qwen3_5_nothink": "qwen3_5", "qwen3_5_think": "qwen3_5", "qwen3_6": "qwen3_5",
    "qwen3_8": "qwen3_5",
    "nemotron_3_nano": "nemotron_3", "nemotron_3_super": "nemotron_3",
    "nemotron_3_ultra": "nemotron_3", "nemotron_3_5_lightning": "nemotron_3",
    "lfm2_v2": "lfm2_2_5", "lfm2_2_5": "lfm2_2_5", "lfm2_2_5_v2": "lfm2_2_5",
    "lfm2_2_5_vl": "lfm2_2_5",
    "gemma4": "gemma4", "gemma4_v2": "gemma4", "gemma4_v3": "gemma4", "gemma4_v4": "gemma4",
    "gemma4_v5": "gemma4",
}

#: Help of ``--chat_template``, shared by ``train.py`` (``ECreditConfig.chat_template``),
#: ``eval.run`` and ``python -m ecredit_trl.agent.rollouts``.
CHAT_TEMPLATE_HELP = (
    "use TRL's copy of this family's chat template instead of the model's own (TRL parses "
    "tool calls only from its own templates, character for character): "
    + ", ".join(TOOL_TEMPLATES))

#: Mapped by ``add_response_schema`` but rendering no tool calls (TRL's
#: ``supports_tool_calling`` is False: the template drops ``tool_calls`` when content is set),
#: so no agent episode can run with them.
NO_TOOL_TEMPLATES = ("deepseek_r1_distill",)

#: A template that differs from TRL's in at most this many characters is reported as an edited
#: copy of it ("differs from TRL's X at character N"); beyond, as matching none.
_NEAR_CHARS = 64


class TemplateRefused(ValueError):
    """A policy whose chat template TRL cannot parse tool calls from (one-line message)."""


def _trl_dir() -> Path:
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("trl is not installed (needed for its chat templates)")
    return Path(list(spec.submodule_search_locations)[0]) / "chat_templates"


def trl_template(name: str) -> str:
    """TRL's shipped template ``name`` (``trl/chat_templates/<name>.jinja``), as TRL reads it.

    Raises: ValueError naming ``--chat_template`` and the accepted names for a name not in
        :data:`TOOL_TEMPLATES`.
    """
    if name not in TOOL_TEMPLATES:
        extra = (f" ({name} renders no tool calls)" if name in NO_TOOL_TEMPLATES else "")
        raise ValueError(f"--chat_template: unknown template {name!r}{extra}; expected one of "
                         f"{', '.join(TOOL_TEMPLATES)}")
    return (_trl_dir() / f"{name}.jinja").read_text(encoding="utf-8")


def _mismatch(a: str, b: str) -> tuple[int, int]:
    """(first differing character, characters outside the common prefix and suffix)."""
    n = min(len(a), len(b))
    p = 0
    while p < n and a[p] == b[p]:
        p += 1
    s = 0
    while s < n - p and a[-1 - s] == b[-1 - s]:
        s += 1
    return p, max(len(a), len(b)) - p - s


def _diagnose(text: str | None) -> tuple[str | None, str]:
    """(TRL name when ``text`` is exactly a tool template, else None; what is missing)."""
    if not text:
        return None, "it has no chat template"
    if not isinstance(text, str):
        return None, "its chat template is a set of named variants, not one TRL template"
    best = None
    for name in (*TOOL_TEMPLATES, *NO_TOOL_TEMPLATES):
        ref = (_trl_dir() / f"{name}.jinja").read_text(encoding="utf-8")
        if text == ref:
            if name in NO_TOOL_TEMPLATES:
                return None, f"it is TRL's {name} template, which renders no tool calls"
            return name, ""
        at, diff = _mismatch(text, ref)
        if best is None or diff < best[2]:
            best = (name, at, diff)
    if best is not None and best[2] <= _NEAR_CHARS:
        return None, (f"it differs from TRL's {best[0]} template at character {best[1]}, and "
                      "TRL parses tool calls only from its own templates, character for character")
    return None, "it matches none of TRL's templates with a tool-call parser"


def check_template(text: str | None, model: str) -> str:
    """The TRL template name of ``text``; refuse anything TRL cannot parse tool calls from.

    Args:
        text: the policy tokenizer's ``chat_template`` (after any ``--chat_template``).
        model: the model as the user named it (path or hub id), for the message.

    Returns: the name in :data:`TOOL_TEMPLATES` whose TRL copy equals ``text``.

    Raises: TemplateRefused, one line: the model, what is missing, the fix
        (``--chat_template NAME`` with the accepted names).
    """
    name, missing = _diagnose(text)
    if name is not None:
        return name
    raise TemplateRefused(
        f"model {model}: no tool-call parser for its chat template ({missing}); pass "
        f"--chat_template NAME to use TRL's copy of that family's template, NAME one of: "
        f"{', '.join(TOOL_TEMPLATES)}")


def resolve_template_option(name: str | None, text: str | None, model: str) -> tuple[str, str]:
    """The template a run uses: TRL's ``name`` when given, else the model's own ``text``,
    checked with :func:`check_template`.

    Returns: (TRL template name, template text to set on the tokenizer).

    Raises: ValueError naming ``--chat_template`` for an unknown name; TemplateRefused.
    """
    if name:
        return name, trl_template(name)
    return check_template(text, model), text


def model_template_text(model_dir: str | Path) -> str | None:
    """The chat template a tokenizer saved in ``model_dir`` carries, read as transformers 5
    does: ``chat_template.jinja`` first, else ``tokenizer_config.json``'s ``chat_template``
    (a string; a list of named variants is returned as given). None when there is none.

    Raises: ValueError naming the file when ``tokenizer_config.json`` is not JSON.
    """
    d = Path(model_dir)
    jinja = d / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    cfg = d / "tokenizer_config.json"
    if not cfg.is_file():
        return None
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"tokenizer config {cfg}: not valid JSON ({exc.msg})") from None
    return data.get("chat_template") if isinstance(data, dict) else None


def check_policy_template(ref, chat_template: str | None = None) -> str:
    """:func:`resolve_template_option` for a resolved policy (:class:`eval.evaluation.modelref.ModelRef`):
    the template its tokenizer was saved with (the model dir's, else an adapter's base's).

    Returns: the TRL template name. Raises: TemplateRefused; ValueError for an unknown name.
    """
    tok_dir = Path(ref.model_dir)
    if ref.adapter and model_template_text(tok_dir) is None and ref.base_model:
        base = Path(ref.base_model).expanduser()
        if not base.is_dir() and looks_like_hub_id(ref.base_model):
            base = hub_snapshot(ref.base_model)
        tok_dir = base
    text = None if chat_template else model_template_text(tok_dir)
    return resolve_template_option(chat_template, text, ref.given)[0]
