"""The family warm start's SFT rows: a gold-patch demonstration as the rollout
loop assembles an episode, with the loss on generated ids only, for families with and without
a TRL training template; a family whose parser cannot read a demonstration back is refused."""

import json

import pytest

from ecredit_trl.policy.families import FAMILIES

TASK = "bundled__cachetools-8.0.2-0010"
#: text of the tool results of the demonstration (editor view and edit outputs)
RESULT_TEXT = ("Here's the result of running `cat -n`", "has been edited")


@pytest.fixture(scope="module")
def demo():
    from ecredit_trl.policy.demos import DemoVariants, demo_conversation
    from eval.tasks.splits import load_tasks

    (task,) = [t for t in load_tasks("bundled:train", purpose="train") if t.instance_id == TASK]
    return task, demo_conversation(task, variants=DemoVariants(0.0, 0.0, 0))


def _policy(template):
    from ecredit_trl.agent.generation import load_rollout_policy
    from ecredit_trl.policy.families import ensure_family_model

    return load_rollout_policy(str(ensure_family_model(template)), device="cpu")


@pytest.mark.parametrize("template", ["qwen2_5", "llama3_2", "gptoss", "gemma4"])
def test_episode_rows_mask_exactly_the_generated_turns(template, demo):
    from ecredit_trl.agent.prompts import task_prompt
    from ecredit_trl.policy.corpus import call_messages, episode_example

    task, d = demo
    policy = _policy(template)
    msgs = call_messages(d["messages"])
    row = episode_example(policy, msgs)
    ids, mask = row["input_ids"], row["completion_mask"]
    assert len(ids) == len(mask)
    # the row starts with exactly the prompt a rollout of this task starts from
    prompt = policy.render_prompt(task_prompt(task))
    assert ids[: len(prompt)] == prompt and not any(mask[: len(prompt)])
    n_assistant = sum(m["role"] == "assistant" for m in msgs)
    assert len(row["turn_lengths"]) == n_assistant and sum(mask) == sum(row["turn_lengths"])
    # one run of 1s per assistant turn, each ending on an end-of-turn id
    runs, prev = [], 0
    for i, m in enumerate(mask):
        if m and not prev:
            runs.append([i, i])
        if m:
            runs[-1][1] = i
        prev = m
    assert [b - a + 1 for a, b in runs] == row["turn_lengths"]
    assert all(ids[b] in policy.eos_token_ids for _, b in runs)
    trained = policy.tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    masked = policy.tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    for text in RESULT_TEXT:
        assert text in masked and text not in trained
    edit = next(c["function"]["arguments"] for m in msgs for c in m.get("tool_calls") or []
                if c["function"]["name"] == "str_replace")
    assert json.dumps(edit["new_str"])[1:-1] in trained or edit["new_str"] in trained


def test_a_family_that_loses_argument_text_is_refused(demo):
    """Qwen3.5's XML-style parser strips leading blanks of a string argument: a demonstration
    whose ``old_str`` keeps its indentation would teach an edit the parser hands to the editor
    without it, so the row is refused, naming the turn. (The demonstrations strip the edited
    line, so every family in the matrix reads them back.)"""
    from ecredit_trl.policy.corpus import call_messages, episode_example

    _, d = demo
    msgs = call_messages(d["messages"])
    episode_example(_policy("qwen3_5_nothink"), msgs)  # as built: read back exactly
    (edit,) = [c["function"]["arguments"] for m in msgs for c in m.get("tool_calls") or []
               if c["function"]["name"] == "str_replace"]
    edit["old_str"] = "    " + edit["old_str"]
    with pytest.raises(ValueError, match=r"turn 2: the parser reads .*str_replace"):
        episode_example(_policy("qwen3_5_nothink"), msgs)
    episode_example(_policy("qwen2_5"), msgs)  # JSON calls keep the blanks


def test_call_messages_decodes_arguments_and_names_bad_ones():
    from ecredit_trl.policy.corpus import call_messages

    call = {"type": "function", "function": {"name": "view", "arguments": '{"path": "a.py"}'}}
    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "",
                                               "tool_calls": [call]}]
    out = call_messages(msgs)
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"path": "a.py"}
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == '{"path": "a.py"}'  # a copy
    bad = dict(call, function={"name": "view", "arguments": "{not json"})
    with pytest.raises(ValueError, match="tool call 'view': arguments are not JSON"):
        call_messages([{"role": "assistant", "content": "", "tool_calls": [bad]}])


def test_family_recipe_names_unknown_fields_and_keys_on_the_template():
    from ecredit_trl.policy.family_warmstart import family_recipe

    with pytest.raises(ValueError, match=r"unknown field\(s\) \['lr'\]"):
        family_recipe("llama3_2", lr=1.0)
    with pytest.raises(KeyError, match="no tiny model for template 'nope'"):
        family_recipe("nope")
    a, b = family_recipe("llama3_2"), family_recipe("llama3_1")
    assert a["template_sha"] != b["template_sha"] and set(FAMILIES) >= {"llama3_1", "llama3_2"}


def test_build_command_names_the_templates_on_a_bad_one(capsys):
    from ecredit_trl.policy.family_warmstart import main

    with pytest.raises(SystemExit) as exc:
        main(["build", "nope"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument TEMPLATE: invalid choice: 'nope'" in err
    with pytest.raises(SystemExit):
        main(["build", "qwen2_5", "--steps", "x"])


def test_a_moe_saved_with_router_logits_on_generates_padded_batches(tmp_path):
    """TRL's SFTTrainer saves a MoE config with ``output_router_logits`` on; padded batched
    generation then crashed in gpt-oss's load-balancing loss ("size of tensor a (2) must
    match ..."). ``load_rollout_policy`` switches it off: two prompts of different lengths,
    left-padded, generate."""
    import shutil

    from transformers import AutoModelForCausalLM

    from ecredit_trl.agent.generation import load_rollout_policy
    from ecredit_trl.policy.families import ensure_family_model

    d = tmp_path / "gptoss-sft"
    shutil.copytree(ensure_family_model("gptoss"), d)
    lm = AutoModelForCausalLM.from_pretrained(d)
    lm.config.output_router_logits = True
    lm.save_pretrained(d)
    policy = load_rollout_policy(str(d), device="cpu")
    assert policy.model.config.output_router_logits is False
    tok = policy.tokenizer
    tok.padding_side = "left"
    tok.pad_token = tok.pad_token or tok.eos_token
    enc = tok(["hello there how are you", "hi"], return_tensors="pt", padding=True)
    assert enc["attention_mask"][1].sum() < enc["attention_mask"][0].sum()  # really padded
    out = policy.model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert out.shape == (2, enc["input_ids"].shape[1] + 4)
