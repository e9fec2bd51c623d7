"""Batched evaluation rollouts: the embedded policy on bundled tasks gives the
same seeded rows one episode at a time and batched (greedy and sampled); rows are written as
episodes end, resume skips written slots, errors release every environment. No Podman: the
agent's bash has no sandbox (the embedded policy views, edits and submits)."""

from __future__ import annotations

import json

import pytest
from test_rollouts import task, tiny  # noqa: F401 - fixtures

from ecredit_trl.agent.generation import GenerationSettings, load_rollout_policy
from ecredit_trl.agent.rollouts import run_rollouts

#: What may differ between two runs of the same seeded rollout: wall-clock seconds and the
#: engine tag (batch size).
VOLATILE = ("timings", "engine")


@pytest.fixture(scope="module")
def embedded():
    from ecredit_trl.policy.warmstart import ensure_default_policy
    from eval.tasks.splits import load_tasks

    path = ensure_default_policy(load_tasks("bundled:train", purpose="train"))
    return load_rollout_policy(path, device="cpu")


@pytest.fixture(scope="module")
def tasks():
    from eval.tasks.splits import load_tasks

    return load_tasks("bundled:train", purpose="eval")[:3]


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _stable(row):
    out = {k: v for k, v in row.items() if k not in VOLATILE}
    out["tool_calls"] = [{k: v for k, v in c.items() if k != "seconds"}
                         for c in row["tool_calls"]]
    return out


def _by_slot(rows):
    return {(r["task_id"], r["rollout_index"]): _stable(r) for r in rows}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_rows_equal_one_at_a_time(embedded, tasks, tmp_path, temperature):
    settings = GenerationSettings(temperature=temperature, max_turns=4, max_new_tokens=640)
    common = dict(n=2, seed=7, settings=settings, runtime=None, log=lambda *_: None)
    seq = run_rollouts(embedded, tasks, tmp_path / "seq.jsonl", batch_size=1, **common)
    bat = run_rollouts(embedded, tasks, tmp_path / "bat.jsonl", batch_size=4,
                       agent_concurrency=3, **common)
    assert seq["written"] == bat["written"] == 6 and seq["binding"] == bat["binding"]
    assert bat["generate_calls"] < bat["generated_rows"]  # turns really were batched
    a, b = _rows(tmp_path / "seq.jsonl"), _rows(tmp_path / "bat.jsonl")
    assert _by_slot(a) == _by_slot(b)
    assert {r["engine"]["batch_size"] for r in b} == {4}
    # not a vacuous equality: episodes made tool calls over several turns and tokens
    assert sum(len(r["tool_calls"]) for r in a) >= 6
    assert max(c["turn"] for r in a for c in r["tool_calls"]) >= 2
    assert all(r["generated_tokens"] > 0 for r in a)
    if temperature == 0.0:  # greedy: the two rollouts of a task are the same episode
        for t in tasks:
            assert (_stable(next(r for r in a if r["task_id"] == t.instance_id
                                 and r["rollout_index"] == 0))["artifact"]
                    == _by_slot(a)[(t.instance_id, 1)]["artifact"])


def test_batched_resume_skips_written_slots(embedded, tasks, tmp_path):
    settings = GenerationSettings(temperature=0.0, max_turns=2, max_new_tokens=200)
    out = tmp_path / "r.jsonl"
    common = dict(n=2, seed=0, settings=settings, runtime=None, log=lambda *_: None,
                  batch_size=3)
    first = run_rollouts(embedded, tasks[:1], out, **common)
    assert first["written"] == 2
    again = run_rollouts(embedded, tasks[:2], out, binding=first["binding"], **common)
    assert again["skipped"] == 2 and again["written"] == 2
    slots = [(r["task_id"], r["rollout_index"]) for r in _rows(out)]
    assert sorted(slots) == sorted((t.instance_id, i) for t in tasks[:2] for i in range(2))


