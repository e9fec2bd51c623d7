"""Task schema, split loaders, sealed holdouts (eval.tasks.schema, eval.tasks.splits, eval.tasks.sealed,
eval.holdout). No hub access, no Podman.

Fixtures in the SWE-bench format are written by the tests themselves.
"""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest
from conftest import REPO_ROOT, git, write_jsonl

from eval import holdout
from eval.holdout import seal
from eval.tasks import sealed
from eval.tasks.schema import Task, save_tasks, task_from_row
from eval.tasks.sealed import SealedTaskError, check_not_sealed, ids_sha256, read_manifest
from eval.tasks.splits import load_tasks
from eval.tasks.trialspec import repo_archive, task_trial_spec
from sandbox.images import swebench_image

# An eval script shaped like the ones swebench 5 ships in its dataset rows.
SWE_EVAL = ("#!/bin/bash\nset -uxo pipefail\nsource /opt/miniconda3/bin/activate\n"
            "conda activate testbed\ncd /testbed\n"
            "git checkout {base} tests/test_x.py\n"
            "git apply -v - <<'EOF_114329324912'\n{test_patch}\nEOF_114329324912\n"
            ": '>>>>> Start Test Output'\n./tests/runtests.py --verbosity 2 x\n"
            ": '>>>>> End Test Output'\ngit checkout {base} tests/test_x.py\n")


def swe_row(i: int, repo: str = "django/django", *, with_script: bool = True, **over) -> dict:
    """One SWE-bench Verified-style row; list fields as JSON strings like the HF files."""
    base = f"{i:040x}"
    row = {
        "repo": repo, "instance_id": f"{repo.replace('/', '__')}-{10000 + i}",
        "base_commit": base, "patch": "diff --git a/x.py b/x.py\n", "test_patch": "diff --git a/t b/t\n",
        "problem_statement": f"issue {i}", "hints_text": "", "created_at": "2019-01-01T00:00:00Z",
        "version": "3.0", "FAIL_TO_PASS": json.dumps([f"test_new_{i} (x.tests.T)"]),
        "PASS_TO_PASS": json.dumps(["test_old (x.tests.T)", "test_other (x.tests.T)"]),
        "environment_setup_commit": "e" * 40, "difficulty": "<15 min fix",
    }
    if with_script:
        row["eval_script"] = SWE_EVAL.format(base=base, test_patch="--- a/t\n+++ b/t")
    row.update(over)
    return row




# ---------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------

def test_json_string_and_list_fields_give_the_same_task():
    a = task_from_row(swe_row(1), 1)
    row = swe_row(1)
    row["FAIL_TO_PASS"] = json.loads(row["FAIL_TO_PASS"])
    row["PASS_TO_PASS"] = json.loads(row["PASS_TO_PASS"])
    b = task_from_row(row, 1)
    assert a == b
    assert a.FAIL_TO_PASS == ["test_new_1 (x.tests.T)"]
    assert a.PASS_TO_PASS == ["test_old (x.tests.T)", "test_other (x.tests.T)"]
    assert a.extra["difficulty"] == "<15 min fix" and a.extra["hints_text"] == ""


def test_swebench_row_gets_official_parser_image_and_script():
    t = task_from_row(swe_row(7), 1, official=True)
    assert t.log_parser == "parse_log_django"
    assert t.image == swebench_image(t.instance_id)
    assert t.image.startswith("docker.io/swebench/sweb.eval.x86_64.django_1776_django-10007")
    # make_test_spec records the test command's own exit status after the end marker
    lines = t.eval_script.splitlines()
    assert lines[:2] == ["#!/bin/bash", "set -uxo pipefail"]
    end = next(i for i, s in enumerate(lines) if ">>>>> End Test Output" in s)
    assert lines[end - 1] == "SWEBENCH_TEST_EXIT_CODE=$?"
    assert lines[end + 1] == 'echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"'
    assert t.repo_dir is None and t.workdir == "/testbed"
    # a saved task loads back unchanged (the script is not wrapped twice)
    assert task_from_row(t.to_dict(), 1) == t
    assert task_from_row(swe_row(8, repo="sympy/sympy"), 1).log_parser == "parse_log_sympy"
    assert task_from_row(swe_row(9, repo="pytest-dev/pytest"), 1).log_parser == "parse_log_pytest"


