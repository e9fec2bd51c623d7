"""sandbox.snapshots.snapshot on real git repositories."""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import git

from sandbox.snapshots.snapshot import (
    EMPTY_TREE,
    SnapshotError,
    Snapshotter,
    artifact,
    changed_paths,
    restore_paths,
)


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / "pkg").mkdir()
    (r / "pkg" / "a.py").write_text("A = 1\n")
    (r / "pkg" / "b.py").write_text("B = 2\n")
    (r / "run.sh").write_text("echo hi\n")
    (r / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (r / ".gitignore").write_text("*.log\nbuild/\n")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "base")
    return r


def sgit(snap, *args: str) -> str:
    """git on the snapshotter's private store (where every snapshot tree lives)."""
    return git(snap.git_dir.parent, f"--git-dir={snap.git_dir}", *args)


def _state(r):
    """The agent-visible git state that snapshots must never change."""
    return (git(r, "rev-parse", "HEAD"), git(r, "symbolic-ref", "-q", "HEAD"),
            git(r, "status", "--porcelain", "--untracked-files=all"),
            git(r, "stash", "list"), git(r, "branch", "--list"))


def test_snapshot_records_tree_without_touching_agent_state(repo):
    with Snapshotter(repo) as snap:
        s0 = snap.snapshot()
        assert s0 == snap.base_tree == git(repo, "rev-parse", "HEAD^{tree}")
        (repo / "pkg" / "a.py").write_text("A = 10\n")
        (repo / "new.txt").write_text("untracked\n")
        (repo / "x.log").write_text("ignored\n")
        (repo / "pkg" / "b.py").unlink()
        before = _state(repo)
        s1 = snap.snapshot()
        assert _state(repo) == before
        assert sgit(snap, "show", f"{s1}:pkg/a.py") == "A = 10"
        assert sgit(snap, "show", f"{s1}:new.txt") == "untracked"
        names = sgit(snap, "ls-tree", "-r", "--name-only", s1).split()
        assert "x.log" not in names and "pkg/b.py" not in names
    assert not snap.git_dir.exists()  # the private store goes with close()


def test_changed_paths_kinds(repo):
    with Snapshotter(repo) as snap:
        s0 = snap.snapshot()
        (repo / "pkg" / "a.py").write_text("A = 3\n")  # modified
        (repo / "pkg" / "b.py").unlink()  # deleted
        (repo / "c.py").write_text("C = 1\n")  # created
        os.chmod(repo / "run.sh", 0o755)  # mode only
        data = bytearray((repo / "blob.bin").read_bytes())
        data[10] ^= 0xFF
        (repo / "blob.bin").write_bytes(bytes(data))  # binary
        os.symlink("pkg/a.py", repo / "link")  # symlink created
        s1 = snap.snapshot()
        got = {c.path: (c.status, c.old_mode, c.new_mode)
               for c in changed_paths(snap.git_dir, s0, s1)}
    assert got == {
        "blob.bin": ("M", "100644", "100644"),
        "c.py": ("A", "000000", "100644"),
        "link": ("A", "000000", "120000"),
        "pkg/a.py": ("M", "100644", "100644"),
        "pkg/b.py": ("D", "100644", "000000"),
        "run.sh": ("X", "100644", "100755"),
    }


def test_restore_paths_blob_mode_and_deletion(repo):
    with Snapshotter(repo) as snap:
        s0 = snap.snapshot()
        (repo / "pkg" / "a.py").write_text("A = 3\n")
        os.chmod(repo / "run.sh", 0o755)
        s1 = snap.snapshot()
        (repo / "c.py").write_text("C\n")
        (repo / "pkg" / "b.py").unlink()
        s2 = snap.snapshot()
        st = snap.git_dir
        # undo turn 2 (c.py created, b.py deleted) on the final tree
        t = restore_paths(st, s2, s1, ["c.py", "pkg/b.py"])
        assert t == s1
        # undo turn 1 on the final tree: a.py and run.sh come back, turn 2 stays
        t = restore_paths(st, s2, s0, ["pkg/a.py", "run.sh"])
        assert sgit(snap, "show", f"{t}:pkg/a.py") == "A = 1"
        assert sgit(snap, "ls-tree", t, "run.sh").split()[0] == "100644"
        assert sgit(snap, "show", f"{t}:c.py") == "C"
        assert "pkg/b.py" not in sgit(snap, "ls-tree", "-r", "--name-only", t).split()


def test_restore_to_empty_tree_and_not_restorable(repo):
    with Snapshotter(repo) as snap:
        s0 = snap.snapshot()
        for p in list(repo.iterdir()):
            if p.name != ".git":
                subprocess.run(["rm", "-rf", str(p)], check=True)
        s1 = snap.snapshot()
        assert s1 == EMPTY_TREE
        (repo / "pkg").write_text("now a file\n")  # file where a dir was
        s2 = snap.snapshot()
        st = snap.git_dir
        everything = [c.path for c in changed_paths(st, s0, s1)]
        assert restore_paths(st, s1, s0, everything) == s0
        # restoring pkg/a.py while the final tree has a *file* named pkg fails
        with pytest.raises(SnapshotError):
            restore_paths(st, s2, s0, ["pkg/a.py"])


