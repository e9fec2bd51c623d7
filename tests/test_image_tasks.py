"""Stand-in image-held tasks (eval.tasks.bundled.imagetasks): images, rows, splits,
and verifier trials with ``repo_archive=None`` (the image holds /testbed).

Unit tests need nothing; tests marked ``podman`` build the image tasks (or load them from the
cache: about 40 s cold here, on top of the cached bundled set) and run real containers.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest
from conftest import REPO_ROOT

from eval.tasks.bundled.imagetasks import (
    ACTIVATE,
    BUILD_OUTPUT,
    Layout,
    conftest_text,
    eval_image_name,
    image_eval_script,
    layout,
)
from eval.tasks.bundled.recipe import BuildError, ModuleSpec, ProjectRecipe, load_recipe


def _project(path: str) -> ProjectRecipe:
    return ProjectRecipe(name="demo", version="1.0", sdist="demo-1.0.tar.gz", sha256="0" * 64,
                         homepage="", env={}, test_support=(),
                         modules=(ModuleSpec(path, ("tests/test_m.py",)),))


def test_layout_and_names():
    by_name = {p.name: layout(p) for p in load_recipe().projects}
    assert by_name == {"inflection": Layout("", "inflection"), "toolz": Layout("", "toolz"),
                       "cachetools": Layout("src", "cachetools")}
    assert by_name["cachetools"].build_output == "src/cachetools/_build_info.py"
    assert by_name["toolz"].build_output == "toolz/_build_info.py"
    with pytest.raises(BuildError, match="demo: module m.py is not inside a package"):
        layout(_project("m.py"))
    # swebench's naming: "__" -> "_1776_", lowercase, registry-qualified
    assert (eval_image_name("bundled__Toolz-1.2.0-0004", "abc")
            == "localhost/ecredit-eval.x86_64.bundled_1776_toolz-1.2.0-0004:abc")


def test_eval_script_activates_the_environment_first():
    p = _project("demo/core.py")
    files = {"tests/test_m.py": b"def test_x():\n    assert True\n"}
    script = image_eval_script(p, ("tests/test_m.py",), files, b"import os\n")
    lines = script.splitlines()
    assert lines.index(ACTIVATE) < lines.index("cd /testbed")
    assert ACTIVATE == "source /etc/profile.d/testbed.sh"
    # conftest.py (which imports the build output) is restored like a test file
    assert "cat > 'conftest.py' <<" in script and "import os\n" in script
    assert script.index("conftest.py") < script.index(">>>>> Start Test Output")
    assert "python3 -m pytest -rA -p no:cacheprovider tests/test_m.py" in script
    assert conftest_text(Layout("src", "demo")).endswith(
        'importlib.import_module("demo._build_info")\n')
    assert BUILD_OUTPUT == "_build_info.py"


def _src_repo(tmp_path, files: dict[str, str]) -> tuple[str, str]:
    from eval.tasks.bundled.sources import GitRepo

    src = tmp_path / "src"
    for path, text in files.items():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_text(text)
    return str(src), GitRepo(src).init_pristine("pristine")


def test_task_repo_is_reproducible_with_two_commits(tmp_path):
    from eval.tasks.bundled.imagetasks import make_task_repo
    from eval.tasks.bundled.sources import GitRepo

    src, base = _src_repo(tmp_path, {"demo/core.py": "X = 1\n", "tests/test_m.py": "pass\n"})
    p = _project("demo/core.py")
    a = make_task_repo(src, base, p, tmp_path / "a")
    b = make_task_repo(src, base, p, tmp_path / "b")
    assert a == b and a[0] != a[1]
    repo = GitRepo(tmp_path / "a")
    assert repo.git("log", "--format=%s").splitlines() == [
        "build setup: demo/_build_info.py is generated (ignored), conftest.py imports it",
        "demo 1.0: sdist import"]
    assert repo.git("ls-tree", "-r", "--name-only", a[1]).split() == [
        ".gitignore", "conftest.py", "demo/core.py", "tests/test_m.py"]
    assert repo.git("status", "--porcelain") == ""
    (tmp_path / "a" / "demo" / "_build_info.py").write_text("X = 2\n")  # the build output
    assert repo.git("status", "--porcelain") == ""  # ignored
    # the source tree at the bundled base, nothing else of the source repository
    assert repo.git("show", f"{a[0]}:demo/core.py") == "X = 1\n"
    assert repo.git("rev-list", "--all").split() == [a[1], a[0]]


def test_task_repo_refuses_a_tree_that_has_our_files(tmp_path):
    from eval.tasks.bundled.imagetasks import make_task_repo

    src, base = _src_repo(tmp_path, {"demo/core.py": "X = 1\n", "conftest.py": "\n"})
    with pytest.raises(BuildError, match=r"demo: the sdist already has \['conftest.py'\]"):
        make_task_repo(src, base, _project("demo/core.py"), tmp_path / "a")


# ---------------------------------------------------------------------------
# built (Podman)
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bundled():
    from eval.tasks.bundled.cache import ensure_built

    return ensure_built(log=lambda msg: print(f"[build_tasks] {msg}", flush=True))


@pytest.fixture(scope="module")
def image_tasks(bundled):
    from eval.tasks.bundled.imagetasks import ensure_image_tasks

    return ensure_image_tasks(log=lambda msg: print(f"[build_tasks] {msg}", flush=True))


def _sample(tasks):
    """The first and the last task of each project, in project order."""
    firsts: dict[str, object] = {}
    lasts: dict[str, object] = {}
    for t in tasks:
        firsts.setdefault(t.extra["project"], t)
        lasts[t.extra["project"]] = t
    return [x for k in firsts for x in (firsts[k], lasts[k])]


def _in_image(image: str, cmd: str, shell: str = "bash -lc") -> subprocess.CompletedProcess:
    from sandbox.runtimes.podman_runtime import podman_env

    return subprocess.run(["podman", "run", "--rm", "--network", "none", image,
                           *shell.split(), cmd], capture_output=True, text=True,
                          env=podman_env(), timeout=60)


@pytest.mark.podman
def test_rows_are_swebench_format_without_repo_dir(bundled, image_tasks):
    from eval.tasks.bundled.imagetasks import env_image_name, missing_images

    assert [t.instance_id for t in image_tasks] == [t.instance_id for t in bundled]
    by_id = {t.instance_id: t for t in bundled}
    tags = {t.image.rsplit(":", 1)[1] for t in image_tasks}
    assert len(tags) == 1
    tag = tags.pop()
    assert missing_images(image_tasks) == []
    assert len({t.image for t in image_tasks}) == len(image_tasks)  # one image per task
    for t in image_tasks:
        b = by_id[t.instance_id]
        assert t.repo_dir is None and t.workdir == "/testbed"
        assert t.image == eval_image_name(t.instance_id, tag)
        assert t.extra["env_image"] == env_image_name(t.extra["project"], tag)
        assert (t.patch, t.FAIL_TO_PASS, t.PASS_TO_PASS, t.problem_statement, t.log_parser) == (
            b.patch, b.FAIL_TO_PASS, b.PASS_TO_PASS, b.problem_statement, b.log_parser)
        assert t.base_commit != b.base_commit and t.extra["bundled_base_commit"] == b.base_commit
        assert t.eval_script.splitlines()[3] == ACTIVATE
        assert ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE" in t.eval_script
    # every task image is its own (a layer cache keyed only by the Containerfile once gave
    # all tasks of a project the first task's tree); 3 project images besides
    build = json.loads((_built_dir() / "build.json").read_text())
    task_ids = [i for n, i in build["images"].items() if n.startswith("localhost/ecredit-eval")]
    assert len(set(task_ids)) == len(task_ids) == len(image_tasks)
    assert len(build["images"]) == len(image_tasks) + len(load_recipe().projects)
    rows = [json.loads(x) for x in
            (_built_dir() / "tasks.jsonl").read_text().splitlines()]
    for r in rows:
        assert r["repo_dir"] is None
        for key in ("instance_id", "repo", "base_commit", "problem_statement", "patch",
                    "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS", "image", "eval_script",
                    "log_parser", "version", "environment_setup_commit"):
            assert key in r, key


def _built_dir():
    from eval.tasks.bundled.imagetasks import image_built_dir

    return image_built_dir(load_recipe())


@pytest.mark.podman
def test_base_commit_is_reproducible(bundled, image_tasks, tmp_path):
    from eval.tasks.bundled.imagetasks import make_task_repo

    recipe = {p.name: p for p in load_recipe().projects}
    by_id = {t.instance_id: t for t in bundled}
    for t in _sample(image_tasks):
        b = by_id[t.instance_id]
        first, base = make_task_repo(b.repo_dir, b.base_commit, recipe[t.extra["project"]],
                                     tmp_path / t.instance_id)
        assert base == t.base_commit and first != base


@pytest.mark.podman
def test_image_holds_testbed_at_base_with_env_and_build_output(image_tasks):
    """/testbed at base_commit, clean, two commits of history without the fix; the venv on
    PATH only in a login shell; the build output present, ignored by git, and naming HEAD."""
    for t in _sample(image_tasks):
        bo = t.extra["build_output"]
        r = _in_image(t.image, "cd /testbed && which python && git rev-parse HEAD && "
                      "git status --porcelain && echo --- && git log --format=%s && echo --- && "
                      f"git status --porcelain --ignored {bo} && cat {bo} && "
                      f"(git cat-file -e {t.extra['pristine_commit']} 2>/dev/null "
                      "&& echo PRISTINE-REACHABLE || echo no-pristine)")
        assert r.returncode == 0, r.stderr
        head, log, rest = r.stdout.split("---\n")
        assert head.splitlines() == ["/opt/testbed-env/bin/python", t.base_commit]
        assert log.splitlines() == ["build setup: " + bo + " is generated (ignored), "
                                    "conftest.py imports it",
                                    f"{t.extra['project']} {t.version}: sdist import"]
        assert rest.splitlines()[0] == f"!! {bo}"
        assert f"BASE_COMMIT = '{t.base_commit}'" in rest
        assert "PYTHON = '/opt/testbed-env/bin/python'" in rest
        assert rest.splitlines()[-1] == "no-pristine"
        # a plain non-login shell does not see the environment (Debian has no bare python)
        plain = _in_image(t.image, "command -v python || echo none", shell="sh -c")
        assert plain.stdout.strip() == "none"
        # the environment's editable install imports the package from anywhere
        pkg = layout(next(p for p in load_recipe().projects if p.name == t.extra["project"]))
        imp = _in_image(t.image, f"cd / && python -c 'import {pkg.package}._build_info as b; "
                        "print(b.__file__)'")
        assert imp.stdout.strip() == f"/testbed/{bo}", imp.stderr


@pytest.mark.podman
def test_gold_resolves_and_empty_does_not_on_image_tasks(image_tasks, podman_runtime):
    from eval.grading.grader import grade
    from eval.integrity.retry import RetryPolicy
    from eval.tasks.trialspec import task_trial_spec
    from sandbox.trials.pool import VerifierPool
    sample = _sample(image_tasks)
    specs = []
    for t in sample:
        specs.append(task_trial_spec(t, t.patch, f"igold-{t.instance_id}", timeout_s=60))
        specs.append(task_trial_spec(t, "", f"iempty-{t.instance_id}", timeout_s=60))
    assert all(s.repo_archive is None for s in specs)
    with VerifierPool(podman_runtime, max_concurrency=2, retry=RetryPolicy()) as pool:
        results = pool.map(specs)
    for i, t in enumerate(sample):
        g, e = results[2 * i], results[2 * i + 1]
        assert g.exit_class == e.exit_class == "ok", (g.error, e.error, g.log[-800:])
        gr = grade(g.log, f2p=t.FAIL_TO_PASS, p2p=t.PASS_TO_PASS, parser=t.log_parser)
        er = grade(e.log, f2p=t.FAIL_TO_PASS, p2p=t.PASS_TO_PASS, parser=t.log_parser,
                   expected_resolved=False)
        assert gr.resolved and gr.complete and gr.utility == 1.0, (t.instance_id, g.log[-1500:])
        assert not er.resolved and er.complete and er.utility == 0.0, t.instance_id
        assert set(er.f2p.values()) <= {"FAILED", "ERROR"}
        assert set(er.p2p.values()) == {"PASSED"}


@pytest.mark.podman
def test_build_output_is_in_the_verifier_and_the_tests_need_it(image_tasks, podman_runtime):
    """The verifier container sees the untracked build output; the same gold trial with
    that file removed (an artifact cannot delete an ignored file) resolves nothing."""
    from eval.grading.grader import grade
    from eval.integrity.retry import RetryPolicy
    from eval.tasks.trialspec import task_trial_spec
    from sandbox.trials.pool import VerifierPool
    t = _sample(image_tasks)[-1]  # cachetools: src/ layout
    bo = t.extra["build_output"]
    base = task_trial_spec(t, t.patch, f"ibo-{t.instance_id}", timeout_s=60)
    head, rest = base.eval_script.split("\n", 1)
    show = dataclasses.replace(base, eval_script=f"{head}\necho \"bo: $(cat /testbed/{bo} | "
                               f"grep BASE_COMMIT)\"\n{rest}")
    gone = dataclasses.replace(base, trial_id=f"ibo-rm-{t.instance_id}",
                               eval_script=f"{head}\nrm /testbed/{bo}\n{rest}")
    with VerifierPool(podman_runtime, max_concurrency=2, retry=RetryPolicy()) as pool:
        r_show, r_gone = pool.map([show, gone])
    assert r_show.exit_class == "ok", r_show.error
    assert f"bo: BASE_COMMIT = '{t.base_commit}'" in r_show.log
    assert grade(r_show.log, f2p=t.FAIL_TO_PASS, p2p=t.PASS_TO_PASS,
                 parser=t.log_parser).resolved
    assert r_gone.exit_class == "ok", r_gone.error
    assert "_build_info" in r_gone.log and "ModuleNotFoundError" in r_gone.log
    gr = grade(r_gone.log, f2p=t.FAIL_TO_PASS, p2p=t.PASS_TO_PASS, parser=t.log_parser,
               expected_resolved=False)
    # pytest stops at the conftest (exit 4, no test ran): not resolved, and no utility is
    # invented for a run where nothing was observed
    assert not gr.resolved and not gr.complete and gr.utility is None
    assert gr.test_exit_code == 4 and gr.status_map == {}
    assert not gr.resolved_swebench_parser


@pytest.mark.podman
def test_bundled_image_splits_keep_the_sealed_partition(bundled, image_tasks):
    from eval.tasks.sealed import SealedTaskError, read_manifest
    from eval.tasks.splits import load_tasks

    man = read_manifest(REPO_ROOT / "datasets" / "bundled_holdout.json")
    with pytest.raises(SealedTaskError) as exc:
        load_tasks("bundled-image", purpose="train")
    assert all(i in str(exc.value) for i in man["ids"])
    train = load_tasks("bundled-image:train", purpose="train")
    assert [t.instance_id for t in train] == [t.instance_id for t in
                                              load_tasks("bundled:train", purpose="train")]
    assert all(t.repo_dir is None and t.extra["image_task"] for t in train)
    hold = load_tasks("bundled-image:holdout")
    assert [t.instance_id for t in hold] == man["ids"]
    assert all(t.repo_dir is None for t in hold)
    with pytest.raises(SealedTaskError):
        load_tasks("bundled-image:holdout", purpose="train")
    with pytest.raises(ValueError, match="unknown bundled-image split 'dev'"):
        load_tasks("bundled-image:dev")


@pytest.mark.podman
def test_cli_image_tasks_summary(image_tasks, capsys):
    from eval.build_tasks import main

    assert main(["--image-tasks"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["image_tasks"] == len(image_tasks) == out["images"]
    assert out["dir"] == str(_built_dir())
    assert sum(out["per_project"].values()) == len(image_tasks)