def test_official_row_keeps_its_own_image_registry_qualified():
    """A row's own ``image`` wins; Podman needs the registry in front."""
    t = task_from_row(swe_row(3, image="swebench/whatever:v1"), 1, official=True)
    assert t.image == "docker.io/swebench/whatever:v1"
    t = task_from_row(swe_row(3, image="ghcr.io/me/img:2"), 1, official=True)
    assert t.image == "ghcr.io/me/img:2"
    t = task_from_row(swe_row(3, image="localhost/img:2"), 1, official=True)
    assert t.image == "localhost/img:2"
    assert task_from_row(swe_row(3), 1, official=True).image == swebench_image(t.instance_id)


@pytest.mark.parametrize("field, value, needle", [
    ("base_commit", None, "field 'base_commit' missing"),
    ("version", 3.0, "field 'version' must be a string, got float"),
    ("FAIL_TO_PASS", "[not json", "field 'FAIL_TO_PASS' is a string but not JSON"),
    ("FAIL_TO_PASS", "[]", "field 'FAIL_TO_PASS' is empty"),
    ("PASS_TO_PASS", json.dumps({"a": 1}), "field 'PASS_TO_PASS' must be a list"),
    ("PASS_TO_PASS", json.dumps(["a", 3]), "field 'PASS_TO_PASS' item 1"),
    ("PASS_TO_PASS", json.dumps(["a", "a"]), "field 'PASS_TO_PASS' lists test ids twice"),
    ("PASS_TO_PASS", json.dumps(["test_new_2 (x.tests.T)"]), "repeats FAIL_TO_PASS"),
    ("instance_id", "  ", "field 'instance_id' is empty"),
    ("eval_script", 5, "field 'eval_script' must be a string"),
])
def test_malformed_row_names_row_number_and_field(tmp_path, field, value, needle):
    rows = [swe_row(1), swe_row(2), swe_row(3)]
    if value is None:
        del rows[1][field]
    else:
        rows[1][field] = value
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    with pytest.raises(ValueError) as exc:
        load_tasks(path)
    assert f"{path} row 2: " in str(exc.value)
    assert needle in str(exc.value)


def test_jsonl_row_numbers_are_line_numbers(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(swe_row(1)) + "\n\n" + "{oops\n")
    with pytest.raises(ValueError, match=r"row 3: not valid JSON"):
        load_tasks(str(p))
    bad = swe_row(2)
    del bad["patch"]
    p.write_text(json.dumps(swe_row(1)) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"row 3: field 'patch' missing"):
        load_tasks(str(p))


def test_unknown_repo_without_parser_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [swe_row(1, repo="me/unknown")])
    with pytest.raises(ValueError, match=r"row 1: field 'log_parser' missing and swebench has no "
                                         r"parser for repo 'me/unknown'"):
        load_tasks(path)
    ok = write_jsonl(tmp_path / "u.jsonl", [swe_row(1, repo="me/unknown", log_parser="pytest")])
    assert load_tasks(ok)[0].log_parser == "parse_log_pytest"
    bad = write_jsonl(tmp_path / "v.jsonl", [swe_row(1, log_parser="nope")])
    with pytest.raises(ValueError, match=r"row 1: field 'log_parser'"):
        load_tasks(bad)


def test_duplicate_ids_in_a_jsonl_are_refused(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [swe_row(1), swe_row(2), swe_row(1)])
    with pytest.raises(ValueError, match=r"duplicate instance_id: django__django-10001 "
                                         r"\(rows 1 and 3\)"):
        load_tasks(path)


def test_unknown_sources_and_purposes(tmp_path):
    with pytest.raises(ValueError, match="unknown task source 'nonsense'"):
        load_tasks("nonsense")
    with pytest.raises(ValueError, match="purpose"):
        load_tasks("official500", purpose="play")
    with pytest.raises(FileNotFoundError):
        load_tasks(str(tmp_path / "absent.jsonl"))
    p = tmp_path / "t.csv"
    p.write_text("x")
    with pytest.raises(ValueError, match="unknown tasks file type"):
        load_tasks(str(p))


def test_save_and_reload_roundtrip(tmp_path):
    tasks = load_tasks(write_jsonl(tmp_path / "t.jsonl", [swe_row(i) for i in range(3)]))
    save_tasks(tasks, tmp_path / "out.jsonl")
    assert load_tasks(str(tmp_path / "out.jsonl")) == tasks


