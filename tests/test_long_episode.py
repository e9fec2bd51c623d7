"""Long episodes: a scripted 40-turn episode in the real trainer, one twin cut
mid-turn by ``max_completion_length``.

Real SWE episodes run 30-100 turns and TRL's tool loop keeps the whole episode inside
``max_completion_length``. The shorter versions of these checks live in
``test_trainer_records`` (3 turns, truncation made by dropping an EOS),
``test_tool_loop_bookkeeping`` (turn maps on hand-made masks) and ``test_rollouts`` (scripted
turns through the evaluation loop). Here one group of two rollouts of a bundled task runs through
``ecredit_trl.train.main`` (Podman, the embedded policy and tokenizer with TRL's qwen3 template,
TRL's own tool loop, real tools and snapshots, real verifier trials, a real GRPO step, arm M);
only the policy's sampling is scripted, at TRL's generation seam:

* rollout 0 (**A**) makes 40 turns: views, test-only files, seven drafts of the buggy line's
  module, the gold fix at turn 35, ``submit`` at turn 39 and a plain-text turn 40;
* rollout 1 (**B**) is A's twin with a longer text before every call; ``max_completion_length``
  is set so that TRL's loop slices its turn 33 in half (after the last draft, before the fix).

Checked exactly: the token -> turn map of both rows over every turn (each turn's tokens are
the scripted ids, in order; tool-result tokens are -1 and are the tool suffix); B is
truncated by TRL's rule, masked by ``mask_truncated_completions``, excluded as ``truncated``
(its eligible block planned, no counterfactual trial, C = 0, no loss tokens); A's last-touch
eligibility (only the fix's turn: the drafts are overwritten, the other files are test-only),
its contrast from the two real trials, and its credit vector C = s·λ·D·L/m on the fix's tokens
and 0 elsewhere (design page, "Credit arms"; L leaves out turn 40, after ``submit``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

K = 40  # turns of rollout A
DRAFTS = (3, 8, 13, 18, 23, 28, 31)  # turns that edit the fix's module before the fix
GOLD_TURN, SUBMIT_TURN = 35, 39
MODULE = "inflection/__init__.py"
BUG = "    if not word and word.lower() in UNCOUNTABLES:"
FIX = "    if not word or word.lower() in UNCOUNTABLES:"
TWIN_TEXT = "Thinking it over once more before the next step, slowly and with care.\n"
CUT_TURN = 33  # the twin's budget ends inside this turn: after the last draft, before the fix
LAMBDA, CAP = 0.5, 1000.0  # cap large: s = 1, so C shows λ·D·L/m itself


def _call(name: str, **args) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def turn_call(k: int) -> str | None:
    """The tool call of turn ``k`` (None: turn 40's plain text)."""
    if k in DRAFTS:
        i = DRAFTS.index(k)
        old = BUG if i == 0 else f"    # note {i}\n{BUG}"
        return _call("str_replace", path=MODULE, old_str=old, new_str=f"    # note {i + 1}\n{BUG}")
    if k == GOLD_TURN:
        return _call("str_replace", path=MODULE, old_str=f"    # note {len(DRAFTS)}\n{BUG}",
                     new_str=FIX)
    if k == SUBMIT_TURN:
        return _call("submit")
    if k == K:
        return None
    if k % 4 == 1:
        return _call("view", path=MODULE, line=300)
    return _call("create", path=f"test_scratch_{k}.py", file_text=f"# scratch {k}\n")


def turn_text(k: int, twin: bool) -> str:
    call = turn_call(k)
    text = "The fix is submitted." if call is None else call
    return TWIN_TEXT + text if twin else text


def _scripted_generation(monkeypatch, tok, eos: int) -> dict[str, list[list[int]]]:
    """TRL's generation seam returns the scripted ids of each row's next turn (EOS appended,
    as a policy ends a turn); rows are told apart by the twin's text. Returns the ids handed
    out per row (A, B), turn by turn."""
    from trl import GRPOTrainer

    given: dict[str, list[list[int]]] = {"A": [], "B": []}

    def gen(self, prompt_ids, *args, **kwargs):
        k = self.agent_ctx.turn
        out = []
        for i, ids in enumerate(prompt_ids):
            row = ("B" if i % 2 else "A") if k == 1 else (
                "B" if TWIN_TEXT.strip() in tok.decode(ids) else "A")
            assert len(given[row]) == k - 1, f"row {row} asked for turn {k} out of order"
            new = tok(turn_text(k, row == "B"), add_special_tokens=False)["input_ids"] + [eos]
            given[row].append(new)
            out.append(new)
        return out, None

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", gen)
    return given


def _spy_credit(monkeypatch) -> list[dict]:
    """Record the inputs and outputs of the trainer's credit injection (the real function)."""
    import ecredit_trl.credit.injection as injection_mod

    real = injection_mod.per_token_advantages
    seen: list[dict] = []

    def spy(arm, **kw):
        adv, C, turns = real(arm, **kw)
        seen.append({"arm": arm, **kw, "per_token": adv, "C": C, "turns": turns})
        return adv, C, turns

    monkeypatch.setattr(injection_mod, "per_token_advantages", spy)
    return seen


def _spy_rows(monkeypatch) -> dict:
    """Keep the completion ids and pre-masking turn map of the round (TRL's own lists)."""
    from ecredit_trl.trainer import ECreditGRPOTrainer

    real = ECreditGRPOTrainer._credit_round
    seen: dict = {}

    def spy(self, rnd, out, t0):
        seen.update(ids=[list(x) for x in rnd.completion_ids], gen_turns=rnd.gen_turns.clone(),
                    completion_mask=out["completion_mask"].clone())
        return real(self, rnd, out, t0)

    monkeypatch.setattr(ECreditGRPOTrainer, "_credit_round", spy)
    return seen


def _runs(row_ids: list[int], turn_map: torch.Tensor) -> tuple[dict[int, list[int]], list]:
    """Per turn k the ids whose map entry is k (in order), and the maximal runs of -1 ids."""
    by_turn: dict[int, list[int]] = {}
    tool_runs: list[list[int]] = []
    prev = None
    for tok_id, k in zip(row_ids, turn_map[:len(row_ids)].tolist(), strict=True):
        if k >= 0:
            by_turn.setdefault(k, []).append(tok_id)
        elif prev is not None and prev < 0:
            tool_runs[-1].append(tok_id)
        else:
            tool_runs.append([tok_id])
        prev = k
    return by_turn, tool_runs


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


# -- the scripted episode through the evaluation loop (no sandbox) ---------------------------




def expected_blocks(last_turn: int) -> dict[int, tuple[tuple[str, ...], tuple[int, ...]]]:
    """Turn -> (eligibility reasons, later touches) of every edit block of turns 1..last_turn:
    a draft is overwritten by the next draft (or the fix), the fix (or, when the episode ends
    before it, the last draft) is last-touch, the scratch files are test-only."""
    edits = [k for k in (*DRAFTS, GOLD_TURN) if k <= last_turn]
    out = {}
    for k in range(1, last_turn + 1):
        call = turn_call(k) or ""
        if k in edits:
            later = tuple(j for j in edits if j > k)
            out[k] = (("not_last_touch",) if later else (), later)
        elif '"create"' in call:
            out[k] = (("test_only",), ())
    return out


def _scripted_policy(model, tok, ref, twin: bool):
    """A :class:`~ecredit_trl.agent.generation.Policy` whose turns are :func:`turn_text` (EOS
    appended; cut at the turn's limit as ``Policy.generate`` is). It notes each turn's ids
    (``script``) and the completion length the turn starts at (``starts``)."""
    from ecredit_trl.agent.generation import Policy

    class Scripted(Policy):
        def generate(self, input_ids, max_new_tokens, settings, seed):
            self.starts.append(len(input_ids) - self.prompt_len)
            ids = self.tokenizer(turn_text(len(self.starts), twin),
                                 add_special_tokens=False)["input_ids"]
            self.script.append(ids + [self.eos_token_ids[0]])
            return self.script[-1][:max_new_tokens]

    p = Scripted(model, tok, ref)
    p.starts, p.script, p.prompt_len = [], [], 0
    return p


def _episode(model_dir, max_positions: int, twin: bool, budget: int, tmp_path, tag: str):
    """One episode of the scripted policy on the first bundled training task (the real agent
    environment, no bash sandbox). Returns (row, policy, task)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release
    from ecredit_trl.agent.prompts import task_prompt
    from ecredit_trl.agent.rollouts import GenerationSettings, run_rollout
    from eval.evaluation.modelref import resolve_model
    from eval.tasks.splits import load_tasks

    task = load_tasks("bundled:train", purpose="train")[0]
    cfg = AutoConfig.from_pretrained(model_dir, max_position_embeddings=max_positions)
    model = AutoModelForCausalLM.from_pretrained(model_dir, config=cfg)
    policy = _scripted_policy(model, AutoTokenizer.from_pretrained(model_dir),
                              resolve_model(model_dir), twin)
    policy.prompt_len = len(policy.render_prompt(task_prompt(task)))
    env = SWEAgentEnv(AgentContext(tasks={task.instance_id: task}, runtime=None,
                                   workroot=str(tmp_path / f"work-{tag}")))
    try:
        row = run_rollout(policy, env, task, rollout_index=int(twin), seed=0,
                          settings=GenerationSettings(max_turns=K, max_new_tokens=budget))
    finally:
        release(env)
    return row, policy, task


def _offline_plan(row: dict, task, workdir: Path):
    """The row as a trajectory record: replayed from its writes and planned (blocks,
    eligibility, selection), as the signal pilot does."""
    from ecredit_trl.credit.blocks import DEFAULT_TEST_PATTERNS
    from ecredit_trl.credit.planning import plan_query
    from ecredit_trl.credit.trajectory import parse_trajectory, replay

    traj = parse_trajectory(json.loads(json.dumps(row)))
    snaps = replay(traj, task.repo_dir, task.base_commit, workdir)
    plan = plan_query(workdir, snaps, task_id=task.instance_id, rollout_index=row["rollout_index"],
                      run_seed=0, test_patterns=DEFAULT_TEST_PATTERNS, format_error=traj.format_error)
    return traj, snaps, plan




def twin_budget(model_dir, tmp_path) -> tuple[int, int]:
    """``(budget, partial)``: the completion budget that ends the twin inside turn
    :data:`CUT_TURN` after ``partial`` of its tokens (half the turn), found by running the twin
    with no budget through the evaluation loop, whose tool suffixes are TRL's construction
    (``Policy.tool_suffix_ids``), so completion lengths are the same in both loops."""
    _, probe, _ = _episode(model_dir, 1 << 15, True, 1 << 15, tmp_path, "probe")
    partial = len(probe.script[CUT_TURN - 1]) // 2
    return probe.starts[CUT_TURN - 1] + partial, partial


def _check_credit_of_a(a: dict, c: dict, gen_turns: torch.Tensor, n: int,
                       given: list[list[int]]) -> None:
    """Rollout A's record and the trainer's credit row 0: last-touch eligibility (only the
    fix's turn), D from the two real trials, C = s·λ·D·L/m on the fix's tokens and 0 elsewhere
    (L leaves out turn 40, after submit), per-token advantages (A + C) · mask.

    ``c``: the spied :func:`per_token_advantages` call; ``gen_turns``: (T,) row 0's turn map
    before masking; ``n``: row 0's completion length; ``given``: A's ids per turn."""
    assert a["exclusion"] is None and a["submit_turn"] == SUBMIT_TURN
    assert a["eligible_turns"] == [GOLD_TURN] and a["selected_turn"] == GOLD_TURN
    assert a["selected_paths"] == [MODULE]
    assert [bool(t.get("after_submit")) for t in a["turns"]] == [k == K for k in range(1, K + 1)]
    assert a["resolved"] is True and a["utility"] == 1.0 and a["utility_ablated"] == 0.0
    D = a["contrast"]
    assert D == a["utility"] - a["utility_ablated"] == 1.0
    L = sum(len(x) for x in given[:SUBMIT_TURN])  # turn 40 is after submit
    m = len(given[GOLD_TURN - 1])
    s = min(1.0, CAP / (LAMBDA * abs(D) * L / m))
    assert (a["L"], a["m"], a["shrinkage"], a["cap_active"]) == (L, m, s, False)
    turns = c["turns"][0]
    assert torch.equal(turns[:n], torch.where(gen_turns[:n] > SUBMIT_TURN, -1, gen_turns[:n]))
    sel = turns == GOLD_TURN
    assert int(sel.sum()) == m
    expected = torch.zeros_like(c["C"][0])
    expected[sel] = s * LAMBDA * D * L / m
    assert torch.allclose(c["C"][0], expected, rtol=0, atol=1e-6)
    A = float(c["advantages"][0])
    assert A == pytest.approx(a["advantage"]) and A > 0  # A resolved, its twin did not
    mask = (c["completion_mask"][0] * c["tool_mask"][0]).float()
    assert torch.allclose(c["per_token"][0], (A + expected) * mask, atol=1e-6)
    assert float(c["C"][0].sum()) == pytest.approx(s * LAMBDA * D * L, rel=1e-5)  # B's mass
    assert a["credited_tokens"] == int(mask.sum()) == a["generated_tokens"]


@pytest.mark.podman
@pytest.mark.slow
def test_forty_turn_episode_truncated_mid_turn_keeps_turns_exclusion_and_credit_exact(
        tmp_path, monkeypatch, warm_policy):
    from transformers import AutoTokenizer

    from ecredit_trl.credit.planning import is_truncated
    from ecredit_trl.train import main

    budget, partial = twin_budget(warm_policy, tmp_path)
    tok = AutoTokenizer.from_pretrained(warm_policy)
    eos = tok.eos_token_id
    given = _scripted_generation(monkeypatch, tok, eos)
    credit = _spy_credit(monkeypatch)
    rows = _spy_rows(monkeypatch)
    rc = main(["--arm", "M", "--max_steps", "1", "--runs_dir", str(tmp_path / "runs"),
               "--max_tasks", "1", "--num_generations", "2", "--per_device_train_batch_size", "2",
               "--max_turns", str(K), "--max_completion_length", str(budget),
               "--mask_truncated_completions", "True", "--credit_lambda", str(LAMBDA),
               "--credit_cap", str(CAP), "--save_strategy", "no", "--verifier_retries", "0"])
    assert rc == 0
    (run,) = (tmp_path / "runs").iterdir()
    traj = {t["rollout_index"]: t for t in _jsonl(run / "trajectories.jsonl")}
    a, b = traj[0], traj[1]
    ids_a, ids_b = rows["ids"]
    gen = rows["gen_turns"]

    # -- the token -> turn map, every turn of both rows ------------------------------------
    by_turn, tools_a = _runs(ids_a, gen[0])
    assert len(given["A"]) == K and sorted(by_turn) == list(range(1, K + 1))
    for k in range(1, K + 1):  # each turn's tokens are exactly what the policy generated
        assert by_turn[k] == given["A"][k - 1], f"turn {k}"
    assert len(tools_a) == K - 1  # one tool-result suffix between consecutive turns
    assert all("<tool_response>" in tok.decode(r) for r in tools_a)
    assert not any(eos in r[:-1] for r in by_turn.values())  # EOS only ends a turn
    assert [t["generated_tokens"] for t in a["turns"]] == [len(x) for x in given["A"]]
    assert a["generated_tokens"] == sum(len(x) for x in given["A"])
    assert len(ids_a) < budget and ids_a[-1] == eos

    by_turn_b, tools_b = _runs(ids_b, gen[1])
    cut = max(by_turn_b)  # B's last turn: sliced by TRL, no EOS
    assert cut == CUT_TURN and len(ids_b) == budget
    assert not is_truncated(ids_a, [eos, tok.pad_token_id])
    assert is_truncated(ids_b, [eos, tok.pad_token_id])
    assert sorted(by_turn_b) == list(range(1, cut + 1)) and len(tools_b) == cut - 1
    for k in range(1, cut):
        assert by_turn_b[k] == given["B"][k - 1], f"twin turn {k}"
    part = by_turn_b[cut]  # TRL sliced the turn at the budget: its first ``partial`` tokens
    assert len(part) == partial > 0 and part == given["B"][cut - 1][:partial]
    assert [t["generated_tokens"] for t in b["turns"]] == \
        [len(x) for x in given["B"][:cut - 1]] + [len(part)]

    # -- B: truncated, masked, excluded before any counterfactual, no credit ---------------
    assert b["truncated"] is True and a["truncated"] is False
    assert b["exclusion"] == "truncated" and b["format_error"] is False
    assert b["eligible_turns"] == [DRAFTS[-1]] and b["selected_turn"] == DRAFTS[-1]
    assert b["factual"] is not None and b["counterfactual"] is None and b["contrast"] is None
    assert b["credited_tokens"] == 0 and b["L"] == 0
    assert b["generated_tokens"] == sum(len(v) for v in by_turn_b.values())
    (c,) = credit
    assert int(rows["completion_mask"][1].sum()) == 0  # TRL zeroed the row
    assert torch.all(c["C"][1] == 0) and torch.all(c["per_token"][1] == 0)
    assert torch.all(c["turns"][1] == -1)

    _check_credit_of_a(a, c, gen[0], len(ids_a), given["A"])
    ledger = _jsonl(run / "ledger.jsonl")[-1]
    assert ledger["rollouts_excluded"]["truncated"] == 1
    assert ledger["trials_counterfactual"] == 1 and ledger["usable_contrasts"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("which", ["embedded", "qwen2_5"])
def test_forty_turn_episode_in_the_evaluation_loop_and_offline_credit(which, tmp_path,
                                                                      warm_policy):
    """The evaluation loop (``agent.episode``: the rules of TRL's tool loop, one episode at a
    time) on the same script, with the embedded policy and the qwen2_5 family model (its
    700-token vocabulary makes the episode ~10k tokens, past the 4096 positions it is saved
    with: it is loaded with a larger limit, same random weights; nothing is learned here).
    A stops at ``submit`` (turn 39: this loop ends there); the twin gets a budget that ends it
    inside turn 33. Both replay to the environment's own trees, and the offline credit path
    (``credit.trajectory`` -> ``credit.planning`` / ``blocks`` -> ``credit.coefficients``) finds
    every block's eligibility and puts C on the selected turn's tokens exactly."""
    from ecredit_trl.credit.coefficients import credit_coefficients
    from ecredit_trl.credit.trajectory import generated_token_turns
    from ecredit_trl.policy.families import ensure_family_model

    model_dir = warm_policy if which == "embedded" else ensure_family_model(which)
    a, pa, task = _episode(model_dir, 1 << 15, False, 1 << 15, tmp_path, "a")
    assert a["stop_reason"] == "submit" and len(a["turns"]) == SUBMIT_TURN
    assert [t["generated_tokens"] for t in a["turns"]] == [len(x) for x in pa.script]
    assert [c["turn"] for c in a["tool_calls"]] == list(range(1, SUBMIT_TURN + 1))
    assert all(c["ok"] for c in a["tool_calls"]) and a["format_errors"] == 0
    # every turn starts where the previous turn and its tool results ended
    assert pa.starts[0] == 0 and all(s1 > s0 + len(x) for s0, s1, x in
                                     zip(pa.starts, pa.starts[1:], pa.script, strict=False))

    # the twin: full-length turns up to 32, then a budget that ends it mid-turn 33
    budget, partial = twin_budget(model_dir, tmp_path)
    cut = CUT_TURN
    b, pb, _ = _episode(model_dir, 1 << 15, True, budget, tmp_path, "b")
    assert b["stop_reason"] == "token_budget" and len(b["turns"]) == cut
    assert b["completion_tokens"] == budget
    assert b["turns"][-1]["generated_tokens"] == partial
    assert b["turns"][-1]["tool_calls"] == [] and b["turns"][-1]["executed"] is False
    assert [t["generated_tokens"] for t in b["turns"][:-1]] == [len(x) for x in pb.script[:-1]]

    for row, last, chosen in ((a, SUBMIT_TURN, GOLD_TURN), (b, cut, DRAFTS[-1])):
        traj, snaps, plan = _offline_plan(row, task, tmp_path / f"replay-{row['rollout_index']}")
        assert snaps == row["snapshots"]  # the record rebuilds the environment's trees
        got = {e["turn"]: (tuple(e["reasons"]), tuple(e["later_touches"]))
               for e in plan.selection.eligibility}
        assert got == expected_blocks(last)
        assert plan.selection.eligible_turns == [chosen] == [plan.selection.selected_turn]
        assert plan.exclusion is None and plan.ablated_artifact is not None
        turns = generated_token_turns(traj)  # (L,) turn of every generated token
        lengths = [t.generated_tokens for t in traj.turns]
        assert turns.tolist() == [k + 1 for k, n in enumerate(lengths) for _ in range(n)]
        L, m = sum(lengths), lengths[chosen - 1]
        D, lam, cap = 1.0, LAMBDA, CAP  # D given: no verifier in this test
        C = credit_coefficients("M", advantage=0.25, contrast=D, token_turn=turns,
                                selected_turn=chosen, credit_lambda=lam, credit_cap=cap)
        s = min(1.0, cap / (lam * abs(D) * L / m))
        start = sum(lengths[:chosen - 1])
        expected = torch.zeros(L)
        expected[start:start + m] = s * lam * D * L / m
        assert torch.allclose(C, expected, rtol=0, atol=1e-6)
    assert "+    if not word or word.lower() in UNCOUNTABLES:" in a["artifact"]
    assert "# note 7" in b["artifact"] and "word or word" not in b["artifact"]
