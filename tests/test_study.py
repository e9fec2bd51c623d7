"""``python -m ecredit_trl.study``: config validation, changed-config refusal, the lock,
status of a partial folder (fast); and the CI smoke study (Podman, tiny policy, CPU): a
2-arm × 1-seed × 2-step study killed (SIGTERM to the study process) in the middle of its second
training run, then resumed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT

from ecredit_trl.study.config import (
    StudyConfigError,
    config_from_dict,
    load_study_config,
    split_dirname,
)
from ecredit_trl.train import embedded_defaults

BASE = {"arms": ["O", "M"], "seeds": [0], "train": {"max_steps": 2},
        "eval": {"splits": ["bundled:train"], "n": 1}}


def _cfg(**over):
    raw = json.loads(json.dumps(BASE))
    for k, v in over.items():
        raw[k] = v
    return config_from_dict(raw, where="t.yaml")


# -- config -----------------------------------------------------------------------------------
@pytest.mark.parametrize("over, named", [
    ({"armz": ["O"]}, "t.yaml: armz: unknown key"),
    ({"arms": ["O", "X"]}, "t.yaml: arms:"),
    ({"seeds": [0, 0]}, "t.yaml: seeds: seeds repeated"),
    ({"seeds_by_arm": {"Q": [1]}}, "t.yaml: seeds_by_arm.Q: not an arm"),
    ({"train": {"max_stepz": 2}}, "t.yaml: train.max_stepz: unknown field"),
    ({"train": {"seed": 3}}, "t.yaml: train.seed: set by the study"),
    ({"train": {"max_steps": "two"}}, "t.yaml: train.max_steps: expected int"),
    ({"train": {"learning_rate": True}}, "t.yaml: train.learning_rate: expected float"),
    ({"eval": {"splits": ["bundled:train"], "n": 0}}, "t.yaml: eval.n: expected an int >= 1"),
    ({"eval": {"splits": [], "n": 1}}, "t.yaml: eval.tasks.splits:"),
    ({"eval": {"splits": ["bundled:train"], "n": 1, "temp": 1}}, "t.yaml: eval.temp: unknown"),
    ({"eval": {"splits": ["bundled:train"], "n": 1, "n_by_split": {"official500": 2}}},
     "t.yaml: eval.n_by_split.official500: not one of eval.tasks.splits"),
    ({"bootstrap": {"alpha": 1.5}}, "t.yaml: bootstrap.alpha: expected a number in (0, 1)"),
])
def test_config_errors_name_the_key(over, named):
    with pytest.raises(StudyConfigError) as ei:
        _cfg(**over)
    assert str(ei.value).startswith(named), str(ei.value)


def test_config_resolves_seeds_defaults_and_hash():
    c = _cfg(seeds=[0, 1], seeds_by_arm={"E": [0]})
    assert c.arms == ["O", "M", "E"]
    assert c.design() == [("O", 0), ("O", 1), ("M", 0), ("M", 1), ("E", 0)]
    assert c.eval["temperature"] == 1.0 and c.eval["concurrency"] == 2
    assert c.bootstrap == {"n_boot": 10000, "seed": 0, "alpha": 0.05, "power": 0.8}
    assert c.pooled_seeds == "shared" and c.eval["in_distribution"] == []
    assert c.sha256() == _cfg(seeds=[0, 1], seeds_by_arm={"E": [0]}).sha256()
    assert c.sha256() != _cfg(seeds=[0, 2], seeds_by_arm={"E": [0]}).sha256()
    assert split_dirname("bundled:holdout") == "bundled-holdout"
    assert split_dirname("/x/two.jsonl") == "two"


def test_shipped_study_configs_load():
    emb = load_study_config(REPO_ROOT / "studies" / "embedded.yaml")
    assert emb.model is None and emb.accelerate_config is None
    # the positive control: M runs first, then O, B, E
    assert emb.design() == [("M", 0), ("O", 0), ("B", 0), ("E", 0)]
    assert emb.warmstart == {"harmful_fraction": 0.5}
    assert emb.eval["splits"] == ["bundled:train"]
    assert emb.eval_n("bundled:train") >= 4 and emb.eval["temperature"] == 1.0
    assert emb.eval["reuse_verdicts"] is True  # opt-in verdict store (to save cost)
    # the study trains with the trainer's learning recipe's anchor; its rate is its own: the
    # default 1e-3 goes with every task's group in every step, and a step here holds 2 of 20
    recipe = ("lr_scheduler_type", "warmup_steps", "beta", "negative_advantage_weight")
    assert {k: emb.train[k] for k in recipe} == {k: embedded_defaults(False)[k] for k in recipe}
    assert emb.train["learning_rate"] == 5e-4 < embedded_defaults(False)["learning_rate"]
    off = load_study_config(REPO_ROOT / "studies" / "official500_lora.yaml")
    assert off.arms == ["O", "B", "M", "E"] and off.seeds == [0, 1, 2]
    assert off.train["max_steps"] == 80 and off.train["lora_r"] > 0
    assert off.eval_n("official500") == 2 and off.eval_n("holdout100") == 16
    assert Path(off.accelerate_config).is_file() or (REPO_ROOT / off.accelerate_config).is_file()
    assert off.eval["reuse_verdicts"] is False  # official: every slot verified


def test_commands_carry_the_study_fields(tmp_path):
    from ecredit_trl.study.runner import eval_command, train_command

    c = _cfg(train={"max_steps": 2, "credit_lambda": 0.3, "test_path_patterns": ["t/", "x"]},
             eval={"splits": ["bundled:train"], "n": 3, "temperature": 1.0})
    cmd = train_command(c, "M", 0, tmp_path / "runs" / "M-s0")
    i = cmd.index(str(REPO_ROOT / "ecredit_trl" / "train.py"))
    assert cmd[1:3] == ["-m", "accelerate.commands.launch"]
    assert cmd[i + 1:] == ["--arm", "M", "--seed", "0", "--output_dir",
                           str(tmp_path / "runs" / "M-s0"), "--max_steps", "2",
                           "--credit_lambda", "0.3", "--test_path_patterns", "t/", "x"]
    ck = tmp_path / "runs" / "M-s0" / "checkpoint-1"
    assert train_command(c, "M", 0, ck.parent, ck)[-2:] == ["--resume-from", str(ck)]
    ev = eval_command(c, "/m", "bundled:train", tmp_path / "e")
    assert ev[1:3] == ["-m", "eval.run"]
    assert ev[ev.index("--n") + 1] == "3" and ev[ev.index("--temperature") + 1] == "1.0"
    assert "--reuse-verdicts" not in ev  # opt-in


def test_reuse_verdicts_config_and_command(tmp_path):
    from ecredit_trl.study.config import StudyConfigError
    from ecredit_trl.study.runner import eval_command

    off = _cfg()
    on = _cfg(eval={**BASE["eval"], "reuse_verdicts": True})
    explicit_off = _cfg(eval={**BASE["eval"], "reuse_verdicts": False})
    # false (the default) stays out of the resolved config: hashes of older studies hold
    assert "reuse_verdicts" not in off.resolved()["eval"]
    assert explicit_off.sha256() == off.sha256() != on.sha256()
    assert on.resolved()["eval"]["reuse_verdicts"] is True
    ev = eval_command(on, "/m", "bundled:train", tmp_path / "evals" / "baseline" / "b",
                      tmp_path / "verdicts")
    assert ev[ev.index("--reuse-verdicts") + 1] == str(tmp_path / "verdicts")
    with pytest.raises(StudyConfigError, match="eval.reuse_verdicts"):
        _cfg(eval={**BASE["eval"], "reuse_verdicts": "yes"})


# -- study.json binding and the lock ----------------------------------------------------------
def test_changed_config_is_refused_naming_keys(tmp_path, capsys):
    from ecredit_trl.study.__main__ import main
    from ecredit_trl.study.supervisor import StudyLock, StudyRefused, bind_study

    out = tmp_path / "s"
    c1 = _cfg()
    rec = bind_study(c1, out, allow_changed=False, command=["x"])
    assert rec["config_sha256"] == c1.sha256() and rec["history"] == []
    assert bind_study(c1, out, allow_changed=False, command=["y"])["command"] == ["x"]
    c2 = _cfg(train={"max_steps": 3}, seeds=[0, 1])
    with pytest.raises(StudyRefused, match=r"changed \(seeds, seeds_by_arm.M, seeds_by_arm.O, "
                                           r"train.max_steps\)"):
        bind_study(c2, out, allow_changed=False, command=["y"])
    assert json.loads((out / "study.json").read_text())["config_sha256"] == c1.sha256()
    rec = bind_study(c2, out, allow_changed=True, command=["z"])
    assert rec["config_sha256"] == c2.sha256()
    assert rec["history"][0]["was_sha256"] == c1.sha256()
    assert "train.max_steps" in rec["history"][0]["changed_keys"]
    # the CLI: one line, exit 2, nothing else written
    yml = tmp_path / "c.yaml"
    yml.write_text(yaml.safe_dump({**BASE, "eval": {**BASE["eval"],
                                                    "in_distribution": ["bundled:train"]}}))
    assert main(["run", "--config", str(yml), "--out", str(out)]) == 2
    assert "study config changed" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == [".study.lock", "study.json"]
    with StudyLock(out), pytest.raises(StudyRefused, match=f"pid {os.getpid()}"):
        with StudyLock(out):
            pass


# -- status of a partial folder ---------------------------------------------------------------
def _wj(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def _fake_run(rd: Path, arm: str, cls: str | None, final: bool, max_steps: int = 2) -> None:
    _wj(rd / "manifest.json", {"run_name": rd.name})
    _wj(rd / "config.json", {"ecredit": {"arm": arm, "seed": 0, "max_steps": max_steps},
                             "model": {"model": None}})
    _wj(rd / "receipts" / "s00-start.json", {"process": {"pid": 1, "start_ticks": 1}})
    if cls:
        _wj(rd / "receipts" / "s00-termination.json", {"class": cls, "step": 1})
    if final:
        (rd / "checkpoint-final").mkdir()
        _wj(rd / "receipts" / "s00-checkpoint-final.json", {"step": 2, "reason": "final"})


def _fake_eval(ed: Path, split: str, graded: int, run_dir: Path | None) -> None:
    _wj(ed / "run.json", {"binding": "b1"})
    _wj(ed / "results.json", {
        "binding": "b1", "split": split, "n": 1, "seed": 0,
        "overrides": {"temperature": 1.0, "max_turns": 3, "max_new_tokens": 640},
        "run_dir": str(run_dir) if run_dir else None, "rollouts_exit_code": 0,
        "summary": {"denominator": {"tasks": 2, "n": 1, "slots": 2}, "success": 0.5,
                    "unknown": 0}, "slots": [{}] * graded})


def test_status_on_a_partial_folder(tmp_path):
    from ecredit_trl.study.__main__ import main
    from ecredit_trl.study.status import render_status, study_units
    from ecredit_trl.study.supervisor import bind_study

    out = tmp_path / "s"
    c = _cfg(arms=["O", "M", "B"])
    bind_study(c, out, allow_changed=False, command=["x"])
    _fake_run(out / "runs" / "O-s0", "O", "completed", True)
    _fake_run(out / "runs" / "M-s0", "M", "sigterm", False)
    _wj(out / "units" / "train-M-s0.json", {"rc": 143})
    _fake_run(out / "runs" / "B-s0", "B", "completed", True, max_steps=5)  # another config
    _fake_eval(out / "evals" / "baseline" / "bundled-train", "bundled:train", 2, None)
    _fake_eval(out / "evals" / "O-s0" / "bundled-train", "bundled:train", 1,
               out / "runs" / "O-s0")
    units = {f"{u.kind} {u.name}": u for u in study_units(c, out)}
    assert list(units) == ["train O-s0", "train M-s0", "train B-s0",
                           "eval baseline/bundled-train", "eval O-s0/bundled-train",
                           "eval M-s0/bundled-train", "eval B-s0/bundled-train",
                           "compare bundled-train", "report report"]
    got = {k: (u.state, u.detail) for k, u in units.items()}
    assert got["train O-s0"] == ("done", "1 session(s)")
    assert got["train M-s0"] == ("failed", "termination sigterm; exit 143")
    assert got["train B-s0"][0] == "stale" and "max_steps=5 (study: 2)" in got["train B-s0"][1]
    assert got["eval baseline/bundled-train"] == ("done", "success 0.500, unknown 0")
    assert got["eval O-s0/bundled-train"] == ("failed", "incomplete: 1/2 slots")
    assert [got[k][0] for k in list(got)[5:]] == ["pending"] * 4
    table = render_status(list(units.values()), out)
    assert table.splitlines()[-1] == "2 done, 2 failed, 1 stale, 4 pending"
    assert main(["status", "--out", str(out)]) == 1  # a unit failed


# -- the CI smoke study -----------------------------------------------------------------------
def _sha_tree(d: Path) -> dict:
    import hashlib

    return {str(p.relative_to(d)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.podman
@pytest.mark.slow
def test_smoke_study_killed_and_resumed(tmp_path, warm_policy):
    # warm_policy: the bundled tasks and the embedded policy are built (on a cold cache,
    # ~12 min) before the study starts, never inside the deadline below, which times a step
    from eval.tasks.schema import save_tasks
    from eval.tasks.splits import load_tasks

    split = tmp_path / "two.jsonl"
    save_tasks(load_tasks("bundled:train")[:2], split)
    cfg = {"name": "smoke", "arms": ["O", "M"], "seeds": [0],
           "train": {"max_steps": 2, "max_tasks": 2, "num_generations": 2,
                     "per_device_train_batch_size": 2, "max_completion_length": 256,
                     "save_steps": 1, "verifier_retries": 0},
           "eval": {"splits": [str(split)], "n": 1, "temperature": 1.0, "batch_size": 2,
                    "reuse_verdicts": True,  # as studies/embedded.yaml
                    "in_distribution": [str(split)]},  # the split is the training pool
           "bootstrap": {"n_boot": 200}}
    yml = tmp_path / "smoke.yaml"
    yml.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "study"
    cmd = [sys.executable, "-m", "ecredit_trl.study", "run", "--config", str(yml),
           "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TMPDIR=str(tmp_path),
               CONTAINERS_CONF=str(REPO_ROOT / "sandbox" / "containers.conf"))
    p = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    ledger = out / "runs" / "M-s0" / "ledger.jsonl"
    deadline = time.monotonic() + 400
    while not (ledger.is_file() and ledger.read_text().strip()):  # M's step 1 is done
        assert p.poll() is None, p.stdout.read()
        assert time.monotonic() < deadline, "the second run never finished a step"
        time.sleep(0.5)
    # to the study process alone (`kill <pid>`, a scheduler): accelerate's one-process launcher
    # does not pass SIGTERM on, so the study must signal the unit's whole process group
    os.kill(p.pid, signal.SIGTERM)
    first = p.communicate(timeout=300)[0]
    assert p.returncode == 143, first
    o_run = out / "runs" / "O-s0"
    o_files = _sha_tree(o_run)
    r = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "train O-s0: done, skipped" in r.stdout
    assert _sha_tree(o_run) == o_files  # the finished run was not retrained nor touched
    m_run = out / "runs" / "M-s0"
    resume = json.loads((m_run / "receipts" / "s01-resume.json").read_text())
    assert json.dumps(resume).count("checkpoint-") >= 1
    term0 = json.loads((m_run / "receipts" / "s00-termination.json").read_text())
    assert term0["class"] == "sigterm"
    assert json.loads((m_run / "receipts" / "s01-termination.json").read_text())["class"] == \
        "completed"
    steps = [json.loads(x)["step"] for x in ledger.read_text().splitlines() if x.strip()]
    assert steps == [1, 2]
    for policy in ("baseline", "O-s0", "M-s0"):
        res = json.loads((out / "evals" / policy / "two" / "results.json").read_text())
        assert res["summary"]["denominator"] == {"tasks": 2, "n": 1, "slots": 2}
        assert len(res["slots"]) == 2
        assert res["verdict_store"]["path"] == str(out / "verdicts")
    # the three evals share one store: each task's empty-patch control ran once in the study
    n_ctrl = sum(json.loads((out / "evals" / p / "two" / "results.json").read_text())["cost"]
                 ["trials_control"] for p in ("baseline", "O-s0", "M-s0"))
    assert n_ctrl <= 2 and len(list((out / "verdicts").glob("*.json"))) >= n_ctrl
    cmp = json.loads((out / "compare" / "two" / "compare.json").read_text())
    assert {s["label"] for s in cmp["seeds"]} == {"baseline", "O:0", "M:0"}
    assert [x["name"] for x in cmp["pairs"]] == ["M−O"]
    st = subprocess.run([sys.executable, "-m", "ecredit_trl.study", "status", "--out", str(out)],
                        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert st.returncode == 0, st.stderr
    states = {" ".join(line.split()[:2]): line.split()[2]
              for line in st.stdout.strip().splitlines()[1:-1]}
    assert len(states) == 7 and all(v == "done" for k, v in states.items()
                                    if k != "report report"), st.stdout
    report_there = (REPO_ROOT / "ecredit_trl" / "study" / "report.py").is_file()
    assert states["report report"] == ("done" if report_there else "pending"), st.stdout
    # the study's own records name paths relative to the study folder ...
    rec = json.loads((out / "units" / "eval-O-s0-two.json").read_text())
    assert rec["run_dir"] == "runs/O-s0" and rec["log"] == "logs/eval-O-s0-two.log"
    inputs = json.loads((out / "compare" / "two" / "inputs.json").read_text())
    assert "baseline=evals/baseline/two" in inputs["args"]
    # ... so a copied folder (new mtimes, the old place gone) reads the same: nothing stale
    import shutil

    moved = tmp_path / "moved"
    shutil.copytree(out, moved, copy_function=shutil.copy)
    shutil.rmtree(out)
    st = subprocess.run([sys.executable, "-m", "ecredit_trl.study", "status", "--out",
                         str(moved)], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                        timeout=120)
    assert st.returncode == 0, st.stderr
    assert st.stdout.strip().splitlines()[-1] == "7 done", st.stdout


@pytest.mark.podman
@pytest.mark.slow
def test_failed_run_does_not_stop_independent_units(tmp_path, warm_policy):
    """A run that fails at model load (LoRA on a module the model lacks): the baseline eval
    and the comparison still run; the study exits 1; status names the class and exit code."""
    # warm_policy: built before the study's timeout starts (see the test above)
    from eval.tasks.schema import save_tasks
    from eval.tasks.splits import load_tasks

    split = tmp_path / "one.jsonl"
    save_tasks(load_tasks("bundled:train")[:1], split)
    cfg = {"arms": ["O"], "seeds": [0],
           "train": {"max_steps": 1, "max_tasks": 1, "lora_r": 1,
                     "lora_target_modules": ["no_such_module"]},
           "eval": {"splits": [str(split)], "n": 1, "batch_size": 1,
                    "in_distribution": [str(split)]},
           "bootstrap": {"n_boot": 100}}
    yml = tmp_path / "bad.yaml"
    yml.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "study"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TMPDIR=str(tmp_path),
               CONTAINERS_CONF=str(REPO_ROOT / "sandbox" / "containers.conf"))
    r = subprocess.run([sys.executable, "-m", "ecredit_trl.study", "run", "--config", str(yml),
                        "--out", str(out)], cwd=REPO_ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert "evals of O-s0 skipped (training not done)" in r.stdout
    from ecredit_trl.study.config import load_study_config
    from ecredit_trl.study.status import study_units

    got = {f"{u.kind} {u.name}": (u.state, u.detail) for u in
           study_units(load_study_config(yml), out)}
    assert got["train O-s0"] == ("failed", "termination exception; exit 1")
    assert got["eval baseline/one"][0] == "done"
    assert got["eval O-s0/one"] == ("pending", "")
    assert got["compare one"][0] == "done"
    cmp = json.loads((out / "compare" / "one" / "compare.json").read_text())
    assert [s["label"] for s in cmp["seeds"]] == ["baseline"]


def test_eval_protocol_defaults_to_the_training_fields():
    """The baseline (bare policy) and trained runs are evaluated with one protocol: unset eval
    max_turns / max_new_tokens / temperature come from the training fields (or train.py's
    embedded defaults), never from eval.run's own defaults (a measured confound)."""
    c = config_from_dict({"arms": ["O"], "seeds": [0], "train": {"max_turns": 5},
                          "eval": {"splits": ["bundled:train"], "n": 2}})
    assert (c.eval["max_turns"], c.eval["max_new_tokens"], c.eval["temperature"]) == (5, 640, 1.0)
    c = config_from_dict({"arms": ["O"], "seeds": [0], "train": {"temperature": 0.7},
                          "eval": {"splits": ["bundled:train"], "n": 2, "max_turns": 2,
                                   "temperature": 0.0}})
    assert (c.eval["max_turns"], c.eval["temperature"]) == (2, 0.0)


