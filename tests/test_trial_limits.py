"""Trial limits from the split: SWE-bench-format image tasks get the harness's
1800 s and 8 GB, bundled tasks keep today's, a row's trial_defaults and explicit flags win;
every trial records what it ran under."""

import dataclasses

import pytest

from eval.tasks.trialspec import (
    BUNDLED_TIMEOUT_S,
    HARNESS_LIMITS,
    TrialLimits,
    task_trial_spec,
    trial_limits,
)


@pytest.fixture(scope="module")
def bundled_task():
    from eval.tasks.splits import load_tasks

    return load_tasks("bundled:holdout")[0]


def test_the_split_sets_the_defaults(bundled_task):
    image_task = dataclasses.replace(bundled_task, repo_dir=None)
    assert trial_limits(image_task) == TrialLimits(1800.0, "8g", 4096, 2.0, "harness")
    assert trial_limits(image_task) == HARNESS_LIMITS
    assert trial_limits(bundled_task) == TrialLimits(600.0, "2g", 1024, 1.0, "bundled")
    assert BUNDLED_TIMEOUT_S == 600.0
    assert trial_limits(bundled_task, bundled_timeout_s=120).timeout_s == 120.0
    # bundled_timeout_s never reaches an image task
    assert trial_limits(image_task, bundled_timeout_s=120).timeout_s == 1800.0


def test_explicit_flags_win_and_say_so(bundled_task):
    image_task = dataclasses.replace(bundled_task, repo_dir=None)
    lim = trial_limits(image_task, timeout_s=90, memory="4g")
    assert lim == TrialLimits(90, "4g", 4096, 2.0, "harness+memory,timeout_s")
    assert trial_limits(bundled_task, cpus=0.5).source == "bundled+cpus"
    with pytest.raises(ValueError, match="^timeout_s: must be > 0, got 0"):
        trial_limits(bundled_task, timeout_s=0)


def test_a_rows_trial_defaults_come_before_the_split(bundled_task):
    row = dataclasses.replace(bundled_task, repo_dir=None,
                              extra={"trial_defaults": {"timeout_s": 300, "memory": "16g"}})
    assert trial_limits(row) == TrialLimits(300.0, "16g", 4096, 2.0, "row")
    assert trial_limits(row, timeout_s=10).timeout_s == 10
    bad = dataclasses.replace(bundled_task, extra={"trial_defaults": {"timeout": 3}})
    with pytest.raises(ValueError, match=r"field 'trial_defaults': expected an object with "
                                         r"keys among \['cpus', 'memory', 'pids', 'timeout_s'\]"):
        trial_limits(bad)
    bad = dataclasses.replace(bundled_task, extra={"trial_defaults": {"pids": "many"}})
    with pytest.raises(ValueError, match="trial_defaults': pids must be int, got 'many'"):
        trial_limits(bad)


def test_the_spec_carries_the_limits_and_their_source(bundled_task):
    image_task = dataclasses.replace(bundled_task, repo_dir=None)
    spec = task_trial_spec(image_task, "", "t1")
    assert (spec.timeout_s, spec.limits.memory, spec.limits.cpus) == (1800.0, "8g", 2.0)
    assert spec.limits_record() == {"timeout_s": 1800.0, "memory": "8g", "pids": 4096,
                                    "cpus": 2.0, "output_bytes": 64 * 2**20,
                                    "source": "harness"}
    spec = task_trial_spec(bundled_task, "", "t2", timeout_s=30)
    assert spec.limits_record()["source"] == "bundled+timeout_s" and spec.timeout_s == 30


def test_train_config_leaves_limits_to_the_task(tmp_path):
    from ecredit_trl.config import ECreditConfig
    from ecredit_trl.trainer.trials import TRAIN_BUNDLED_TIMEOUT_S

    cfg = ECreditConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False)
    assert (cfg.trial_timeout_s, cfg.trial_memory, cfg.trial_cpus) == (None, None, None)
    assert TRAIN_BUNDLED_TIMEOUT_S == 120.0


@pytest.mark.podman
def test_every_trial_records_its_limits(bundled_task, podman_runtime):
    from eval.evaluation.verification import trial_row
    from eval.integrity.retry import RetryPolicy
    from sandbox.trials.pool import VerifierPool
    spec = task_trial_spec(bundled_task, "", "limits-rec", bundled_timeout_s=45)
    with VerifierPool(podman_runtime, max_concurrency=1, retry=RetryPolicy()) as pool:
        (res,) = pool.map([spec])
    assert res.exit_class == "ok", res.error
    want = {"timeout_s": 45.0, "memory": "2g", "pids": 1024, "cpus": 1.0,
            "output_bytes": 64 * 2**20, "source": "bundled"}
    assert res.limits == want
    assert res.to_json()["limits"] == want  # the trainer's trajectory rows hold to_json()
    assert trial_row(res)["limits"] == want  # eval slot rows
