"""The docs are checked against the code: the MkDocs site builds with
``--strict`` (broken links and anchors fail), every command block marked runnable in
README.md and docs/ runs, every CLI a command block names has its ``--help`` run, every flag
a command block passes exists in that CLI's parser, and the generated references cover every
``ECreditConfig`` field and every CLI.

Runnable marker: the line ``<!-- runnable -->`` right before a fenced block (see
docs/development.md). Only such blocks run; the others (training, pulls, GPU) are parsed.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "docs"))
import gen_ref  # noqa: E402 - docs/ is not a package

MARKER = "<!-- runnable -->"
PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
PROJECT_TOPS = ("ecredit_trl", "eval", "sandbox")
SCRIPT_SOURCES = {name: rel for rel, name in gen_ref.console_scripts().items()}


@dataclasses.dataclass
class Block:
    """One fenced code block of a page: where it is, its info string, its text."""

    page: str
    line: int
    info: str
    text: str
    runnable: bool


def blocks(path: Path) -> list[Block]:
    """Fenced blocks at the top level of a Markdown file (blocks shown inside a longer fence
    are content, not blocks). ``runnable``: the previous non-blank line is the marker."""
    out, lines = [], path.read_text(encoding="utf-8").splitlines()
    i, prev = 0, ""
    while i < len(lines):
        m = re.match(r"^(\s*)(`{3,})(.*)$", lines[i])
        if not m:
            if lines[i].strip():
                prev = lines[i].strip()
            i += 1
            continue
        fence, start, body = m.group(2), i, []
        i += 1
        while i < len(lines) and not re.match(rf"^\s*{fence}\s*$", lines[i]):
            body.append(lines[i])
            i += 1
        out.append(Block(path.relative_to(REPO_ROOT).as_posix(), start + 1,
                         m.group(3).strip(), "\n".join(body), prev == MARKER))
        i, prev = i + 1, ""
    return out


ALL_BLOCKS = [b for p in PAGES for b in blocks(p)]
RUNNABLE = [b for b in ALL_BLOCKS if b.runnable]
SHELL = [b for b in ALL_BLOCKS if b.info in ("bash", "sh", "")]


def commands(text: str) -> list[str]:
    """Shell command lines of a block: continuation lines joined, comments dropped."""
    out, cur = [], ""
    for raw in text.splitlines():
        line = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip():
            out.append(cur.strip())
        cur = ""
    return out


def cli_calls(line: str) -> list[tuple[str, list[str]]]:
    """(CLI source file, its arguments) for each project CLI a command line runs.

    ``python -m pkg.mod`` → ``pkg/mod.py`` or ``pkg/mod/__main__.py``;
    ``python benchmarks/x.py``; ``ecredit_trl/train.py`` (after ``accelerate launch ...``);
    an installed command (``ecredit-eval``, ``.venv/bin/ecredit-eval``) → the source of its
    ``[project.scripts]`` entry. Pipelines and ``&&`` chains are split first. A module outside
    the project is skipped.
    """
    out = []
    for part in re.split(r"&&|\|\||;|\|", line):
        try:
            words = shlex.split(part)
        except ValueError:
            words = part.split()
        for k, w in enumerate(words):
            if w.rpartition("/")[2] in SCRIPT_SOURCES:
                out.append((SCRIPT_SOURCES[w.rpartition("/")[2]], words[k + 1:]))
                break
            if w == "-m" and k + 1 < len(words) and words[k - 1].endswith("python"):
                mod = words[k + 1]
                if mod.split(".")[0] not in PROJECT_TOPS:
                    break
                base = mod.replace(".", "/")
                rel = f"{base}.py" if (REPO_ROOT / f"{base}.py").exists() else f"{base}/__main__.py"
                out.append((rel, words[k + 2:]))
                break
            if w.endswith(".py") and (w.startswith("benchmarks/") or w == gen_ref.TRAIN):
                out.append((w, words[k + 1:]))
                break
    return out


def test_mkdocs_strict_build(tmp_path):
    """The site builds with --strict (links, anchors, nav) and its generated pages hold
    every ECreditConfig field and every CLI."""
    site = tmp_path / "site"
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                         env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    config_html = (site / "reference" / "config" / "index.html").read_text()
    for f in gen_ref.own_config_fields():
        assert f'<code>{f.name}</code>' in config_html, f.name
    assert "generated: config-reference" not in config_html
    # a <placeholder> in help text is shown, not swallowed as an unknown HTML tag
    assert "runs/&lt;prefix&gt;-&lt;arm&gt;-" in config_html
    cli_html = (site / "reference" / "cli" / "index.html").read_text()
    for rel in gen_ref.cli_sources():
        assert f'id="{gen_ref.anchor_of(rel)}"' in cli_html, rel


def test_runnable_blocks_exist_and_are_shell():
    assert len(RUNNABLE) >= 10
    bad = [f"{b.page}:{b.line} ({b.info!r})" for b in RUNNABLE if b.info not in ("bash", "sh")]
    assert bad == []


@pytest.mark.parametrize("block", RUNNABLE, ids=[f"{b.page}:{b.line}" for b in RUNNABLE])
def test_runnable_block_runs(block):
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"{block.page}:{block.line}\n{run.stdout[-2000:]}{run.stderr[-3000:]}"
    if "--help" in block.text:
        assert run.stdout.count("usage:") >= block.text.count("--help"), run.stdout[-2000:]


def test_every_cli_named_has_its_help_run():
    """A CLI a command block names exists in the code, and a runnable block runs its --help
    (for a subcommand: the CLI's own --help or the subcommand's)."""
    named, helped = set(), set()
    for b in SHELL:
        for line in commands(b.text):
            for rel, args in cli_calls(line):
                named.add(rel)
                if b.runnable and "--help" in args:
                    helped.add(rel)
    known = set(gen_ref.cli_sources())
    assert sorted(named - known) == []
    assert sorted(named - helped) == []
    assert {"ecredit_trl/study/__main__.py", "eval/run.py", "sandbox/__main__.py",
            gen_ref.TRAIN} <= helped


def _train_flags() -> set[str]:
    from ecredit_trl.config import ECreditConfig, ModelArguments, RunArguments

    names = [f.name for dc in (ECreditConfig, ModelArguments, RunArguments)
             for f in dataclasses.fields(dc)]
    return {"--help"} | {f"--{n}" for n in names} | {"--" + n.replace("_", "-") for n in names}


def test_every_flag_in_a_command_block_exists():
    """Flags the docs give a project CLI are options of its parser (ECreditConfig /
    ModelArguments / RunArguments fields for train.py), so an example cannot drift."""
    parsers, missing = {}, []
    train_flags, known = _train_flags(), set(gen_ref.cli_sources())
    for b in SHELL:
        for line in commands(b.text):
            for rel, args in cli_calls(line):
                if rel not in known:  # an unknown CLI fails test_every_cli_named_...
                    continue
                if rel == gen_ref.TRAIN:
                    valid = train_flags
                else:
                    if rel not in parsers:
                        parsers[rel] = gen_ref.capture_parser(rel)
                    valid = gen_ref.option_strings(parsers[rel]) | {"--help"}
                for a in args:
                    flag = a.split("=")[0]
                    if flag.startswith("--") and flag != "--" and flag not in valid:
                        missing.append(f"{b.page}:{b.line}: {rel} {flag}")
    assert missing == []


def test_cli_sources_find_every_parser_and_capture_it():
    """Every file of ecredit_trl/, eval/, sandbox/, benchmarks/ that builds an argparse parser
    is in the CLI reference, and each parser is captured without running its command."""
    found = []
    for top in gen_ref.CLI_DIRS:
        for path in (REPO_ROOT / top).rglob("*.py"):
            # a parser call, argparse's or sandbox.bounds' subclass (not that class statement)
            if re.search(r"^(?!class ).*ArgumentParser\(", path.read_text(encoding="utf-8"),
                         re.MULTILINE):
                found.append(path.relative_to(REPO_ROOT).as_posix())
    assert sorted(found) == gen_ref.cli_sources()
    for rel in gen_ref.cli_sources():
        if rel != gen_ref.TRAIN:
            assert gen_ref.capture_parser(rel).format_help().startswith("usage:"), rel


def test_config_reference_lists_every_own_field_with_its_help():
    from trl import GRPOConfig

    from ecredit_trl.config import ECreditConfig

    text = gen_ref.config_reference()
    base = {f.name for f in dataclasses.fields(GRPOConfig)}
    own = [f for f in dataclasses.fields(ECreditConfig) if f.name not in base]
    assert [f.name for f in gen_ref.own_config_fields()] == [f.name for f in own]
    for f in own:
        row = next(r for r in text.splitlines() if r.startswith(f"| `{f.name}` |"))
        help_ = " ".join(f.metadata["help"].split()).replace("|", "\\|")
        assert help_.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in row, f.name
    assert "| `arm` | `str` | `B` |" in text
    # an empty string default is written out; an empty code span would show as two backticks
    assert "| `ray_podman_url` | `str` | \"\" (empty) |" in text
    assert "``" not in text


def test_readme_stays_short_and_opens_with_the_two_commands():
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    shell = [b.text for b in blocks(REPO_ROOT / "README.md") if b.info == "bash"]
    assert shell[:2] == [
        "bash scripts/setup.sh && .venv/bin/accelerate launch ecredit_trl/train.py --arm B",
        "bash scripts/setup.sh && .venv/bin/python -m pytest -q"]
    assert re.findall(r"^## .*", text, re.M)[0].startswith("## Two commands")
    ci = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert shell[1] in ci
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        assert (REPO_ROOT / target).exists(), target
