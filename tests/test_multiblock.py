"""Multi-block bundled tasks and demonstration variants.

Pure parts (pairing, combined mutations, ids, problem-statement order, recipe fields,
screening of a pair, demonstration steps) need only git; ``test_pair_build_on_one_project``
builds a one-project recipe in Podman (sdist from the cache; about a minute).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from eval.tasks.bundled.multi import (
    apply_all,
    enclosing_function,
    interleave_tests,
    pair_components,
    pair_id,
    parse_pair_id,
)
from eval.tasks.bundled.mutations import Mutation, find_mutations

CALC = "\n".join([
    '"""Tiny arithmetic helpers."""',
    "",
    "",
    "def add(a, b):",
    "    return a + b",
    "",
    "",
    "class Box:",
    "    def grow(self, n):",
    "        self.size = n + 1",
    "        return self.size",
    "",
    "",
    "def clamp(x, lo, hi):",
    "    if x < lo:",
    "        return lo",
    "    return x",
    "",
])
UTIL = "\n".join([
    '"""Helpers."""',
    "",
    "",
    "def double(x):",
    "    return x * 2",
    "",
    "",
    "def half(x):",
    "    return x // 2",
    "",
])


def _mut(path: str, text: str, line: int, kind: str) -> Mutation:
    return next(m for m in find_mutations(path, text) if m.line == line and m.kind == kind)


def test_enclosing_function_names_the_innermost_def():
    assert enclosing_function(CALC, 5) == "add"
    assert enclosing_function(CALC, 10) == "Box.grow"
    assert enclosing_function(CALC, 15) == "clamp"
    assert enclosing_function(CALC, 1) is None
    with pytest.raises(SyntaxError):
        enclosing_function("def (:", 1)


def test_pairs_prefer_another_file_then_another_function():
    texts = {"pkg/calc.py": CALC, "pkg/util.py": UTIL}
    a = _mut("pkg/calc.py", CALC, 5, "arith")        # add
    b = _mut("pkg/calc.py", CALC, 15, "compare")     # clamp
    c = _mut("pkg/util.py", UTIL, 5, "arith")        # double (other file)
    d = _mut("pkg/calc.py", CALC, 16, "return")      # clamp again
    # a pairs with c (other file) before b; b then pairs with... d is the same function: none
    assert pair_components([a, b, c, d], texts) == [(0, 2)]
    # one file only: another function of it
    e = _mut("pkg/calc.py", CALC, 10, "arith")       # Box.grow
    assert pair_components([b, d, e], texts) == [(0, 2)]
    assert pair_components([a], texts) == []


def test_apply_all_combines_mutations_and_refuses_overlap():
    texts = {"pkg/calc.py": CALC, "pkg/util.py": UTIL}
    a = _mut("pkg/calc.py", CALC, 5, "arith")
    b = _mut("pkg/calc.py", CALC, 15, "compare")
    c = _mut("pkg/util.py", UTIL, 5, "arith")
    out = apply_all((b, a, c), texts)
    assert set(out) == {"pkg/calc.py", "pkg/util.py"}
    assert out["pkg/calc.py"] == CALC.replace("return a + b", "return a - b").replace(
        "if x < lo:", "if x <= lo:")
    assert out["pkg/util.py"] == c.apply(UTIL)
    same = [m for m in find_mutations("pkg/calc.py", CALC) if m.line == 15]
    with pytest.raises(ValueError, match="overlap"):
        apply_all((same[0], same[0]), texts)


def test_pair_ids_round_trip():
    iid = pair_id("toolz", "1.2.0", 3, 17)
    assert iid == "bundled__toolz-1.2.0-0003-0017"
    assert parse_pair_id(iid) == (3, 17)
    assert parse_pair_id("bundled__toolz-1.2.0-0003") is None


def test_problem_statement_order_quotes_both_parts():
    f2p = ["t::a1", "t::a2", "t::a3", "t::b1", "t::c"]
    order = interleave_tests(f2p, [["t::a1", "t::a2", "t::a3"], ["t::b1", "t::zz"]])
    assert order == ["t::a1", "t::b1", "t::a2", "t::a3", "t::c"]
    assert sorted(order) == sorted(f2p)


def test_recipe_multi_fields(tmp_path):
    from conftest import REPO_ROOT

    from eval.tasks.bundled.recipe import load_recipe

    r = load_recipe()
    assert r.multi_per_project >= 1
    assert r.singles_needed == r.target_per_project + 2 * r.multi_per_project + r.multi_spare
    # at least a third of all tasks are pairs (the holdout takes ~a fifth of them)
    assert 3 * r.multi_per_project >= r.target_per_project + r.multi_per_project
    text = (REPO_ROOT / "datasets" / "bundled.yaml").read_text()
    bad = tmp_path / "r.yaml"
    bad.write_text(text.replace("multi_per_project: 6", "multi_per_project: -1"))
    with pytest.raises(ValueError, match="multi_per_project"):
        load_recipe(bad)


def _pytest_log(status: dict[str, str]) -> str:
    lines = [">>>>> Start Test Output", "=== short test summary info ==="]
    lines += [f"{s} {t}" for t, s in status.items()]
    return "\n".join(lines + [">>>>> End Test Output", ">>>>> Test Exit Code: 1"]) + "\n"


def test_screening_a_pair_needs_a_failing_test_of_each_part():
    from eval.grading.grader import parse_log
    from eval.tasks.bundled.recipe import PARSER, ModuleSpec, ProjectRecipe, load_recipe
    from eval.tasks.bundled.screening import Candidate, screen

    mod = ModuleSpec("pkg/calc.py", ("tests/test_calc.py",))
    proj = ProjectRecipe("p", "1.0", "p.tar.gz", "0" * 64, "", {}, (), (mod,))
    m = _mut("pkg/calc.py", CALC, 5, "arith")
    ids = [f"tests/test_calc.py::test_{k}" for k in "abcd"]
    base = dict.fromkeys(ids, "PASSED")
    a = Candidate(proj, 1, m, mod, "bundled__p-1.0-0001", f2p=[ids[0]])
    b = Candidate(proj, 2, m, mod, "bundled__p-1.0-0002", f2p=[ids[1], ids[2]])
    recipe = load_recipe()
    assert PARSER == "parse_log_pytest"
    for failing, ok in (({ids[0], ids[2]}, True), ({ids[0], ids[3]}, False)):
        pair = Candidate(proj, 1, m, mod, pair_id("p", "1.0", 1, 2), parts=(a, b),
                         tests=("tests/test_calc.py",))
        log = _pytest_log({i: "FAILED" if i in failing else "PASSED" for i in ids})
        screen(pair, SimpleNamespace(log=log, exit_class="ok"), base, recipe, parse_log)
        assert pair.tag == "0001-0002"
        assert (pair.outcome == "screened") is ok, pair.outcome
        assert pair.f2p == sorted(failing)


# ---------------------------------------------------------------------------
# demonstrations
# ---------------------------------------------------------------------------

def _git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@e", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env).stdout


def _task(root: Path, iid: str, bugs: dict[str, tuple[str, str]]):
    """A repo with ``pkg/calc.py`` and ``pkg/util.py``; the base commit carries each
    ``path: (good, bad)`` bug, the gold patch undoes them."""
    repo = root / iid
    (repo / "pkg").mkdir(parents=True)
    _git(repo, "init", "-q")
    good = {"pkg/calc.py": CALC, "pkg/util.py": UTIL, "pkg/test_calc.py": "def test_x():\n    pass\n"}
    for p, t in good.items():
        bad = t.replace(*bugs[p], 1) if p in bugs else t
        (repo / p).write_text(bad)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    for p, t in good.items():
        (repo / p).write_text(t)
    patch = _git(repo, "diff")
    _git(repo, "checkout", "-q", "--", ".")
    return SimpleNamespace(instance_id=iid, repo_dir=str(repo), base_commit=base, patch=patch,
                           problem_statement=f"{iid}: tests fail")


def _replay(task, demo, root: Path) -> list[tuple[str, dict]]:
    """Run the demo's tool calls on a fresh checkout (outputs must match); returns the calls."""
    from ecredit_trl.agent import editor
    from ecredit_trl.agent.env import _clone_at

    _clone_at(task.repo_dir, task.base_commit, root)
    calls = []
    m = demo["messages"]
    for call, out in zip(m[1::2], m[2::2], strict=False):
        if "tool_calls" not in call:
            break
        f = call["tool_calls"][0]["function"]
        args = json.loads(f["arguments"])
        calls.append((f["name"], args))
        if f["name"] != "submit":
            assert out["content"] == getattr(editor, f["name"])(root, **args)
    return calls


