"""Bundled tasks (eval.tasks.bundled, eval.build_tasks): recipe, mutations, scripts, and the built set in Podman.

Unit tests need only git and bash. Tests marked ``podman`` build the bundled set (or load it
from the cache, ``$ECREDIT_CACHE`` default ``~/.cache/ecredit-trl``: a cold builder-5 build
ran 255 trials in 8.2 minutes here with the 2 cores shared by two SFT runs and a test run
(load 4-5); builder 3's 144 trials took 3 minutes on the idle machine) and run gold/empty
controls on a sample.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess

import pytest
from conftest import REPO_ROOT

from eval.tasks.bundled.mutations import choose_candidates, find_mutations, mutation_is_valid
from eval.tasks.bundled.recipe import KINDS, ModuleSpec, ProjectRecipe, load_recipe, recipe_hash
from eval.tasks.bundled.scripts import failure_messages, make_eval_script, make_problem_statement
from eval.tasks.bundled.sources import GitRepo

SRC = '''"""Module doc with 1 < 2."""
import functools

LIMIT = 10  # module level: never mutated


def clamp(x, lo=0, hi=LIMIT):
    """Doc string: x + 1."""
    if x < lo:
        return lo
    total = x + 1
    total += 2
    ok = x > 0 and hi > 0
    msg = f"{x + 1}"
    while not ok:
        ok = True
    print(total, msg)
    return total * 2


@functools.lru_cache(maxsize=128)
def other(a: int = 3) -> int:
    for _ in range(4):
        pass
    return a


class Box:
    size: int = 5

    def grow(self):
        self.size += 1
'''
NEVER_TOUCHED = {1, 2, 4, 7, 8, 21, 22, 28, 29}  # 1-based lines
FSTRING_LINE = 14  # may be dropped as a statement, never edited inside


def test_repository_recipe_is_valid():
    r = load_recipe(REPO_ROOT / "datasets" / "bundled.yaml")
    assert {p.name for p in r.projects} >= {"inflection", "toolz", "cachetools"}
    assert len(r.projects) >= 3 and r.min_per_project >= 8 and r.min_total >= 30
    assert (r.target_per_project + r.multi_per_project) * len(r.projects) >= r.min_total
    for p in r.projects:
        assert p.sdist == f"{p.name}-{p.version}.tar.gz"
        assert len(p.sha256) == 64
        for m in p.modules:
            assert m.tests and m.path not in m.tests
    assert recipe_hash(r, "img") == recipe_hash(load_recipe(), "img")
    assert recipe_hash(r, "img") != recipe_hash(r, "img2")


@pytest.mark.parametrize("edit, needle", [
    (lambda t: t.replace("seed: 20261130\n", ""), "field 'seed' missing"),
    (lambda t: t.replace("kinds: [compare,", "kinds: [teleport, compare,"), "unknown or empty"),
    (lambda t: t.replace("sha256: 1a29", "sha256: XX29"), "inflection: field 'sha256'"),
    (lambda t: t.replace("coverage: names}", "coverage: some}", 1), "field 'coverage'"),
])
def test_bad_recipe_names_the_field(tmp_path, edit, needle):
    text = (REPO_ROOT / "datasets" / "bundled.yaml").read_text()
    p = tmp_path / "r.yaml"
    p.write_text(edit(text))
    with pytest.raises(ValueError, match=needle):
        load_recipe(p)


def test_mutations_are_minimal_single_line_edits():
    muts = find_mutations("m.py", SRC)
    kinds = {m.kind for m in muts}
    assert kinds == set(KINDS), kinds - set(KINDS) or set(KINDS) - kinds
    old_lines = SRC.split("\n")
    for m in muts:
        assert mutation_is_valid(SRC, m), m
        new = m.apply(SRC)
        new_lines = new.split("\n")
        assert m.line not in NEVER_TOUCHED, m
        assert m.line != FSTRING_LINE or m.kind == "drop", m
        if m.kind == "drop" and m.replacement == "":
            assert new_lines == old_lines[:m.line - 1] + old_lines[m.line:], m
        else:
            assert len(new_lines) == len(old_lines)
            changed = [i + 1 for i, (a, b) in enumerate(zip(old_lines, new_lines, strict=True))
                       if a != b]
            assert changed == [m.line], m
            # formatting of the rest of the line is kept
            a, b = old_lines[m.line - 1], new_lines[m.line - 1]
            assert a[:len(a) - len(a.lstrip())] == b[:len(b) - len(b.lstrip())]
    by = {(m.kind, m.line, m.replacement) for m in muts}
    assert ("compare", 9, "<=") in by              # x < lo -> x <= lo
    assert ("arith", 11, "-") in by                # x + 1 -> x - 1
    assert ("augassign", 12, "-=") in by
    assert ("boolop", 13, "or") in by
    assert ("negate", 15, "ok") in by              # while not ok -> while ok
    assert ("bool", 16, "False") in by
    assert ("return", 18, "None") in by
    assert ("constant", 23, "5") in by             # range(4) -> range(5)
    assert ("drop", 17, "") in by                  # print(...) dropped
    assert ("drop", 24, "pass") not in by          # `pass` is not droppable
    assert ("augassign", 32, "-=") in by


def test_coverage_filter_keeps_named_functions_only():
    muts = find_mutations("m.py", SRC, covered_names={"other"})
    assert muts and {m.line for m in muts} <= {23, 25}
    assert find_mutations("m.py", SRC, covered_names={"Box"})[0].line == 32


def _fake_project(tmp_path) -> tuple[ProjectRecipe, dict[str, str]]:
    files = {"pkg/m.py": SRC, "tests/test_m.py": "from pkg.m import clamp, other, Box\n"}
    proj = ProjectRecipe(name="fake", version="1.0", sdist="fake-1.0.tar.gz", sha256="0" * 64,
                         homepage="", env={"PYTHONPATH": "src"}, test_support=(),
                         modules=(ModuleSpec("pkg/m.py", ("tests/test_m.py",), "names"),))
    return proj, files


def test_candidates_are_deterministic_and_one_per_line(tmp_path):
    recipe = load_recipe()
    proj, files = _fake_project(tmp_path)
    a = choose_candidates(proj, files, recipe)
    b = choose_candidates(proj, files, recipe)
    assert a == b and len(a) >= 8
    assert len({(m.path, m.line) for m in a}) == len(a)
    # round-robin by kind (a kind whose next site sits on a used line yields its turn)
    assert len({m.kind for m in a[:len(recipe.kinds)]}) >= len(recipe.kinds) - 2


def test_git_commits_are_reproducible(tmp_path):
    shas = []
    for name in ("a", "b"):
        repo = GitRepo(tmp_path / name)
        (repo.path / "pkg").mkdir(parents=True)
        (repo.path / "pkg" / "m.py").write_text(SRC)
        base = repo.init_pristine("pristine")
        mut = repo.commit_file(base, "pkg/m.py", SRC.replace("x < lo", "x <= lo").encode(),
                               "m1", "refs/ecredit/m1")
        shas.append((base, mut, repo.diff(mut, base)))
    assert shas[0] == shas[1]
    patch = shas[0][2]
    assert "-    if x <= lo:\n+    if x < lo:\n" in patch
    assert "index " in patch and len(patch.split("index ")[1].split("..")[0]) == 40  # full index


def test_eval_script_restores_test_files_exactly(tmp_path):
    proj, _ = _fake_project(tmp_path)
    files = {
        "tests/test_m.py": b"def test_x():\n    assert \"$HOME\" == '$(x)'\nEOF\n",
        "tests/data/no_newline.py": b"x = 1",
        "tests/bin.py": b"\xff\xfe not utf-8\n",
    }
    tests = tuple(files)
    script = make_eval_script(proj, tests, files)
    assert script.startswith("#!/bin/bash\n")
    assert "export PYTHONPATH=src" in script and "export PYTHONHASHSEED=0" in script
    head, tail = script.split("echo '>>>>> Start Test Output'\n")
    assert tail.startswith("python3 -m pytest -rA -p no:cacheprovider tests/test_m.py ")
    assert "SWEBENCH_TEST_EXIT_CODE=$?\necho '>>>>> End Test Output'\n" in tail
    assert tail.endswith('echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"\n')
    work = tmp_path / "w"
    (work / "tests").mkdir(parents=True)
    (work / "tests" / "test_m.py").write_text("tampered by an agent\n")
    subprocess.run(["bash", "-c", head.replace("cd /testbed", f"cd {work}")], check=True)
    for path, content in files.items():
        assert (work / path).read_bytes() == content, path


LOG = """>>>>> Start Test Output
============================= test session starts ==============================
collected 3 items

