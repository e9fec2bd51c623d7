"""A real GRPO step with a mixed group: a hanging rollout gets the negative
advantage an honest failure gets; a rollout that failed for infrastructure reasons gets 0
and stays out of the group's baseline.

The trainer path of ``tests/test_reward_guard.py`` (`ecredit_trl.train.main`: Podman, tiny
policy, real TRL step, real verifier trials), one task and one group of four rollouts. The
final artifacts of three rollouts are set when their query is planned (the tiny policy does
not write them): the gold fix, an honest failure (a notes file), and the same failure plus
``time.sleep(10**6)`` at the import of the module the tests load. The fourth rollout's agent
container cannot start (an infra failure injected at the container's creation).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import subprocess
import threading
from pathlib import Path

import pytest

pytestmark = [pytest.mark.podman, pytest.mark.slow]
TRIAL_TIMEOUT_S = 15


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _artifacts(task) -> dict[str, str]:
    """gold / honest failure / hang for ``task`` (``git diff`` text from its base)."""
    path = next(line[len("+++ b/"):].split("\t")[0] for line in task.patch.splitlines()
                if line.startswith("+++ b/") and line.endswith(".py"))
    base = subprocess.run(["git", "-C", task.repo_dir, "show", f"{task.base_commit}:{path}"],
                          check=True, capture_output=True, text=True).stdout
    hung = "import time\ntime.sleep(10**6)\n" + base
    body = "".join(difflib.unified_diff(base.splitlines(keepends=True),
                                        hung.splitlines(keepends=True), f"a/{path}", f"b/{path}"))
    honest = ("diff --git a/NOTES.md b/NOTES.md\nnew file mode 100644\n--- /dev/null\n"
              "+++ b/NOTES.md\n@@ -0,0 +1 @@\n+looked at the bug\n")
    return {"gold": task.patch, "honest": honest,
            "hang": honest + f"diff --git a/{path} b/{path}\n{body}"}


def test_a_hang_is_an_honest_failure_and_an_infra_failure_is_out_of_the_baseline(
        tmp_path, monkeypatch, warm_policy):
    import torch
    from trl.trainer.utils import nanstd

    import ecredit_trl.agent.episode_record as record_mod  # builds the records
    import sandbox.workspace.rollout as env_mod  # the workspace opens the rollout's session
    from ecredit_trl.train import main
    from eval.tasks.splits import load_tasks
    from sandbox.images import build_offline

    build_offline(log=lambda *_: None)
    tasks = {t.instance_id: t for t in load_tasks("bundled:train", purpose="train")}
    real_open, real_plan = env_mod.open_session, record_mod.plan_query
    opened, kinds = [], {}
    lock = threading.Lock()

    def open_session(*a, **kw):  # the first rollout's container cannot start
        with lock:
            opened.append(1)
            first = len(opened) == 1
        if first:
            raise RuntimeError("OCI runtime error: injected")
        return real_open(*a, **kw)

    def plan_query(repo, snapshots, **kw):
        plan = real_plan(repo, snapshots, **kw)
        with lock:
            kind = ("gold", "honest", "hang")[len(kinds)]
            kinds[kw["rollout_index"]] = kind
        return dataclasses.replace(plan, final_artifact=_artifacts(tasks[kw["task_id"]])[kind])

    monkeypatch.setattr(env_mod, "open_session", open_session)
    monkeypatch.setattr(record_mod, "plan_query", plan_query)
    runs = tmp_path / "runs"
    rc = main(["--arm", "O", "--max_steps", "1", "--runs_dir", str(runs), "--max_tasks", "1",
               "--save_steps", "100", "--verifier_retries", "0",
               "--trial_timeout_s", str(TRIAL_TIMEOUT_S)])
    assert rc == 0
    (run,) = runs.iterdir()
    trajs = {t["rollout_index"]: t for t in _jsonl(run / "trajectories.jsonl")}
    assert len(trajs) == 4 and len({t["task_id"] for t in trajs.values()}) == 1
    (infra,) = [t for t in trajs.values() if t["exclusion"] == "sandbox_setup"]
    by = {kinds[i]: trajs[i] for i in kinds}
    gold, honest, hang = by["gold"], by["honest"], by["hang"]
    assert gold["reward"] == 1.0 and gold["factual_outcome"] == "graded", gold["factual"]
    assert honest["reward"] == 0.0 and honest["factual_outcome"] == "graded"
    # the hang: timed out twice while the control completed, scored as a failure
    assert hang["factual_outcome"] == hang["failure_class"] == "artifact_timeout"
    assert hang["reward"] == 0.0 and hang["utility"] == -1.0
    assert hang["exclusion"] != "no_original_utility"
    ev = hang["failure_evidence"]
    assert ev["retry_exit_class"] == "timeout" and ev["limit"] == {"timeout_s": TRIAL_TIMEOUT_S}
    assert ev["controls"][0]["exit_class"] == "ok"
    assert ev["controls"][0]["test_s"] < TRIAL_TIMEOUT_S / 2
    assert [a["exit_class"] for a in hang["factual"]["failed_attempts"]] == ["timeout"]
    # advantages: the hang's equals the honest failure's and is negative; the infra row is 0
    # and out of the baseline (mean and std over the three scored rewards only)
    assert infra["reward"] is None and infra["advantage"] == 0.0
    assert hang["advantage"] < 0 and hang["advantage"] == pytest.approx(honest["advantage"])
    scored = torch.tensor([1.0, 0.0, 0.0])
    want = float((1.0 - scored.mean()) / (nanstd(scored) + 1e-4))
    assert gold["advantage"] == pytest.approx(want, rel=1e-4)
    # counted per step: ledger and metrics.jsonl
    (ledger,) = _jsonl(run / "ledger.jsonl")
    assert ledger["failures_attributed"] == {"artifact_timeout": 1}
    assert ledger["masked_share"] == 0.25 and ledger["reward_unavailable"] == 1
    assert ledger["rollouts_excluded"]["sandbox_setup"] == 1
    assert ledger["failure_retries"] == 1 and ledger["retries"] == 0
    metrics = _jsonl(run / "metrics.jsonl")
    shares = [m["ecredit/masked_share"] for m in metrics if "ecredit/masked_share" in m]
    assert shares == [0.25]