def test_demo_variant_is_a_seeded_fraction():
    from ecredit_trl.policy.demos import DemoVariants, demo_variant

    v = DemoVariants(0.25, 0.25, seed=3)
    got = [demo_variant(f"t{i}", v) for i in range(800)]
    assert got == [demo_variant(f"t{i}", v) for i in range(800)]  # deterministic
    assert 160 <= got.count("extra") <= 240 and 160 <= got.count("revert") <= 240
    assert got != [demo_variant(f"t{i}", DemoVariants(0.25, 0.25, seed=4)) for i in range(800)]
    assert {demo_variant(f"t{i}", DemoVariants()) for i in range(50)} == {"plain"}
    with pytest.raises(ValueError, match="extra_fraction"):
        DemoVariants(1.5, 0)
    with pytest.raises(ValueError, match="revert_fraction"):
        DemoVariants(0.75, 0.5)


def test_pair_task_demo_has_one_edit_per_block(tmp_path):
    from ecredit_trl.policy.demos import demo_conversation

    t = _task(tmp_path, "syn__pair", {"pkg/calc.py": ("a + b", "a - b"),
                                      "pkg/util.py": ("x * 2", "x * 3")})
    d = demo_conversation(t)
    calls = _replay(t, d, tmp_path / "r")
    assert [c[0] for c in calls] == ["view", "str_replace", "view", "str_replace", "submit"]
    assert [c[1]["path"] for c in calls[:4]] == ["pkg/calc.py"] * 2 + ["pkg/util.py"] * 2
    assert d["variant"] == "plain"
    assert (tmp_path / "r" / "pkg/calc.py").read_text() == CALC
    assert (tmp_path / "r" / "pkg/util.py").read_text() == UTIL