t/test_x.py F.F                                                          [100%]

=================================== FAILURES ===================================
__________________________________ test_one ___________________________________

    def test_one():
>       assert f(1) == 2
E       AssertionError: assert 3 == 2
E        +  where 3 = <function f at 0x7f3a2b1c0d30>(1)
E       Use -v to get more diff

t/test_x.py:3: AssertionError
______________________________ TestK.test_two[a-1] ______________________________
E   KeyError: 1
E   KeyError: 1
=========================== short test summary info ============================
FAILED t/test_x.py::test_one - AssertionError: assert 3 == 2
FAILED t/test_x.py::TestK::test_two[a-1] - KeyError: 1
PASSED t/test_x.py::test_three
========================= 2 failed, 1 passed in 0.05s ==========================
>>>>> End Test Output
"""


def test_problem_statement_from_failing_tests_only(tmp_path):
    f2p = ["t/test_x.py::test_one", "t/test_x.py::TestK::test_two[a-1]"]
    msgs = failure_messages(LOG, f2p)
    assert msgs == {
        "t/test_x.py::test_one": ["AssertionError: assert 3 == 2",
                                  "+  where 3 = <function f at 0x…>(1)"],
        "t/test_x.py::TestK::test_two[a-1]": ["KeyError: 1"],
    }
    proj, _ = _fake_project(tmp_path)
    text = make_problem_statement(proj, ("t/test_x.py",), f2p, msgs, max_tests=1)
    assert text.startswith("fake 1.0: 2 tests fail after a recent change")
    assert "`PYTHONPATH=src python3 -m pytest t/test_x.py`" in text
    assert "- t/test_x.py::test_one\n    AssertionError: assert 3 == 2\n" in text
    assert "- ... and 1 more" in text and "test_two" not in text
    # a localized world's statement: the same text with the frame above the closing line
    frames = (("src/fake/m.py", 12, "Box.grow", "        self.size -= 1\n"),)
    loc = make_problem_statement(proj, ("t/test_x.py",), f2p, msgs, max_tests=1, frames=frames)
    block = ('\nThe failures trace to this library code:\n'
             '  File "src/fake/m.py", line 12, in Box.grow\n    self.size -= 1\n')
    assert loc == text.replace("\nFix the library", block + "\nFix the library")


# ---------------------------------------------------------------------------
# the built set (Podman)
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bundled():
    from eval.tasks.bundled.cache import ensure_built

    return ensure_built(log=lambda msg: print(f"[build_tasks] {msg}", flush=True))


def _gold_lines(patch: str) -> list[str]:
    return [ln[1:].strip() for ln in patch.splitlines()
            if ln[:1] in "+-" and not ln.startswith(("+++", "---")) and len(ln[1:].strip()) > 8]


@pytest.mark.podman
def test_bundled_counts(bundled):
    recipe = load_recipe()
    per: dict[str, int] = {}
    for t in bundled:
        per[t.extra["project"]] = per.get(t.extra["project"], 0) + 1
    assert len(bundled) >= 30, per
    assert set(per) == {p.name for p in recipe.projects}
    assert all(n >= 8 for n in per.values()), per
    assert len({t.instance_id for t in bundled}) == len(bundled)


@pytest.mark.podman
def test_bundled_tasks_are_consistent(bundled):
    for t in bundled:
        repo = GitRepo(t.repo_dir)
        assert repo.git("cat-file", "-t", t.base_commit).strip() == "commit"
        assert repo.git("rev-parse", f"{t.base_commit}^").strip() == t.environment_setup_commit
        assert repo.diff(t.base_commit, t.environment_setup_commit) == t.patch
        # one-line fix (or re-add) per mutation; a pair task has two
        assert t.patch.count("\n+") - t.patch.count("\n+++") <= t.extra["blocks"]
        assert len(t.extra["mutations"]) == t.extra["blocks"] in (1, 2)
        assert t.FAIL_TO_PASS and not set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)
        files = tuple(t.extra["test_files"])
        assert all(i.split("::")[0] in files for i in t.FAIL_TO_PASS + t.PASS_TO_PASS)
        assert t.log_parser == "parse_log_pytest" and t.test_patch == ""
        assert ">>>>> Start Test Output" in t.eval_script
        # the problem statement names failing tests and never quotes the gold patch
        assert t.FAIL_TO_PASS[0] in t.problem_statement
        for line in _gold_lines(t.patch):
            assert line not in t.problem_statement, (t.instance_id, line)
        for m in t.extra["mutations"]:
            assert ast.parse(repo.git("show", f"{t.base_commit}:{m['path']}")) is not None


@pytest.mark.podman
def test_a_third_of_the_training_tasks_are_pairs(bundled):
    """At least a third of bundled:train needs edits in two places."""
    from eval.tasks.splits import load_tasks

    train = load_tasks("bundled:train", purpose="train")
    pairs = [t for t in train if t.extra["blocks"] == 2]
    assert 3 * len(pairs) >= len(train), (len(pairs), len(train))
    two_files = [t for t in pairs if len({m["path"] for m in t.extra["mutations"]}) == 2]
    assert two_files  # toolz and cachetools have several modules


@pytest.mark.podman
def test_bundled_is_deterministic(bundled, tmp_path):
    from eval.tasks.bundled.cache import built_dir, ensure_built
    from eval.tasks.bundled.materialize import materialize

    again = ensure_built()
    assert again == bundled
    redo = materialize(load_recipe(), tmp_path, ids={t.instance_id for t in bundled})
    for t in bundled:
        assert redo[t.instance_id] == {"base_commit": t.base_commit, "patch": t.patch,
                                       "environment_setup_commit": t.environment_setup_commit}
    built = built_dir(load_recipe())
    assert bundled[0].repo_dir.startswith(str(built))
    rows = [json.loads(x) for x in (built / "tasks.jsonl").read_text().splitlines()]
    assert all(r["repo_dir"].startswith("repos/") for r in rows)  # relocatable


@pytest.mark.podman
def test_bundled_controls_on_a_sample(bundled, podman_runtime):
    from eval.grading.grader import grade
    from eval.integrity.retry import RetryPolicy
    from eval.tasks.trialspec import task_trial_spec
    from sandbox.trials.pool import VerifierPool
    sample = []
    for name in sorted({t.extra["project"] for t in bundled}):
        mine = [t for t in bundled if t.extra["project"] == name]
        sample += [mine[0], mine[-1]]
    specs = []
    for t in sample:
        specs.append(task_trial_spec(t, t.patch, f"gold-{t.instance_id}", timeout_s=60))
        specs.append(task_trial_spec(t, "", f"empty-{t.instance_id}", timeout_s=60))
    with VerifierPool(podman_runtime, max_concurrency=2, retry=RetryPolicy()) as pool:
        results = pool.map(specs)
    for i, t in enumerate(sample):
        g, e = results[2 * i], results[2 * i + 1]
        assert g.exit_class == e.exit_class == "ok", (g.error, e.error)
        gr = grade(g.log, f2p=t.FAIL_TO_PASS, p2p=t.PASS_TO_PASS, parser=t.log_parser)
        er = grade(e.log, f2p=t.FAIL_TO_PASS, p2p=t.PASS_TO_PASS, parser=t.log_parser,
                   expected_resolved=False)
        assert gr.resolved and gr.complete and gr.utility == 1.0, t.instance_id
        assert not er.resolved and er.complete, t.instance_id
        assert set(er.f2p.values()) <= {"FAILED", "ERROR"}
        assert set(er.p2p.values()) == {"PASSED"}
        assert er.utility == 0.0


@pytest.mark.podman
def test_bundled_holdout_is_sealed_and_binding(bundled):
    from eval.tasks.sealed import SealedTaskError, ids_sha256, read_manifest
    from eval.tasks.splits import load_tasks

    man = read_manifest(REPO_ROOT / "datasets" / "bundled_holdout.json")
    ids = [t.instance_id for t in bundled]
    assert man["pool"] == "bundled" and man["pool_sha256"] == ids_sha256(ids)
    assert set(man["ids"]) <= set(ids)
    assert 0.2 <= man["n"] / len(ids) <= 0.3
    with pytest.raises(SealedTaskError) as exc:
        load_tasks("bundled", purpose="train")
    assert all(i in str(exc.value) for i in man["ids"])
    train = load_tasks("bundled:train", purpose="train")
    assert len(train) == len(ids) - man["n"]
    assert not {t.instance_id for t in train} & set(man["ids"])
    hold = load_tasks("bundled:holdout")
    assert [t.instance_id for t in hold] == man["ids"]
    assert load_tasks(str(REPO_ROOT / "datasets" / "bundled_holdout.json")) == hold


@pytest.mark.podman
@pytest.mark.slow
def test_cold_rebuild_gives_identical_tasks(bundled, tmp_path, monkeypatch):
    """A second build from scratch (own cache, sdists copied) writes the same tasks.

    It rebuilds the recipe's first project, not all of them (one project's trials instead of
    every project's: the costliest test of the suite before). What it still proves: a cold
    build, screening and control trials included, writes that project's rows of the cached
    build byte for byte (only the recipe hash they carry differs), and the cache folder is
    named by the recipe alone. A project's candidates (``random.Random(f"{seed}:{name}")``),
    screening rounds, controls and pairs depend on that project only
    (:func:`eval.tasks.bundled.build.plan_round` sizes each project's batch from its own
    outcomes), so one project's rebuild checks what the whole set's would.
    """
    import dataclasses

    from eval.tasks.bundled.build import build
    from eval.tasks.bundled.cache import built_dir
    from eval.tasks.bundled.recipe import cache_dir

    full = load_recipe()
    src = built_dir(full)
    sd = cache_dir() / "sdists"
    monkeypatch.setenv("ECREDIT_CACHE", str(tmp_path / "cache"))
    shutil.copytree(sd, tmp_path / "cache" / "sdists")
    new = built_dir(full)
    assert new != src and new.name == src.name
    project = full.projects[0]
    one = dataclasses.replace(full, projects=(project,), min_total=full.min_per_project)
    out = built_dir(one)
    build(one, out, log=lambda msg: print(f"[build_tasks] {msg}", flush=True))
    want = [line for line in (src / "tasks.jsonl").read_text().splitlines()
            if json.loads(line)["extra"]["project"] == project.name]
    got = (out / "tasks.jsonl").read_text().replace(out.name, src.name).splitlines()
    assert want and got == want
    assert os.path.isdir(out / "repos")
