"""Bounds of command-line values, declared once beside each flag or field (design page,
"Bad input").

A :class:`Bound` says what a value may be (its type, a range or choices, a path's kind and
format) and why. It is used in three places, always the same object:

* as an argparse ``type=`` (``ap.add_argument("--n", type=Int(ge=1))``): the string is
  converted and checked, a bad one is refused by :class:`ArgumentParser` in one line
  (``prog: error: argument --n: -3: not allowed (out of range); allowed: an integer >= 1``),
  exit 2;
* as dataclass field metadata (``field(default=4, metadata={"help": ..., "bounds": Int(ge=1)})``)
  of a class decorated with :func:`declared`, which moves each bound into :data:`FIELD_BOUNDS`
  (transformers' ``HfArgumentParser`` hands every metadata key to ``add_argument``, so the key
  cannot stay) - :func:`register` adds bounds of fields a class inherits and cannot edit;
  :func:`check_fields` checks an instance and raises :class:`BoundError` naming the flag;
* by the generated references (``docs/gen_ref.py``) and the fuzz test, through
  :meth:`Bound.allowed` and :meth:`Bound.samples`.

The module imports nothing first-party but :mod:`sandbox.file_formats` (a file flag's format
check), which imports nothing itself (every layer may use both).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
from pathlib import Path

from sandbox.file_formats import format_problem

__all__ = ["ArgumentParser", "Bound", "BoundError", "Choice", "FIELD_BOUNDS", "Float", "InDir",
           "InFile", "InPath", "Int", "ModelRef", "OutDir", "OutFile", "Source", "Text", "bound_of",
           "check_fields", "check_value", "declared", "flag_bounds", "register",
           "use_bounds"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_MODEL_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # gpt2, org/name


class BoundError(ValueError):
    """A value outside its declared bounds; the message is one line naming the flag, the
    value and what is allowed."""


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)


@dataclasses.dataclass(frozen=True)
class Bound:
    """What one value may be.

    Attributes:
        kind: ``int``, ``float``, ``text`` (``any-text``: "" allowed), ``choice``, ``in-file``,
            ``in-dir``, ``in-path`` (either), ``out-file``,
            ``out-dir``, ``source`` (a name, or a file path in ``fmt``) or ``model`` (a model
            directory or a hub id ``org/name``).
        ge, gt, le, lt: numeric limits (inclusive / exclusive); None = none.
        choices: the allowed values of a ``choice``.
        fmt: a file's format, checked on its first bytes: ``json``, ``jsonl``, ``yaml``.
        nullable: None (the field's "unset") is allowed.
        why: the reason, shown with the refusal and in the references.
    """

    kind: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple = ()
    fmt: str = ""
    nullable: bool = False
    why: str = ""

    @property
    def __name__(self) -> str:  # argparse names a type by its __name__ in its messages
        return self.kind

    # -- what is allowed -------------------------------------------------------------------
    def allowed(self) -> str:
        """What is allowed, in words (``an integer >= 1``, ``one of a, b``, ``an existing
        .jsonl file``)."""
        if self.kind in ("int", "float"):
            parts = [f">= {_num(self.ge)}" if self.ge is not None else "",
                     f"> {_num(self.gt)}" if self.gt is not None else "",
                     f"<= {_num(self.le)}" if self.le is not None else "",
                     f"< {_num(self.lt)}" if self.lt is not None else ""]
            noun = "an integer" if self.kind == "int" else "a finite number"
            text = " ".join([noun, " and ".join(p for p in parts if p)]).strip()
        elif self.kind == "choice":
            text = "one of " + ", ".join(map(str, self.choices))
        elif self.kind == "text":
            text = "a non-empty string"
        elif self.kind == "any-text":
            text = "any string"
        elif self.kind == "in-file":
            text = f"an existing readable {self.fmt + ' ' if self.fmt else ''}file"
        elif self.kind == "in-dir":
            text = "an existing directory"
        elif self.kind == "in-path":
            text = "an existing file or directory"
        elif self.kind == "out-file":
            text = "a file path to write (not a directory)"
        elif self.kind == "out-dir":
            text = "a directory path to write (not a file)"
        elif self.kind == "source":
            text = f"a name, or an existing readable {self.fmt + ' ' if self.fmt else ''}file"
        else:  # model
            text = "an existing model directory or a hub id (name or org/name)"
        return text + (" or None" if self.nullable else "")

    def describe(self) -> str:
        """:meth:`allowed` with the reason (the references' text)."""
        return self.allowed() + (f" ({self.why})" if self.why else "")

    # -- checking --------------------------------------------------------------------------
    def convert(self, text: str):
        """The value of a command-line string. Raises BoundError (the problem, no flag)."""
        if self.nullable and text == "None":
            return None
        if self.kind == "int":
            try:
                return int(text)
            except ValueError:
                raise BoundError(f"{text!r} is not an integer") from None
        if self.kind == "float":
            try:
                return float(text)
            except ValueError:
                raise BoundError(f"{text!r} is not a number") from None
        return text

    def problem(self, value) -> str | None:
        """Why ``value`` is outside the bounds (None when it is inside)."""
        if value is None:
            return None if self.nullable else "a value is required"
        if self.kind in ("int", "float"):
            return self._number_problem(value)
        if self.kind == "choice":
            return None if value in self.choices else "not a choice"
        if not isinstance(value, str):
            return "not a string"
        if self.kind == "any-text":
            return None
        if not value.strip():
            return "empty"
        if self.kind == "in-path":
            return None if Path(value).expanduser().exists() else "no such file or directory"
        if self.kind in ("in-file", "in-dir", "out-file", "out-dir"):
            return _path_problem(self.kind, self.fmt, Path(value))
        if self.kind == "source":
            # a scheme prefix (swegym:PATH, bundled:train) names the loader; its path is checked
            if re.match(r"^[\w-]+:", value):  # its loader reads a file or a folder
                rest = value.split(":", 1)[1]
                if _looks_like_path(rest) and not Path(rest).expanduser().exists():
                    return "no such file or directory"
            elif _looks_like_path(value) or Path(value).is_dir():
                return _path_problem("in-file", self.fmt, Path(value))
        if self.kind == "model":
            if _looks_like_path(value) or Path(value).exists():
                return _path_problem("in-dir", "", Path(value))
            return None if _MODEL_ID.match(value) else "neither a directory nor a hub id"
        return None

    def _number_problem(self, value) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "not a number"
        if self.kind == "int" and not float(value).is_integer():
            return "not an integer"
        if not math.isfinite(value):
            return "not finite"
        if ((self.ge is not None and value < self.ge) or (self.gt is not None and value <= self.gt)
                or (self.le is not None and value > self.le)
                or (self.lt is not None and value >= self.lt)):
            return "out of range"
        return None

    def refusal(self, name: str, value) -> str | None:
        """The one-line refusal of ``value`` for the flag ``name`` (None when allowed)."""
        why = self.problem(value)
        if why is None:
            return None
        shown = repr(value) if isinstance(value, str) else str(value)
        return f"{name} {shown}: not allowed ({why}); allowed: {self.describe()}"

    def __call__(self, text: str):
        """argparse ``type=``: the converted value; ArgumentTypeError (one line) when the
        string is not of the type or the value is outside the bounds."""
        try:
            value = self.convert(text)
        except BoundError as exc:
            raise argparse.ArgumentTypeError(f"{exc}; allowed: {self.describe()}") from None
        why = self.problem(value)
        if why is not None:
            raise argparse.ArgumentTypeError(f"{text}: not allowed ({why}); allowed: "
                                             f"{self.describe()}")
        return value

    # -- the fuzz test's values ------------------------------------------------------------
    def samples(self, tmp: Path) -> list[tuple[str, bool]]:
        """(command-line string, allowed?) pairs at, just inside and just outside the bounds,
        of the wrong type, and for paths: missing, a directory / a file, the wrong format
        (made under ``tmp``). The first allowed one is a valid example."""
        if self.kind in ("int", "float"):
            return self._number_samples()
        if self.kind == "choice":
            return [(str(c), True) for c in self.choices] + [("not-a-choice-x", False)]
        if self.kind == "text":
            return [("x", True), ("", False)]
        if self.kind == "any-text":
            return [("x", True), ("", True)]
        return _path_samples(self, tmp)

    def _number_samples(self) -> list[tuple[str, bool]]:
        step = 1 if self.kind == "int" else 1e-3
        out: list[tuple[str, bool]] = []
        lo = self.ge if self.ge is not None else (self.gt + step if self.gt is not None else None)
        hi = self.le if self.le is not None else (self.lt - step if self.lt is not None else None)
        for edge, sign in ((lo, -1), (hi, 1)):
            if edge is not None:
                shown = _num(edge) if self.kind == "float" else str(int(edge))
                out += [(shown, True), (_num(edge + sign * step), False)]
        if lo is None and hi is None:
            out.append(("0", True))
        out += [("x", False), ("1.5", False)] if self.kind == "int" else [("x", False), ("nan", False)]
        return out


def _looks_like_path(value: str) -> bool:
    return (value.startswith(("/", "./", "../", "~")) or value.endswith((".json", ".jsonl",
            ".yaml", ".yml")) or os.sep in value and not _HUB_ID.match(value))


def _path_problem(kind: str, fmt: str, path: Path) -> str | None:
    path = path.expanduser()
    if kind == "in-dir":
        return None if path.is_dir() else ("not a directory" if path.exists() else "no such directory")
    if kind == "out-file":
        return "a directory" if path.is_dir() else None
    if kind == "out-dir":
        return "an existing file" if path.exists() and not path.is_dir() else None
    if not path.exists():
        return "no such file"
    if path.is_dir():
        return "a directory"
    try:
        with path.open("rb") as fh:
            return format_problem(fmt, fh)
    except OSError as exc:
        return f"unreadable ({exc.strerror})"


_GOOD = {"jsonl": '{"a": 1}\n', "json": '{"a": 1}\n', "yaml": "a: 1\n", "": "x\n"}
_BAD = {"jsonl": "not json\n", "json": "not json\n", "yaml": "a: [1\n"}


def _path_samples(b: Bound, tmp: Path) -> list[tuple[str, bool]]:
    tmp.mkdir(parents=True, exist_ok=True)
    good = tmp / f"good.{b.fmt or 'txt'}"
    good.write_text(_GOOD[b.fmt])
    adir = tmp / "a-dir"
    adir.mkdir(exist_ok=True)
    missing = str(tmp / "missing" / f"x.{b.fmt or 'txt'}")
    out: list[tuple[str, bool]]
    if b.kind == "in-dir":
        out = [(str(adir), True), (missing, False), (str(good), False)]
    elif b.kind == "in-path":
        out = [(str(good), True), (str(adir), True), (missing, False)]
    elif b.kind == "out-file":
        out = [(str(tmp / "new.out"), True), (str(adir), False)]
    elif b.kind == "out-dir":
        out = [(str(tmp / "new-dir"), True), (str(good), False)]
    elif b.kind == "model":
        out = [(str(adir), True), ("org/name", True), (missing, False), (str(good), False)]
    else:  # in-file, source
        out = [(str(good), True), (missing, False), (str(adir), False)]
        if b.kind == "source":
            out.insert(1, ("a-name", True))
        if b.fmt in _BAD:
            bad = tmp / f"bad.{b.fmt}"
            bad.write_text(_BAD[b.fmt])
            out.append((str(bad), False))
        if hasattr(os, "geteuid") and os.geteuid() != 0:  # root reads anything
            locked = tmp / f"locked.{b.fmt or 'txt'}"
            locked.write_text(_GOOD[b.fmt])
            locked.chmod(0)
            out.append((str(locked), False))
    return out + [("", False)]


# -- constructors (what a declaration reads like) ---------------------------------------------
def Int(*, ge=None, gt=None, le=None, lt=None, nullable=False, why="") -> Bound:  # noqa: N802
    """An integer in the given range."""
    return Bound("int", ge, gt, le, lt, nullable=nullable, why=why)


def Float(*, ge=None, gt=None, le=None, lt=None, nullable=False, why="") -> Bound:  # noqa: N802
    """A finite number in the given range (nan and inf are refused)."""
    return Bound("float", ge, gt, le, lt, nullable=nullable, why=why)


def Choice(*values, nullable=False, why="") -> Bound:  # noqa: N802
    """One of ``values``."""
    return Bound("choice", choices=tuple(values), nullable=nullable, why=why)


def Text(*, empty=False, nullable=False, why="") -> Bound:  # noqa: N802
    """A non-empty string (free form: names, reasons, addresses); ``empty=True``: any string
    (where "" means "the default")."""
    return Bound("any-text" if empty else "text", nullable=nullable, why=why)


def InFile(fmt: str = "", *, nullable=False, why="") -> Bound:  # noqa: N802
    """An existing readable file (``fmt``: json, jsonl, yaml, or "" for any)."""
    return Bound("in-file", fmt=fmt, nullable=nullable, why=why)


def InDir(*, nullable=False, why="") -> Bound:  # noqa: N802
    """An existing directory."""
    return Bound("in-dir", nullable=nullable, why=why)


def InPath(*, nullable=False, why="") -> Bound:  # noqa: N802
    """An existing file or directory (a results file or the folder holding it)."""
    return Bound("in-path", nullable=nullable, why=why)


def OutFile(*, nullable=False, why="") -> Bound:  # noqa: N802
    """A file to write: anything but an existing directory."""
    return Bound("out-file", nullable=nullable, why=why)


def OutDir(*, nullable=False, why="") -> Bound:  # noqa: N802
    """A directory to write into: anything but an existing file."""
    return Bound("out-dir", nullable=nullable, why=why)


def Source(fmt: str = "", *, nullable=False, why="") -> Bound:  # noqa: N802
    """A named source (``bundled:train``, ``official500``, ``swegym:PATH``) or a path to a
    file (``fmt``: its format, "" any); a value that looks like a path (``/``, ``./``, a
    ``.jsonl`` suffix), alone or after a ``scheme:``, must be a readable file."""
    return Bound("source", fmt=fmt, nullable=nullable, why=why)


def ModelRef(*, nullable=False, why="") -> Bound:  # noqa: N802
    """A model directory, or a hub id ``org/name`` (a path-looking value must exist)."""
    return Bound("model", nullable=nullable, why=why)


# -- dataclass fields -------------------------------------------------------------------------
FIELD_BOUNDS: dict[type, dict[str, Bound]] = {}
"""class -> field name -> its bound: from :func:`declared` (the fields' own metadata) and
:func:`register` (fields a class inherits)."""


def declared(cls):
    """Class decorator (above ``@dataclass``): move each field's ``metadata["bounds"]`` into
    :data:`FIELD_BOUNDS` (the metadata keeps the rest, for ``HfArgumentParser``)."""
    own = FIELD_BOUNDS.setdefault(cls, {})
    for f in dataclasses.fields(cls):
        if "bounds" in f.metadata:
            own[f.name] = f.metadata["bounds"]
            f.metadata = type(f.metadata)({k: v for k, v in f.metadata.items() if k != "bounds"})
    return cls


def register(cls, table: dict[str, Bound]) -> None:
    """Add bounds of fields ``cls`` inherits (keyed by field name; a name ``cls`` lacks, or
    one already declared, raises KeyError)."""
    names = {f.name for f in dataclasses.fields(cls)}
    own = FIELD_BOUNDS.setdefault(cls, {})
    for name, b in table.items():
        if name not in names or name in own:
            raise KeyError(f"{cls.__name__}.{name}: " + ("no such field" if name not in names
                                                         else "bounds declared twice"))
        own[name] = b


def bound_of(cls, name: str) -> Bound | None:
    """The bound of field ``name`` of ``cls`` (its own, or the nearest base class's)."""
    for klass in getattr(cls, "__mro__", (cls,)):
        if name in FIELD_BOUNDS.get(klass, {}):
            return FIELD_BOUNDS[klass][name]
    return None


def check_value(name: str, b: Bound, value) -> None:
    """Raise BoundError (one line, ``--name``) when ``value`` (or any item of a list value) is
    outside ``b``."""
    for item in value if isinstance(value, (list, tuple)) and b.kind != "choice" else [value]:
        msg = b.refusal(f"--{name}", item)
        if msg is not None:
            raise BoundError(msg)


def check_fields(obj) -> None:
    """Check every field of the dataclass instance ``obj`` that has a bound
    (:func:`bound_of`). Raises BoundError naming the first field outside its bounds."""
    for f in dataclasses.fields(obj):
        b = bound_of(type(obj), f.name)
        if b is not None:
            check_value(f.name, b, getattr(obj, f.name))


# -- argparse -------------------------------------------------------------------------------
def use_bounds(parser: argparse.ArgumentParser, classes) -> None:
    """Make the declared bounds of ``classes``' fields the ``type=`` of the arguments
    ``HfArgumentParser`` made from them, so a bad value is refused by argparse naming the flag
    (its own type names only the type). Switches (``bool`` fields) are left as they are."""
    for action in parser._actions:  # argparse has no public accessor
        if action.nargs == 0 or action.type is None or getattr(action.type, "__name__", "") in (
                "string_to_bool",):
            continue
        for cls in classes:
            b = bound_of(cls, action.dest)
            if b is not None:
                action.type = b
                break


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line (``prog: error: ...``, exit 2),
    without the usage block; subcommand parsers are of the same class."""

    def error(self, message: str):
        """Print ``prog: error: message`` on stderr and exit 2."""
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def flag_bounds(parser: argparse.ArgumentParser) -> list[tuple[str, Bound | None]]:
    """(flag, bound) of each value-taking argument of ``parser`` (not its subcommands): the
    ``type=`` bound, a ``choices`` list as a :func:`Choice`, or None (undeclared). Switches
    (``store_true`` and the like) and ``--help`` take no value and are left out."""
    out = []
    for a in parser._actions:  # argparse has no public accessor
        if a.nargs == 0 or isinstance(a, argparse._SubParsersAction):
            continue
        name = max(a.option_strings, key=len) if a.option_strings else a.dest
        if isinstance(a.type, Bound):
            out.append((name, a.type))
        elif a.choices is not None:
            out.append((name, Choice(*a.choices)))
        else:
            out.append((name, None))
    return out

