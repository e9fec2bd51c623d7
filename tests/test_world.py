"""The procedural world (datasets/procedural.yaml, eval.tasks.bundled.world): the recipe's
world fields, the unit each mutation belongs to, the split by unit, and a real small world
built in Podman whose held-out instances the training loader refuses."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess

import pytest
from conftest import REPO_ROOT

from ecredit_trl.study.config import StudyConfigError
from eval.tasks.bundled.mutations import find_mutations
from eval.tasks.bundled.recipe import load_recipe, recipe_hash
from eval.tasks.bundled.world import instance_split, unit_of, unit_split
from eval.tasks.sealed import SealedTaskError
from eval.tasks.splits import load_tasks, load_world

WORLD = REPO_ROOT / "datasets" / "procedural.yaml"
LOCALIZED = REPO_ROOT / "datasets" / "procedural_localized.yaml"

SRC = '''def top(x):
    def inner(y):
        return y < 1
    return inner(x) and x > 2


class Cache:
    def get(self, k):
        if k in self:
            return True
        return False

    class Node:
        def link(self, n):
            return n + 1
'''


def test_each_mutation_records_its_outermost_function():
    """Sites inside a nested function belong to the function that defines it; a method (of
    a nested class too) is class-qualified."""
    got = {(m.line, m.function) for m in find_mutations("m.py", SRC)}
    want_by_line = {3: "top", 4: "top", 9: "Cache.get", 10: "Cache.get", 11: "Cache.get",
                    15: "Cache.Node.link"}
    assert {line for line, _ in got} == set(want_by_line)
    assert all(fn == want_by_line[line] for line, fn in got)


def test_unit_of_module_and_function():
    m = next(m for m in find_mutations("pkg/m.py", SRC) if m.line == 15)
    assert unit_of(m, "module") == "pkg/m.py"
    assert unit_of(m, "function") == "pkg/m.py::Cache.Node.link"
    with pytest.raises(ValueError, match="unknown held-out unit 'line'"):
        unit_of(m, "line")
    with pytest.raises(ValueError, match="records no function"):
        unit_of(dataclasses.replace(m, function=""), "function")


def test_unit_split_is_a_fixed_draw_per_unit():
    """The same unit gets the same side on every call; the share held out follows the
    fraction (2,000 units: within 3 points of it); 0 and 1 are the extremes."""
    units = [f"m.py::f{i}" for i in range(2000)]
    for frac in (0.1, 0.3, 0.5):
        sides = [unit_split(7, "p", u, frac) for u in units]
        assert sides == [unit_split(7, "p", u, frac) for u in units]
        assert abs(sides.count("heldout") / len(units) - frac) < 0.03
    assert {unit_split(7, "p", u, 0.0) for u in units} == {"train"}
    assert {unit_split(7, "p", u, 1.0) for u in units} == {"heldout"}
    # another seed or project draws again
    assert ([unit_split(7, "p", u, 0.3) for u in units]
            != [unit_split(8, "p", u, 0.3) for u in units])
    assert ([unit_split(7, "p", u, 0.3) for u in units]
            != [unit_split(7, "q", u, 0.3) for u in units])


def test_world_recipe_is_valid():
    r = load_recipe(WORLD)
    assert r.id_prefix == "procedural"
    assert (r.heldout.by, r.heldout.fraction) == ("function", 0.3)
    assert r.multi_per_project == 0
    assert r.target_per_project > r.max_candidates_per_project or r.target_per_project >= 1000
    assert "return" not in r.kinds and "drop" not in r.kinds


def test_bundled_recipe_key_has_no_world_fields():
    """A recipe that sets no world field hashes as it did before the fields existed (the
    bundled cache stays valid); setting one changes the key."""
    r = load_recipe()
    canon = r.canonical()
    assert "id_prefix" not in canon and "heldout" not in canon and "locate" not in canon
    assert recipe_hash(dataclasses.replace(r, id_prefix="other"), "img") != recipe_hash(r, "img")
    assert recipe_hash(dataclasses.replace(r, locate=True), "img") != recipe_hash(r, "img")


def test_localized_world_is_the_plain_world_with_frames():
    """The localized recipe differs from the plain world's only in its prefix and ``locate``:
    same projects, seed, kinds and split, so the same instances fall on the same sides."""
    loc, plain = load_recipe(LOCALIZED), load_recipe(WORLD)
    assert loc.locate and not plain.locate and loc.id_prefix == "localized"
    assert dataclasses.replace(loc, id_prefix="procedural", locate=False) == plain
    assert "locate" in loc.canonical()


@pytest.mark.parametrize("new", ["locate: 1", "locate: maybe", "locate: [true]"])
def test_bad_locate_names_the_field(tmp_path, new):
    text = LOCALIZED.read_text()
    old = next(ln for ln in text.splitlines() if ln.startswith("locate:"))
    p = tmp_path / "w.yaml"
    p.write_text(text.replace(old, new))
    with pytest.raises(ValueError, match="field 'locate' must be true or false") as e:
        load_recipe(p)
    assert str(p) in str(e.value)


HELDOUT = "heldout: {by: function, fraction: 0.3}"


@pytest.mark.parametrize("old, new, needle", [
    (HELDOUT, "heldout: [function, 0.3]", "field 'heldout' must be a mapping"),
    (HELDOUT, "heldout: {by: function}", "field 'heldout' must be a mapping"),
    (HELDOUT, "heldout: {by: line, fraction: 0.3}", "field 'heldout.by' must be one of"),
    (HELDOUT, "heldout: {by: function, fraction: 1.5}", "field 'heldout.fraction' must be a number"),
    (HELDOUT, "heldout: {by: function, fraction: true}", "field 'heldout.fraction' must be a number"),
    ("id_prefix: procedural", "id_prefix: Proc-1", "field 'id_prefix' must be lowercase"),
    ("multi_per_project: 0", "multi_per_project: 2", "field 'heldout' needs multi_per_project 0"),
    ("multi_per_project: 0", "multi_per_project: x", "field 'multi_per_project' must be a non-neg"),
    ("id_prefix: procedural", "id_prefix: bundled", "field 'id_prefix' must be set"),
    ("id_prefix: procedural\n", "", "field 'id_prefix' must be set"),
])
def test_bad_world_recipe_names_the_field(tmp_path, old, new, needle):
    text = WORLD.read_text()
    assert old in text
    p = tmp_path / "w.yaml"
    p.write_text(text.replace(old, new))
    with pytest.raises(ValueError, match=needle) as e:
        load_recipe(p)
    assert str(p) in str(e.value)


def _small_world(tmp_path):
    """The world recipe cut to its first project (inflection) and its first 8 candidates,
    half the units held out: a world of a few instances, both sides present."""
    full = load_recipe(WORLD)
    small = dataclasses.replace(
        full, projects=(full.projects[0],), max_candidates_per_project=8, min_per_project=1,
        min_total=1, heldout=dataclasses.replace(full.heldout, fraction=0.5))
    assert full.projects[0].name == "inflection"
    text = WORLD.read_text()
    text = text.replace("max_candidates_per_project: 10000", "max_candidates_per_project: 8")
    text = text.replace("min_per_project: 8", "min_per_project: 1")
    text = text.replace("min_total: 100", "min_total: 1")
    text = text.replace("fraction: 0.3", "fraction: 0.5")
    head, _, projects = text.partition("projects:")
    first = projects.split("\n  - name:")[1]
    path = tmp_path / "small.yaml"
    path.write_text(head + "projects:\n  - name:" + first.rstrip() + "\n")
    assert load_recipe(path) == small
    return path


@pytest.fixture(scope="module")
def small_world(tmp_path_factory):
    """A real build of the small world (Podman trials: screening, gold twice, empty)."""
    from eval.tasks.bundled.cache import built_dir

    tmp = tmp_path_factory.mktemp("world")
    path = _small_world(tmp)
    tasks = load_world("procedural", recipe_path=path,
                       log=lambda m: print(f"[build_tasks] {m}", flush=True))
    return path, tasks, built_dir(load_recipe(path))


@pytest.mark.podman
def test_small_localized_world_quotes_the_broken_line_and_nothing_else(small_world, tmp_path):
    """The small world built again with ``locate``: each statement is the plain world's
    statement of the same candidate with one traceback frame added, naming the mutated file,
    line and function and quoting that line as it stands at ``base_commit`` (the broken
    line: never the gold patch's text); same candidates, same sides."""
    path, plain, _ = small_world
    text = path.read_text().replace("id_prefix: procedural\n",
                                    "id_prefix: localized\nlocate: true\n")
    lpath = tmp_path / "small_localized.yaml"
    lpath.write_text(text)
    loc = load_world("procedural", recipe_path=lpath,
                     log=lambda m: print(f"[build_tasks] {m}", flush=True))
    by_tag = {t.instance_id.split("__", 1)[1]: t for t in plain}
    assert sorted(by_tag) == sorted(t.instance_id.split("__", 1)[1] for t in loc)
    for t in loc:
        twin = by_tag[t.instance_id.split("__", 1)[1]]
        assert t.instance_id.startswith("localized__") and t.extra["split"] == twin.extra["split"]
        m = t.extra["mutation"]
        func = t.extra["unit"].split("::", 1)[1]
        broken = subprocess.run(["git", "-C", t.repo_dir, "show", f"{t.base_commit}:{m['path']}"],
                                capture_output=True, text=True, check=True
                                ).stdout.splitlines()[m["line"] - 1]
        frame = (f"\nThe failures trace to this library code:\n"
                 f'  File "{m["path"]}", line {m["line"]}, in {func}\n    {broken.strip()}\n')
        assert frame in t.problem_statement
        assert t.problem_statement.replace(frame, "") == twin.problem_statement
        fixed = [ln[1:].strip() for ln in t.patch.splitlines()
                 if ln.startswith("+") and not ln.startswith("+++")]
        assert fixed and all(f not in t.problem_statement for f in fixed)


@pytest.mark.podman
def test_small_world_builds_and_splits_by_function(small_world):
    """Every instance carries the prefix, its unit and side; no unit is on both sides; the
    unit names the function whose span (in the pristine file) holds the mutated line; the
    build's counts agree with the rows."""
    path, tasks, out = small_world
    assert tasks and all(t.instance_id.startswith("procedural__inflection-0.5.1-")
                         for t in tasks)
    sides = {t.extra["split"] for t in tasks}
    assert sides == {"train", "heldout"}
    by_unit: dict[str, set[str]] = {}
    for t in tasks:
        by_unit.setdefault(t.extra["unit"], set()).add(t.extra["split"])
    assert all(len(s) == 1 for s in by_unit.values())
    recipe = load_recipe(path)
    for t in tasks:
        m = t.extra["mutation"]
        fpath, _, func = t.extra["unit"].partition("::")
        assert fpath == m["path"]
        pristine = subprocess.run(
            ["git", "-C", t.repo_dir, "show", f"{t.environment_setup_commit}:{fpath}"],
            capture_output=True, text=True, check=True).stdout
        spans = {n.name: (n.lineno, n.end_lineno) for n in ast.parse(pristine).body
                 if isinstance(n, ast.FunctionDef)}
        lo, hi = spans[func]
        assert lo <= m["line"] <= hi
        assert t.extra["split"] == unit_split(recipe.seed, "inflection", t.extra["unit"],
                                              recipe.heldout.fraction)
    stats = json.loads((out / "build.json").read_text())
    assert stats["split_counts"] == {s: sum(t.extra["split"] == s for t in tasks)
                                     for s in ("train", "heldout")}
    assert stats["split_units"]["heldout"] == len({u for u, s in by_unit.items()
                                                   if s == {"heldout"}})


@pytest.mark.podman
def test_world_splits_load_and_training_refuses_heldout(small_world, tmp_path):
    """``:train`` and ``:heldout`` partition the world; the training loader refuses a task
    file that holds a held-out instance, naming it; the training side loads."""
    path, tasks, out = small_world
    train = load_world("procedural", "train", recipe_path=path)
    held = load_world("procedural", "heldout", recipe_path=path)
    assert sorted(t.instance_id for t in train + held) == sorted(t.instance_id for t in tasks)
    assert {t.extra["split"] for t in held} == {"heldout"}
    rows = (out / "tasks.jsonl").read_text().splitlines()
    (tmp_path / "repos").symlink_to(out / "repos")  # rows name repos/<project> beside them
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join(rows) + "\n")
    with pytest.raises(SealedTaskError, match=held[0].instance_id):
        load_tasks(str(mixed), purpose="train")
    train_rows = [r for r in rows if json.loads(r)["extra"]["split"] == "train"]
    only_train = tmp_path / "train.jsonl"
    only_train.write_text("\n".join(train_rows) + "\n")
    assert len(load_tasks(str(only_train), purpose="train")) == len(train)
    with pytest.raises(ValueError, match="unknown procedural split 'test'"):
        load_world("procedural", "test", recipe_path=path)


