"""Atomic JSON / fsync-ed JSONL records."""

import json
import os

import pytest

from ecredit_trl.records import RecordWriteError, append_jsonl, read_jsonl, write_json


def test_write_json_is_atomic_and_keeps_old_content_on_failure(tmp_path, monkeypatch):
    p = tmp_path / "r" / "manifest.json"
    write_json(p, {"a": 1})
    assert json.loads(p.read_text()) == {"a": 1}

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(RecordWriteError, match="manifest.json"):
        write_json(p, {"a": 2})
    assert json.loads(p.read_text()) == {"a": 1}
    assert [x.name for x in p.parent.iterdir()] == ["manifest.json"]


def test_jsonl_append_and_truncated_last_line(tmp_path):
    p = tmp_path / "ledger.jsonl"
    append_jsonl(p, [{"step": 1}, {"step": 2}])
    with open(p, "a") as f:
        f.write('{"step": 3, "tru')
    assert read_jsonl(p) == [{"step": 1}, {"step": 2}]
    p.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match="ledger.jsonl:2"):
        read_jsonl(p)
