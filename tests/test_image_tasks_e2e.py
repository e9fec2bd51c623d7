"""End to end on the stand-in image-held tasks (``bundled-image``): the agent's
tree and the verifier keep the untracked build output; the main job (arm M, 2 steps),
``eval.run``, ``eval.controls`` and the pilot run on them (2-3 tasks, few rollouts).

Mirrors the bundled-task tests (test_train.py, test_eval_run.py, test_eval_controls.py,
test_pilot.py). The image tasks and the embedded policy come from their caches (built on
first use).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from sandbox.backend import SandboxOptions

pytestmark = pytest.mark.podman


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def image_tasks():
    from eval.tasks.splits import load_tasks

    return load_tasks("bundled-image", log=lambda m: print(f"[build_tasks] {m}", flush=True))


def _one_per_project(tasks, k: int = 1):
    out, seen = [], {}
    for t in tasks:
        if seen.get(t.extra["project"], 0) < k:
            seen[t.extra["project"]] = seen.get(t.extra["project"], 0) + 1
            out.append(t)
    return out


@pytest.fixture(scope="module")
def split_file(tmp_path_factory):
    """Two held-out image tasks of two projects, as a swebench-format .jsonl (no repo_dir)."""
    from eval.tasks.schema import save_tasks
    from eval.tasks.splits import load_tasks

    hold = load_tasks("bundled-image:holdout")
    two = _one_per_project(hold)[:2]
    path = tmp_path_factory.mktemp("isplit") / "two.jsonl"
    save_tasks(two, path)
    assert all(r["repo_dir"] is None for r in _jsonl(path))
    return path


# ---------------------------------------------------------------------------
# the build output survives into the agent's tree and the verifier
# ---------------------------------------------------------------------------

def test_build_output_in_the_agents_tree_and_the_verifier(image_tasks, tmp_path,
                                                          podman_runtime):
    from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release
    from eval.evaluation.verification import grade_trial
    from eval.tasks.trialspec import task_trial_spec
    from sandbox.snapshots.snapshot import artifact, changed_paths

    t = _one_per_project(image_tasks)[-1]  # cachetools: src/ layout, PYTHONPATH=src
    bo, mut = t.extra["build_output"], t.extra["mutation"]
    ctx = AgentContext(tasks={t.instance_id: t}, runtime=podman_runtime,
                       workroot=str(tmp_path / "wr"))
    try:
        env = SWEAgentEnv(ctx)
        env.reset(instance_id=t.instance_id)
        assert env.failure is None, env.failure
        # on the host side of the tree (what the editor tools read) ...
        assert f"BASE_COMMIT = '{t.base_commit}'" in (env.workdir / bo).read_text()
        # ... through the agent's tools ...
        assert f"BASE_COMMIT = '{t.base_commit}'" in env.view(bo)
        assert f"BASE_COMMIT = '{t.base_commit}'" in env.bash(f"cat {bo}")
        # ... with the image's environment active in the agent's login shell
        assert env.bash("which python").strip() == "/opt/testbed-env/bin/python"
        # the agent's repository is S_0 alone: not the image's base commit,
        # whose parent is the sdist import; that history stays the verifier's
        (base,) = [v for k, v in ctx._image_bases.items() if k[0] != "lock"]
        assert env.bash("git rev-list --all").split() == [base.commit]
        assert base.commit != t.base_commit
        # the listed tests run in the agent's container (the generated module imported)
        f2p = t.FAIL_TO_PASS[0]
        out = env.bash(f"PYTHONPATH=src python -m pytest -q -p no:cacheprovider '{f2p}' 2>&1 "
                       "| tail -3")
        assert "1 failed" in out, out
        # the gold fix, made with the agent's editor, resolves in a fresh container
        minus = [ln[1:] for ln in t.patch.splitlines()
                 if ln.startswith("-") and not ln.startswith("---")]
        plus = [ln[1:] for ln in t.patch.splitlines()
                if ln.startswith("+") and not ln.startswith("+++")]
        assert len(minus) == len(plus) == 1, t.patch
        assert "ERROR" not in env.str_replace(mut["path"], minus[0], plus[0])
        assert [c.path for c in changed_paths(env.snapshot_repo, env.base_tree,
                                              env.final_tree)] == [mut["path"]]
        patch = artifact(env.snapshot_repo, env.base_tree, env.final_tree)
        assert bo not in patch  # ignored: never part of an artifact
        spec = task_trial_spec(t, patch, "e2e-agent-fix", timeout_s=120)
        assert spec.repo_archive is None
        head, rest = spec.eval_script.split("\n", 1)
        spec.eval_script = f"{head}\necho \"verifier: $(grep BASE_COMMIT /testbed/{bo})\"\n{rest}"
        r = podman_runtime.run_trial(spec)
        assert r.exit_class == "ok", r.log[-2000:]
        assert f"verifier: BASE_COMMIT = '{t.base_commit}'" in r.log
        assert grade_trial(t, r, None)["resolved"] is True
        env.submit()
        release(env)
    finally:
        ctx.close()


# ---------------------------------------------------------------------------
# eval.run, eval.controls
# ---------------------------------------------------------------------------


def test_eval_run_on_image_tasks(tiny_policy, split_file, tmp_path, podman_runtime):
    from eval.evaluation.options import EvalOptions
    from eval.run import evaluate

    out = tmp_path / "ev"
    res = evaluate(EvalOptions(out=out, model=str(tiny_policy), split=str(split_file), n=2,
                               max_new_tokens=48),
                   runtime=podman_runtime, log=lambda *_: None)
    s = res["summary"]
    assert s["denominator"] == {"tasks": 2, "n": 2, "slots": 4}
    assert s["resolved"] + s["failed"] + s["unknown"] == 4
    ids = {r["instance_id"] for r in _jsonl(split_file)}
    assert set(s["per_task"]) == ids
    rollouts = _jsonl(out / "rollouts.jsonl")
    assert len(rollouts) == 4 and all(r["turns"] for r in rollouts)
    # no rollout failed to set up (the image's tree, not a repo_dir)
    assert not [r for r in rollouts if (r.get("failure") or {}).get("kind") == "sandbox_setup"]
    slots = _jsonl(out / "slots.jsonl")
    assert len(slots) == 4
    assert all(not r["classification"]["unknown"] for r in slots), slots
    # every slot records the limits its trial ran under, control-answered slots included
    # (stand-in image tasks have no repo_dir: the harness limits)
    assert [r["trial"]["limits"]["source"] for r in slots] == ["harness"] * 4
    assert {r["trial"]["limits"]["timeout_s"] for r in slots} == {1800.0}


def test_eval_run_help_names_the_image_split(capsys):
    from eval.run import main

    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--split SPLIT official500 | holdout100 | bundled[:train|:holdout] | " \
           "bundled-image[:train|:holdout]" in text


def test_controls_admit_image_tasks(split_file, tmp_path, podman_runtime):
    from eval.controls import run_controls

    rows = _jsonl(split_file)
    res = run_controls(str(split_file), tmp_path, runtime=podman_runtime, concurrency=2,
                       log=lambda *_: None)
    c = res["counts"]
    assert c["controls"]["count"] == 2 * len(rows)
    assert c["admitted"]["count"] == len(rows), c["not_admitted"]
    for k in ("unresolved", "partially_observed", "expectation_mismatches", "infra_errors"):
        assert c[k]["count"] == 0, k
    man = json.loads((tmp_path / "admission.json").read_text())
    assert set(man["images"]) == {r["image"] for r in rows}  # one image per task
    assert all(d and d.startswith("sha256:") for d in man["images"].values())


# ---------------------------------------------------------------------------
# the main job: arm M, 2 steps
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def warm_policy():
    """The embedded policy, warm-started on the bundled twins of these tasks (its demos
    need a host repository; the image tasks have the same ids, problems and gold)."""
    from ecredit_trl.policy.warmstart import ensure_default_policy
    from eval.tasks.splits import load_tasks

    return ensure_default_policy(load_tasks("bundled:train", purpose="train"))


def test_train_arm_m_two_steps_on_image_tasks(tmp_path, warm_policy, image_tasks):
    runs = tmp_path / "runs"
    cmd = [str(Path(sys.executable).with_name("accelerate")), "launch", "--num_processes",
           "1", "ecredit_trl/train.py", "--arm", "M", "--runs_dir", str(runs), "--max_steps",
           "2", "--tasks", "bundled-image:train", "--max_tasks", "2", "--model",
           str(warm_policy), "--reuse_control_for_empty_ablation", "false"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
                          env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (run,) = list(runs.iterdir())
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["ecredit"]["arm"] == "M"
    ledger = _jsonl(run / "ledger.jsonl")
    assert [r["step"] for r in ledger] == [1, 2]
    trajs = _jsonl(run / "trajectories.jsonl")
    assert len(trajs) == sum(r["rollouts"] for r in ledger) == 2 * 4
    by_id = {t.instance_id: t for t in image_tasks}
    assert len({t["task_id"] for t in trajs}) <= 2 and {t["task_id"] for t in trajs} <= set(by_id)
    assert sum(r["trials_factual"] for r in ledger) == len(trajs)
    assert all(t["factual"] for t in trajs)
    # every rollout got its tree from the image (no setup failure), and arm M asked one
    # counterfactual per admitted rollout
    assert not [t["exclusion"] for t in trajs if t["exclusion"] == "sandbox_setup"]
    queried = [t for t in trajs if t["counterfactual"]]
    assert sum(r["trials_counterfactual"] for r in ledger) == len(queried) >= 1, (
        ledger, [(t["exclusion"], t["contrast"]) for t in trajs])
    assert all(t["exclusion"] is None for t in queried)
    man = json.loads((run / "manifest.json").read_text())
    used = {by_id[t["task_id"]].image for t in trajs}
    assert used <= set(man["images"]) and all(
        man["images"][i].startswith("sha256:") for i in used)
    assert all(by_id[i].repo_dir is None for i in {t["task_id"] for t in trajs})


def test_default_warm_start_of_image_tasks_is_the_bundled_policy(image_tasks, split_file):
    """bundled-image:train warm-starts on its bundled twins (same cache key as a bundled run);
    an image-only set without twins, or a twin that differs, is refused naming --model."""
    import dataclasses

    from ecredit_trl.policy.warmstart import default_policy_tasks, policy_key, recipe_for
    from eval.tasks.splits import load_tasks

    img = load_tasks("bundled-image:train", purpose="train")
    bundled = load_tasks("bundled:train", purpose="train")
    assert all(t.repo_dir is None for t in img) and all(t.repo_dir for t in bundled)
    chosen = default_policy_tasks("bundled-image:train", img)
    assert [t.instance_id for t in chosen] == [t.instance_id for t in bundled]
    assert all(t.repo_dir for t in chosen)
    r = recipe_for()
    assert policy_key(chosen, r) == policy_key(bundled, r) != policy_key(img, r)
    assert default_policy_tasks("bundled:train", bundled) == bundled  # unchanged
    with pytest.raises(ValueError, match=r"--model: 2 training task\(s\) of .*two\.jsonl"):
        default_policy_tasks(str(split_file), load_tasks(str(split_file)))
    changed = [dataclasses.replace(img[0], patch=img[0].patch + "\n")] + img[1:]
    with pytest.raises(ValueError, match=rf"--model: task\(s\) \['{img[0].instance_id}'\]"):
        default_policy_tasks("bundled-image:train", changed)


def test_train_without_model_on_image_tasks_reuses_the_bundled_policy(tmp_path, warm_policy,
                                                                      capsys):
    """train.main on bundled-image:train without --model: the cached bundled policy, 1 step."""
    from ecredit_trl.train import main

    stamp = (Path(warm_policy) / "warmstart.json").stat().st_mtime_ns
    runs = tmp_path / "runs"
    rc = main(["--arm", "O", "--max_steps", "1", "--runs_dir", str(runs), "--tasks",
               "bundled-image:train", "--max_tasks", "1", "--save_steps", "100"])
    assert rc == 0
    assert f"warmstart: reusing cached policy {warm_policy}" in capsys.readouterr().out
    assert (Path(warm_policy) / "warmstart.json").stat().st_mtime_ns == stamp  # not retrained
    (run,) = runs.iterdir()
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["model"]["path"] == str(warm_policy) and cfg["model"]["model"] is None
    (ledger,) = _jsonl(run / "ledger.jsonl")
    trajs = _jsonl(run / "trajectories.jsonl")
    assert ledger["step"] == 1 and len(trajs) == ledger["rollouts"] == 4
    assert not [t for t in trajs if t["exclusion"] == "sandbox_setup"]
    assert ledger["trials_factual"] == len(trajs)


# ---------------------------------------------------------------------------
# the pilot
# ---------------------------------------------------------------------------

def test_pilot_on_image_tasks(tmp_path, image_tasks, podman_runtime):
    """Scripted rollouts and the pilot's replay start from S_0 = the image's tree at reset
    (the base the agent environment starts from), trials run in the task images."""
    from test_pilot import _check_signs, _check_table_against_records

    from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release
    from ecredit_trl.credit.pilot import run_pilot
    from ecredit_trl.credit.scripted import KINDS, scripted_trajectories

    tasks = _one_per_project(image_tasks)[:2]
    assert len(tasks) == 2 and all(t.repo_dir is None for t in tasks)
    trajs = scripted_trajectories(tasks, max_tasks=2)
    # one-line mutations: the gold fix cannot be split, so 5 kinds per task
    assert [(t.task_id, t.rollout_index) for t in trajs] == [
        (t.instance_id, KINDS.index(k)) for t in sorted(tasks, key=lambda t: t.repo)
        for k in KINDS if k != "gold_split"]
    out = tmp_path / "pilot"
    table = run_pilot(tasks, trajs, out, seed=0, concurrency=2, runtime=podman_runtime,
                      timeout_s=300, log=lambda _m: None)
    records = _jsonl(out / "records.jsonl")
    trials = _jsonl(out / "trials.jsonl")
    _check_table_against_records(table, records, trials)
    assert table["planned"] == len(records) == 10
    assert table["excluded"]["format_error"] == 2
    assert table["excluded"]["no_eligible_block"] == 2  # tests_only
    assert table["excluded"]["no_original_utility"] == 0
    assert table["usable"] == 6  # mixed, gold_only, nofix of each task
    assert table["trials"]["factual"] == table["trials"]["counterfactual"] == 6
    assert sum(t["role"] == "control" for t in trials) == 2
    assert all(t["exit_class"] == "ok" for t in trials), trials
    by_key = {(r["task_id"], r["rollout_index"]): r for r in records}
    for t in tasks:
        g = by_key[(t.instance_id, KINDS.index("gold_only"))]
        assert g["resolved_P"] and g["D"] == 1.0 and g["ablation"]["artifact_empty"]
        n = by_key[(t.instance_id, KINDS.index("nofix"))]
        assert not n["resolved_P"] and n["D"] == 0
    assert _check_signs(records) >= 4
    assert table["meta"]["selections_before_trials"]
    # S_0 of every replay is the tree an agent rollout of the task starts from
    ctx = AgentContext(tasks={t.instance_id: t for t in tasks}, runtime=podman_runtime,
                       workroot=str(tmp_path / "wr"))
    try:
        for t in tasks:
            env = SWEAgentEnv(ctx)
            env.reset(instance_id=t.instance_id)
            assert env.failure is None, env.failure
            s0 = {r["snapshots"][0] for r in records
                  if r["task_id"] == t.instance_id and r.get("snapshots")}
            assert s0 == {env.base_tree}
            release(env)
    finally:
        ctx.close()


def test_pilot_and_scripted_refuse_a_task_without_repository_or_image(image_tasks, tmp_path):
    import dataclasses

    from ecredit_trl.credit.pilot import run_pilot
    from ecredit_trl.credit.scripted import scripted_for_task
    from ecredit_trl.credit.trajectory import FileWrite, Trajectory, Turn

    t = dataclasses.replace(image_tasks[0], image="")
    traj = Trajectory(t.instance_id, 0, False, (Turn(5, {"x.txt": FileWrite(b"x\n")}),))
    with pytest.raises(ValueError, match=r"tasks: neither repo_dir nor image for \['"):
        run_pilot([t], [traj], tmp_path / "p", runtime=SandboxOptions(kind="local"), log=lambda _m: None)
    assert not (tmp_path / "p").exists()  # refused before anything is written
    with pytest.raises(ValueError, match=rf"image: task {t.instance_id} has neither"):
        scripted_for_task(t)
