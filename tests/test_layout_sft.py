"""The warm starts share one SFT path (``ecredit_trl.policy.sft.run_sft_job``): no other module
builds TRL's ``SFTConfig`` / ``SFTTrainer`` or saves and restores torch's thread count."""

import ast
import json
from pathlib import Path

from conftest import REPO_ROOT

from ecredit_trl.policy.sft import read_job

SHARED = Path("ecredit_trl/policy/sft.py")
SCANNED = ("ecredit_trl", "eval", "sandbox", "benchmarks", "scripts", "docs")


def _called(tree: ast.AST) -> set[str]:
    """The last name of every called function (``torch.set_num_threads(...)`` ->
    ``set_num_threads``)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            out.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return out


def offences(source: str) -> list[str]:
    """What a module does that only the shared SFT path may: build ``SFTConfig`` /
    ``SFTTrainer``, or read and set torch's thread count (a save and restore)."""
    called = _called(ast.parse(source))
    out = sorted(called & {"SFTConfig", "SFTTrainer"})
    if {"get_num_threads", "set_num_threads"} <= called:
        out.append("restores torch threads")
    return out


def test_the_rule_catches_a_second_sft_path():
    assert offences("from trl import SFTConfig\nargs = SFTConfig(output_dir='x')\n") == [
        "SFTConfig"]
    assert offences("import torch\nprev = torch.get_num_threads()\ntorch.set_num_threads(1)\n"
                    "torch.set_num_threads(prev)\n") == ["restores torch threads"]
    # setting the thread count for generation (no restore) is not training
    assert offences("import torch\ntorch.set_num_threads(2)\n") == []


def test_only_the_shared_sft_path_builds_an_sft_config_or_restores_threads():
    bad = {}
    for top in SCANNED:
        for path in sorted((REPO_ROOT / top).rglob("*.py")):
            rel = path.relative_to(REPO_ROOT)
            if rel != SHARED and (o := offences(path.read_text())):
                bad[str(rel)] = o
    assert bad == {}
    assert offences((REPO_ROOT / SHARED).read_text()) == [
        "SFTConfig", "SFTTrainer", "restores torch threads"]


def test_a_job_reads_back_rows_holding_line_separators(tmp_path):
    """Demonstrations are written with ensure_ascii=False; a row quoting U+2028 / U+0085 (a
    repository file may hold them) reads back whole, not cut at them."""
    rows = [{"messages": [{"role": "tool", "content": "a\u2028b\u0085c\u2029d"}]}, {"n": 2}]
    (tmp_path / "job.json").write_text(json.dumps({"recipe": "x"}))
    with open(tmp_path / "demos.jsonl", "w", encoding="utf-8") as fh:  # as the writer does
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    assert read_job(tmp_path) == ({"recipe": "x"}, rows)
