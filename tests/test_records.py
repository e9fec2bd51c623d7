"""Atomic JSON / fsync-ed JSONL records."""

import json
import os
from pathlib import Path

import pytest

from ecredit_trl.runs import records
from ecredit_trl.runs.records import RecordWriteError, append_jsonl, read_jsonl, write_json
from eval import files


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


@pytest.fixture
def small_disk(tmp_path):
    """A real 64 KiB tmpfs (needs root and mount permission; skipped otherwise), unmounted after."""
    import subprocess

    mnt = tmp_path / "disk"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_disk_full_names_the_path_and_keeps_earlier_records(small_disk):
    from ecredit_trl.runs.receipts import RunReceipts

    run = small_disk / "run"
    write_json(run / "manifest.json", {"run": "r", "ok": True})
    receipts = RunReceipts(run, 0)
    receipts.start(note="small disk")
    ledger = run / "ledger.jsonl"
    row = {"step": 0, "pad": "x" * 1500}
    written = 0
    with pytest.raises(RecordWriteError) as err:
        for step in range(1, 200):
            append_jsonl(ledger, [dict(row, step=step)])
            written = step
    assert str(ledger) in str(err.value) and err.value.errno == 28  # ENOSPC
    assert 0 < written < 199
    # every earlier line intact, the failed one cut off again: the file ends on a full line
    assert [r["step"] for r in read_jsonl(ledger)] == list(range(1, written + 1))
    assert ledger.read_text().endswith("\n")
    # atomic JSON on a full disk: error names the file, old content kept, no temp file left
    with pytest.raises(RecordWriteError, match="manifest.json"):
        write_json(run / "manifest.json", {"run": "r", "pad": "y" * 100_000})
    assert json.loads((run / "manifest.json").read_text()) == {"run": "r", "ok": True}
    with pytest.raises(RecordWriteError, match="s00-termination.json"):
        receipts.termination("exception", step=written, traceback_text=None,
                             note="z" * 100_000)
    assert sorted(p.name for p in (run / "receipts").iterdir()) == ["s00-start.json"]
    assert sorted(p.name for p in run.iterdir()) == ["ledger.jsonl", "manifest.json", "receipts"]


def test_records_write_with_the_one_atomic_writer(tmp_path, monkeypatch):
    obj = {"b": [1, 2], "a": {"x": None}}
    assert records.write_json(tmp_path / "r.json", obj).read_text() == \
        files.write_json(tmp_path / "e.json", obj).read_text()
    assert records.write_json(tmp_path / "i.json", obj, indent=None).read_text() == \
        '{"a": {"x": null}, "b": [1, 2]}\n'
    calls = []
    monkeypatch.setattr(files, "atomic_write_text", lambda p, t: calls.append(p) or p)
    records.write_json(tmp_path / "m.json", obj)
    records.write_jsonl_atomic(tmp_path / "l.jsonl", [obj])
    assert [Path(p).name for p in calls] == ["m.json", "l.jsonl"]