def test_instance_split_matches_the_unit_draw():
    r = load_recipe(WORLD)
    m = next(m for m in find_mutations("pkg/m.py", SRC) if m.line == 9)
    unit, side = instance_split(r.seed, "p", m, r.heldout)
    assert unit == "pkg/m.py::Cache.get"
    assert side == unit_split(r.seed, "p", unit, r.heldout.fraction)


@pytest.mark.podman
@pytest.mark.parametrize("edit", ["split says train", "no split"])
def test_a_heldout_id_is_refused_whatever_its_row_says(small_world, tmp_path, edit):
    """The attack: a row of a held-out instance of the shipped world whose ``extra`` was
    edited to say ``train`` (or to say nothing) is still refused for training, by its id; the
    same row under a training id loads."""
    from eval.tasks.splits import world_heldout_ids

    _, _, out = small_world
    held = sorted(world_heldout_ids(str(WORLD)))
    row = json.loads((out / "tasks.jsonl").read_text().splitlines()[0])
    if edit == "no split":
        row["extra"].pop("split")
    else:
        row["extra"]["split"] = "train"
    (tmp_path / "repos").symlink_to(out / "repos")
    path = tmp_path / "edited.jsonl"
    row["instance_id"] = held[0]
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(SealedTaskError, match=held[0]):
        load_tasks(str(path), purpose="train")
    row["instance_id"] = "procedural__inflection-0.5.1-9999"  # no candidate has this index
    path.write_text(json.dumps(row) + "\n")
    assert [t.instance_id for t in load_tasks(str(path), purpose="train")] == [row["instance_id"]]


