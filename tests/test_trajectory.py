"""ecredit_trl.credit.trajectory: strict loader and replay into snapshot trees."""

from __future__ import annotations

import base64
import json
import subprocess

import pytest
from conftest import git

from ecredit_trl.credit.blocks import edit_blocks
from ecredit_trl.credit.trajectory import (
    FileWrite,
    ReplayError,
    Trajectory,
    TrajectoryFormatError,
    Turn,
    dump_trajectories,
    generated_token_turns,
    load_trajectories,
    parse_trajectory,
    replay,
)

BIN = bytes(range(256)) + b"\0\0"


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / "pkg").mkdir()
    (r / "pkg" / "a.py").write_text("A = 1\n")
    (r / "pkg" / "gone.py").write_text("G = 1\n")
    (r / "run.sh").write_text("echo hi\n")
    (r / ".gitignore").write_text("*.log\n")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "base")
    (r / "pkg" / "a.py").write_text("dirty working tree of the task repo\n")  # never read
    return r


def _rec(**kw):
    d = {"task_id": "t", "rollout_index": 0, "format_error": False,
         "turns": [{"generated_tokens": 3, "writes": {"a.py": "x"}}]}
    d.update(kw)
    return d


def _write_lines(path, objs):
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))


def _blob(repo, tree, path):
    return subprocess.run(["git", "-C", str(repo), "cat-file", "blob", f"{tree}:{path}"],
                          check=True, capture_output=True).stdout


def test_load_roundtrip_and_extras(tmp_path):
    recs = [
        _rec(model="m1", turns=[
            {"generated_tokens": 5, "writes": {"a.py": "x", "b.bin": {"base64": base64.b64encode(BIN).decode()},
                                               "c.py": None}, "note": "kept"},
            {"generated_tokens": 0, "writes": {}},
        ]),
        _rec(rollout_index=1, format_error=True, turns=[]),
    ]
    f = tmp_path / "t.jsonl"
    _write_lines(f, [recs[0], "", recs[1]])
    trajs = load_trajectories(f)
    t = trajs[0]
    assert t.extra == {"model": "m1"} and t.turns[0].extra == {"note": "kept"}
    assert t.turns[0].writes["b.bin"].data == BIN
    assert t.turns[0].writes["c.py"].data is None
    assert t.K == 2 and t.L == 5 and t.m(1) == 5 and t.m(2) == 0 and t.m(None) == 0
    assert trajs[1].format_error and trajs[1].K == 0
    out = tmp_path / "out.jsonl"
    dump_trajectories(trajs, out)
    assert load_trajectories(out) == trajs
    assert generated_token_turns(t).tolist() == [1] * 5
    assert generated_token_turns(trajs[1]).tolist() == []


@pytest.mark.parametrize("bad,field", [
    ({"rollout_index": 0, "format_error": False, "turns": []}, "task_id"),
    (_rec(task_id=""), "task_id"),
    (_rec(rollout_index=-1), "rollout_index"),
    (_rec(rollout_index=True), "rollout_index"),
    (_rec(format_error="no"), "format_error"),
    (_rec(turns={}), "turns"),
    (_rec(turns=[{"writes": {}}]), "turns[0].generated_tokens"),
    (_rec(turns=[{"generated_tokens": 1.5, "writes": {}}]), "turns[0].generated_tokens"),
    (_rec(turns=[{"generated_tokens": 1, "writes": []}]), "turns[0].writes"),
    (_rec(turns=[{"generated_tokens": 1, "writes": {"/etc/passwd": "x"}}]), "/etc/passwd"),
    (_rec(turns=[{"generated_tokens": 1, "writes": {"../x": "x"}}]), "../x"),
    (_rec(turns=[{"generated_tokens": 1, "writes": {"a//b": "x"}}]), "a//b"),
    (_rec(turns=[{"generated_tokens": 1, "writes": {".git/config": "x"}}]), ".git/config"),
    (_rec(turns=[{"generated_tokens": 1, "writes": {"a": 3}}]), "writes['a']"),
    (_rec(turns=[{"generated_tokens": 1, "writes": {"a": {"base64": "!!"}}}]), "base64"),
    (_rec(turns=[{"generated_tokens": 1, "writes": {"a": {"b64": "AA=="}}}]), "writes['a']"),
    (_rec(turns=[{"generated_tokens": 1, "writes": {"a": {"text": "x", "executable": 1}}}]),
     "executable"),
    (_rec(turns=[{"generated_tokens": 1, "writes": {"a": "x", "a/b": "y"}}]), "writes"),
])
def test_strict_loader_names_line_and_field(tmp_path, bad, field):
    f = tmp_path / "t.jsonl"
    _write_lines(f, [_rec(rollout_index=5), bad])
    with pytest.raises(TrajectoryFormatError) as ei:
        load_trajectories(f)
    msg = str(ei.value)
    assert f"{f}:2:" in msg and field in msg


def test_loader_rejects_bad_json_and_duplicates(tmp_path):
    f = tmp_path / "t.jsonl"
    _write_lines(f, [_rec(), "{not json"])
    with pytest.raises(TrajectoryFormatError, match=":2: invalid JSON"):
        load_trajectories(f)
    _write_lines(f, [_rec(), _rec()])
    with pytest.raises(TrajectoryFormatError, match=r":2: .*duplicate rollout.*line 1"):
        load_trajectories(f)
    with pytest.raises(TrajectoryFormatError, match="expected a JSON object"):
        parse_trajectory([1, 2])


