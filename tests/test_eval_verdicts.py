"""eval.run --reuse-verdicts in Podman (to save cost): the same per-slot verdicts with
and without the store, identical artifacts verified once, a second eval reusing the first
one's verdicts (controls included), untrusted store entries re-verified, unclean trials
(injected infra error, real timeout) never stored."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.podman

SHA = "f" * 64
GARBAGE = "this is not a patch\n"


@pytest.fixture(scope="module")
def two_tasks(tmp_path_factory):
    """Two bundled holdout tasks (a split file) and a rollouts file: task A gold, gold,
    empty; task B gold, garbage, garbage (``apply_failed``: never stored)."""
    from eval.tasks.schema import save_tasks
    from eval.tasks.splits import load_tasks

    d = tmp_path_factory.mktemp("verdicts")
    tasks = load_tasks("bundled:holdout")[:2]
    save_tasks(tasks, d / "two.jsonl")
    a, b = tasks
    arts = [(a, 0, a.patch), (a, 1, a.patch), (a, 2, ""),
            (b, 0, b.patch), (b, 1, GARBAGE), (b, 2, GARBAGE)]
    rows = [{"task_id": t.instance_id, "rollout_index": i, "artifact": art,
             "model_sha256": SHA, "turns": 1} for t, i, art in arts]
    (d / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return SimpleNamespace(dir=d, split=str(d / "two.jsonl"), rollouts=d / "rollouts.jsonl",
                           a=a, b=b)


def _eval(two_tasks, rt, out, store=None, **kw):
    from eval.evaluation.options import EvalOptions
    from eval.run import evaluate

    return evaluate(EvalOptions(model=None, split=two_tasks.split, n=3, out=out,
                                rollouts=two_tasks.rollouts, reuse_verdicts=store, **kw),
                    runtime=rt, log=lambda *_: None)


def _verdicts(res):
    return {(r["task_id"], r["rollout_index"]): (r["resolved"], r["exit_class"],
                                                 r["classification"]["unknown"])
            for r in res["slots"]}


@pytest.fixture(scope="module")
def plain_and_stored(two_tasks, podman_runtime):
    """The same rollouts evaluated without a store, then with a fresh one."""
    d = two_tasks.dir
    plain = _eval(two_tasks, podman_runtime, d / "plain")
    stored = _eval(two_tasks, podman_runtime, d / "stored", d / "store")
    return plain, stored


def test_store_gives_the_same_verdicts_and_verifies_identical_artifacts_once(
        two_tasks, plain_and_stored):
    plain, stored = plain_and_stored
    a, b = two_tasks.a.instance_id, two_tasks.b.instance_id
    v = _verdicts(plain)
    assert v == _verdicts(stored)
    assert v[(a, 0)][0] is True and v[(b, 0)][0] is True  # the gold patches resolve
    assert v[(b, 1)][1] == "apply_failed" and v[(a, 2)][1] == "ok"
    assert plain["verdict_store"] is None
    assert plain["cost"]["trials_factual"] == 5 and plain["cost"]["trials_control"] == 2
    assert plain["cost"]["slots_from_reused_verdict"] == 0
    # A's second gold waited for the first trial; B's garbage (apply_failed) is not clean:
    # each of its slots ran its own trial
    c = stored["cost"]
    assert c["trials_factual"] == 4 and c["trials_control"] == 2
    assert c["slots_from_reused_verdict"] == 1
    reused = [r for r in stored["slots"] if r.get("verdict_reused_from")]
    assert [(r["task_id"], r["rollout_index"]) for r in reused] == [(a, 1)]
    first = next(r for r in stored["slots"] if (r["task_id"], r["rollout_index"]) == (a, 0))
    assert reused[0]["verdict_reused_from"]["trial_id"] == first["trial_id"]
    assert reused[0]["log_path"] == first["log_path"]
    assert stored["verdict_store"]["slots_reused"] == 1
    assert stored["verdict_store"]["rejected_entries"] == 0
    assert all(v and v.startswith("sha256:") for v in stored["images"].values())
    # stored: A gold, B gold, the two controls; never the apply_failed garbage
    entries = [json.loads(p.read_text()) for p in (two_tasks.dir / "store").glob("*.json")]
    assert sorted((e["task_id"], e["artifact_sha256"][:8]) for e in entries) == sorted(
        (t.instance_id, _sha(art)[:8]) for t in (two_tasks.a, two_tasks.b)
        for art in (t.patch, ""))
    assert {e["exit_class"] for e in entries} == {"ok"}
    assert "verdict store" in (two_tasks.dir / "stored" / "report.md").read_text()


def _sha(text: str) -> str:
    from eval.evaluation.slots import text_sha256

    return text_sha256(text)


def test_second_eval_reuses_the_first_ones_verdicts(two_tasks, plain_and_stored,
                                                    podman_runtime):
    plain, stored = plain_and_stored
    d = two_tasks.dir
    again = _eval(two_tasks, podman_runtime, d / "again", d / "store")
    assert _verdicts(again) == _verdicts(plain)
    c = again["cost"]
    # only the two garbage slots run; gold and controls come from the store
    assert c["trials_factual"] == 2 and c["trials_control"] == 0
    assert c["controls_from_reused_verdict"] == 2
    assert c["slots_from_reused_verdict"] == 4  # A gold ×2, B gold, A empty (via control)
    src = {r["trial_id"] for r in stored["slots"]}
    for r in again["slots"]:
        if r.get("verdict_reused_from"):
            assert r["verdict_reused_from"]["trial_id"] in src
            assert r["verdict_reused_from"]["eval"] == str((d / "stored").resolve())
            assert (d / "again" / r["log_path"]).is_file()


def test_untrusted_store_entries_are_reverified(two_tasks, plain_and_stored, podman_runtime):
    from eval.evaluation.verdicts import EMPTY_SHA256, verdict_key

    plain, stored = plain_and_stored
    dig = stored["images"]
    d = two_tasks.dir
    store = d / "store-bad"
    shutil.copytree(d / "store", store)
    a, b = two_tasks.a, two_tasks.b
    ka = store / f"{verdict_key(a, None, _sha(a.patch), dig[a.image])}.json"
    kb = store / f"{verdict_key(b, None, _sha(b.patch), dig[b.image])}.json"
    kc = store / f"{verdict_key(a, None, EMPTY_SHA256, dig[a.image])}.json"
    good_a = ka.read_text()
    ka.write_text(good_a[: len(good_a) // 2])  # bad JSON
    kb.write_text(good_a)  # forged: an ok entry of another task under B's key
    e = json.loads(kc.read_text())
    e["log"] += "\nforged line"  # tampered log (its digest no longer matches)
    kc.write_text(json.dumps(e))
    res = _eval(two_tasks, podman_runtime, d / "bad", store)
    assert _verdicts(res) == _verdicts(plain)
    assert res["verdict_store"]["rejected_entries"] == 3
    c = res["cost"]
    # A gold (once, its twin waits), B gold, B garbage ×2 re-run; A's control re-run
    assert c["trials_factual"] == 4 and c["trials_control"] == 1
    assert c["controls_from_reused_verdict"] == 1
    # the re-verified results replaced the bad entries
    assert json.loads(ka.read_text())["task_id"] == a.instance_id
    assert json.loads(kb.read_text())["task_id"] == b.instance_id


class _InfraOnFirst:
    """The real Podman runtime, but every factual trial of ``artifact`` ends ``infra_error``
    (an injected fault: a real infra failure cannot be caused on demand here)."""

    def __init__(self, rt, artifact: str) -> None:
        self.rt, self.artifact = rt, artifact

    def run_trial(self, spec):
        from sandbox.trials.trial import TrialResult

        if spec.artifact == self.artifact:
            return TrialResult(trial_id=spec.trial_id, exit_class="infra_error",
                               error="injected")
        return self.rt.run_trial(spec)

    def __getattr__(self, name):
        return getattr(self.rt, name)


def test_unclean_trials_are_never_stored(two_tasks, podman_runtime):
    d = two_tasks.dir
    rt = _InfraOnFirst(podman_runtime, two_tasks.a.patch)
    res = _eval(two_tasks, rt, d / "infra", d / "store-infra", max_retries=0)
    a = two_tasks.a.instance_id
    infra = [r for r in res["slots"] if r["task_id"] == a and r["exit_class"] == "infra_error"]
    assert len(infra) == 2 and all(r["unknown_reason"] == "trial_infra_error" for r in infra)
    assert res["cost"]["trials_factual"] == 5  # A's twin was re-submitted after the failure
    stored = {json.loads(p.read_text())["artifact_sha256"]
              for p in (d / "store-infra").glob("*.json")}
    assert _sha(two_tasks.a.patch) not in stored and _sha(two_tasks.b.patch) in stored
    # a real timeout stores nothing either (0.05 s: below any pytest start, whatever the load;
    # 0.5 s let a trial finish on a quiet machine)
    res = _eval(two_tasks, podman_runtime, d / "tmo", d / "store-tmo", timeout_s=0.05)
    classes = [r["exit_class"] for r in res["slots"]]
    assert "timeout" in classes and set(classes) <= {"timeout", "apply_failed"}
    assert list((d / "store-tmo").glob("*.json")) == []


def test_store_put_refuses_an_unclean_result(tmp_path):
    from eval.evaluation.verdicts import VerdictStore

    st = VerdictStore(tmp_path / "s", eval_dir=tmp_path, binding="b", say=lambda *_: None)
    res = SimpleNamespace(exit_class="timeout", log="x", trial_id="t")
    with pytest.raises(ValueError, match="exit_class"):
        st.put("k", "task", "sha", res, {})
    assert not (tmp_path / "s").exists()


def test_verdict_key_covers_what_decides_the_verdict(two_tasks):
    import dataclasses

    from eval.evaluation.verdicts import EMPTY_SHA256, verdict_key

    a, b = two_tasks.a, two_tasks.b
    base = verdict_key(a, None, EMPTY_SHA256, "sha256:1")
    assert base == verdict_key(a, None, EMPTY_SHA256, "sha256:1")  # deterministic
    assert len({base, verdict_key(b, None, EMPTY_SHA256, "sha256:1"),
                verdict_key(a, 5.0, EMPTY_SHA256, "sha256:1"),        # trial limits
                verdict_key(a, None, _sha(a.patch), "sha256:1"),      # artifact
                verdict_key(a, None, EMPTY_SHA256, "sha256:2"),       # rebuilt image
                verdict_key(dataclasses.replace(a, eval_script=a.eval_script + "\n"),
                            None, EMPTY_SHA256, "sha256:1")}) == 6
