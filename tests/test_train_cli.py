"""Bad arguments to the main job: one clear line naming the field or path, exit 2."""

import subprocess
import sys

import pytest
from conftest import REPO_ROOT


@pytest.mark.parametrize("args,expected", [
    (["--arm", "X"], "argument --arm: X: not allowed (not a choice); allowed: one of O, B, M, E"),
    (["--arm", "B", "--credit_lambda", "-1"],
     "argument --credit_lambda/--credit-lambda: -1: not allowed (out of range); allowed: a "
     "finite number >= 0"),
    (["--arm", "B", "--config", "/nonexistent.yaml"],
     "argument --config: /nonexistent.yaml: not allowed (no such file); allowed: an existing "
     "readable yaml file"),
    (["--arm", "B", "--credit_lamda", "0.3"], "--credit_lamda"),
    (["--arm", "B", "--snapshot_ignore", "*.pyc", " "],
     "argument --snapshot_ignore/--snapshot-ignore:  : not allowed (empty)"),
    (["--arm", "B", "--credit_lambda", "abc"],
     "argument --credit_lambda/--credit-lambda: 'abc' is not a number; allowed: a finite "
     "number >= 0"),
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
    assert len([ln for ln in proc.stderr.splitlines() if ln.strip()]) == 1


@pytest.mark.parametrize("args,expected", [
    # inherited TRL / transformers fields: refused naming the flag, before any run directory
    (["--arm", "B", "--max_steps", "-3"], "argument --max_steps/--max-steps: -3: not allowed"
     " (out of range); allowed: an integer >= 1 (a run counts steps"),
    (["--arm", "B", "--lora_r", "-4"],
     "argument --lora_r/--lora-r: -4: not allowed (out of range); allowed: an integer >= 0"),
    (["--arm", "B", "--learning_rate", "-1"], "argument --learning_rate/--learning-rate: -1: "
     "not allowed (out of range); allowed: a finite number >= 0"),
    (["--arm", "B", "--temperature", "-1"],
     "argument --temperature: -1: not allowed (out of range); allowed: a finite number > 0"),
    (["--arm", "B", "--num_generations", "0"], "argument --num_generations/--num-generations: "
     "0: not allowed (out of range); allowed: an integer >= 2"),
    (["--arm", "B", "--top_p", "2"], "argument --top_p/--top-p: 2: not allowed (out of range);"
     " allowed: a finite number > 0 and <= 1"),
    # combinations
    (["--arm", "B", "--per_device_train_batch_size", "3"],
     "--num_generations: 4 does not divide the generation batch (per_device_train_batch_size 3"
     " x processes 1 x gradient_accumulation_steps 1 = 3): each batch must hold whole groups of "
     "num_generations completions (TRL's rule)"),
    (["--arm", "B", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "3"],
     "gradient_accumulation_steps 3 = 6"),
    (["--arm", "B", "--max_completion_length", "5"],
     "--max_completion_length: 5 is shorter than one turn's minimum (16 tokens"),
])
def test_refused_in_one_line_before_the_run_directory(args, expected, tmp_path, capsys):
    """The issue's table of inherited fields and the field combinations, through ``cli`` in
    this process (the subprocess rows above show the same path from the command line; one
    real run of a table row is the last case): exit 2, one line naming the flag, the value and
    what is allowed, no run directory."""
    from ecredit_trl.train import cli

    runs = tmp_path / "runs"
    try:
        rc = cli([*args, "--runs_dir", str(runs)])
    except SystemExit as exc:  # argparse refuses a flag's value itself
        rc = exc.code
    assert rc == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("train.py: error: ") and expected in err[0], err
    assert not runs.exists()


def test_a_table_row_from_the_command_line(tmp_path):
    proc = subprocess.run([sys.executable, "ecredit_trl/train.py", "--arm", "B", "--top_p", "2",
                           "--runs_dir", str(tmp_path / "runs")], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "train.py: error: argument --top_p/--top-p: 2: not allowed (out of range); allowed: a "
        "finite number > 0 and <= 1 (a probability mass)"]
    assert not (tmp_path / "runs").exists()


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
