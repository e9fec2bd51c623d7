"""Tool calls in parallel across rollouts: TRL's own tool loop, prefetched.

TRL 1.16's real ``GRPOTrainer._tool_call_loop`` runs here on a stand-in trainer: the
generation is scripted (token ids name the next assistant message; ``parse_response``
reads them back) and the tools belong to fake environments that record every call. Only
the policy is scripted; the loop (overlong rollback, empty post-tool completions, the
iteration cap, failure counting) is TRL's.
"""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import trl.trainer.grpo_trainer as grpo
from trl import GRPOTrainer

from ecredit_trl.agent.toolpool import (
    PrefetchMismatch,
    ToolPrefetcher,
    expected_calls,
    prefetch_resets,
)


def call(name, **args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


def msg(*calls, text=""):
    m = {"role": "assistant", "content": text}
    if calls:
        m["tool_calls"] = list(calls)
    return m


TEXT = msg(text="done")
# row -> the assistant message of each generation (None: an empty post-tool completion)
SCRIPT = {
    0: [msg(call("a", x=1), call("a", x=2)), msg(call("boom")), TEXT],  # error path, then ends
    1: [TEXT],  # no tool call: never enters the loop
    2: [msg(call("big"))],  # its tool result is overlong: rolled back, leaves the loop
    3: [msg(call("a", x=4)), None],  # empty post-tool completion
    4: [msg(call("a", x=5)), msg(call("a", x=6)), msg(call("a", x=7)), msg(call("a", x=8))],
    5: [msg(call("nope"), {"type": "other", "name": "n"}, call("a", y=1), call("a", x=9)),
        TEXT],  # unknown tool, wrong type, bad argument, then a good call
    6: [msg(call("nope")), msg(call("a", x=10)), TEXT],  # no proxied call in iteration 0
}


class FakeEnv:
    def __init__(self, row: int, log: list, barrier=None) -> None:
        self.row, self.log, self.barrier = row, log, barrier

    def a(self, x: int) -> str:
        self.log.append((self.row, "a", x, threading.get_ident()))
        time.sleep(0.01)
        return f"a{x}"

    def boom(self) -> str:
        self.log.append((self.row, "boom", None, threading.get_ident()))
        raise RuntimeError("boom failed")

    def big(self) -> str:
        self.log.append((self.row, "big", None, threading.get_ident()))
        return "x" * 500

    def meet(self) -> str:
        self.log.append((self.row, "meet", None, threading.get_ident()))
        self.barrier.wait()  # passes only when two calls are in flight at once
        return "met"

    def tools(self) -> dict:
        return {"a": self.a, "boom": self.boom, "big": self.big, "meet": self.meet}


class Config:
    max_position_embeddings = 10**6


class Model:
    config = Config()


class StandIn:
    """The attributes TRL's ``_tool_call_loop`` reads, with a scripted generation."""

    _tool_call_loop = GRPOTrainer._tool_call_loop

    def __init__(self, script, envs, max_iterations=3, prefetch=None) -> None:
        self.script = script
        self._sync_tool_dicts = [e.tools() for e in envs]
        self._async_tool_dicts = [{} for _ in envs]
        self.max_tool_calling_iterations = max_iterations
        self.max_completion_length = 200
        self.use_vllm, self._is_vlm, self.model = False, False, Model()
        self.environment_factories, self.tools, self._tokenizer = None, [], None
        self.turns = {r: 0 for r in script}
        self.generations: list[list[int]] = []
        self.prefetch = prefetch
        self.ended_before_generation: list[set] = []

    def _get_tool_suffix_ids(self, tool_messages):
        return [7] * sum(len(str(m["content"])) for m in tool_messages)

    def _generate_single_turn(self, ids, images, mm, num_generations=1, has_tool_images=False):
        if self.prefetch is not None:
            self.prefetch.generation_started()
            self.ended_before_generation.append(set(self.ended))
        rows = [p[0] - 1000 for p in ids]
        self.generations.append(rows)
        out = []
        for r in rows:
            self.turns[r] += 1
            m = self.script[r][self.turns[r]]
            out.append([] if m is None else [r * 100 + self.turns[r]])
        return out, None


CURRENT = {"script": SCRIPT}  # the script the running loop reads back


def fake_parse(tokenizer, ids, prefix=None, tools=None):
    r, k = divmod(ids[0], 100)
    return copy.deepcopy(CURRENT["script"][r][k])


@pytest.fixture(autouse=True)
def scripted_parse(monkeypatch):
    monkeypatch.setattr(grpo, "parse_response", fake_parse)


def run_loop(prefetched: bool, script=SCRIPT, max_iterations=3, workers=4, barrier=None):
    log: list = []
    CURRENT["script"] = script
    envs = [FakeEnv(r, log, barrier) for r in script]
    trainer = StandIn(script, envs, max_iterations)
    prompts = [[{"role": "user", "content": f"task {r}"}] for r in script]
    prompt_ids = [[1000 + r] for r in script]
    completion_ids = [[r * 100] for r in script]
    completions = [[copy.deepcopy(script[r][0])] for r in script]
    ended: list[int] = []
    trainer.ended = ended
    pf = None
    if prefetched:
        pool = ThreadPoolExecutor(max_workers=workers)
        pf = ToolPrefetcher(completions, trainer._sync_tool_dicts, pool,
                            on_episode_end=ended.append)
        trainer.prefetch, trainer._sync_tool_dicts = pf, pf.dicts
    out = trainer._tool_call_loop(prompts, prompt_ids, completion_ids, completions, None, None,
                                  {})
    if pf is not None:
        pf.finish()
        pool.shutdown()
    return out, log, trainer, ended


def by_row(log):
    rows: dict = {}
    for r, name, x, _ in log:
        rows.setdefault(r, []).append((name, x))
    return rows


def test_prefetched_loop_gives_trls_results_and_each_rollouts_call_order():
    plain, plain_log, plain_tr, _ = run_loop(prefetched=False)
    fast, fast_log, fast_tr, ended = run_loop(prefetched=True)
    tool_mask, completions, completion_ids, logprobs, n_calls, n_failed, images = fast
    assert fast == plain  # masks, messages (tool results, errors), ids, counts
    assert (n_calls, n_failed) == (14, 5)  # boom, nope x2, type other, bad argument
    assert by_row(fast_log) == by_row(plain_log) == {
        0: [("a", 1), ("a", 2), ("boom", None)], 2: [("big", None)], 3: [("a", 4)],
        4: [("a", 5), ("a", 6), ("a", 7)], 5: [("a", 9)], 6: [("a", 10)]}
    assert fast_tr.generations == plain_tr.generations == [[0, 3, 4, 5, 6], [0, 4, 6], [4]]
    errors = [m["content"] for m in completions[0] if m["role"] == "tool"]
    assert errors == ["a1", "a2", "{'error': 'boom failed'}"]  # TRL's error path, same text
    row5 = [m["content"] for m in completions[5] if m["role"] == "tool"]
    assert "unexpected keyword argument 'y'" in row5[2] and row5[3] == "a9"
    assert len(completions[2]) == 1  # overlong: its tool result was rolled back
    # every episode ended once; when it is known: row 1 at once, row 2 (overlong) before
    # the first generation, rows 3 and 5 at the next iteration, 0 and 6 after it, 4 at the cap
    assert sorted(ended) == list(range(7))
    assert fast_tr.ended_before_generation == [{1, 2}, {1, 2, 3, 5}, {1, 2, 3, 5, 0, 6}]
    assert ended[-1] == 4


def test_calls_of_different_rollouts_run_at_the_same_time():
    script = {0: [msg(call("meet"), call("a", x=1)), TEXT],
              1: [msg(call("a", x=2), call("meet")), TEXT]}
    barrier = threading.Barrier(2, timeout=10)
    out, log, _, _ = run_loop(prefetched=True, script=script, barrier=barrier)
    assert by_row(log) == {0: [("meet", None), ("a", 1)], 1: [("a", 2), ("meet", None)]}
    assert len({tid for *_, tid in log}) == 2  # two worker threads
    assert out[4:6] == (4, 0)  # the barrier passed: no failure
    # TRL alone runs rollout 0 to the end before rollout 1: the barrier breaks
    barrier = threading.Barrier(2, timeout=0.5)
    out, _, _, _ = run_loop(prefetched=False, script=script, barrier=barrier)
    assert out[5] >= 1


def test_one_worker_keeps_trls_order_exactly():
    _, plain_log, _, _ = run_loop(prefetched=False)
    _, fast_log, _, _ = run_loop(prefetched=True, workers=1)
    assert [e[:3] for e in fast_log] == [e[:3] for e in plain_log]


def test_iteration_cap_ends_the_episodes_after_the_loop():
    _, log, trainer, ended = run_loop(prefetched=True, max_iterations=1)
    assert trainer.generations == [[0, 3, 4, 5, 6]]
    assert sorted(ended) == list(range(7)) and by_row(log)[4] == [("a", 5)]


def test_a_call_that_was_not_prefetched_fails_loudly():
    log: list = []
    with ThreadPoolExecutor(1) as pool:
        pf = ToolPrefetcher([[msg(call("a", x=1))]], [FakeEnv(0, log).tools()], pool)
        with pytest.raises(PrefetchMismatch, match="prefetched a"):
            pf.dicts[0]["a"](x=2)  # not what was prefetched: nothing else runs
    assert by_row(log) == {0: [("a", 1)]}
    assert not issubclass(PrefetchMismatch, Exception)  # TRL's `except Exception` lets it by
    with ThreadPoolExecutor(1) as pool:
        pf = ToolPrefetcher([[msg(call("a", x=1))], [msg(call("a", x=2))]],
                            [FakeEnv(0, []).tools(), FakeEnv(1, []).tools()], pool)
        with pytest.raises(PrefetchMismatch, match=r"expected rows \[0, 1\]"):
            pf.dicts[1]  # TRL reads the rows in ascending order


def test_prefetched_calls_left_unasked_fail_at_the_generation():
    completions = [[msg(call("a", x=1), call("a", x=2))]]
    with ThreadPoolExecutor(1) as pool:
        pf = ToolPrefetcher(completions, [FakeEnv(0, []).tools()], pool)
        assert pf.dicts[0]["a"](x=1) == "a1"
        completions[0].append({"role": "tool", "name": "a", "content": "a1"})
        with pytest.raises(PrefetchMismatch, match=r"\{0: 1\}"):
            pf.generation_started()


def test_expected_calls_follow_trls_skips():
    tools = {"a": None}
    calls = [call("a", x=1), call("zz"), {"type": "x"}, {"type": "function",
             "function": {"name": "a", "arguments": "{oops"}}, {"type": "function",
             "function": {"name": "a"}}, call("a")]
    assert expected_calls(calls, tools) == [("a", {"x": 1}), ("a", {})]
    with pytest.raises(KeyError):
        expected_calls([{"function": {}}], tools)


class ResetEnv:
    def __init__(self, log):
        self.log = log

    def reset(self, **row):
        self.log.append(row["instance_id"])
        return None


def test_prefetched_resets_answer_trls_calls_once():
    log: list = []
    envs = [ResetEnv(log), ResetEnv(log)]
    rows = [{"instance_id": "t1", "prompt": []}, {"instance_id": "t2", "prompt": []}]
    with ThreadPoolExecutor(2) as pool:
        prefetch_resets(envs, rows, pool)
    assert sorted(log) == ["t1", "t2"]
    assert envs[0].reset(**rows[0]) is None and sorted(log) == ["t1", "t2"]
    envs[0].reset(**rows[0])  # the next round resets for real
    assert log.count("t1") == 2
    with ThreadPoolExecutor(2) as pool:  # envs[1]'s prefetched reset was never asked for
        prefetch_resets(envs, rows, pool)
    assert sorted(log) == ["t1", "t1", "t1", "t2", "t2"]
    with pytest.raises(PrefetchMismatch, match="t2"):
        envs[1].reset(instance_id="t3", prompt=[])
