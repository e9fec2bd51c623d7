"""The bundled-task recipe (``datasets/bundled.yaml``): its schema, loader and cache key.

The cache key (:func:`recipe_hash`) covers the recipe, :data:`BUILDER_VERSION` and the image
name only, never the builder's source: moving code does not rebuild; a change of output
for the same recipe must bump :data:`BUILDER_VERSION`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from eval.files import datasets_dir

#: Bump when the builder's output for the same recipe changes (it is part of the cache key).
#: 3: pristine and gold run twice, flaky tests and candidates dropped.
#: 4: multi-block tasks (two mutations in one task, :mod:`eval.tasks.bundled.multi`).
#: 5: pair parts screened only (no controls of their own), a pair's screening trial is its
#:    empty control, pairs tried only until the target count is kept (build cost).
BUILDER_VERSION = 5
PARSER = "parse_log_pytest"
PYTEST_CMD = "python3 -m pytest -rA -p no:cacheprovider"
KINDS = ("compare", "arith", "augassign", "boolop", "negate", "constant", "bool", "return", "drop")


class BuildError(RuntimeError):
    """The bundled set could not be built; the message names the project and step."""


def cache_dir() -> Path:
    """``$ECREDIT_CACHE`` or ``~/.cache/ecredit-trl``."""
    env = os.environ.get("ECREDIT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ecredit-trl"


def default_recipe_path() -> Path:
    return datasets_dir() / "bundled.yaml"


#: Units a held-out split may group instances by: the mutated module, or the function (or
#: method, class-qualified) that holds the mutation.
HELDOUT_UNITS = ("module", "function")


@dataclass(frozen=True)
class HeldoutSpec:
    """How a world recipe splits its instances into training and held-out ones.

    ``by``: one of :data:`HELDOUT_UNITS`; every instance of one unit lands in the same split,
    so a held-out instance mutates code no training instance mutates. ``fraction``: share of
    units held out, in (0, 1); a unit is held out when the first 8 bytes of
    ``sha256("<seed>:<project>:<unit>")``, read as an integer over 2**64, fall below it
    (:func:`eval.tasks.bundled.world.unit_split`).
    """

    by: str
    fraction: float


@dataclass(frozen=True)
class ModuleSpec:
    """A library file to mutate and the test files (repo-relative) that exercise it."""

    path: str
    tests: tuple[str, ...]
    coverage: str = "names"


@dataclass(frozen=True)
class ProjectRecipe:
    name: str
    version: str
    sdist: str
    sha256: str
    homepage: str
    env: dict
    test_support: tuple[str, ...]
    modules: tuple[ModuleSpec, ...]

    @property
    def all_tests(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t for m in self.modules for t in m.tests))

    @property
    def source_files(self) -> list[str]:
        """Every repo-relative file the recipe names: modules, their tests, test support."""
        return [m.path for m in self.modules] + list(self.all_tests) + list(self.test_support)


@dataclass(frozen=True)
class Recipe:
    """A parsed ``bundled.yaml`` (see that file for the meaning of each field)."""

    schema: int
    seed: int
    trial_timeout_s: float
    target_per_project: int
    min_per_project: int
    min_total: int
    max_candidates_per_project: int
    max_fail_to_pass: int
    max_problem_tests: int
    kinds: tuple[str, ...]
    projects: tuple[ProjectRecipe, ...]
    multi_per_project: int = 0
    multi_spare: int = 0
    #: instance ids are ``<id_prefix>__<project>-<version>-<index>``
    id_prefix: str = "bundled"
    heldout: HeldoutSpec | None = None
    #: problem statements quote each mutated line as a traceback's library frame would
    #: (``File "<path>", line <n>, in <function>`` and the line's text): a localized world
    locate: bool = False

    @property
    def singles_needed(self) -> int:
        """Validated single mutations to keep per project: ``target_per_project`` single
        tasks + ``2 * multi_per_project + multi_spare`` components for pair tasks (0 spare
        without pairs)."""
        if not self.multi_per_project:
            return self.target_per_project
        return self.target_per_project + 2 * self.multi_per_project + self.multi_spare

    def canonical(self) -> dict:
        """The recipe as a dict for :func:`recipe_hash`; the optional world fields
        (``id_prefix``, ``heldout``, ``locate``) appear only when set away from their
        defaults, so a recipe without them keeps the key it had before they existed."""
        out = asdict(self)
        if out["id_prefix"] == "bundled":
            del out["id_prefix"]
        if out["heldout"] is None:
            del out["heldout"]
        if not out["locate"]:
            del out["locate"]
        return out


def _need(d: dict, key: str, typ, where: str):
    if key not in d:
        raise ValueError(f"{where}: field {key!r} missing")
    value = d[key]
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, typ) or isinstance(value, bool) and typ is not bool:
        raise ValueError(f"{where}: field {key!r} must be {typ.__name__}, got {value!r}")
    return value


def load_recipe(path: str | Path | None = None) -> Recipe:
    """Read and validate a recipe YAML (default ``datasets/bundled.yaml``).

    Raises:
        FileNotFoundError: no recipe file.
        ValueError: ``"<path>: <project>: field '<name>' ..."`` for a missing/mistyped field,
            an unknown mutation kind, a bad sha256, or a module listed twice.
    """
    import yaml

    path = Path(path) if path else default_recipe_path()
    if not path.is_file():
        raise FileNotFoundError(f"recipe not found: {path}")
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    where = str(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping at top level")
    kinds = tuple(_need(raw, "kinds", list, where))
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"{where}: field 'kinds': unknown or empty {bad} (known: {KINDS})")
    projects = []
    for i, p in enumerate(_need(raw, "projects", list, where)):
        pw = f"{where}: projects[{i}]"
        if not isinstance(p, dict):
            raise ValueError(f"{pw}: expected a mapping")
        name = _need(p, "name", str, pw)
        pw = f"{where}: {name}"
        sha = _need(p, "sha256", str, pw)
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise ValueError(f"{pw}: field 'sha256' must be 64 lowercase hex digits")
        mods = []
        for mpath, m in _need(p, "modules", dict, pw).items():
            mw = f"{pw}: modules[{mpath}]"
            if not isinstance(m, dict):
                raise ValueError(f"{mw}: expected a mapping with 'tests'")
            tests = _need(m, "tests", list, mw)
            if not tests or not all(isinstance(t, str) for t in tests):
                raise ValueError(f"{mw}: field 'tests' must be a non-empty list of paths")
            cov = m.get("coverage", "names")
            if cov not in ("names", "all"):
                raise ValueError(f"{mw}: field 'coverage' must be 'names' or 'all'")
            if mpath in tests:
                raise ValueError(f"{mw}: a module cannot be its own test file")
            mods.append(ModuleSpec(mpath, tuple(tests), cov))
        env = p.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise ValueError(f"{pw}: field 'env' must map names to strings")
        projects.append(ProjectRecipe(
            name=name, version=str(_need(p, "version", str, pw)),
            sdist=_need(p, "sdist", str, pw), sha256=sha, homepage=str(p.get("homepage", "")),
            env=dict(sorted(env.items())), test_support=tuple(p.get("test_support") or ()),
            modules=tuple(mods)))
    names = [p.name for p in projects]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: field 'projects' lists a name twice: {names}")
    multi = _count(raw, "multi_per_project", where)
    heldout, prefix = _heldout(raw, where), _id_prefix(raw, where)
    if heldout is not None and multi:
        raise ValueError(f"{where}: field 'heldout' needs multi_per_project 0 (a pair's two "
                         "mutations may fall in different units)")
    if heldout is not None and prefix == "bundled":
        raise ValueError(f"{where}: field 'id_prefix' must be set (not 'bundled') in a world "
                         "recipe: its ids must never be taken for the bundled set's, whose "
                         "holdout is sealed by id")
    locate = raw.get("locate", False)
    if not isinstance(locate, bool):
        raise ValueError(f"{where}: field 'locate' must be true or false, got {locate!r}")
    return Recipe(
        schema=_need(raw, "schema", int, where), seed=_need(raw, "seed", int, where),
        trial_timeout_s=_need(raw, "trial_timeout_s", float, where),
        target_per_project=_need(raw, "target_per_project", int, where),
        min_per_project=_need(raw, "min_per_project", int, where),
        min_total=_need(raw, "min_total", int, where),
        max_candidates_per_project=_need(raw, "max_candidates_per_project", int, where),
        max_fail_to_pass=_need(raw, "max_fail_to_pass", int, where),
        max_problem_tests=_need(raw, "max_problem_tests", int, where),
        kinds=kinds, projects=tuple(projects),
        multi_per_project=multi, multi_spare=_count(raw, "multi_spare", where),
        id_prefix=prefix, heldout=heldout, locate=locate)


def _id_prefix(raw: dict, where: str) -> str:
    value = raw.get("id_prefix", "bundled")
    if not isinstance(value, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", value):
        raise ValueError(f"{where}: field 'id_prefix' must be lowercase letters, digits and "
                         f"'_' starting with a letter, got {value!r}")
    return value


def _heldout(raw: dict, where: str) -> HeldoutSpec | None:
    """Optional ``heldout: {by: module|function, fraction: 0 < f < 1}``."""
    value = raw.get("heldout")
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"by", "fraction"}:
        raise ValueError(f"{where}: field 'heldout' must be a mapping with exactly 'by' and "
                         f"'fraction', got {value!r}")
    if value["by"] not in HELDOUT_UNITS:
        raise ValueError(f"{where}: field 'heldout.by' must be one of {HELDOUT_UNITS}, "
                         f"got {value['by']!r}")
    frac = value["fraction"]
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac < 1:
        raise ValueError(f"{where}: field 'heldout.fraction' must be a number in (0, 1), "
                         f"got {frac!r}")
    return HeldoutSpec(by=value["by"], fraction=float(frac))


def _count(raw: dict, key: str, where: str) -> int:
    """Optional non-negative int field (0 when absent)."""
    value = raw.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{where}: field {key!r} must be a non-negative int, got {value!r}")
    return value


def recipe_hash(recipe: Recipe, image: str) -> str:
    """16 hex digits of sha256 over the recipe, :data:`BUILDER_VERSION` and the image name."""
    blob = json.dumps({"recipe": recipe.canonical(), "builder": BUILDER_VERSION,
                       "image": image}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
