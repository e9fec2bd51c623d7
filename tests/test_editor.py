"""ecredit_trl.agent.editor: str_replace_editor semantics on real files."""

import pytest

from ecredit_trl.agent import editor
from ecredit_trl.agent.editor import EditorError


@pytest.fixture
def root(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("a = 1\nb = 2\nc = 3\nb = 2\n")
    return tmp_path


def test_view_file_window_and_dir(root):
    out = editor.view(root, "pkg/m.py")
    assert out.splitlines()[1:] == ["     1\ta = 1", "     2\tb = 2", "     3\tc = 3",
                                    "     4\tb = 2", "     5\t"]
    win = editor.view(root, "/testbed/pkg/m.py", line=3)
    assert "     3\tc = 3" in win
    listing = editor.view(root, "pkg")
    assert listing.splitlines()[1:] == ["m.py"]
    with pytest.raises(EditorError, match="does not exist"):
        editor.view(root, "nope.py")
    with pytest.raises(EditorError, match="Invalid line 99"):
        editor.view(root, "pkg/m.py", line=99)


def test_paths_cannot_leave_the_tree(root):
    for bad in ("../etc/passwd", "/etc/passwd", "pkg/../../x"):
        with pytest.raises(EditorError, match="outside the repository"):
            editor.view(root, bad)


def test_str_replace_unique_only(root):
    with pytest.raises(EditorError, match=r"Multiple occurrences of old_str `b = 2` in lines \[2, 4\]"):
        editor.str_replace(root, "pkg/m.py", "b = 2", "b = 5")
    with pytest.raises(EditorError, match="did not appear verbatim"):
        editor.str_replace(root, "pkg/m.py", "zzz", "y")
    out = editor.str_replace(root, "pkg/m.py", "c = 3", "c = 30")
    assert "has been edited" in out and "     3\tc = 30" in out
    assert (root / "pkg" / "m.py").read_text() == "a = 1\nb = 2\nc = 30\nb = 2\n"


def test_create_and_insert(root):
    assert "created" in editor.create(root, "new/f.py", "x = 1\n")
    assert (root / "new" / "f.py").read_text() == "x = 1\n"
    with pytest.raises(EditorError, match="already exists"):
        editor.create(root, "new/f.py", "y")
    editor.insert(root, "pkg/m.py", 1, "z = 0")
    assert (root / "pkg" / "m.py").read_text() == "a = 1\nz = 0\nb = 2\nc = 3\nb = 2\n"
    with pytest.raises(EditorError, match="insert_line"):
        editor.insert(root, "pkg/m.py", 50, "q")
