"""A user's own model family, end to end, for three structurally different
chat formats: Qwen2.5 (``<tool_call>`` JSON inside ChatML), Llama 3.2 (a bare JSON call after
the assistant header, ``<|eot_id|>``; TRL has no ``{% generation %}`` template for it) and
gpt-oss (harmony channels: ``commentary to=functions.NAME``, ``<|call|>``; MoE experts).

For each: the family's tiny model (its architecture class, a BPE with its tokens, TRL's
template byte for byte) is warm-started on demonstrations rendered with its own template
(:mod:`ecredit_trl.policy.family_warmstart`), then ``train.py`` runs 2 GRPO steps of arm M with
LoRA and gradient checkpointing on, in Podman with real verifier trials, and ``eval.run``
evaluates the saved adapter. Checked: tool calls in the family's format were parsed and run
(a file changed), factual and counterfactual trials ran, the credit C is non-zero exactly on
the selected turn's tokens of the turn map (and their count is the rollout's record of that
turn), the adapter targets the family's modules, and ``eval.run`` grades rollouts of it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.podman, pytest.mark.slow]

#: The families run end to end (the others are round trips in test_families.py).
E2E_FAMILIES = ("qwen2_5", "llama3_2", "gptoss")
MAX_TURNS = 4
#: Text each family's template writes around a call (TRL's chat_templates/<name>.jinja): the
#: evaluated turns must carry it, so the calls were parsed from that family's format.
CALL_FORMAT = {"qwen2_5": ("<tool_call>\n{", "</tool_call><|im_end|>"),
               "llama3_2": ('{"name": ', '"parameters": ', "<|eot_id|>"),
               "gptoss": (" to=functions.", "<|channel|>commentary json<|message|>", "<|call|>")}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def e2e_tasks(tmp_path_factory):
    """(tasks, the split file holding them) for training and evaluation."""
    from ecredit_trl.policy.family_warmstart import DEFAULT_TASKS, default_tasks
    from eval.tasks.schema import save_tasks

    # two single-block training tasks (view -> str_replace -> submit -> closing turn) that
    # the warm start memorises
    tasks = default_tasks()
    assert [t.instance_id for t in tasks] == list(DEFAULT_TASKS)
    path = tmp_path_factory.mktemp("split") / "e2e.jsonl"
    save_tasks(tasks, path)
    return tasks, path


def _capture_credit(monkeypatch) -> list[dict]:
    """Record every call of the trainer's per-token advantage seam (inputs and outputs)."""
    import ecredit_trl.credit.injection as injection_mod

    real = injection_mod.per_token_advantages
    seen: list[dict] = []

    def spy(arm, **kw):
        out = real(arm, **kw)
        seen.append({"selected": list(kw["selected_turns"]), "contrasts": list(kw["contrasts"]),
                     "C": out[1].detach().clone(), "turns": out[2].detach().clone()})
        return out

    monkeypatch.setattr(injection_mod, "per_token_advantages", spy)
    return seen


def _train(template: str, policy: str, split: Path, runs: Path) -> Path:
    from ecredit_trl.train import main

    rc = main(["--arm", "M", "--model", policy, "--tasks", str(split), "--max_steps", "2",
               "--lora_r", "8", "--gradient_checkpointing", "true",
               "--max_turns", str(MAX_TURNS), "--max_completion_length", "1024",
               "--runs_dir", str(runs), "--save_strategy", "no", "--verifier_retries", "0",
               "--seed", "0"])
    assert rc == 0, template
    (run,) = runs.iterdir()
    return run


def _check_credit(seen: list[dict], rows: list[dict]) -> int:
    """C != 0 exactly on the selected turn's tokens; returns how many rows were credited."""
    credited = 0
    flat = [(s, d, c, t) for call in seen for s, d, c, t in
            zip(call["selected"], call["contrasts"], call["C"], call["turns"], strict=True)]
    assert len(flat) == len(rows)
    for (sel, d, c, turns), row in zip(flat, rows, strict=True):
        assert row["selected_turn"] == sel and row["contrast"] == d
        if sel is None or not d:
            assert not c.any()
            continue
        on_turn = turns == sel
        assert ((c != 0) == on_turn).all(), "credit off the selected turn's tokens"
        # the trainer's turn map agrees with the rollout's own count of that turn's tokens
        assert int(on_turn.sum()) == row["turns"][sel - 1]["generated_tokens"] == row["m"]
        credited += 1
    return credited