def test_repo_dir_is_checked_when_the_file_is_loaded(tmp_path):
    """A row copied out of its task folder keeps its relative repo_dir: refused at load, naming
    the field, the row and where the path resolved (not at the first rollout)."""
    rows = [swe_row(0, repo_dir="repos/proj")]
    src = tmp_path / "copy" / "t.jsonl"
    src.parent.mkdir()
    with pytest.raises(ValueError, match=r"row 1: field 'repo_dir' 'repos/proj' is not a git "
                       r"repository \(resolved to .*copy/repos/proj"):
        load_tasks(write_jsonl(src, rows))
    (src.parent / "repos" / "proj").mkdir(parents=True)  # a folder, still no repository
    with pytest.raises(ValueError, match="field 'repo_dir'"):
        load_tasks(str(src))
    git(src.parent / "repos" / "proj", "init", "-q")
    (task,) = load_tasks(str(src))
    assert task.repo_dir == str((src.parent / "repos" / "proj").resolve())


# ---------------------------------------------------------------------------
# official500
# ---------------------------------------------------------------------------

REPOS = ["django/django", "sympy/sympy", "astropy/astropy", "pytest-dev/pytest",
         "scikit-learn/scikit-learn"]


def official_rows(n: int) -> list[dict]:
    return [swe_row(i, repo=REPOS[i % len(REPOS)]) for i in range(n)]


@pytest.mark.parametrize("suffix", ["jsonl", "json", "parquet"])
def test_official500_from_a_local_file(tmp_path, suffix):
    rows = official_rows(500)
    path = tmp_path / f"verified.{suffix}"
    if suffix == "jsonl":
        write_jsonl(path, rows)
    elif suffix == "json":
        path.write_text(json.dumps(rows))
    else:
        from datasets import Dataset

        Dataset.from_list(rows).to_parquet(str(path))
    tasks = load_tasks(f"official500:{path}")
    assert len(tasks) == 500 and len({t.instance_id for t in tasks}) == 500
    assert tasks == load_tasks("official500", path=path)
    by_repo = {t.repo: t.log_parser for t in tasks}
    assert by_repo["django/django"] == "parse_log_django"
    assert by_repo["sympy/sympy"] == "parse_log_sympy"
    assert by_repo["scikit-learn/scikit-learn"] == "parse_log_pytest_v2"  # = parse_log_scikit
    assert all(t.image == swebench_image(t.instance_id) for t in tasks)


def test_official500_refuses_499_rows(tmp_path):
    path = write_jsonl(tmp_path / "v.jsonl", official_rows(499))
    with pytest.raises(ValueError, match=r"expected 500 unique instance ids, found 499 rows "
                                         r"with 499 unique ids"):
        load_tasks(f"official500:{path}")


def test_official500_refuses_duplicates(tmp_path):
    rows = official_rows(500)
    rows[-1] = dict(rows[3])
    path = write_jsonl(tmp_path / "v.jsonl", rows)
    with pytest.raises(ValueError, match=r"found 500 rows with 499 unique ids; duplicated: "
                                         r"pytest-dev__pytest-10003"):
        load_tasks(f"official500:{path}")