def test_extra_and_reverted_demos_in_their_seeded_fraction(tmp_path):
    from ecredit_trl.policy.demos import (
        EXTRA_COMMENT,
        DemoVariants,
        demo_conversations,
        demo_variant,
    )

    v = DemoVariants(0.3, 0.3, seed=7)
    tasks = [_task(tmp_path / "repos", f"syn__t{i}", {"pkg/calc.py": ("a + b", "a - b")})
             for i in range(12)]
    want = [demo_variant(t.instance_id, v) for t in tasks]
    assert {"extra", "revert", "plain"} <= set(want)
    demos = demo_conversations(tasks, strict=True, variants=v)
    assert [d["variant"] for d in demos] == want
    for t, d in zip(tasks, demos, strict=True):
        root = tmp_path / "replay" / t.instance_id
        calls = _replay(t, d, root)
        names = [c[0] for c in calls]
        srs = [c[1] for c in calls if c[0] == "str_replace"]
        final = _git(root, "diff")
        if d["variant"] == "plain":
            assert names == ["view", "str_replace", "submit"]
            assert final == t.patch
        elif d["variant"] == "extra":
            # fix, then a comment above a def in the other library file (a D = 0 block)
            assert names == ["view", "str_replace", "str_replace", "submit"]
            assert srs[1]["path"] == "pkg/util.py" and srs[1]["new_str"].startswith(EXTRA_COMMENT)
            assert (root / "pkg/calc.py").read_text() == CALC
            util = (root / "pkg/util.py").read_text()
            assert util.replace(EXTRA_COMMENT + "\n", "", 1) == UTIL and util != UTIL
        else:
            # an exploratory wrong edit, corrected by the next turn: final patch == gold
            assert names == ["view", "str_replace", "str_replace", "submit"]
            wrong = srs[0]["new_str"]
            assert srs[0] == {"path": "pkg/calc.py", "old_str": "return a - b", "new_str": wrong}
            assert wrong not in ("return a - b", "return a + b")
            assert srs[1] == {"path": "pkg/calc.py", "old_str": wrong, "new_str": "return a + b"}
            assert final == t.patch
            assert (root / "pkg/calc.py").read_text() == CALC


def test_demo_steps_without_a_variant_site_stay_plain():
    from ecredit_trl.policy.demos import demo_steps

    old, new = {"a.py": "X = 1\n"}, {"a.py": "X = 2\n"}
    steps, done = demo_steps(old, new, "revert", random.Random(0))
    assert done == "plain" and [s[0] for s in steps] == ["view", "str_replace"]
    steps, done = demo_steps(old, new, "extra", random.Random(0), {})
    assert done == "plain" and len(steps) == 2


