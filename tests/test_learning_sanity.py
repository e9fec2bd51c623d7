"""The learning sanity benchmark refuses a before/after comparison at different generation
settings (``benchmarks/learning_sanity.py``): a bare model directory evaluated with
``eval.run``'s defaults against a run directory evaluated with its training settings compares
different budgets."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import REPO_ROOT

spec = importlib.util.spec_from_file_location("learning_sanity",
                                              REPO_ROOT / "benchmarks" / "learning_sanity.py")
sanity = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sanity)

RUN = {"max_turns": 3, "max_new_tokens": 640, "temperature": 1.0, "top_p": 1.0}


def test_matching_settings_pass():
    sanity.same_settings({"settings": dict(RUN)}, {"settings": dict(RUN)}, "before vs after")


@pytest.mark.parametrize("field,value", [("max_turns", 4), ("max_new_tokens", 1024),
                                         ("temperature", 0.7), ("top_k", 50)])
def test_a_different_budget_stops_naming_the_field(field, value):
    with pytest.raises(SystemExit) as exc:
        sanity.same_settings({"settings": dict(RUN)}, {"settings": {**RUN, field: value}},
                             "before vs after arm O")
    msg = str(exc.value)
    assert "before vs after arm O" in msg and field in msg and repr(value) in msg