def test_replay_snapshots_every_turn(repo, tmp_path):
    base = git(repo, "rev-parse", "HEAD")
    traj = Trajectory("t", 0, False, (
        Turn(4, {"pkg/a.py": FileWrite(b"A = 2\n"), "new/deep/file.txt": FileWrite(b"n\n")}),
        Turn(2, {}),
        Turn(3, {"pkg/gone.py": FileWrite(None), "img.bin": FileWrite(BIN),
                 "run.sh": FileWrite(b"echo hi\n", executable=True), "x.log": FileWrite(b"i\n"),
                 "missing.txt": FileWrite(None)}),
        Turn(1, {"new/deep/file.txt": FileWrite(None), "new": FileWrite(b"now a file\n")}),
    ))
    work = tmp_path / "work"
    snaps = replay(traj, repo, base, work)
    assert len(snaps) == 5
    assert snaps[0] == git(repo, "rev-parse", "HEAD^{tree}")
    assert snaps[1] != snaps[0] and snaps[2] == snaps[1]
    assert _blob(work, snaps[1], "pkg/a.py") == b"A = 2\n"
    assert _blob(work, snaps[3], "img.bin") == BIN
    blocks = {b.turn: b for b in edit_blocks(work, snaps)}
    assert set(blocks) == {1, 3, 4}
    b3 = dict(zip(blocks[3].paths, blocks[3].statuses, strict=True))
    assert b3 == {"pkg/gone.py": "D", "img.bin": "A", "run.sh": "X"}  # x.log is ignored
    b4 = dict(zip(blocks[4].paths, blocks[4].statuses, strict=True))
    assert b4 == {"new/deep/file.txt": "D", "new": "A"}
    # the task repo itself is untouched (still dirty as we left it, same HEAD)
    assert (repo / "pkg" / "a.py").read_text().startswith("dirty")
    assert git(repo, "rev-parse", "HEAD") == base


def test_replay_errors(repo, tmp_path):
    base = git(repo, "rev-parse", "HEAD")
    work = tmp_path / "w1"
    traj = Trajectory("t", 0, False, (Turn(1, {"pkg/a.py/x": FileWrite(b"x")}),))
    with pytest.raises(ReplayError, match="turn 1: path 'pkg/a.py/x'"):
        replay(traj, repo, base, work)
    traj = Trajectory("t", 0, False, (Turn(1, {"pkg": FileWrite(b"x")}),))
    with pytest.raises(ReplayError, match="is a directory"):
        replay(traj, repo, base, tmp_path / "w2")
    with pytest.raises(ReplayError, match="not empty"):
        replay(traj, repo, base, work)
    with pytest.raises(ReplayError, match="checkout"):
        replay(Trajectory("t", 0, False, ()), repo, "f" * 40, tmp_path / "w3")


def test_turn_writes_then_replay_keeps_symlinks_and_modes(repo, tmp_path):
    """A rollout's trees → turn_writes → JSON → replay gives the same trees
    (a symlink stays mode 120000, executable bits stay what they are)."""
    import os

    from ecredit_trl.credit.trajectory import turn_writes
    from sandbox.snapshots.snapshot import Snapshotter

    base = git(repo, "rev-parse", "HEAD")
    agent = tmp_path / "agent"
    git(tmp_path, "clone", "-q", str(repo), str(agent))
    with Snapshotter(agent, base=base, objects_from=repo) as snap:
        trees = [snap.base_tree]
        os.symlink("pkg/a.py", agent / "link")  # new symlink
        os.chmod(agent / "run.sh", 0o755)  # mode only
        (agent / "tool.sh").write_text("#!/bin/sh\n")
        os.chmod(agent / "tool.sh", 0o755)  # new executable
        trees.append(snap.snapshot())
        (agent / "link").unlink()
        os.symlink("run.sh", agent / "link")  # retargeted symlink
        (agent / "pkg" / "a.py").unlink()
        os.symlink("../run.sh", agent / "pkg" / "a.py")  # file -> symlink
        os.chmod(agent / "run.sh", 0o644)  # exec bit removed
        trees.append(snap.snapshot())
        (agent / "link").unlink()
        (agent / "link").write_text("now a file\n")  # symlink -> file
        trees.append(snap.snapshot())
        writes = turn_writes(snap.git_dir, trees)
    assert writes[0]["link"] == {"symlink": "pkg/a.py"}
    assert writes[0]["run.sh"] == {"text": "echo hi\n", "executable": True}
    assert writes[1]["pkg/a.py"] == {"symlink": "../run.sh"}
    assert writes[2]["link"] == "now a file\n"
    rec = {"task_id": "t", "rollout_index": 0, "format_error": False,
           "turns": [{"generated_tokens": 1, "writes": w} for w in writes]}
    traj = parse_trajectory(json.loads(json.dumps(rec)))
    assert traj.turns[0].writes["link"] == FileWrite(b"pkg/a.py", symlink=True)
    assert replay(traj, repo, base, tmp_path / "replayed") == trees
    with pytest.raises(TrajectoryFormatError, match="symlink"):
        parse_trajectory(_rec(turns=[{"generated_tokens": 1,
                                      "writes": {"l": {"symlink": "x", "executable": True}}}]))
