"""Bad arguments to the main job: one clear line naming the field or path, exit 2."""

import subprocess
import sys

import pytest
from conftest import REPO_ROOT


@pytest.mark.parametrize("args,expected", [
    (["--arm", "X"], "arm: expected one of ('O', 'B', 'M', 'E'), got 'X'"),
    (["--arm", "B", "--credit_lambda", "-1"], "credit_lambda: must be >= 0, got -1.0"),
    (["--arm", "B", "--config", "/nonexistent.yaml"], "--config: no such file /nonexistent.yaml"),
    (["--arm", "B", "--credit_lamda", "0.3"], "--credit_lamda"),
    (["--arm", "B", "--snapshot_ignore", "*.pyc", " "],
     "snapshot_ignore: expected a list of non-empty glob strings"),
    (["--arm", "B", "--credit_lambda", "abc"],
     "argument --credit_lambda/--credit-lambda: invalid float value: 'abc'"),
])
def test_bad_arguments_fail_with_one_line(args, expected, tmp_path):
    proc = subprocess.run([sys.executable, "ecredit_trl/train.py", *args, "--runs_dir",
                           str(tmp_path)], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2
    last = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1]
    assert last.startswith("train.py: error: ") and expected in last
    assert "Traceback" not in proc.stderr
    assert "usage:" not in proc.stderr  # not the hundreds of fields before the one line
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_selection_seed_defaults_to_the_run_seed():
    """Every seed of a study gets its own block-selection stream; an explicit
    selection_seed still wins."""
    from ecredit_trl.train import parse_args

    cfg, _ = parse_args(["--arm", "B", "--seed", "7"])
    assert (cfg.seed, cfg.selection_seed) == (7, 7)
    cfg, _ = parse_args(["--arm", "B", "--seed", "7", "--selection_seed", "3"])
    assert (cfg.seed, cfg.selection_seed) == (7, 3)
    cfg, _ = parse_args(["--arm", "B"])
    assert cfg.selection_seed == cfg.seed  # the embedded default seed