def test_heldout_ids_are_the_candidates_of_heldout_functions():
    """``heldout_ids`` on a made-up project: the ids of exactly the candidates whose function
    (found here from the AST's line spans, not from the mutation's own record) is drawn held
    out; a seed is picked where both sides are present."""
    from eval.tasks.bundled.mutations import choose_candidates
    from eval.tasks.bundled.recipe import ModuleSpec, ProjectRecipe
    from eval.tasks.bundled.world import heldout_ids

    proj = ProjectRecipe(name="fake", version="1.0", sdist="fake-1.0.tar.gz", sha256="0" * 64,
                         homepage="", env={}, test_support=(),
                         modules=(ModuleSpec("pkg/m.py", ("tests/test_m.py",), "all"),))
    texts = {"fake": {"pkg/m.py": SRC, "tests/test_m.py": "def test_x():\n    pass\n"}}
    spans = []
    for node in ast.parse(SRC).body:
        if isinstance(node, ast.FunctionDef):
            spans.append((node.name, node.lineno, node.end_lineno))
        elif isinstance(node, ast.ClassDef):
            for sub in ast.walk(node):
                if isinstance(sub, ast.FunctionDef):
                    owner = "Cache.Node" if sub.name == "link" else "Cache"
                    spans.append((f"{owner}.{sub.name}", sub.lineno, sub.end_lineno))
    base = load_recipe(WORLD)
    for seed in range(200):
        recipe = dataclasses.replace(base, seed=seed, projects=(proj,))
        cands = choose_candidates(proj, texts["fake"], recipe)
        func = [next(n for n, lo, hi in spans if lo <= m.line <= hi) for m in cands]
        sides = [unit_split(seed, "fake", f"pkg/m.py::{f}", 0.3) for f in func]
        if {"train", "heldout"} <= set(sides):
            break
    else:
        pytest.fail("no seed below 200 puts units on both sides")
    want = {f"procedural__fake-1.0-{k:04d}" for k, s in enumerate(sides) if s == "heldout"}
    assert heldout_ids(recipe, texts) == want
    with pytest.raises(ValueError, match="no 'heldout' field"):
        heldout_ids(dataclasses.replace(recipe, heldout=None), texts)