def test_official500_hub_offline_says_what_to_do(monkeypatch):
    """Through HF datasets with HF_HUB_OFFLINE=1: a cached copy must hold 500 ids, no copy
    gives an error that names the local-file alternative."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    try:
        tasks = load_tasks("official500")
    except RuntimeError as exc:
        assert "SWE-bench/SWE-bench_Verified" in str(exc)
        assert "official500:PATH" in str(exc)
    else:  # pragma: no cover - only where the dataset is in the local HF cache
        assert len({t.instance_id for t in tasks}) == 500


def test_row_without_eval_script_loads_but_cannot_be_verified(tmp_path):
    t = task_from_row(swe_row(1, with_script=False), 1, official=True)
    assert t.eval_script == ""
    with pytest.raises(ValueError, match="eval_script: task django__django-10001 has none"):
        task_trial_spec(t, "", "t1")


def test_swebench_trial_spec_uses_the_image_repo():
    t = task_from_row(swe_row(1), 1, official=True)
    spec = task_trial_spec(t, "diff --git a/x b/x\n", "t-1", timeout_s=30)
    assert spec.repo_archive is None and spec.image == t.image and spec.workdir == "/testbed"
    assert spec.eval_script == t.eval_script and spec.timeout_s == 30


def test_bundled_style_trial_spec_archives_base_commit_once(tmp_path):
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "calc.py").write_text("changed later\n")
    git(repo, "commit", "-qam", "later")
    t = task_from_row(swe_row(1, repo_dir="r", base_commit=base, image="localhost/x:1",
                             log_parser="parse_log_pytest"), 1, base_dir=tmp_path)
    assert t.repo_dir == str(repo.resolve())
    s1 = task_trial_spec(t, "", "a")
    s2 = task_trial_spec(t, "", "b")
    assert s1.repo_archive is s2.repo_archive  # cached per (repo_dir, commit)
    with tarfile.open(fileobj=io.BytesIO(s1.repo_archive)) as tar:
        assert tar.extractfile("calc.py").read() == b"def add(a, b):\n    return a - b\n"
    with pytest.raises(ValueError, match="base_commit"):
        repo_archive(repo, "0" * 40)


# ---------------------------------------------------------------------------
# sealed holdouts
# ---------------------------------------------------------------------------

def test_seal_writes_a_binding_manifest(tmp_path, ds_dir):
    pool = write_jsonl(tmp_path / "pool.jsonl", [swe_row(i) for i in range(40)])
    out = ds_dir / "hold.json"
    man = seal(pool, 10, 7, out)
    assert man == read_manifest(out)
    assert man["sealed"] is True and man["n"] == 10 and man["seed"] == 7 and man["pool"] == pool
    assert man["ids"] == sorted(man["ids"]) and man["sha256"] == ids_sha256(man["ids"])
    assert man["pool_size"] == 40
    # deterministic: a second seal with the same inputs is a no-op, another seed is refused
    assert seal(pool, 10, 7, out) == man
    with pytest.raises(FileExistsError, match="different sealed manifest"):
        seal(pool, 10, 8, out)
    # the manifest loads its tasks from the pool
    sealed = load_tasks(str(out))
    assert [t.instance_id for t in sealed] == man["ids"]
    # training refuses the pool (it holds sealed ids), listing every one of them
    with pytest.raises(SealedTaskError) as exc:
        load_tasks(pool, purpose="train")
    for i in man["ids"]:
        assert f"{i} (hold.json)" in str(exc.value)
    assert "10 task(s) are sealed" in str(exc.value)
    rest = [t for t in load_tasks(pool) if t.instance_id not in man["ids"]]
    check_not_sealed([t.instance_id for t in rest])  # no error
    save_tasks(rest, tmp_path / "train.jsonl")
    assert len(load_tasks(str(tmp_path / "train.jsonl"), purpose="train")) == 30


def test_tampered_manifest_is_refused(tmp_path, ds_dir):
    pool = write_jsonl(tmp_path / "pool.jsonl", [swe_row(i) for i in range(12)])
    out = ds_dir / "h.json"
    seal(pool, 3, 1, out)
    data = json.loads(out.read_text())
    data["ids"][0] = "django__django-99999"
    out.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="field 'sha256' does not match"):
        read_manifest(out)
    with pytest.raises(ValueError, match="does not match"):
        check_not_sealed(["anything"])


def test_selection_is_independent_of_pool_order():
    ids = [f"t{i}" for i in range(50)]
    assert sealed.select_ids(ids, 5, 3) == sealed.select_ids(list(reversed(ids)), 5, 3)
    assert sealed.select_ids(ids, 5, 3) != sealed.select_ids(ids, 5, 4)
    with pytest.raises(ValueError, match="n: must be in 1..50"):
        sealed.select_ids(ids, 51, 3)


def test_holdout_cli(tmp_path, ds_dir, capsys):
    pool = write_jsonl(tmp_path / "pool.jsonl", [swe_row(i) for i in range(20)])
    out = ds_dir / "cli.json"
    assert holdout.main(["seal", "--pool", pool, "--n", "5", "--seed", "11", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["n"] == 5 and printed["sha256"] == read_manifest(out)["sha256"]
    assert holdout.main(["show", str(out)]) == 0
    assert holdout.main(["check", "--source", pool]) == 1
    assert "sealed for evaluation" in capsys.readouterr().err


def test_holdout100_without_manifest_explains_how_to_seal(ds_dir):
    with pytest.raises(FileNotFoundError, match="python -m eval.holdout seal"):
        load_tasks("holdout100")


def test_repository_manifests_are_valid():
    """Every sealed manifest committed under datasets/ verifies (sha256 of its ids)."""
    mans = sealed.manifests(REPO_ROOT / "datasets")
    for path, man in mans.items():
        assert man["sha256"] == ids_sha256(man["ids"]), path
    assert not (REPO_ROOT / "datasets" / "__init__.py").exists()


def test_task_fields_match_the_issue():
    names = [f for f in Task.__dataclass_fields__]
    for f in ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
              "FAIL_TO_PASS", "PASS_TO_PASS", "version", "environment_setup_commit", "image",
              "eval_script", "log_parser", "repo_dir", "workdir", "extra"):
        assert f in names
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
