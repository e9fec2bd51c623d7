"""Reference pages generated from the code at docs build time (so they cannot drift).

* :func:`config_reference` — a Markdown table of every ``ECreditConfig`` field the project
  adds to TRL's ``GRPOConfig`` (name, type, default, the field's ``metadata["help"]``), the
  main job's ``ModelArguments`` / ``RunArguments``, the ``GRPOConfig`` fields the embedded
  default sets (``ecredit_trl.train.embedded_defaults``) and the ``GRPOConfig`` fields the
  code under ``ecredit_trl/`` reads (found by an AST scan, not a hand-kept list).
* :func:`own_fields_table` — that first table alone (the Training page).
* :func:`cli_reference` — the ``--help`` text of every argparse parser in ``ecredit_trl/``,
  ``eval/``, ``sandbox/`` and ``benchmarks/`` (subcommands included), captured in-process:
  each module's ``main()`` is called with ``ArgumentParser.parse_args`` patched to hand the
  parser back before anything runs, so one build imports torch/TRL once (seconds, not the
  minutes of one ``--help`` subprocess per CLI).

Used by ``docs/hooks.py`` (MkDocs) and by ``tests/test_docs.py``. Raises
:class:`CliCaptureError` naming the file when a CLI's parser cannot be captured.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import os
import re
import runpy
import sys
from contextlib import contextmanager
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
CLI_DIRS = ("ecredit_trl", "eval", "sandbox", "benchmarks")
# train.py's only ArgumentParser is the add_help=False pre-parser of its session arguments;
# its CLI is transformers' HfArgumentParser over the config dataclasses (config reference).
TRAIN = "ecredit_trl/train.py"
HELP_COLUMNS = "100"
# a parser is argparse's or sandbox.bounds' one-line-error subclass (not its class statement)
_CALL = re.compile(r"^(?!class ).*\b(argparse\.)?ArgumentParser\(", re.MULTILINE)
# the generator imports the project's packages from this checkout (no install needed)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sandbox.bounds import bound_of, flag_bounds  # noqa: E402 - after the path entry above


class CliCaptureError(RuntimeError):
    """A CLI's parser could not be captured (its ``main`` ran past or never reached
    ``parse_args``)."""


def cli_sources(root: Path = ROOT) -> list[str]:
    """Repository-relative paths of every ``.py`` file under :data:`CLI_DIRS` that calls
    ``argparse.ArgumentParser(``, sorted."""
    out = []
    for top in CLI_DIRS:
        for path in sorted((root / top).rglob("*.py")):
            if _CALL.search(path.read_text(encoding="utf-8")):
                out.append(path.relative_to(root).as_posix())
    return sorted(out)


def command_of(rel: str) -> str:
    """How a user runs the CLI in ``rel``: ``python -m pkg.mod``, ``python benchmarks/x.py``
    or ``accelerate launch ecredit_trl/train.py``."""
    if rel == TRAIN:
        return "accelerate launch ecredit_trl/train.py"
    if rel.startswith("benchmarks/"):
        return f"python {rel}"
    mod = rel[:-3].replace("/", ".")
    return "python -m " + mod.removesuffix(".__main__")


def console_scripts(root: Path = ROOT) -> dict[str, str]:
    """Repository-relative CLI source → its command (``eval/run.py`` → ``ecredit-eval``),
    from ``[project.scripts]`` of ``pyproject.toml``: each entry is ``module:function``;
    the source is ``module.py`` or ``module/__main__.py`` when the module is a package's
    ``__main__``. Raises KeyError naming the entry when neither file exists."""
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    out = {}
    for name, target in scripts.items():
        rel = target.split(":")[0].replace(".", "/") + ".py"
        if not (root / rel).is_file():
            raise KeyError(f"pyproject.toml [project.scripts] {name}: no {rel}")
        out[rel] = name
    return out


def anchor_of(rel: str) -> str:
    """The heading id of a CLI on the CLI reference page (``cli-eval-run``)."""
    return "cli-" + re.sub(r"[^a-z0-9]+", "-", command_of(rel).split()[-1].lower()).strip("-")


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__(parser.prog)
        self.parser = parser


@contextmanager
def _capturing():
    orig = argparse.ArgumentParser.parse_args

    def grab(self, *args, **kwargs):
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = grab
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = orig


@contextmanager
def _columns():
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def capture_parser(rel: str, root: Path = ROOT) -> argparse.ArgumentParser:
    """The parser that ``main()`` of the file ``rel`` builds, without running the command.

    Raises: CliCaptureError naming ``rel`` when ``main`` is missing or returns/raises
    without reaching ``parse_args``.
    """
    if rel.startswith("benchmarks/"):
        main = runpy.run_path(str(root / rel), run_name="ecredit_docs_cli").get("main")
    else:
        main = getattr(importlib.import_module(rel[:-3].replace("/", ".")), "main", None)
    if main is None:
        raise CliCaptureError(f"{rel}: no main() to build its parser")
    # a parser without prog= names itself after sys.argv[0], as when run as a script
    argv0, sys.argv[0] = sys.argv[0], rel
    with _capturing():
        try:
            main()
        except _Captured as got:
            return got.parser
        except BaseException as exc:  # noqa: BLE001 - reported with the file's name
            raise CliCaptureError(f"{rel}: main() raised {exc!r} before parse_args") from exc
        finally:
            sys.argv[0] = argv0
    raise CliCaptureError(f"{rel}: main() returned without calling parse_args")


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """(name, parser) of each subcommand of ``parser``, aliases left out, in order."""
    out, seen = [], set()
    for action in parser._actions:  # argparse has no public accessor for subparsers
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    out.append((name, sub))
    return out


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every ``--flag`` of ``parser`` and of its subcommands."""
    out = {s for a in parser._actions for s in a.option_strings}
    for _, sub in subcommands(parser):
        out |= option_strings(sub)
    return out


def _help_block(parser: argparse.ArgumentParser) -> str:
    with _columns():
        text = parser.format_help().rstrip()
    return f"```text\n{text}\n```\n"


def cli_reference(root: Path = ROOT) -> str:
    """Markdown of every CLI's ``--help`` (the body of ``docs/reference/cli.md``)."""
    parts, scripts = [], console_scripts(root)
    for rel in cli_sources(root):
        cmd = command_of(rel)
        script = scripts.get(rel)
        also = f" Installed as the command `{script}` (the same parser)." if script else ""
        parts.append(f"## `{cmd}` {{#{anchor_of(rel)}}}\n\nSource: `{rel}`.{also}\n")
        if rel == TRAIN:
            parts.append("Takes every field of the [configuration reference](config.md) as "
                         "`--field value` (or `--field-value`), plus `--config FILE.yaml`; "
                         "the session arguments `--resume-from`, `--allow-changed`, "
                         "`--reason` are listed there too. `--help` prints all of them "
                         "(several hundred, TRL's included).\n")
            continue
        parser = capture_parser(rel, root)
        parts.append(_help_block(parser))
        parts.append(_flag_table(parser))
        for name, sub in subcommands(parser):
            parts.append(f"### `{cmd} {name}`\n\n{_help_block(sub)}\n{_flag_table(sub)}")
    return "\n".join(parts)


# -- configuration ----------------------------------------------------------------------------
def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    if isinstance(value, list):
        return " ".join(f"`{v}`" for v in value) if value else "[] (empty)"
    if value == "":
        return '"" (empty)'  # an empty code span renders as two bare backticks
    return f"`{value}`"


def _cell(text: str) -> str:
    # argparse-style help strings escape % as %%
    return " ".join(str(text).split()).replace("%%", "%").replace("|", "\\|")


def _type_name(cls, f: dataclasses.Field) -> str:
    """A field's annotation as written in its class (the string under ``from __future__
    import annotations``), read from ``__annotations__`` rather than ``Field.type``:
    transformers' ``HfArgumentParser`` replaces ``Field.type`` in place by the resolved and
    narrowed type (``str | None`` becomes ``str``) in any process that parsed a config, and
    the reference must not depend on that."""
    for k in (cls.__mro__ if cls is not None else ()):
        t = vars(k).get("__annotations__", {}).get(f.name)
        if t is not None:
            break
    else:
        t = f.type
    if isinstance(t, str):
        return t
    return t.__name__ if isinstance(t, type) else str(t).replace("typing.", "")


def _prose(text: str) -> str:
    """Help text for a table cell outside a code span: ``<`` and ``>`` escaped, since
    Markdown passes ``<placeholder>`` through as an (unknown, invisible) HTML tag."""
    return _cell(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _bounds_cell(cls, name: str) -> str:
    """The field's declared bounds in words (:mod:`sandbox.bounds`), or "-" (a switch, or a
    field passed through to TRL unchecked)."""
    b = bound_of(cls, name) if cls is not None else None
    return _prose(b.describe()) if b is not None else "-"


def _field_table(fields, cls=None) -> str:
    rows = ["| field | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    for f in fields:
        rows.append(f"| `{f.name}` | `{_cell(_type_name(cls, f))}` | {_cell(_default(f))} | "
                    f"{_bounds_cell(cls, f.name)} | {_prose(f.metadata.get('help', ''))} |")
    return "\n".join(rows) + "\n"


def _flag_table(parser: argparse.ArgumentParser) -> str:
    """``| flag | allowed |`` of each value-taking argument of ``parser`` (its bounds)."""
    rows = ["| flag | allowed |", "|---|---|"]
    for flag, b in flag_bounds(parser):
        rows.append(f"| `{flag}` | {_prose(b.describe()) if b is not None else '-'} |")
    return "\n".join(rows) + "\n" if len(rows) > 2 else ""


def own_config_fields() -> list[dataclasses.Field]:
    """``ECreditConfig`` fields that ``GRPOConfig`` does not have, in declaration order."""
    from trl import GRPOConfig

    from ecredit_trl.config import ECreditConfig

    base = {f.name for f in dataclasses.fields(GRPOConfig)}
    return [f for f in dataclasses.fields(ECreditConfig) if f.name not in base]


def own_fields_table() -> str:
    """Markdown table of the :func:`own_config_fields` (the Training page's field list)."""
    from ecredit_trl.config import ECreditConfig

    return _field_table(own_config_fields(), ECreditConfig)


def _is_config(recv: ast.expr, in_config_py: bool) -> bool:
    """Whether ``recv`` names the run's config: ``cfg`` / ``ecfg``, ``<x>.ecfg``, the
    trainer's ``self.args`` / ``trainer.args``, or ``self`` inside ``config.py``."""
    if isinstance(recv, ast.Name):
        return recv.id in ("cfg", "ecfg") or (in_config_py and recv.id == "self")
    if isinstance(recv, ast.Attribute) and isinstance(recv.value, ast.Name):
        return recv.attr == "ecfg" or (
            recv.attr == "args" and recv.value.id in ("self", "trainer"))
    return False


def _reads(root: Path, names: set[str]) -> dict[str, set[str]]:
    """GRPOConfig field name -> files under ecredit_trl/ that read it from the run's config
    (:func:`_is_config`). ``ecredit_trl/study/`` is left out: its ``cfg`` is a study config."""
    out: dict[str, set[str]] = {}
    for path in sorted((root / "ecredit_trl").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("ecredit_trl/study/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr in names
                    and _is_config(node.value, rel == "ecredit_trl/config.py")):
                out.setdefault(node.attr, set()).add(rel)
    return out


def config_reference(root: Path = ROOT) -> str:
    """Markdown of the configuration reference (the body of ``docs/reference/config.md``)."""
    from trl import GRPOConfig

    from ecredit_trl.config import (
        INHERITED,
        MIN_TURN_TOKENS,
        SIZE_FIELDS,
        ECreditConfig,
        ModelArguments,
        RunArguments,
    )
    from ecredit_trl.train import embedded_defaults

    grpo = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    every = {f.name: f for f in dataclasses.fields(ECreditConfig)}
    own = {f.name for f in own_config_fields()}
    parts = [
        f"## ECreditConfig fields {{#ecreditconfig}}\n\n`ecredit_trl.config.ECreditConfig` "
        f"adds {len(own)} fields to `trl.GRPOConfig` "
        f"({len(dataclasses.fields(ECreditConfig))} fields in all).\n",
        _field_table(own_config_fields(), ECreditConfig),
        "## Model arguments {#model-arguments}\n\n`ecredit_trl.config.ModelArguments`: which "
        "policy to train and how (recorded in the manifest as `model.<field>`).\n",
        _field_table(dataclasses.fields(ModelArguments), ModelArguments),
        "## Session arguments {#session-arguments}\n\n`ecredit_trl.config.RunArguments`: "
        "session control, never part of the run's config or its hashes.\n",
        _field_table(dataclasses.fields(RunArguments), RunArguments),
    ]
    rows = ["| field | TRL default | allowed |", "|---|---|---|"]
    for name in sorted(INHERITED):
        rows.append(f"| `{name}` | {_cell(_default(grpo[name]))} | "
                    f"{_bounds_cell(ECreditConfig, name)} |")
    parts.append("## Bounds of the inherited fields {#inherited-bounds}\n\n"
                 "`ecredit_trl.config.INHERITED`: the GRPOConfig / TrainingArguments fields "
                 "a run checks (with the command line's own fields, before the run directory "
                 "is made; [Development](../development.md#declaring-bounds)). `max_steps` "
                 "defaults to 2 here (TRL: -1, 'train epochs instead', refused). The field "
                 "combinations checked too: the generation batch holds whole groups of "
                 "`num_generations` (TRL's rule), `max_completion_length` >= "
                 f"{MIN_TURN_TOKENS} tokens (one turn), a resume keeps "
                 + ", ".join(f"`{n}`" for n in SIZE_FIELDS) + " and the world size.\n")
    parts.append("\n".join(rows) + "\n")
    cpu, gpu = embedded_defaults(False), embedded_defaults(True)
    rows = ["| field | embedded value (CPU) | on a CUDA host | meaning (the field's help) |", "|---|---|---|---|"]
    for name in sorted(cpu):
        help_ = every[name].metadata.get("help", "") if name in every else ""
        on_gpu = f"`{gpu[name]}`" if name in gpu else "TRL's default"
        rows.append(f"| `{name}` | `{cpu[name]}` | {on_gpu} | {_prose(help_[:300])} |")
    parts.append("## GRPOConfig fields the embedded default sets {#embedded-defaults}\n\n"
                 "`ecredit_trl.train.embedded_defaults`: the values a run starts from, before "
                 "`--config` YAML and the command line (both win over them).\n")
    parts.append("\n".join(rows) + "\n")
    reads = _reads(root, set(grpo) - own)
    rows = ["| field | TRL default | read in |", "|---|---|---|"]
    for name in sorted(reads):
        rows.append(f"| `{name}` | {_cell(_default(grpo[name]))} | "
                    + ", ".join(f"`{p}`" for p in sorted(reads[name])) + " |")
    parts.append("## GRPOConfig fields the code relies on {#grpo-fields-read}\n\n"
                 "Found by scanning `ecredit_trl/` for reads of a GRPOConfig field from the "
                 "run's config (`cfg.<field>`, `ecfg.<field>`, the trainer's "
                 "`self.args.<field>`, `self.<field>` in `ECreditConfig`). Every other GRPOConfig / TrainingArguments field passes through to "
                 "TRL unchanged (`--help` lists them).\n")
    parts.append("\n".join(rows) + "\n")
    return "\n".join(parts)