def test_batched_reset_error_raises_and_releases(embedded, tasks, tmp_path):
    import dataclasses
    import os

    # no repo_dir: an image-held task, which needs the Podman runtime (runtime=None here)
    bad = dataclasses.replace(tasks[1], repo_dir=None)
    settings = GenerationSettings(temperature=0.0, max_turns=2, max_new_tokens=100)
    before = set(os.listdir("/tmp"))
    with pytest.raises(ValueError, match=r"runtime: task .* is held in image .* need the "
                       r"Podman runtime"):
        run_rollouts(embedded, [tasks[0], bad], tmp_path / "x.jsonl", n=1, seed=0,
                     settings=settings, runtime=None, batch_size=2, log=lambda *_: None)
    left = [d for d in set(os.listdir("/tmp")) - before if d.startswith("ecredit-rollouts-")]
    assert left == []  # the work root (every episode's tree) is gone
    with pytest.raises(ValueError, match="batch_size"):
        run_rollouts(embedded, tasks, tmp_path / "y.jsonl", n=1, seed=0, settings=settings,
                     runtime=None, batch_size=0)


class ScriptedEngine:
    """A generation engine whose episodes say fixed texts: the k-th episode started gets
    ``scripts[k % len(scripts)]`` (its per-episode sampler); the real template, parser, pool,
    environment and records run on them."""

    name = "scripted"

    def __init__(self, tokenizer, scripts):
        self.tok, self.scripts, self.calls, self.started = tokenizer, scripts, [], 0

    def row_sampler(self, seed):
        self.started += 1
        return list(self.scripts[(self.started - 1) % len(self.scripts)])

    def generate_batch(self, contexts, limits, settings, scripts):
        self.calls.append(len(contexts))
        out = []
        for script, limit in zip(scripts, limits, strict=True):
            ids = self.tok(script.pop(0), add_special_tokens=False)["input_ids"]
            out.append((ids + [self.tok.eos_token_id])[:limit])
        return out


def test_tool_calls_run_concurrently_in_order_with_exact_turns(tiny, task, tmp_path,  # noqa: F811
                                                               monkeypatch):
    """Episodes of different lengths share rounds, so one round runs tool calls of different
    turns at once: each call must carry its own episode's turn."""
    import threading
    import time

    from test_rollouts import _call, _policy

    import ecredit_trl.agent.batched as batched

    policy = _policy(tiny, [])
    fix = _call("str_replace", path="calc.py", old_str="return a - b", new_str="return a + b")
    long = [_call("view", path="calc.py"), _call("view", path="calc.py", line=1), fix,
            _call("submit")]
    short = [_call("view", path="calc.py") + "\n" + fix, _call("submit")]
    engine = ScriptedEngine(policy.tokenizer, [long, short])
    active, peak, lock = [0], [0], threading.Lock()
    real = batched.run_tool_calls

    def counting(calls, fns):  # one job = one episode's calls of one turn
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.3)
        try:
            return real(calls, fns)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(batched, "run_tool_calls", counting)
    out = tmp_path / "s.jsonl"
    s = run_rollouts(policy, [task], out, n=4, seed=0, settings=GenerationSettings(max_turns=5),
                     runtime=None, batch_size=2, agent_concurrency=2, engine=engine,
                     log=lambda *_: None)
    rows = _rows(out)
    assert s["written"] == 4 and len(rows) == 4
    assert peak[0] == 2  # two episodes' tool jobs ran at once
    assert max(engine.calls) == 2 and sum(engine.calls) == 4 + 2 + 4 + 2  # turns generated
    shapes = sorted([c["name"] for c in r["tool_calls"]] + [c["turn"] for c in r["tool_calls"]]
                    for r in rows)
    assert shapes == sorted([["view", "view", "str_replace", "submit", 1, 2, 3, 4]] * 2
                            + [["view", "str_replace", "submit", 1, 1, 2]] * 2)
    for r in rows:
        assert r["stop_reason"] == "submit" and "+    return a + b" in r["artifact"]
        assert r["engine"] == {"name": "scripted", "batch_size": 2}
        k = 3 if len(r["turns"]) == 4 else 1  # the turn that wrote calc.py
        assert [list(t["writes"]) for t in r["turns"]] == [
            ["calc.py"] if i == k else [] for i in range(1, len(r["turns"]) + 1)]
    assert sorted(r["rollout_index"] for r in rows) == [0, 1, 2, 3]
