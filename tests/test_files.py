"""eval.files: atomic, world-readable record files."""

import os
import stat

import pytest

from eval.files import (
    append_jsonl,
    atomic_write_text,
    read_json_object,
    read_jsonl,
    write_json,
    write_jsonl,
)


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


class _NamedError(ValueError):
    pass


def test_read_json_object_raises_the_callers_error_naming_the_file(tmp_path):
    good = tmp_path / "good.json"
    write_json(good, {"a": 1})
    assert read_json_object(good) == {"a": 1}
    cases = {"list.json": ("[1, 2]", "expected a JSON object, got list"),
             "bad.json": ('{"a": ', "not valid JSON"),
             "bytes.json": (b"\xff\xfe{}", "not UTF-8")}
    for name, (content, msg) in cases.items():
        p = tmp_path / name
        (p.write_bytes if isinstance(content, bytes) else p.write_text)(content)
        with pytest.raises(_NamedError, match=f"^study {p}: {msg}"):
            read_json_object(p, _NamedError, what="study")
    with pytest.raises(_NamedError, match="missing.json: cannot read"):
        read_json_object(tmp_path / "missing.json", _NamedError)


def test_write_json_indent_and_write_jsonl_are_atomic(tmp_path):
    p = write_json(tmp_path / "one.json", {"b": 1, "a": [1]}, indent=None)
    assert p.read_text() == '{"a": [1], "b": 1}\n'
    rows = [{"z": "é", "a": 1}, {"a": 2}]
    q = write_jsonl(tmp_path / "rows.jsonl", rows, ensure_ascii=False)
    assert q.read_text(encoding="utf-8") == '{"a": 1, "z": "é"}\n{"a": 2}\n'
    assert read_jsonl(q) == rows
    assert sorted(x.name for x in tmp_path.iterdir()) == ["one.json", "rows.jsonl"]
