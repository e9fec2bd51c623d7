"""The editor keeps every byte it was not asked to change: CRLF, Latin-1,
no final newline, file mode."""

import os
import stat

import pytest

from ecredit_trl.agent import editor
from ecredit_trl.agent.editor import EditorError

CRLF_LATIN1 = b"# caf\xe9\r\ndef f():\r\n    return 1\r\n"


def _mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


def test_str_replace_on_crlf_latin1_changes_only_the_asked_bytes(tmp_path):
    f = tmp_path / "m.py"
    f.write_bytes(CRLF_LATIN1)
    os.chmod(f, 0o755)
    out = editor.str_replace(tmp_path, "m.py", "return 1", "return 2")
    assert f.read_bytes() == b"# caf\xe9\r\ndef f():\r\n    return 2\r\n"
    assert _mode(f) == 0o755
    assert "\ufffd" not in out and "café" in out
    # the agent may quote several lines with LF (what view shows) or with CRLF
    editor.str_replace(tmp_path, "m.py", "def f():\n    return 2", "def g():\n    return 3")
    assert f.read_bytes() == b"# caf\xe9\r\ndef g():\r\n    return 3\r\n"
    editor.str_replace(tmp_path, "m.py", "def g():\r\n", "def h():\r\n")
    assert f.read_bytes() == b"# caf\xe9\r\ndef h():\r\n    return 3\r\n"
    # a Latin-1 character the agent types is written as the Latin-1 byte
    editor.str_replace(tmp_path, "m.py", "café", "thé")
    assert f.read_bytes().startswith(b"# th\xe9\r\n")
    # a character Latin-1 has no byte for is refused; the file stays as it was
    before = f.read_bytes()
    with pytest.raises(EditorError, match="latin-1"):
        editor.str_replace(tmp_path, "m.py", "thé", "\u2603")
    assert f.read_bytes() == before


def test_view_shows_lines_without_cr_and_real_characters(tmp_path):
    (tmp_path / "m.py").write_bytes(CRLF_LATIN1)
    out = editor.view(tmp_path, "m.py")
    assert "\r" not in out
    assert "     1\t# café\n     2\tdef f():\n     3\t    return 1" in out
    assert (tmp_path / "m.py").read_bytes() == CRLF_LATIN1  # view writes nothing


def test_insert_keeps_crlf_and_missing_final_newline(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(b"one\r\ntwo\r\nthree")  # CRLF, no final newline
    editor.insert(tmp_path, "a.txt", 1, "inserted")
    assert f.read_bytes() == b"one\r\ninserted\r\ntwo\r\nthree"
    editor.insert(tmp_path, "a.txt", 4, "last")
    assert f.read_bytes() == b"one\r\ninserted\r\ntwo\r\nthree\r\nlast"
    g = tmp_path / "b.txt"
    g.write_bytes(b"x = 1\ny = 2")  # LF, no final newline
    editor.str_replace(tmp_path, "b.txt", "y = 2", "y = 3")
    assert g.read_bytes() == b"x = 1\ny = 3"
    editor.insert(tmp_path, "b.txt", 0, "# top")
    assert g.read_bytes() == b"# top\nx = 1\ny = 3"


def test_mixed_line_ends_and_undecodable_bytes_survive_an_unrelated_edit(tmp_path):
    f = tmp_path / "mixed.txt"
    raw = b"a\r\nb\nc\xff\xfe\r\nkey = 1\n"
    f.write_bytes(raw)
    editor.str_replace(tmp_path, "mixed.txt", "key = 1", "key = 2")
    assert f.read_bytes() == raw.replace(b"key = 1", b"key = 2")


def test_create_writes_exact_utf8_bytes(tmp_path):
    editor.create(tmp_path, "new/x.txt", "é\r\nno newline")
    assert (tmp_path / "new" / "x.txt").read_bytes() == "é\r\nno newline".encode()
    with pytest.raises(EditorError, match="file_text"):
        editor.create(tmp_path, "y.txt", None)
    with pytest.raises(EditorError, match="new_str"):
        editor.insert(tmp_path, "new/x.txt", 0, None)
