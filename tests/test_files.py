"""eval.files: atomic, world-readable record files."""

import os
import stat

import pytest

from eval.files import append_jsonl, atomic_write_text, read_jsonl, write_json


def test_atomic_files_are_0644_and_leave_no_temp(tmp_path):
    p = write_json(tmp_path / "a" / "results.json", {"x": 1})
    t = atomic_write_text(tmp_path / "report.md", "# r\n")
    for f in (p, t):
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o644
    assert sorted(x.name for x in tmp_path.rglob("*") if x.is_file()) == ["report.md", "results.json"]


def test_failed_write_keeps_previous_content(tmp_path):
    p = atomic_write_text(tmp_path / "r.md", "old")

    class Boom:
        def __str__(self):
            raise RuntimeError("cannot render")

    with pytest.raises(TypeError):
        atomic_write_text(p, Boom())
    assert p.read_text() == "old"
    assert [x.name for x in tmp_path.iterdir()] == ["r.md"]


def test_jsonl_roundtrip_and_custom_error(tmp_path):
    p = append_jsonl(tmp_path / "x.jsonl", [{"a": 1}])
    p.write_text(p.read_text() + "garbage\n" + '{"a": 2}\n')

    class MyError(ValueError):
        pass

    with pytest.raises(MyError, match="x.jsonl:2"):
        read_jsonl(p, error=MyError)
    assert read_jsonl(tmp_path / "missing.jsonl") == []
