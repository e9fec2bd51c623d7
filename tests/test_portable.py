"""Recorded command lines keep their argv, with machine paths made relative or marked."""

import json
import shlex
from pathlib import Path

from ecredit_trl.runs.portable import portable_argv
from ecredit_trl.study.config import config_from_dict
from ecredit_trl.study.runner import bind_study

COMMITTED_STUDY = Path(__file__).resolve().parent.parent / "studies" / "results" / "embedded"


def test_paths_under_the_record_dir_cwd_and_home_are_relative_or_marked():
    home = str(Path.home())
    argv = ["/repo/.venv/bin/python", "-m", "ecredit_trl.study", "run", "--config",
            "studies/x.yaml", "--out", "/data/studies/x/", "--resume-from=/data/studies/x/runs/M",
            f"{home}/models/tiny", "/opt/cache/model", "--allow-changed", "rel/path"]
    assert portable_argv(argv, "/data/studies/x", cwd="/repo") == [
        ".venv/bin/python", "-m", "ecredit_trl.study", "run", "--config", "studies/x.yaml",
        "--out", "<study>", "--resume-from=<study>/runs/M", "<home>/models/tiny",
        "<abs>/model", "--allow-changed", "rel/path"]
    # a relative base is taken from the command's directory
    assert portable_argv(["/repo/out/r/ck"], "out/r", label="run", cwd="/repo") == ["<run>/ck"]


def test_bind_study_records_no_machine_paths(tmp_path):
    out = tmp_path / "study"
    cfg = config_from_dict({"name": "t", "arms": ["O", "M"], "seeds": [0],
                            "eval": {"splits": ["bundled:train"], "n": 1}}, where="t")
    cmd = [str(tmp_path / "venv" / "bin" / "python"), "-m", "ecredit_trl.study", "run",
           "--out", str(out)]
    rec = bind_study(cfg, out, allow_changed=False, command=cmd)
    written = json.loads((out / "study.json").read_text())["command"]
    assert rec["command"] == written
    assert written[-2:] == ["--out", "<study>"]
    assert not any(a.startswith("/") for a in written), written


def test_the_committed_study_records_no_machine_paths():
    rec = json.loads((COMMITTED_STUDY / "study.json").read_text())
    cmds = [rec["command"]] + [h["command"] for h in rec.get("history", []) if "command" in h]
    assert all(not a.startswith("/") for c in cmds for a in c), cmds
    report = (COMMITTED_STUDY / "report.md").read_text()
    assert f"- command: `{shlex.join(rec['command'])}`" in report
