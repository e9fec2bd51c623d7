"""The file editor tools of the agent (SWE-agent's ``str_replace_editor`` semantics).

Pure functions over a working-tree root on the host (the rollout's container
sees the same tree at ``/testbed`` through a bind mount). Every path is
resolved inside the root: absolute paths are read as ``/testbed/...`` and
anything escaping the tree is refused. Errors are raised as
:class:`EditorError` with SWE-agent's wording, which the agent sees as the
tool result.

Source of the semantics: SWE-agent / Anthropic ``str_replace_editor``
(``view`` with line numbers, ``create`` refuses existing files,
``str_replace`` needs exactly one occurrence, ``insert`` after a line).

Bytes the agent did not ask to change are kept: files are read and
written as bytes, decoded as UTF-8 or, when that fails, Latin-1 (a lossless
byte ↔ character map) and encoded back the same way; a file whose line ends are
all CRLF is edited in LF form and written back with CRLF (the agent's
``old_str``/``new_str`` may use either); a missing final newline stays missing;
edits rewrite the file in place, so its mode is kept. ``view`` shows lines without
their ``\r``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SNIPPET_LINES = 7
"""Lines shown on each side of an edit or of ``view(path, line)``."""

MAX_VIEW_CHARS = 8000
"""A whole-file view is cut past this many characters (the agent is told)."""


class EditorError(ValueError):
    """A tool call the editor refuses; the message is what the agent sees."""


def resolve(root: str | Path, path: str, workdir: str = "/testbed") -> Path:
    """Map an agent path (relative, or absolute under ``workdir``) into ``root``.

    Raises: EditorError when the path is empty or leaves the working tree.
    """
    if not isinstance(path, str) or not path.strip():
        raise EditorError("The path parameter is required and must be a non-empty string.")
    root = Path(root).resolve()
    p = path.strip()
    if p.startswith(workdir.rstrip("/") + "/") or p == workdir:
        p = p[len(workdir):].lstrip("/")
    elif p.startswith("/"):
        raise EditorError(f"The path {path} is outside the repository {workdir}.")
    full = (root / p).resolve()
    if full != root and root not in full.parents:
        raise EditorError(f"The path {path} is outside the repository {workdir}.")
    return full


@dataclass(frozen=True)
class _Text:
    """A file's text in LF form plus how to turn it back into the same bytes."""

    text: str
    encoding: str  # "utf-8" or "latin-1"
    crlf: bool  # every line end was CRLF


def _read(full: Path) -> _Text:
    data = full.read_bytes()
    try:
        text, encoding = data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = data.decode("latin-1"), "latin-1"
    n_lf, n_crlf = text.count("\n"), text.count("\r\n")
    crlf = n_lf > 0 and n_lf == n_crlf
    return _Text(text.replace("\r\n", "\n") if crlf else text, encoding, crlf)


def _arg(doc: _Text, value: str) -> str:
    """An agent string in the file's LF form (CRLF files accept either line end)."""
    return value.replace("\r\n", "\n") if doc.crlf else value


def _write(full: Path, doc: _Text, text: str, path: str) -> None:
    if doc.crlf:
        text = text.replace("\n", "\r\n")
    try:
        data = text.encode(doc.encoding)
    except UnicodeEncodeError as exc:
        raise EditorError(f"The new text cannot be written to {path}: the file is "
                          f"{doc.encoding}, which has no {text[exc.start:exc.end]!r}.") from None
    with open(full, "r+b") as fh:  # in place: same inode, same mode
        fh.write(data)
        fh.truncate()


def _numbered(lines: list[str], start: int) -> str:
    return "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(lines, start))


