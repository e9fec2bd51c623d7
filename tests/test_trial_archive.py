"""The one archive a verifier trial copies in: the repository under its workdir, then the
control files (sandbox.trials.archive); the live trials of tests/test_sandbox_podman.py run
through it."""

from __future__ import annotations

import io
import subprocess
import tarfile

import pytest

from sandbox.trials.archive import combined


def _tar(entries: dict[str, bytes | None], links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.LNKTYPE, target
            tar.addfile(info)
    return buf.getvalue()


def _members(blob: bytes) -> dict[str, tuple[str, bytes | None]]:
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        return {m.name: (m.linkname, tar.extractfile(m).read() if m.isreg() else None)
                for m in tar}


def test_repo_under_workdir_then_control_files():
    repo = _tar({"./": None, "pkg": None, "pkg/a.py": b"A\n", "./b.txt": b"B"},
                links={"pkg/c.py": "pkg/a.py"})
    control = _tar({"ecredit": None, "ecredit/trial.sh": b"#!/bin/bash\n"})
    got = _members(combined("/testbed/", repo, control))
    assert list(got) == ["testbed", "testbed/pkg", "testbed/pkg/a.py", "testbed/b.txt",
                         "testbed/pkg/c.py", "ecredit", "ecredit/trial.sh"]
    assert got["testbed/pkg/a.py"] == ("", b"A\n")
    assert got["testbed/pkg/c.py"][0] == "testbed/pkg/a.py"
    assert got["ecredit/trial.sh"] == ("", b"#!/bin/bash\n")


def test_no_repo_archive_is_the_control_tar():
    control = _tar({"ecredit/eval.sh": b"x"})
    assert combined("/testbed", None, control) is control


def test_git_archive_extracts_to_the_same_tree(tmp_path):
    """A real ``git archive`` (pax global header, nested dirs) re-rooted and extracted at a
    fake ``/`` gives the same files as extracting it at the workdir."""
    repo = tmp_path / "repo"
    (repo / "d" / "e").mkdir(parents=True)
    (repo / "d" / "e" / "f.py").write_text("print(1)\n")
    (repo / "top.txt").write_text("t\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@e"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    archive = subprocess.run([*git, "archive", "HEAD"], check=True, capture_output=True).stdout
    out = tmp_path / "root"
    with tarfile.open(fileobj=io.BytesIO(combined("/work/tb", archive, _tar({})))) as tar:
        tar.extractall(out, filter="tar")
    assert (out / "work/tb/d/e/f.py").read_text() == "print(1)\n"
    assert (out / "work/tb/top.txt").read_text() == "t\n"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "work/tb/d/e/f.py", "work/tb/top.txt"]


@pytest.mark.parametrize("name", ["../evil", "a/../../evil", "/etc/passwd"])
def test_member_outside_the_workdir_is_refused(name):
    with pytest.raises(ValueError, match="not inside the workdir"):
        combined("/testbed", _tar({name: b"x"}), _tar({}))


def test_relative_workdir_is_refused():
    with pytest.raises(ValueError, match="workdir: 'testbed' is not an absolute path"):
        combined("testbed", _tar({"a": b"x"}), _tar({}))