@pytest.mark.podman
def test_world_stats_on_the_small_world(small_world):
    """benchmarks/world_stats.py: counts per side agree with the rows; every small-world
    instance's fix is one of its function's sites (its kinds are invertible), so the flip
    ceiling is the mean of 1 / sites over held-out instances, recomputed here by hand."""
    import sys

    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from world_stats import flip_odds, world_stats

    path, tasks, _ = small_world
    recipe = load_recipe(path)
    stats = world_stats(tasks, recipe.kinds)
    held = [t for t in tasks if t.extra["split"] == "heldout"]
    assert stats["instances"] == len(tasks)
    assert stats["splits"]["heldout"]["instances"] == len(held)
    odds = [flip_odds(t, recipe.kinds) for t in held]
    assert all(ok and n >= 1 for n, ok in odds)
    assert stats["heldout_reference"]["flip_ceiling"] == round(
        sum(1 / n for n, _ in odds) / len(held), 3)
    with pytest.raises(ValueError, match="not a world build"):
        world_stats([dataclasses.replace(tasks[0], extra={})], recipe.kinds)
    by_module = dict(tasks[0].extra, unit=tasks[0].extra["mutation"]["path"])
    with pytest.raises(ValueError, match="a split by module"):
        world_stats([dataclasses.replace(tasks[0], extra=by_module)], recipe.kinds)