@pytest.mark.podman
def test_pair_build_on_one_project(tmp_path, podman_runtime):
    """A one-project recipe (inflection, 2 singles + 1 pair): the pair task's commit holds
    both mutations, its FAIL_TO_PASS holds a test of each part, and gold resolves / empty
    does not (the build's controls)."""
    import dataclasses

    from eval.tasks.bundled.build import build
    from eval.tasks.bundled.recipe import load_recipe
    from eval.tasks.bundled.sources import GitRepo

    full = load_recipe()
    recipe = dataclasses.replace(
        full, projects=tuple(p for p in full.projects if p.name == "inflection"),
        target_per_project=2, multi_per_project=1, multi_spare=0, min_per_project=3,
        min_total=3, max_candidates_per_project=12)
    tasks = build(recipe, tmp_path / "out", runtime=podman_runtime, log=print)
    singles = [t for t in tasks if t.extra["blocks"] == 1]
    (pair,) = [t for t in tasks if t.extra["blocks"] == 2]
    assert len(singles) == 2
    i, j = parse_pair_id(pair.instance_id)
    info = json.loads((tmp_path / "out" / "build.json").read_text())
    by_id = {c["instance_id"]: c for c in info["candidates"]}
    assert by_id[pair.instance_id]["parts"] == [
        f"bundled__inflection-0.5.1-{i:04d}", f"bundled__inflection-0.5.1-{j:04d}"]
    # the parts are screened only; the pair itself is controlled (builder 5)
    assert all(by_id[p]["outcome"] == "screened" for p in by_id[pair.instance_id]["parts"])
    assert by_id[pair.instance_id]["outcome"] == "kept"
    # the parts are not single tasks (a shared mutation would leak across the holdout)
    assert not {t.instance_id for t in singles} & set(by_id[pair.instance_id]["parts"])
    repo = GitRepo(pair.repo_dir)
    assert repo.git("rev-parse", f"{pair.base_commit}^").strip() == pair.environment_setup_commit
    hunks = [ln for ln in pair.patch.splitlines() if ln.startswith("@@")]
    assert len(hunks) == 2 and len(pair.extra["mutations"]) == 2
    assert pair.FAIL_TO_PASS and not set(pair.FAIL_TO_PASS) & set(pair.PASS_TO_PASS)
    quoted = [f for f in pair.FAIL_TO_PASS if f"- {f}\n" in pair.problem_statement]
    assert len(quoted) == min(len(pair.FAIL_TO_PASS), recipe.max_problem_tests)


def test_reseal_records_old_and_new_sha256(tmp_path):
    from eval.holdout import seal
    from eval.tasks.sealed import ids_sha256, read_manifest

    out = tmp_path / "h.json"
    first = seal("p", 2, 1, out, pool_ids=[f"a{i}" for i in range(8)])
    with pytest.raises(FileExistsError):
        seal("p", 2, 1, out, pool_ids=[f"b{i}" for i in range(9)])
    with pytest.raises(ValueError, match="reason"):
        seal("p", 2, 1, out, pool_ids=[f"b{i}" for i in range(9)], reason="x")
    assert read_manifest(out) == first  # nothing written by the refused calls
    pool = [f"b{i}" for i in range(9)]
    second = seal("p", 3, 1, out, pool_ids=pool, force=True, reason="recipe v2")
    third = seal("p", 3, 2, out, pool_ids=pool, force=True, reason="seed")
    man = read_manifest(out)
    assert man == third and man["pool_sha256"] == ids_sha256(pool)
    r1, r2 = man["reseals"]
    assert r1["reason"] == "recipe v2" and r2["reason"] == "seed"
    assert (r1["old_sha256"], r1["new_sha256"]) == (first["sha256"], second["sha256"])
    assert (r1["old_pool_sha256"], r1["new_pool_sha256"]) == (first["pool_sha256"],
                                                             ids_sha256(pool))
    assert (r1["old_pool_size"], r1["new_pool_size"], r1["old_n"], r1["new_n"]) == (8, 9, 2, 3)
    assert (r2["old_sha256"], r2["new_sha256"]) == (second["sha256"], third["sha256"])


def test_warmstart_recipe_carries_the_variant_shares():
    from ecredit_trl.policy.warmstart import CODE_VERSION, policy_key, recipe_for

    r = recipe_for()
    assert (r["extra_fraction"], r["revert_fraction"]) == (0.25, 0.25)
    assert r["code_version"] == CODE_VERSION == "warmstart-v2"
    t = SimpleNamespace(instance_id="a", base_commit="b", patch="p", problem_statement="s")
    assert policy_key([t], r) != policy_key([t], recipe_for(extra_fraction=0.5))
    with pytest.raises(ValueError, match="extra_fraction"):
        recipe_for(extra_fraction=2)
