"""Git commands that obey only us: private git directories, safe config and environment.

Host-side git must never read anything the agent can write (design page, "Threat model"): its
``.git/config`` (``core.fsmonitor``, ``filter.<x>.clean``, ``diff.<x>.textconv`` name
programs), hooks, attributes, excludes or object stores. Every command here runs with
an explicit ``--git-dir`` that only we write, ``-c`` overrides of every key that runs a
program or changes what is stored, and an environment without ``GIT_*`` variables or
system/global config. Used by :mod:`sandbox.snapshots.snapshot`.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

DEFAULT_SNAPSHOT_IGNORE: tuple[str, ...] = (
    "__pycache__/", "*.pyc", "*.pyo", ".pytest_cache/", "*.egg-info/", ".coverage",
    ".coverage.*", "coverage.xml", "htmlcov/", ".mypy_cache/", ".ruff_cache/",
    ".hypothesis/", ".tox/", ".nox/",
)
"""Generated files that are never edits (design page, "Edit blocks and eligibility"): a
pattern ending in ``/`` names a directory at any depth, one without ``/`` a file name at any
depth, others a whole path (``fnmatch`` globs, case-sensitive)."""

ATTRIBUTE_RESETS = "* !text !eol !crlf !ident !filter !diff !merge !working-tree-encoding\n"
"""``info/attributes`` of every private store: no conversion, filter or diff driver."""

_CONFIG = """\
[core]
\trepositoryformatversion = 0
\tbare = false
\tfilemode = true
\tsymlinks = true
\tignorecase = false
\tprecomposeunicode = false
\tautocrlf = false
\tsafecrlf = false
\tfsmonitor = false
\tuntrackedCache = false
\tsplitIndex = false
\thooksPath = /dev/null
\tattributesFile = /dev/null
\texcludesFile = /dev/null
\tsparseCheckout = false
\tquotePath = false
[index]
\tsparse = false
[gc]
\tauto = 0
[maintenance]
\tauto = false
"""

_SAFE_C = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null",
           "-c", "core.attributesFile=/dev/null", "-c", "core.excludesFile=/dev/null",
           "-c", "core.autocrlf=false", "-c", "core.safecrlf=false", "-c", "core.filemode=true",
           "-c", "core.symlinks=true", "-c", "core.untrackedCache=false",
           "-c", "core.splitIndex=false", "-c", "gc.auto=0")
"""Command-line overrides on every call (they win over any repository config)."""


class SnapshotError(RuntimeError):
    """A git operation on snapshot trees failed; the message names the repo and step."""


def git_env(index_file: str | os.PathLike | None = None) -> dict[str, str]:
    """Our process environment minus every ``GIT_*`` variable, plus no system/global
    config or attributes, no prompts, no optional locks, no replace refs; with
    ``GIT_INDEX_FILE`` when ``index_file`` is given."""
    # No GIT_* from our caller (GIT_DIR, GIT_OBJECT_DIRECTORY, GIT_CONFIG_PARAMETERS, ...),
    # no system/global config or attributes: only what we pass decides what git does.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_ATTR_NOSYSTEM="1",
               GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0", GIT_NO_REPLACE_OBJECTS="1",
               GIT_NO_LAZY_FETCH="1")
    if index_file is not None:
        env["GIT_INDEX_FILE"] = str(index_file)
    return env


def run_git(git_dir: Path, args: list[str], *, work_tree: Path | None = None, index_file=None,
         input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run git on ``git_dir`` (and ``work_tree``, also the cwd) with our config only.

    Raises: SnapshotError naming the command and directory when ``check`` and git fails.
    """
    return run_git_together(git_dir, [(args, input, check)], work_tree=work_tree,
                            index_file=index_file)[0]


def run_git_together(git_dir: Path, calls: Sequence[tuple[list[str], bytes | None, bool]], *,
                     work_tree: Path | None = None,
                     index_file=None) -> list[subprocess.CompletedProcess]:
    """Run several git commands at once, as :func:`run_git` runs one, and wait for all.

    ``calls``: ``(args, input, check)`` per command. Only for commands whose results do not
    depend on each other (a snapshot's ``add -u`` beside its ``ls-files --others``: the
    first rewrites the index atomically, the second reads either version, and both list
    the same untracked files). A process costs ~2 ms to start here, the lstat pass ~8 ms at
    5k files; side by side they overlap on a second core.

    Returns: one CompletedProcess per call, in order (stdout and stderr as bytes).
    Raises: SnapshotError naming the first command with ``check`` that failed, after all ended.
    """
    cmd = ["git", f"--git-dir={git_dir}"]
    if work_tree is not None:
        cmd.append(f"--work-tree={work_tree}")
    env = git_env(index_file)
    procs = [subprocess.Popen([*cmd, *_SAFE_C, *args], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              cwd=work_tree or git_dir, env=env)
             for args, _, _ in calls]
    done = []
    for proc, (_, data, _) in zip(procs, calls, strict=True):
        out, err = proc.communicate(data)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    for proc, (args, _, check) in zip(done, calls, strict=True):
        if check and proc.returncode != 0:
            raise SnapshotError(
                f"git {' '.join(args[:3])} failed in {work_tree or git_dir}: "
                f"{proc.stderr.decode(errors='replace').strip()}")
    return done


