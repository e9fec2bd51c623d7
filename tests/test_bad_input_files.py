"""Files that pass the up-front format check but are bad further in get one clear line naming the
file (and the row or field), never a traceback or a decoder's chunk-relative byte position."""

from __future__ import annotations

import json

import pytest

from ecredit_trl.study.config import StudyConfigError, load_study_config
from eval.files import read_json_object
from eval.holdout import main as holdout_main
from eval.run import main as eval_main
from eval.tasks.schema import read_rows


@pytest.mark.parametrize("content,says", [
    (b'["a"]', "expected a JSON object, got list"),
    (b'{"rows": 1}', "field split: expected"),
    (b'{"split": 5}', "field split: expected"),
    (b'{"split": "x", "a": "\xff"}', "not UTF-8 text"),
])
def test_replay_of_a_file_that_is_no_results_file_is_one_line(content, says, tmp_path, capsys):
    p = tmp_path / "results.json"
    p.write_bytes(content)
    rc = eval_main(["--replay", str(p), "--out", str(tmp_path / "out"), "--runtime", "local"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("error: --replay results ") and str(p) in err and says in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_tasks_file_not_utf8_far_in_names_its_row(tmp_path):
    rows = [json.dumps({"instance_id": f"i{n}", "pad": "x" * 5000}) for n in range(40)]
    data = ("\n".join(rows) + "\n").encode()
    at = data.index(b"i30")  # inside row 31, far past any 8 KiB read chunk
    p = tmp_path / "tasks.jsonl"
    p.write_bytes(data[:at] + b"\xc3(" + data[at + 2:])
    with pytest.raises(ValueError) as exc:
        read_rows(p)
    msg = str(exc.value)
    assert msg.startswith(f"{p} row 31: not UTF-8 text") and "\n" not in msg
    j = tmp_path / "tasks.json"
    j.write_bytes(b'[{"instance_id": "\xff"}]')
    with pytest.raises(ValueError, match=r"tasks\.json: not UTF-8 text \(invalid start byte at byte 18\)"):
        read_rows(j)


def test_a_study_config_not_utf8_names_the_file(tmp_path):
    p = tmp_path / "study.yaml"
    p.write_bytes(b"name: s\n# " + b"x" * 70_000 + b"\xfe\n")
    with pytest.raises(StudyConfigError) as exc:
        load_study_config(p)
    assert str(exc.value).startswith(f"{p}: not UTF-8 text (invalid start byte at byte 70010)")


def test_a_cut_json_file_reads_its_position_once(tmp_path):
    p = tmp_path / "m.json"
    p.write_text('{"a": "unterminated')
    with pytest.raises(ValueError) as exc:
        read_json_object(p, what="manifest")
    assert str(exc.value) == (f"manifest {p}: not valid JSON (Unterminated string starting at: "
                              "line 1 column 7)")


def test_holdout_check_tells_a_bad_source_from_sealed_ids(tmp_path, capsys):
    """``check`` exits 1 for sealed ids only; a source it cannot read is bad input (2)."""
    p = tmp_path / "rows.jsonl"
    p.write_text(json.dumps([1, 2]) + "\n")
    assert holdout_main(["check", "--source", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(p) in err and err.count("\n") == 1
