"""The up-front file checks of ``sandbox.bounds`` never refuse a file the whole file would pass.

A check reads a prefix (``PREFIX_BYTES``) and may refuse only what those bytes prove: a
multibyte character cut at the prefix end, or a first JSON Lines row longer than the prefix,
is no problem. Valid files of every checked format, around and far past the prefix, are
accepted; files that are provably bad are still refused in one line; and the two commands a
user met the fault with (``eval.grade --log``, ``credit.pilot --trajectories``) run on such
files.
"""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_pilot import _tiny_task

from ecredit_trl.credit.pilot import main as pilot_main
from ecredit_trl.credit.scripted import scripted_for_task
from ecredit_trl.credit.trajectory import FileWrite, dump_trajectories
from eval.files import read_jsonl
from eval.grade import main as grade_main
from eval.tasks.schema import save_tasks
from sandbox.bounds import ArgumentParser, InFile
from sandbox.file_formats import PREFIX_BYTES

MULTIBYTE = ("é", "€", "😀")  # 2, 3 and 4 bytes in UTF-8


def _with_char_at(fmt: str, offset: int, char: str, size: int) -> bytes:
    """A valid ``fmt`` file of at least ``size`` bytes whose byte ``offset`` starts ``char``."""
    opening = {"json": b'{"k": "', "jsonl": b'{"k": "', "yaml": b'k: "'}[fmt]
    pad = b"a" * (offset - len(opening))
    tail_len = max(0, size - offset - len(char.encode()) - 3)
    body = opening + pad + char.encode() + b"b" * tail_len
    if fmt == "json":
        return body + b'"}\n'
    if fmt == "jsonl":  # the first row holds the character; a second row follows
        return body + b'"}\n{"row": 2}\n'
    return body + b'"\n'


@pytest.mark.parametrize("fmt", ["json", "jsonl", "yaml"])
@pytest.mark.parametrize("char", MULTIBYTE)
def test_a_character_straddling_the_prefix_end_is_accepted(fmt, char, tmp_path):
    n = len(char.encode())
    for offset in range(PREFIX_BYTES - n - 1, PREFIX_BYTES + 2):
        p = tmp_path / f"f-{offset}.{fmt}"
        p.write_bytes(_with_char_at(fmt, offset, char, PREFIX_BYTES + 4096))
        if fmt != "yaml":  # the file itself is valid: its reader takes it
            json.loads(p.read_bytes().split(b"\n")[0] if fmt == "jsonl" else p.read_bytes())
        assert InFile(fmt).problem(str(p)) is None, (fmt, char, offset)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from(["json", "jsonl", "yaml"]), char=st.sampled_from(MULTIBYTE),
       offset=st.integers(PREFIX_BYTES - 8, PREFIX_BYTES + 8),
       size=st.integers(PREFIX_BYTES - 16, 3 << 20))
def test_valid_files_of_any_size_are_accepted(fmt, char, offset, size, tmp_path):
    p = tmp_path / f"g.{fmt}"
    p.write_bytes(_with_char_at(fmt, offset, char, size))
    assert InFile(fmt).problem(str(p)) is None


@pytest.mark.parametrize("row_bytes", [PREFIX_BYTES - 1, PREFIX_BYTES, PREFIX_BYTES + 1,
                                       300_000, 3_000_000])