PATCH = """diff --git a/pkg/a.py b/pkg/a.py
index 1..2 100644
--- a/pkg/a.py
+++ b/pkg/a.py
@@ -3,7 +3,7 @@ def f(x):
     y = 1
-    if x < y:
+    if x <= y:
         return y
@@ -20,4 +20,5 @@ def g():
     z = 2
+
     return z
diff --git a/pkg/b.py b/pkg/b.py
--- a/pkg/b.py
+++ b/pkg/b.py
@@ -1,3 +1,3 @@
-A = 1
-B = 2
+A = 2
+B = 1
"""


def test_change_keys_one_per_contiguous_change():
    """Each contiguous change of each file is one key; a blank-line-only addition is none."""
    from eval.tasks.fingerprints import change_keys

    assert change_keys(PATCH) == {("pkg/a.py", 4, "    if x < y:", "    if x <= y:"),
                                  ("pkg/b.py", 1, "A = 1\nB = 2", "A = 2\nB = 1")}
    assert change_keys("") == frozenset()
    # the same edit at another place of the file is another change
    moved = PATCH.replace("@@ -3,7 +3,7 @@", "@@ -30,7 +30,7 @@")
    assert ("pkg/a.py", 31, "    if x < y:", "    if x <= y:") in change_keys(moved)


def test_shared_changes_pair_ids_of_one_repo():
    from eval.tasks.fingerprints import shared_changes

    other = PATCH.replace("x <= y", "x != y").replace("A = 2", "A = 3")
    train = {"t1": ("r/x", other), "t2": ("r/x", PATCH), "t3": ("r/y", PATCH)}
    assert shared_changes(train, {"e1": ("r/x", PATCH)}) == [("e1", "t2")]
    assert shared_changes(train, {"e1": ("r/z", PATCH)}) == []
    assert shared_changes({"t1": ("r/x", other)}, {"e1": ("r/x", PATCH)}) == []


@pytest.mark.podman
def test_study_refuses_a_pool_that_fixes_a_heldout_bug_under_another_id(small_world):
    """Real tasks: the bundled training tasks and the small world share mutations (the same
    site drawn by two recipes; found here from the builds' mutation records, not the patches).
    A study training on bundled:train and evaluating on the world is refused naming a pair;
    so is a pool of the world's own rows renamed; a disjoint pool passes."""
    from ecredit_trl.study.config import config_from_dict
    from ecredit_trl.study.pool import check_train_pool

    _, world, _ = small_world
    bundled_train = load_tasks("bundled:train")

    def sites(t):
        return {(m["path"], m["line"], m["description"]) for m in t.extra["mutations"]}

    want = sorted({w.instance_id for w in world for b in bundled_train if sites(w) & sites(b)})
    assert want  # this small world shares at least one bug with bundled:train
    cfg = config_from_dict({"arms": ["O"], "seeds": [0], "train": {"tasks": "bundled:train"},
                            "eval": {"splits": ["world"], "n": 1}}, where="t.yaml")
    sources = {"bundled:train": bundled_train, "world": world}
    with pytest.raises(StudyConfigError, match=rf"{len(want)} task\(s\) of eval split 'world' "
                                               rf"fix a change a training task fixes \({want[0]} ~"):
        check_train_pool(cfg, load=sources.__getitem__)
    renamed = [dataclasses.replace(t, instance_id=t.instance_id + "-copy") for t in world]
    sources["bundled:train"] = renamed
    with pytest.raises(StudyConfigError, match=rf"{len(world)} task\(s\) of eval split 'world'"):
        check_train_pool(cfg, load=sources.__getitem__)
    sources["bundled:train"] = [t for t in bundled_train
                                if not any(sites(t) & sites(w) for w in world)]
    check_train_pool(cfg, load=sources.__getitem__)


@pytest.mark.podman
def test_warm_starts_refuse_heldout_instances(small_world):
    """The SFT warm starts (embedded and family policies) refuse a held-out instance before
    any demonstration is made, as train.py's loader does."""
    from ecredit_trl.policy.family_warmstart import ensure_family_policy
    from ecredit_trl.policy.warmstart import ensure_default_policy

    _, world, _ = small_world
    held = [t for t in world if t.extra["split"] == "heldout"]
    with pytest.raises(SealedTaskError, match=held[0].instance_id):
        ensure_default_policy(world, log=None)
    with pytest.raises(SealedTaskError, match=held[0].instance_id):
        ensure_family_policy("qwen3", world, log=None)
