"""The entry points' console: the known upstream deprecation warnings are ignored there,
every other warning is still shown (tests themselves filter nothing)."""

import ast
import warnings

import pytest
from conftest import REPO_ROOT

from eval.console import UPSTREAM_WARNINGS, quiet_upstream_warnings

ENTRY_POINTS = ("ecredit_trl/train.py", "eval/run.py", "ecredit_trl/study/__main__.py")


def _shown(emit) -> list[str]:
    """Messages ``emit()`` shows after :func:`quiet_upstream_warnings` (filters restored after)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.resetwarnings()
        warnings.simplefilter("always")
        quiet_upstream_warnings()
        emit()
    return [str(w.message) for w in seen]


def _warn_from(module: str, message: str, category=FutureWarning):
    warnings.warn_explicit(message, category, filename=module.replace(".", "/") + ".py",
                           lineno=1, module=module, registry={})


def test_the_known_upstream_deprecations_are_filtered_and_others_shown():
    grad = "`gradient_checkpointing` is deprecated and will be removed in v6. Use " \
           "`activation_checkpointing` instead."
    is_grad = "`is_gradient_checkpointing` is deprecated and will be removed in v6. Use " \
              "`is_activation_checkpointing` instead."
    unrelated = "`some_option` is deprecated and will be removed in v6."
    shown = _shown(lambda: (
        _warn_from("transformers.training_args", grad),
        _warn_from("transformers.modeling_utils", is_grad),
        _warn_from("transformers.training_args", unrelated),  # another upstream notice
        _warn_from("ecredit_trl.trainer", is_grad),  # the same text, not from upstream
        _warn_from("transformers.training_args", grad, UserWarning),  # another category
    ))
    assert shown == [unrelated, is_grad, grad]
    assert len(UPSTREAM_WARNINGS) == 2


def test_transformers_own_training_arguments_warning_is_filtered(tmp_path):
    transformers = pytest.importorskip("transformers")

    def emit():
        transformers.TrainingArguments(output_dir=str(tmp_path), gradient_checkpointing=False,
                                       report_to=[])
        warnings.warn("unrelated", FutureWarning, stacklevel=1)

    shown = _shown(emit)
    assert "unrelated" in shown
    assert not any("gradient_checkpointing" in m for m in shown), shown


@pytest.mark.parametrize("path", ENTRY_POINTS)
def test_entry_points_quiet_upstream_warnings_first(path):
    tree = ast.parse((REPO_ROOT / path).read_text())
    (main,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    body = main.body[1:] if isinstance(main.body[0].value, ast.Constant) else main.body
    first = body[0]
    assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Call) \
        and getattr(first.value.func, "id", None) == "quiet_upstream_warnings", path