def test_a_first_row_longer_than_the_prefix_is_read_whole(row_bytes, tmp_path):
    text = "x\u2028y\u0085z" + "é" * (row_bytes // 2)  # line-break-like characters inside a string
    row = json.dumps({"text": text[: row_bytes // 2]}, ensure_ascii=False)
    p = tmp_path / "t.jsonl"
    p.write_text("\n\n" + row + "\n" + json.dumps({"n": 2}) + "\n", encoding="utf-8")
    assert InFile("jsonl").problem(str(p)) is None
    assert [r.get("n") for r in read_jsonl(p)] == [None, 2]  # the reader splits at "\n" too
    assert read_jsonl(p)[0]["text"] == text[: row_bytes // 2]


def test_any_file_is_left_to_its_reader(tmp_path):
    """No format: nothing is read (a log with stray bytes is graded with replacement
    characters; a Parquet row file is binary)."""
    p = tmp_path / "rows.parquet"
    p.write_bytes(b"PAR1\x00\xff\xfe\x80" * 20_000)
    assert InFile().problem(str(p)) is None


@pytest.mark.parametrize("fmt,content,why", [
    ("json", b'{"a": "\xff"}', "not UTF-8 text"),
    ("json", b" " * (PREFIX_BYTES + 10) + b"nope", "not JSON"),
    ("json", b'{"a": "\xc3(' + b"x" * PREFIX_BYTES + b'"}', "not UTF-8 text"),  # inside the prefix
    ("json", b'{"a": 1', "not JSON"),
    ("jsonl", b'{"a": "\xff"}\n', "not UTF-8 text"),
    ("jsonl", b"[" + b"1," * PREFIX_BYTES + b"1]\n", "not JSON Lines of objects"),
    ("jsonl", b'{"a": "' + b"x" * (2 * PREFIX_BYTES) + b'\n', "not JSON Lines"),
    ("jsonl", b'{"a": "' + b"x" * (2 * PREFIX_BYTES) + b'\xff"}\n', "not UTF-8 text"),
    ("jsonl", b"\n\nnot json\n", "not JSON Lines"),
    ("yaml", b"a: [1\n", "not YAML"),
    ("yaml", b"\xfe" + b"a" * (2 * PREFIX_BYTES), "not UTF-8 text"),
])
def test_provably_bad_files_are_still_refused_in_one_line(fmt, content, why, tmp_path, capsys):
    p = tmp_path / f"bad.{fmt}"
    p.write_bytes(content)
    assert InFile(fmt).problem(str(p)) == why
    ap = ArgumentParser(prog="prog")
    ap.add_argument("--f", type=InFile(fmt))
    with pytest.raises(SystemExit) as exc:
        ap.parse_args(["--f", str(p)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and f"not allowed ({why})" in err


def _pytest_log(n_pass: int) -> str:
    """A pytest ``-rA`` log whose PASSES section prints non-ASCII text."""
    lines = ["============================= test session starts =============================="]
    for i in range(n_pass):
        lines.append(f"tests/test_m.py::test_{i} PASSED  # naïve café ✓ {i}")
    lines.append("=========================== short test summary info ============================")
    lines += [f"PASSED tests/test_m.py::test_{i}" for i in range(n_pass)]
    lines.append("FAILED tests/test_m.py::test_fix - assert 1 == 2")
    return "\n".join(lines) + "\n"


def test_grade_takes_a_long_utf8_log_with_a_character_at_the_prefix_end(tmp_path, capsys):
    log = _pytest_log(1500).encode()
    assert len(log) > 2 * PREFIX_BYTES
    # move a multibyte character so it straddles byte PREFIX_BYTES
    cut = PREFIX_BYTES - 1
    log = log[:cut] + "€".encode() + log[cut:]
    assert log[PREFIX_BYTES - 1: PREFIX_BYTES + 2] == "€".encode()
    (tmp_path / "L.log").write_bytes(log)
    (tmp_path / "C.log").write_bytes(log)
    inst = {"FAIL_TO_PASS": ["tests/test_m.py::test_fix"],
            "PASS_TO_PASS": ["tests/test_m.py::test_0", "tests/test_m.py::test_1499"],
            "log_parser": "pytest"}
    (tmp_path / "I.json").write_text(json.dumps(inst))
    rc = grade_main(["--instance", str(tmp_path / "I.json"), "--log", str(tmp_path / "L.log"),
                     "--control-log", str(tmp_path / "C.log")])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0
    assert out["utility"] == -0.0 or out["utility"] == 0.0  # F2P failed, P2P passed
    assert out["resolved"] is False and out["complete"] is True


def test_pilot_takes_trajectories_whose_first_row_is_300_kb(tmp_path):
    task = _tiny_task(tmp_path)
    tasks_file = tmp_path / "tasks.jsonl"
    save_tasks([task], tasks_file)
    gold, fmt_err = scripted_for_task(task, kinds=["gold_only", "format_error"])
    # the rollout also wrote a real 300 KB data file in its fixing turn
    big = ("data row ü\n" * 27_300).encode()
    turn = gold.turns[0]
    turn = dataclasses.replace(turn, writes={**turn.writes, "pkg/data.txt": FileWrite(big)})
    gold = dataclasses.replace(gold, turns=(turn, *gold.turns[1:]))
    trajs_file = tmp_path / "trajs.jsonl"
    dump_trajectories([gold, fmt_err], trajs_file)
    first = trajs_file.read_bytes().split(b"\n")[0]
    assert len(first) >= 300_000
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = pilot_main(["--tasks", str(tasks_file), "--trajectories", str(trajs_file),
                         "--out", str(tmp_path / "out"), "--runtime", "local", "--seed", "1",
                         "--concurrency", "1"])
    assert rc == 0
    t = json.loads((tmp_path / "out" / "pilot.json").read_text())
    # the fix and the data file are one block: removing it removes the fix (D = 1)
    assert t["usable"] == 1 and t["positive"] == 1 and t["excluded"]["format_error"] == 1