def test_report_subcommand(tmp_path, capsys):
    """`study report --out DIR` rebuilds the report from what the folder holds (here nothing
    ran: every unit Pending); a folder without study.json is refused naming the path."""
    from ecredit_trl.study.__main__ import main
    from ecredit_trl.study.supervisor import bind_study

    out = tmp_path / "s"
    bind_study(_cfg(arms=["O", "M"]), out, allow_changed=False, command=["x"])
    assert main(["report", "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert "Pending" in (out / "report.md").read_text() and rep["files"]
    assert main(["report", "--out", str(tmp_path / "nope")]) == 2
    assert "study.json missing" in capsys.readouterr().err


# -- the training pool never overlaps an evaluation split -----------------------
def _row(tid: str) -> dict:
    return {"instance_id": tid, "repo": "local/p", "base_commit": "0" * 40,
            "problem_statement": "", "patch": "", "test_patch": "", "version": "0",
            "environment_setup_commit": "0" * 40, "FAIL_TO_PASS": ["t.py::test_a"],
            "PASS_TO_PASS": [], "image": "localhost/x:1", "eval_script": "true\n",
            "log_parser": "parse_log_pytest"}


def _rows_file(path: Path, ids) -> str:
    path.write_text("".join(json.dumps(_row(t)) + "\n" for t in ids))
    return str(path)


def test_overlapping_training_pool_is_refused_in_one_line(tmp_path, capsys):
    from ecredit_trl.study.__main__ import main

    pool = _rows_file(tmp_path / "pool.jsonl", [f"p-{i}" for i in range(10)])
    test = _rows_file(tmp_path / "test.jsonl", ["p-7", "p-3", "q-1", "p-9", "p-5"])
    clean = _rows_file(tmp_path / "clean.jsonl", ["q-1", "q-2"])
    cfg = {"arms": ["O"], "seeds": [0], "train": {"tasks": pool, "max_steps": 1},
           "eval": {"splits": [clean, test], "n": 1}}
    yml = tmp_path / "s.yaml"
    yml.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "study"
    assert main(["run", "--config", str(yml), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    assert (f"{yml}: train.tasks: 4 task id(s) also in eval split {test!r} (p-3, p-5, p-7, ...)"
            in err)
    assert "clean" not in err.split("—")[0] and not out.exists()  # nothing written
    # max_tasks: train.py trains on the first N ids only, so the check does too
    cfg["train"]["max_tasks"] = 3
    from ecredit_trl.study.pool import check_train_pool

    check_train_pool(config_from_dict(cfg, where="t.yaml"))  # p-0..p-2: no overlap
    # opting in: the split is evaluated on training tasks on purpose
    cfg["train"].pop("max_tasks")
    cfg["eval"]["in_distribution"] = [test]
    check_train_pool(config_from_dict(cfg, where="t.yaml"))
    with pytest.raises(StudyConfigError, match=r"eval.in_distribution: 'x' is not one of"):
        config_from_dict({**cfg, "eval": {**cfg["eval"], "in_distribution": ["x"]}})


def test_official_sets_are_never_a_training_pool():
    from ecredit_trl.study.pool import check_train_pool, overlap_message

    def never(source):
        raise AssertionError(f"loaded {source}")

    for src in ("official500", "official500:/x/rows.parquet", "holdout100"):
        c = config_from_dict({"arms": ["O"], "seeds": [0], "train": {"tasks": src},
                              "eval": {"splits": ["bundled:holdout"], "n": 1}}, where="t.yaml")
        with pytest.raises(StudyConfigError, match=rf"train.tasks: '{src}' is evaluation-only"):
            check_train_pool(c, load=never)
    assert overlap_message(["a", "b"], {"s": ["c"]}) is None
    assert overlap_message(["a", "b"], {"s": ["b"]}, in_distribution=["s"]) is None


def test_shipped_configs_pass_the_overlap_check():
    """The official template trains on a pool and evaluates on official500 + holdout100 with
    no opt-in; the embedded study opts in for its in-distribution bundled:train split."""
    from ecredit_trl.study.pool import check_train_pool, train_source

    ids = {"bundled:train": ["b1", "b2"], "bundled:holdout": ["h1"],
           "official500": ["o1", "o2"], "holdout100": ["h2"]}

    def load(source):
        return [type("T", (), {"instance_id": i}) for i in ids.get(source, ["g1", "g2"])]

    emb = load_study_config(REPO_ROOT / "studies" / "embedded.yaml")
    assert emb.eval["in_distribution"] == ["bundled:train"] and train_source(emb) == "bundled:train"
    check_train_pool(emb, load=load)
    off = load_study_config(REPO_ROOT / "studies" / "official500_lora.yaml")
    assert off.train["tasks"].startswith("swegym:") and off.eval["in_distribution"] == []
    assert off.eval["splits"] == ["official500", "holdout100"]
    check_train_pool(off, load=load)
    ids["official500"] = ["g2", "o9"]  # a pool that shares an id with official500: refused
    with pytest.raises(StudyConfigError, match=r"1 task id\(s\) also in eval split 'official500'"):
        check_train_pool(off, load=load)
    text = (REPO_ROOT / "studies" / "official500_lora.yaml").read_text()
    assert "sandbox.images pull" in text and "build_tasks" not in text


def test_procedural_template_trains_and_evaluates_on_disjoint_world_splits():
    """The held-out template for a GPU host: four arms x three seeds, trained on the world's
    training side, evaluated on its held-out side with no in-distribution opt-in; the
    overlap check passes for disjoint sides and refuses a shared id."""
    from ecredit_trl.study.pool import check_train_pool, train_source

    cfg = load_study_config(REPO_ROOT / "studies" / "procedural_lora.yaml")
    assert sorted(cfg.arms) == ["B", "E", "M", "O"] and cfg.seeds == [0, 1, 2]
    assert train_source(cfg) == "procedural:train"
    assert cfg.eval["splits"] == ["procedural:heldout"] and cfg.eval["in_distribution"] == []
    assert cfg.train["lora_r"] > 0 and cfg.eval_n("procedural:heldout") >= 4
    ids = {"procedural:train": ["procedural__t-1-0001"], "procedural:heldout": ["procedural__t-1-0002"]}

    def load(source):
        return [type("T", (), {"instance_id": i}) for i in ids[source]]

    check_train_pool(cfg, load=load)
    ids["procedural:heldout"].append("procedural__t-1-0001")
    with pytest.raises(StudyConfigError, match="also in eval split 'procedural:heldout'"):
        check_train_pool(cfg, load=load)


def test_status_exits_zero_without_a_failed_unit(tmp_path):
    from ecredit_trl.study.__main__ import main
    from ecredit_trl.study.supervisor import bind_study

    out = tmp_path / "s"
    bind_study(_cfg(), out, allow_changed=False, command=["x"])
    _fake_run(out / "runs" / "O-s0", "O", "completed", True)
    assert main(["status", "--out", str(out)]) == 0  # done and pending units only
    _wj(out / "units" / "train-M-s0.json", {"rc": 1})
    _fake_run(out / "runs" / "M-s0", "M", "exception", False)
    assert main(["status", "--out", str(out)]) == 1
