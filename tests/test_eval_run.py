"""eval.run end to end in Podman: rollouts subprocess (tiny random policy), trials, grading,
report, resume, binding, missing rollouts as unknown; the rollout rows replay."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.podman



@pytest.fixture(scope="module")
def split_file(tmp_path_factory):
    from eval.tasks.schema import save_tasks
    from eval.tasks.splits import load_tasks

    path = tmp_path_factory.mktemp("split") / "two.jsonl"
    save_tasks(load_tasks("bundled:holdout")[:2], path)
    return path


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_eval_run_bundled_tiny_policy(tiny_policy, split_file, tmp_path, podman_runtime):
    from ecredit_trl.credit.trajectory import load_trajectories
    from eval.evaluation.options import EvalOptions
    from eval.run import evaluate, main

    out = tmp_path / "ev"
    common = dict(model=str(tiny_policy), split=str(split_file), n=2, max_new_tokens=48)
    with_rt = dict(runtime=podman_runtime, log=lambda *_: None)
    res = evaluate(EvalOptions(out=out, **common), **with_rt)
    s = res["summary"]
    assert s["denominator"] == {"tasks": 2, "n": 2, "slots": 4}
    assert s["resolved"] + s["failed"] + s["unknown"] == 4
    assert s["unknown"] == sum(1 for r in res["slots"] if r["classification"]["unknown"])
    assert s["success"] == s["resolved"] / 4
    assert set(s["per_task"]) == {json.loads(x)["instance_id"]
                                  for x in split_file.read_text().splitlines()}
    for name in ("results.json", "report.md", "success_per_repo.png", "task_success_hist.png",
                 "run.json", "rollouts.jsonl", "slots.jsonl"):
        assert (out / name).stat().st_size > 0, name
    report = (out / "report.md").read_text()
    assert f"**{s['resolved']} / 4 = " in report and "| unknown |" in report
    # both verdicts per slot: on these -rA logs with space-free ids the
    # parsers agree, so they are equal wherever nothing protected was touched
    for r in res["slots"]:
        if not r["classification"]["unknown"] and not r["protected_touched"]:
            assert r["resolved_swebench"] == r["resolved"]
    assert s["protected_paths_touched"] == sum(1 for r in res["slots"]
                                               if r.get("protected_touched"))
    assert "`resolved_swebench`: no protected set" in report
    rollouts = _lines(out / "rollouts.jsonl")
    assert len(rollouts) == 4 and {r["binding"] for r in rollouts} == {res["binding"]}
    assert all(r["turns"] and r["model_sha256"] == res["model"]["sha256"] for r in rollouts)
    assert {r["engine"]["batch_size"] for r in rollouts} == {8}  # the batched path is default
    assert len(load_trajectories(out / "rollouts.jsonl")) == 4  # the replay format holds
    assert len(_lines(out / "slots.jsonl")) == 4

    # resume: nothing regenerated or re-verified, same figures
    again = evaluate(EvalOptions(out=out, **common), **with_rt)
    assert again["graded_this_call"] == 0 and again["summary"]["success"] == s["success"]
    assert len(_lines(out / "rollouts.jsonl")) == 4 and len(_lines(out / "slots.jsonl")) == 4
    # another seed into the same folder is refused, naming what differs
    assert main(["--model", str(tiny_policy), "--split", str(split_file), "--n", "2",
                 "--out", str(out), "--seed", "1", "--runtime", "podman"]) == 2

    # a missing rollout stays in the denominator as unknown
    partial = tmp_path / "partial.jsonl"
    partial.write_text("".join(json.dumps(r) + "\n" for r in rollouts[:3]))
    res2 = evaluate(EvalOptions(out=tmp_path / "ev2", rollouts=partial, **common), **with_rt)
    s2 = res2["summary"]
    assert s2["denominator"]["slots"] == 4
    assert s2["unknown_reasons"].get("no_rollout") == 1
    kept = {(r["task_id"], r["rollout_index"]) for r in rollouts[:3]}
    before = sum(1 for r in res["slots"] if r["classification"]["unknown"]
                 and (r["task_id"], r["rollout_index"]) in kept)
    assert s2["unknown"] == before + 1
    assert res["flaky"]["repeats"] is None and "flaky tests: not measured" in report

    # under an admission manifest: a dropped flaky P2P test is not graded; slots are counted
    from eval.controls import run_controls

    run_controls(str(split_file), tmp_path / "ctl", runtime=podman_runtime, log=lambda *_: None)
    man_p = tmp_path / "ctl" / "admission.json"
    man = json.loads(man_p.read_text())
    t0 = _lines(split_file)[0]
    dropped = t0["PASS_TO_PASS"][:1]
    man["flaky"] = {t0["instance_id"]: {"f2p": [], "p2p": dropped, "statuses": {},
                                        "repeats": {}}}
    man["p2p_dropped"] = {t0["instance_id"]: dropped}
    man_p.write_text(json.dumps(man))
    res3 = evaluate(EvalOptions(out=tmp_path / "ev3", rollouts=out / "rollouts.jsonl",
                                admission=man_p, **common), **with_rt)
    assert res3["flaky"] == {"repeats": 1, "tasks_with_flaky": 1, "slots_of_flaky_tasks": 2,
                             "slots_depending_on_flaky": 0, "p2p_tests_dropped": 1}
    graded = [r for r in _lines(tmp_path / "ev3" / "slots.jsonl")
              if r["task_id"] == t0["instance_id"] and r.get("p2p")]
    assert graded and all(dropped[0] not in r["p2p"] for r in graded)
    assert all(len(r["p2p"]) == len(t0["PASS_TO_PASS"]) - 1 for r in graded)
    assert "1 flaky P2P tests dropped" in (tmp_path / "ev3" / "report.md").read_text()
