"""What a file flag's format check may refuse (design page, "Bad input"): only what the bytes it
read prove, never a whole file judged by a prefix.

:func:`format_problem` is the check behind :func:`sandbox.bounds.InFile` and
:func:`sandbox.bounds.Source` with a format (``json``, ``jsonl``, ``yaml``). A prefix of
:data:`PREFIX_BYTES` is read; a character or a line cut at its end is never a problem; a JSON
Lines file's first row is read to its end. The module imports nothing first-party.
"""

from __future__ import annotations

import codecs
import json

__all__ = ["PREFIX_BYTES", "format_problem"]

PREFIX_BYTES = 1 << 16
"""How much of a file the format checks read up front (bytes); a check reads more only
where a decision needs it (a JSON Lines file's first row)."""

# JSON's insignificant whitespace (RFC 8259 section 2); str.strip would also eat form feeds
_JSON_WS = b" \t\r\n"


def _utf8_problem(data: bytes, *, complete: bool) -> str | None:
    """Whether ``data`` proves the file is not UTF-8. ``complete=False``: ``data`` is a prefix,
    and a multibyte character cut at its end is not a problem (the rest of the file holds
    its remaining bytes)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        decoder.decode(data, final=complete)
    except UnicodeDecodeError:
        return "not UTF-8 text"
    return None


def format_problem(fmt: str, fh) -> str | None:
    """What the open binary file ``fh`` provably is not, for the format ``fmt`` (None: no
    problem found).

    Raises: OSError from reading ``fh``.

    The rule (design page, "Bad input"): a check refuses only what it can prove from the
    bytes it read, and reads more where it must to decide; it never judges a whole file by
    a prefix. So: the first :data:`PREFIX_BYTES` bytes are read; a character or line cut at
    their end is never a problem; ``json`` and ``yaml`` files that fit in the prefix are
    parsed whole, longer ones only checked for UTF-8 and (JSON) an opening ``{`` or ``[``;
    a ``jsonl`` file's first non-blank row is read to its end (however long: a trajectory
    row of hundreds of KB is common) and must be a JSON object; rows end at ``\\n`` alone,
    as in JSON Lines (a U+2028 inside a string is no line break). ``""`` (any
    file) reads nothing: its reader decides (a test log read with replacement characters,
    a Parquet file).
    """
    if not fmt:
        return None
    head = fh.read(PREFIX_BYTES + 1)
    complete = len(head) <= PREFIX_BYTES
    if fmt == "jsonl":
        return _jsonl_problem(head, complete, fh)
    problem = _utf8_problem(head, complete=complete)
    if problem:
        return problem
    if fmt == "json":
        stripped, at_end = head.lstrip(_JSON_WS), complete
        while not stripped and not at_end:  # a prefix of whitespace decides nothing: read on
            more = fh.read(PREFIX_BYTES)
            at_end = not more
            stripped = more.lstrip(_JSON_WS)
            if _utf8_problem(more, complete=at_end):
                return "not UTF-8 text"
        if not stripped.startswith((b"{", b"[")):
            return "not JSON"
        if complete:
            try:
                json.loads(head.decode("utf-8"))
            except ValueError:
                return "not JSON"
    if fmt == "yaml" and complete:
        import yaml  # start-up: only for a YAML path

        try:
            yaml.safe_load(head.decode("utf-8"))
        except yaml.YAMLError:
            return "not YAML"
    return None


def _jsonl_problem(head: bytes, complete: bool, fh) -> str | None:
    """The JSON Lines check of :func:`format_problem`: UTF-8 on the prefix ``head`` (the
    whole file when ``complete``), then the first non-blank row of ``fh``, read whole."""
    if _utf8_problem(head, complete=complete):
        return "not UTF-8 text"
    lead = head.lstrip(b" \t\r\n\x0b\x0c")
    if (not complete and lead and b"\n" not in lead and lead[0] < 0x80
            and not lead.startswith(b"{")):
        # a first row longer than the prefix that does not open with "{" is no object:
        # proven without reading it (a non-ASCII byte may start Unicode whitespace: read on)
        return "not JSON Lines of objects"
    fh.seek(0)
    for raw in fh:  # binary lines end at b"\n" only, each read whole however long
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return "not UTF-8 text"
        if not text.strip():  # a blank line, as the readers skip it
            continue
        try:
            return None if isinstance(json.loads(text), dict) else "not JSON Lines of objects"
        except ValueError:
            return "not JSON Lines"
    return None  # no rows yet: a JSON Lines file (an append-only record starts empty)