@pytest.mark.parametrize("template", E2E_FAMILIES)
def test_family_end_to_end(template, e2e_tasks, tmp_path, monkeypatch, podman_runtime, capsys):
    from ecredit_trl.policy.families import FAMILIES
    from ecredit_trl.policy.family_warmstart import ensure_family_policy
    from ecredit_trl.policy.family_warmstart import main as family_cli
    from ecredit_trl.policy.lora_defaults import LORA_TARGETS
    from eval.evaluation.options import EvalOptions
    from eval.run import evaluate

    tasks, _ = e2e_tasks
    # the documented path: `family_warmstart build TEMPLATE --write-tasks FILE` prints the
    # model dir and writes the tasks it knows; training and evaluation use that file
    split = tmp_path / "family-tasks.jsonl"
    assert family_cli(["build", template, "--write-tasks", str(split)]) == 0
    policy = capsys.readouterr().out.strip().splitlines()[-1]
    assert policy == str(ensure_family_policy(template, tasks))
    assert [r["instance_id"] for r in _jsonl(split)] == [t.instance_id for t in tasks]
    warm = json.loads((Path(policy) / "warmstart.json").read_text())
    assert warm["chat_template_ok"] and warm["arch"] == FAMILIES[template].arch

    seen = _capture_credit(monkeypatch)
    run = _train(template, policy, split, tmp_path / "runs")
    rows = _jsonl(run / "trajectories.jsonl")
    assert len(rows) == 8  # 2 steps x 4 rollouts
    # real tool calls in the family's format, parsed (by TRL's parser for this template) and
    # executed in the container; a str_replace changed the snapshot of its turn
    ran = [c for r in rows for c in r["tool_calls"] if c["ok"]]
    assert {c["name"] for c in ran} >= {"view", "str_replace", "submit"}
    edited = [(r, c) for r in rows for c in r["tool_calls"]
              if c["ok"] and c["name"] == "str_replace" and r["turns"][c["turn"] - 1]["writes"]]
    assert edited, "no tool call changed the snapshot"
    # real verifier trials: factual for every scored rollout, counterfactual for selected ones
    scored = [r for r in rows if r["factual"] is not None]
    assert scored and all(r["factual_outcome"] not in (None, "infra_error") for r in scored)
    queried = [r for r in rows if r["counterfactual"] is not None]
    assert queried and all(r["selected_turn"] in r["eligible_turns"] for r in queried)
    assert _check_credit(seen, rows) >= 1, "no rollout got credit (no D != 0)"

    # LoRA with the family's target modules, gradient checkpointing on, both on record
    man = json.loads((run / "manifest.json").read_text())
    lora = man["config"]["model"]["lora"]
    model_type = json.loads((Path(policy) / "config.json").read_text())["model_type"]
    assert lora["target_modules"] == list(LORA_TARGETS[model_type])
    assert man["config"]["ecredit"]["gradient_checkpointing"] is True
    final = run / "checkpoint-final"
    adapter = json.loads((final / "adapter_config.json").read_text())
    assert set(adapter["target_modules"]) == set(LORA_TARGETS[model_type])
    assert adapter["r"] == 8 and not (final / "model.safetensors").exists()

    # eval.run loads the adapter (merged on its base) and grades its rollouts
    res = evaluate(EvalOptions(model=str(final), split=str(split), n=1, out=tmp_path / "eval",
                               max_turns=MAX_TURNS),
                   runtime=podman_runtime, log=lambda *_: None)
    s = res["summary"]
    assert s["denominator"]["slots"] == 2
    assert s["resolved"] + s["failed"] + s["unknown"] == 2 and s["unknown"] < 2
    assert res["model"]["adapter"] is True and res["model"]["base_model"] == policy
    assert s["resolved"] >= 1  # the merged adapter still solves a memorised task
    ev = _jsonl(tmp_path / "eval" / "rollouts.jsonl")
    assert len(ev) == 2
    call_turns = [t for r in ev for t in r["turns"] if t["tool_calls"]]
    assert call_turns and all(t["executed"] for t in call_turns)
    for t in call_turns:
        text = t["text"]
        assert all(mark in text for mark in CALL_FORMAT[template]), text