def view(root, path: str, line: int = 0) -> str:
    """Show a file with line numbers (``cat -n``), or a directory listing.

    Args:
        path: file or directory in the repository.
        line: when > 0, show only a window of ±``SNIPPET_LINES`` lines around it
            (1-based); 0 shows the whole file (cut past ``MAX_VIEW_CHARS`` chars).

    Raises: EditorError for a missing path or a line out of range.
    """
    full = resolve(root, path)
    if not full.exists():
        raise EditorError(f"The path {path} does not exist. Please provide a valid path.")
    if full.is_dir():
        entries = sorted(
            str(p.relative_to(full)) + ("/" if p.is_dir() else "")
            for p in full.rglob("*")
            if ".git" not in p.relative_to(full).parts and len(p.relative_to(full).parts) <= 2
        )
        return f"Files and directories up to 2 levels deep in {path}:\n" + "\n".join(entries)
    lines = _read(full).text.split("\n")
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
    if line and line > 0:
        if line > len(lines):
            raise EditorError(f"Invalid line {line}: the file {path} has {len(lines)} lines.")
        lo = max(1, line - SNIPPET_LINES)
        hi = min(len(lines), line + SNIPPET_LINES)
        return f"Here's the result of running `cat -n` on {path}:\n" + _numbered(lines[lo - 1:hi], lo)
    out = _numbered(lines, 1)
    if len(out) > MAX_VIEW_CHARS:
        out = out[:MAX_VIEW_CHARS] + "\n<response clipped: use view with a line number>"
    return f"Here's the result of running `cat -n` on {path}:\n" + out


def create(root, path: str, file_text: str) -> str:
    """Create a new file with ``file_text``. Raises EditorError if it exists."""
    full = resolve(root, path)
    if full.exists():
        raise EditorError(f"File already exists at: {path}. Cannot overwrite files using command `create`.")
    if not isinstance(file_text, str):
        raise EditorError("Parameter `file_text` is required for command: create")
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_bytes(file_text.encode("utf-8", errors="surrogateescape"))
    return f"File created successfully at: {path}"


def str_replace(root, path: str, old_str: str, new_str: str = "") -> str:
    """Replace the single occurrence of ``old_str`` in ``path`` by ``new_str``.

    Returns a numbered snippet around the edit.
    Raises: EditorError when the file is missing, or ``old_str`` occurs zero or
    several times (with the line numbers of the occurrences).
    """
    full = resolve(root, path)
    if not full.is_file():
        raise EditorError(f"The path {path} does not exist or is not a file.")
    if not isinstance(old_str, str) or old_str == "":
        raise EditorError("Parameter `old_str` is required for command: str_replace")
    new_str = "" if new_str is None else new_str
    doc = _read(full)
    text, old_str, new_str = doc.text, _arg(doc, old_str), _arg(doc, new_str)
    count = text.count(old_str)
    if count == 0:
        raise EditorError(
            f"No replacement was performed, old_str `{old_str}` did not appear verbatim in {path}.")
    if count > 1:
        lines = [i + 1 for i, ln in enumerate(text.split("\n")) if old_str in ln]
        raise EditorError(
            f"No replacement was performed. Multiple occurrences of old_str `{old_str}` in lines "
            f"{lines}. Please ensure it is unique")
    start_line = text[: text.index(old_str)].count("\n")
    new_text = text.replace(old_str, new_str, 1)
    _write(full, doc, new_text, path)
    lines = new_text.split("\n")
    lo = max(0, start_line - SNIPPET_LINES)
    hi = min(len(lines), start_line + new_str.count("\n") + SNIPPET_LINES + 1)
    return (f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet "
            f"of {path}:\n" + _numbered(lines[lo:hi], lo + 1)
            + "\nReview the changes and make sure they are as expected.")


def insert(root, path: str, insert_line: int, new_str: str) -> str:
    """Insert ``new_str`` after line ``insert_line`` (0 = at the top).

    Raises: EditorError for a missing file or a line outside ``[0, n_lines]``.
    """
    full = resolve(root, path)
    if not full.is_file():
        raise EditorError(f"The path {path} does not exist or is not a file.")
    if not isinstance(new_str, str):
        raise EditorError("Parameter `new_str` is required for command: insert")
    doc = _read(full)
    new_str = _arg(doc, new_str)
    lines = doc.text.split("\n")
    if not isinstance(insert_line, int) or not 0 <= insert_line <= len(lines):
        raise EditorError(
            f"Invalid `insert_line` parameter: {insert_line}. It should be within the range of "
            f"lines of the file: [0, {len(lines)}]")
    new_lines = new_str.split("\n")
    lines[insert_line:insert_line] = new_lines
    _write(full, doc, "\n".join(lines), path)
    lo = max(0, insert_line - SNIPPET_LINES)
    hi = min(len(lines), insert_line + len(new_lines) + SNIPPET_LINES)
    return (f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet "
            f"of the edited file:\n" + _numbered(lines[lo:hi], lo + 1)
            + "\nReview the changes and make sure they are as expected.")
