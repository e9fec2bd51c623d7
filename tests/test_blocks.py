"""ecredit_trl.credit.blocks on scripted local git repositories (no Podman)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO_ROOT, git

from ecredit_trl.credit.blocks import (
    DEFAULT_TEST_PATTERNS,
    EditBlock,
    SelectionRecord,
    ablate,
    edit_blocks,
    eligibility,
    is_test_path,
    select_block,
    selection_seed,
)
from sandbox.snapshots.snapshot import SnapshotError, Snapshotter

BIN_BASE = bytes(range(256)) * 3
BIN_NEW = bytes(reversed(range(256))) * 3 + b"\0\xff"


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "def f(x):\n    return x - 1\n",
        "pkg/b.py": "def g(x):\n    return x * 3\n",
        "pkg/c.py": "C = 'needed'\n",
        "tests/test_a.py": "from pkg.a import f\n\ndef test_f():\n    assert f(1) == 2\n",
        "docs/old.txt": "old docs\n",
        "run.sh": "echo hi\n",
    }
    for p, t in files.items():
        (r / p).parent.mkdir(parents=True, exist_ok=True)
        (r / p).write_text(t)
    (r / "blob.bin").write_bytes(BIN_BASE)
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "base")
    return r


def _entries(repo: Path, tree: str) -> dict[str, tuple[str, str]]:
    """path -> (mode, blob sha) of every file of ``tree``."""
    out = git(repo, "ls-tree", "-r", "--full-tree", tree)
    entries = {}
    for line in out.splitlines():
        meta, path = line.split("\t", 1)
        mode, _t, sha = meta.split()
        entries[path] = (mode, sha)
    return entries


def _blob(repo: Path, tree: str, path: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), "cat-file", "blob", f"{tree}:{path}"],
                          check=True, capture_output=True).stdout


def _expected_restore(repo, final, source, paths):
    exp = _entries(repo, final)
    src = _entries(repo, source)
    for p in paths:
        exp.pop(p, None)
        if p in src:
            exp[p] = src[p]
    return exp


def _script(repo: Path, turns) -> list[str]:
    """Run each turn function on the working tree, snapshot after each (the fixture's own
    ``.git`` is the store, so ``repo`` holds the trees after the snapshotter closes)."""
    with Snapshotter(repo, store=repo / ".git") as snap:
        snaps = [snap.base_tree]
        for fn in turns:
            fn(repo)
            snaps.append(snap.snapshot())
    return snaps


def _write(path, text):
    def fn(r):
        (r / path).parent.mkdir(parents=True, exist_ok=True)
        (r / path).write_text(text)
    return fn


def _many(*fns):
    def fn(r):
        for f in fns:
            f(r)
    return fn


def _delete(path):
    return lambda r: (r / path).unlink()


def _noop(r):
    pass


# ----------------------------------------------------------------------------


@pytest.fixture
def mixed(repo):
    """Seven turns covering every kind of block."""
    turns = [
        _write("pkg/a.py", "def f(x):\n    return x + 1\n"),                   # 1 gold part 1
        _write("tests/test_a.py", "# more tests\n"),                            # 2 test-only
        _write("pkg/b.py", "def g(x):\n    raise NotImplementedError\n"),      # 3 overwritten by 5
        _many(_delete("docs/old.txt"), _write("pkg/new.py", "NEW = 1\n")),      # 4 delete + create
        _write("pkg/b.py", "def g(x):\n    return x * 2\n"),                   # 5 gold part 2
        _many(lambda r: os.chmod(r / "run.sh", 0o755),                          # 6 mode + binary
              lambda r: (r / "blob.bin").write_bytes(BIN_NEW)),
        _noop,                                                                  # 7 no change
    ]
    return repo, _script(repo, turns)


def test_blocks_statuses_and_eligibility(mixed):
    repo, snaps = mixed
    blocks = edit_blocks(repo, snaps)
    assert [b.turn for b in blocks] == [1, 2, 3, 4, 5, 6]  # turn 7 changed nothing
    by = {b.turn: b for b in blocks}
    assert by[4].paths == ("docs/old.txt", "pkg/new.py")
    assert by[4].statuses == ("D", "A")
    assert by[6].paths == ("blob.bin", "run.sh")
    assert by[6].statuses == ("M", "X")
    assert by[6].new_modes == ("100644", "100755")

    judged = {e.turn: e for e in eligibility(repo, snaps, blocks)}
    assert {t: e.reasons for t, e in judged.items()} == {
        1: (), 2: ("test_only",), 3: ("not_last_touch",), 4: (), 5: (), 6: ()}
    assert judged[3].later_touches == (5,)
    assert judged[3].reason == "not_last_touch" and judged[1].reason is None
    assert all(e.ablated_tree for e in judged.values())


@pytest.mark.parametrize("turn", [1, 2, 3, 4, 5, 6])
def test_restored_tree_byte_for_byte(mixed, turn):
    repo, snaps = mixed
    block = next(b for b in edit_blocks(repo, snaps) if b.turn == turn)
    abl = ablate(repo, snaps, block)
    got = _entries(repo, abl.ablated_tree)
    assert got == _expected_restore(repo, snaps[-1], snaps[turn - 1], block.paths)
    # every path of the block is exactly its S_{k-1} bytes (or absent)
    prev = _entries(repo, snaps[turn - 1])
    for p in block.paths:
        if p in prev:
            assert _blob(repo, abl.ablated_tree, p) == _blob(repo, snaps[turn - 1], p)
        else:
            assert p not in got
    # and every other path is the final bytes
    final = _entries(repo, snaps[-1])
    for p in set(final) - set(block.paths):
        assert got[p] == final[p]


def test_restore_delete_create_mode_binary(mixed):
    repo, snaps = mixed
    blocks = {b.turn: b for b in edit_blocks(repo, snaps)}
    a4 = ablate(repo, snaps, blocks[4])
    e4 = _entries(repo, a4.ablated_tree)
    assert "pkg/new.py" not in e4                      # created file removed
    assert _blob(repo, a4.ablated_tree, "docs/old.txt") == b"old docs\n"  # deleted file back
    a6 = ablate(repo, snaps, blocks[6])
    e6 = _entries(repo, a6.ablated_tree)
    assert e6["run.sh"][0] == "100644"                 # mode restored
    assert _blob(repo, a6.ablated_tree, "blob.bin") == BIN_BASE  # binary restored
    assert "GIT binary patch" in ablate(repo, snaps, blocks[1]).artifact  # binary-safe diff


def test_ablation_record_fields(mixed):
    repo, snaps = mixed
    blocks = {b.turn: b for b in edit_blocks(repo, snaps)}
    abl = ablate(repo, snaps, blocks[5])
    # final diff: pkg/a.py, tests/test_a.py, docs/old.txt, pkg/new.py, pkg/b.py, blob.bin, run.sh
    assert len(abl.final_changed) == 7
    assert abl.touched_fraction == pytest.approx(1 / 7)
    assert abl.off_final_diff is False
    assert abl.artifact_empty is False
    assert abl.selected_turn == 5 and abl.paths == ("pkg/b.py",)
    # b.py goes back to S_4, i.e. turn 3's draft (not the base)
    assert b"NotImplementedError" in _blob(repo, abl.ablated_tree, "pkg/b.py")
    assert "+    raise NotImplementedError" in abl.artifact
    assert abl.to_json()["artifact_bytes"] == len(abl.artifact.encode())
    assert "artifact" not in abl.to_json()


def test_block_that_repaired_earlier_damage(repo):
    snaps = _script(repo, [
        _delete("pkg/c.py"),                               # 1 damage
        _write("pkg/a.py", "def f(x):\n    return x + 1\n"),  # 2 fix
        _write("pkg/c.py", "C = 'needed'\n"),              # 3 repair (back to base bytes)
    ])
    judged = {e.turn: e for e in eligibility(repo, snaps)}
    assert judged[1].reasons == ("not_last_touch",)
    assert judged[3].eligible
    block3 = next(b for b in edit_blocks(repo, snaps) if b.turn == 3)
    abl = ablate(repo, snaps, block3)
    assert abl.off_final_diff is True
    assert abl.touched_fraction == 0.0
    assert abl.final_changed == ("pkg/a.py",)
    assert "pkg/c.py" not in _entries(repo, abl.ablated_tree)  # ablation re-does the damage
    assert "deleted file mode" in abl.artifact


def test_ablated_artifact_may_be_empty(repo):
    snaps = _script(repo, [_write("pkg/a.py", "X = 1\n")])
    block = edit_blocks(repo, snaps)[0]
    abl = ablate(repo, snaps, block)
    assert abl.artifact == "" and abl.artifact_empty
    assert abl.ablated_tree == snaps[0]
    assert abl.touched_fraction == 1.0


def test_not_restorable_file_directory_clash(repo):
    # turn 1 deletes file pkg/c.py, turn 2 creates directory pkg/c.py/ holding a file:
    # restoring block 1 (file pkg/c.py) on the final tree would clash with that directory.
    def mkdir_clash(r):
        (r / "pkg" / "c.py").mkdir()
        (r / "pkg" / "c.py" / "x.txt").write_text("x\n")
    snaps = _script(repo, [_delete("pkg/c.py"), mkdir_clash])
    judged = {e.turn: e for e in eligibility(repo, snaps)}
    assert judged[1].reasons == ("not_restorable",)
    assert judged[1].ablated_tree is None and "not restorable" in judged[1].restore_error
    assert judged[2].eligible
    with pytest.raises(SnapshotError):
        ablate(repo, snaps, next(b for b in edit_blocks(repo, snaps) if b.turn == 1))


def test_several_reasons_are_all_kept(repo):
    snaps = _script(repo, [_write("tests/test_a.py", "# 1\n"), _write("tests/test_a.py", "# 2\n")])
    judged = eligibility(repo, snaps)
    assert [e.reasons for e in judged] == [("not_last_touch", "test_only"), ("test_only",)]


def test_last_touch_judged_per_turn(repo):
    # changed and changed back within later turns counts as touches (S_{j-1} -> S_j per turn)
    snaps = _script(repo, [
        _write("pkg/a.py", "A\n"),
        _write("pkg/b.py", "B\n"),
        _write("pkg/a.py", "A2\n"),
        _write("pkg/a.py", "A\n"),
    ])
    judged = {e.turn: e for e in eligibility(repo, snaps)}
    assert judged[1].later_touches == (3, 4)
    assert judged[3].later_touches == (4,)
    assert judged[2].eligible and judged[4].eligible


@pytest.mark.parametrize("path,expected", [
    ("tests/test_a.py", True),
    ("tests/helpers.py", True),
    ("pkg/tests/data/x.json", True),
    ("src/testing/util.py", True),
    ("test_x.py", True),
    ("pkg/sub/test_x.py", True),
    ("pkg/x_test.py", True),
    ("conftest.py", True),
    ("pkg/conftest.py", True),
    ("pkg/tests.py", False),        # a module called tests.py is not a tests/ directory
    ("tests", False),               # a file called tests
    ("pkg/test_x.txt", False),
    ("pkg/contest.py", False),
    ("pkg/latest_news.py", False),
    ("pkg/mytests/a.py", False),
])
def test_default_test_patterns(path, expected):
    assert is_test_path(path) is expected


def test_custom_test_patterns(repo):
    assert is_test_path("spec/a_spec.rb", ["*_spec.rb"])
    assert is_test_path("src/pkg/fixtures/a.json", ["src/*/fixtures/"])
    assert not is_test_path("other/pkg/fixtures/a.json", ["src/*/fixtures/"])
    assert is_test_path("docs/a.txt", ["docs/*.txt"])
    assert not is_test_path("docs/sub/a.txt", ["docs/*.txt"])
    with pytest.raises(ValueError):
        is_test_path("a.py", [""])
    snaps = _script(repo, [_write("docs/old.txt", "new docs\n")])
    assert eligibility(repo, snaps, test_patterns=["docs/"])[0].reasons == ("test_only",)
    assert eligibility(repo, snaps)[0].eligible
    assert DEFAULT_TEST_PATTERNS == ("tests/", "testing/", "test_*.py", "*_test.py",
                                     "conftest.py")


# -- selection -------------------------------------------------------------


def test_select_block_signature_takes_no_verifier_result():
    params = inspect.signature(select_block).parameters
    assert list(params) == ["eligible_turns", "run_seed", "task_id", "rollout_index"]
    assert all(p.kind != p.VAR_KEYWORD and p.kind != p.VAR_POSITIONAL for p in params.values())
    with pytest.raises(TypeError):
        select_block([1, 2], run_seed=0, task_id="t", rollout_index=0, contrast=1.0)


def test_select_block_deterministic_and_order_free():
    kw = dict(run_seed=7, task_id="toolz-3", rollout_index=2)
    first = select_block([1, 4, 6], **kw)
    assert first in (1, 4, 6)
    assert all(select_block([6, 1, 4, 4], **kw) == first for _ in range(5))
    assert select_block([], **kw) is None
    assert select_block([3], **kw) == 3
    with pytest.raises(ValueError):
        select_block([0], **kw)
    with pytest.raises(ValueError):
        select_block([True], **kw)


def test_selection_seed_is_stable_across_processes():
    import hashlib
    import json
    want = int.from_bytes(hashlib.sha256(json.dumps([1, "a", 2], separators=(",", ":"))
                                         .encode()).digest()[:8], "big")
    assert selection_seed(1, "a", 2) == want
    code = ("from ecredit_trl.credit.blocks import select_block as s;"
            "print([s(range(1,9), run_seed=3, task_id='x', rollout_index=i) for i in range(20)])")
    outs = set()
    for hs in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=hs)
        outs.add(subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                                capture_output=True, text=True, check=True).stdout)
    assert len(outs) == 1


def test_selection_varies_with_each_key():
    base = [select_block(range(1, 11), run_seed=0, task_id="t", rollout_index=i)
            for i in range(50)]
    assert len(set(base)) > 5
    other_seed = [select_block(range(1, 11), run_seed=1, task_id="t", rollout_index=i)
                  for i in range(50)]
    other_task = [select_block(range(1, 11), run_seed=0, task_id="u", rollout_index=i)
                  for i in range(50)]
    assert base != other_seed and base != other_task


def test_selection_is_uniform_ish():
    n, turns = 6000, [2, 3, 5, 8]
    counts = Counter(select_block(turns, run_seed=s, task_id="task", rollout_index=s % 7)
                     for s in range(n))
    assert set(counts) == set(turns)
    exp = n / len(turns)
    chi2 = sum((counts[t] - exp) ** 2 / exp for t in turns)
    assert chi2 < 16.27  # p = 0.001 for 3 degrees of freedom


def test_selection_record_is_built_without_trials(mixed):
    repo, snaps = mixed
    blocks = edit_blocks(repo, snaps)
    judged = eligibility(repo, snaps, blocks)
    rec = SelectionRecord.build(task_id="t", rollout_index=0, run_seed=0, blocks=blocks,
                                judged=judged)
    assert rec.eligible_turns == [1, 4, 5, 6]
    assert rec.selected_turn in rec.eligible_turns
    assert rec.selected_paths == list(next(b for b in blocks if b.turn == rec.selected_turn).paths)
    assert rec.seed == selection_seed(0, "t", 0)
    d = rec.to_json()
    assert d["eligibility"][1]["reasons"] == ["test_only"]
    with pytest.raises(ValueError):
        SelectionRecord.build(task_id="t", rollout_index=0, run_seed=0, blocks=blocks[:2],
                              judged=judged)


def test_bad_inputs(repo):
    snaps = _script(repo, [_write("pkg/a.py", "X\n")])
    with pytest.raises(ValueError):
        edit_blocks(repo, [])
    with pytest.raises(ValueError):
        ablate(repo, snaps, EditBlock(turn=2, paths=("pkg/a.py",), statuses=("M",)))
    with pytest.raises(SnapshotError):
        edit_blocks(repo, [snaps[0], "0" * 40])