def test_artifact_applies_on_clean_base_binary_included(repo, tmp_path):
    with Snapshotter(repo) as snap:
        s0 = snap.snapshot()
        assert artifact(snap.git_dir, s0, s0) == ""
        (repo / "pkg" / "a.py").write_text("A = 42\n")
        (repo / "blob.bin").write_bytes(bytes(range(255, -1, -1)) * 3)
        (repo / "new" / "deep").mkdir(parents=True)
        (repo / "new" / "deep" / "f.txt").write_text("hello\n")
        os.chmod(repo / "run.sh", 0o755)
        s1 = snap.snapshot()
        patch = artifact(snap.git_dir, s0, s1)
    assert "GIT binary patch" in patch
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    (tmp_path / "p.diff").write_text(patch)
    git(clone, "apply", str(tmp_path / "p.diff"))
    git(clone, "add", "-A")
    assert git(clone, "write-tree") == s1


def test_agent_git_commands_do_not_break_snapshots(repo):
    with Snapshotter(repo) as snap:
        s0 = snap.snapshot()
        (repo / "pkg" / "a.py").write_text("A = 5\n")
        git(repo, "checkout", "-q", "-b", "agent-branch")
        git(repo, "commit", "-qam", "agent commit")
        s1 = snap.snapshot()
        assert sgit(snap, "show", f"{s1}:pkg/a.py") == "A = 5"
        (repo / "pkg" / "b.py").write_text("B = 7\n")
        git(repo, "stash", "-q")  # the working tree goes back to the agent's commit
        s2 = snap.snapshot()
        assert sgit(snap, "show", f"{s2}:pkg/b.py") == "B = 2"
        git(repo, "stash", "pop", "-q")
        (repo / ".git" / "index").unlink()
        (repo / "untracked.py").write_text("u\n")
        s3 = snap.snapshot()
        assert sgit(snap, "show", f"{s3}:pkg/b.py") == "B = 7"
        assert sgit(snap, "show", f"{s3}:untracked.py") == "u"
        assert [c.path for c in changed_paths(snap.git_dir, s0, s3)] == [
            "pkg/a.py", "pkg/b.py", "untracked.py"]
    assert git(repo, "stash", "list") == ""


def test_first_snapshot_seeds_from_repo_index(repo, monkeypatch):
    """A fresh checkout's index already describes the base: it is reused (no re-hash)."""
    with Snapshotter(repo) as snap:
        own = (repo / ".git" / "index").read_bytes()
        assert snap.index_file.read_bytes() == own


def test_errors_name_the_repo(tmp_path):
    with pytest.raises(SnapshotError, match="not a git working tree"):
        Snapshotter(tmp_path)
    with pytest.raises(SnapshotError, match="neither a git directory"):
        changed_paths(tmp_path, EMPTY_TREE, EMPTY_TREE)


def _reference_tree(tree, tmp_path) -> str:
    """The tree plain git records for ``tree``'s files (a fresh repository, a fresh index,
    ``add -A`` with the base's ``.gitignore``): an oracle independent of the snapshotter."""
    import shutil

    ref = tmp_path / "oracle"
    shutil.rmtree(ref, ignore_errors=True)
    shutil.copytree(tree, ref, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    git(ref, "init", "-q")
    git(ref, "add", "-A")
    return git(ref, "write-tree")


def test_snapshots_match_plain_git_turn_after_turn(repo, tmp_path):
    """Edits, deletions, new files in new directories and a file replaced by a directory of
    its name, over enough turns that the private index is rewritten several times: every
    snapshot is the tree plain git records for the same files."""
    import random

    rng = random.Random(7)
    for i in range(40):
        (repo / "pkg" / f"m{i}.py").write_text(f"M = {i}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "more")
    with Snapshotter(repo) as snap:
        for turn in range(12):
            files = sorted(p for p in (repo / "pkg").rglob("*.py") if p.is_file())
            for f in rng.sample(files, min(6, len(files))):
                f.write_text(f.read_text() + f"# turn {turn}\n")
            if files:
                files[rng.randrange(len(files))].unlink()
            (repo / f"new{turn}" / "deep").mkdir(parents=True)
            (repo / f"new{turn}" / "deep" / "n.py").write_text(f"N = {turn}\n")
            (repo / f"skip{turn}.log").write_text("ignored\n")
            if turn == 5:
                (repo / "run.sh").unlink()
                (repo / "run.sh").mkdir()
                (repo / "run.sh" / "inner.txt").write_text("a directory now\n")
            assert snap.snapshot() == _reference_tree(repo, tmp_path), f"turn {turn}"


def test_a_callers_store_keeps_an_index_that_stands_alone(repo, tmp_path):
    """A snapshotter working in a caller's store (whose index file is copied elsewhere,
    sandbox.workspace.imagetree) leaves an index that another git directory can read."""
    store = tmp_path / "store.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(store))
    (repo / "pkg" / "a.py").write_text("A = 3\n")
    with Snapshotter(repo, store=store) as snap:
        snap.snapshot()
        copy = tmp_path / "copied.index"
        copy.write_bytes(snap.index_file.read_bytes())
    elsewhere = tmp_path / "elsewhere.git"
    git(tmp_path, "init", "-q", "--bare", str(elsewhere))
    listed = subprocess.run(["git", f"--git-dir={elsewhere}", "ls-files"], capture_output=True,
                            text=True, env=dict(os.environ, GIT_INDEX_FILE=str(copy)))
    assert listed.returncode == 0, listed.stderr
    assert "pkg/a.py" in listed.stdout.split()