def store_of(repo: str | os.PathLike) -> Path:
    """The git directory that holds the snapshot trees of ``repo``.

    ``repo`` is a git directory (a :attr:`Snapshotter.git_dir`, or any bare store) or a
    working tree whose ``.git`` directory only the caller writes (never an agent's tree:
    pass its snapshotter's ``git_dir``).

    Raises: SnapshotError naming ``repo`` when it is neither.
    """
    p = Path(repo)
    if (p / ".git").is_dir():
        return p / ".git"
    if (p / "HEAD").is_file() and (p / "objects").is_dir():
        return p
    raise SnapshotError(f"{repo}: neither a git directory nor a working tree with a .git "
                        "directory")


def trusted_git_dir(repo: Path) -> Path:
    """Git dir of a repository we made (read once, before any agent runs in it)."""
    if not (repo / ".git").exists() and not (repo / "HEAD").is_file():
        raise SnapshotError(f"{repo} is not a git working tree (no .git)")
    proc = subprocess.run(["git", "-C", str(repo), *_SAFE_C, "rev-parse", "--absolute-git-dir"],
                          capture_output=True, env=git_env())
    if proc.returncode != 0:
        raise SnapshotError(f"{repo} is not a git repository: "
                            f"{proc.stderr.decode(errors='replace').strip()}")
    return Path(proc.stdout.decode().strip())


def write_private_config(git_dir: Path) -> None:
    """Replace ``git_dir``'s config, ``info/attributes``, ``info/exclude`` and hooks by ours."""
    (git_dir / "config").write_text(_CONFIG)
    info = git_dir / "info"
    info.mkdir(exist_ok=True)
    (info / "attributes").write_text(ATTRIBUTE_RESETS)
    (info / "exclude").write_text("")
    shutil.rmtree(git_dir / "hooks", ignore_errors=True)


def init_store(git_dir: Path, alternates: Sequence[Path]) -> None:
    """A new private git directory whose objects fall back on ``alternates``."""
    proc = subprocess.run(["git", "init", "-q", "--bare", "--template=", str(git_dir)],
                          capture_output=True, env=git_env())
    if proc.returncode != 0:
        raise SnapshotError(f"git init of the private store {git_dir} failed: "
                            f"{proc.stderr.decode(errors='replace').strip()}")
    write_private_config(git_dir)
    info = git_dir / "objects" / "info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "alternates").write_text("".join(f"{a}\n" for a in alternates))


def translate_ignore(text: str, directory: str) -> list[str]:
    """Rewrite the ``.gitignore`` of ``directory`` (POSIX, ``""`` = root) as root-level rules.

    gitignore semantics: a pattern with a slash before its end is relative to the
    file's directory, one without matches at any depth below it (``dir/**/pat``);
    ``!`` negations, comments and blank lines keep their meaning.
    source: gitignore(5) "PATTERN FORMAT".
    """
    out = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if not directory:
            out.append(line)
            continue
        neg = line.startswith("!")
        body = line[1:] if neg else line
        if "/" in body.rstrip("/"):
            body = f"{directory}/{body.lstrip('/')}"
        else:
            body = f"{directory}/**/{body}"
        out.append(("!" if neg else "") + body)
    return out


def is_generated(path: str, patterns: Iterable[str] = DEFAULT_SNAPSHOT_IGNORE) -> bool:
    """Whether ``path`` (repository-relative POSIX) matches a generated-file pattern.

    See :data:`DEFAULT_SNAPSHOT_IGNORE` for the pattern forms.
    """
    parts = path.split("/")
    for pat in patterns:
        if pat.endswith("/"):
            if any(fnmatch.fnmatchcase(part, pat[:-1]) for part in parts[:-1]):
                return True
        elif "/" in pat:
            if fnmatch.fnmatchcase(path, pat):
                return True
        elif fnmatch.fnmatchcase(parts[-1], pat):
            return True
    return False


def check_patterns(patterns) -> tuple[str, ...]:
    """``patterns`` as a tuple; ValueError naming ``snapshot_ignore`` unless non-empty strings."""
    if isinstance(patterns, str) or not all(isinstance(p, str) and p.strip() for p in patterns):
        raise ValueError(f"snapshot_ignore: expected a list of non-empty glob strings, "
                         f"got {patterns!r}")
    return tuple(patterns)
