"""official500 rows kept as swebench 5 ships them, and user-given holdout lists sealed with
``python -m eval.holdout seal --from``. Rows are made here; no hub, no Podman."""

from __future__ import annotations

import json

import pytest
from conftest import write_jsonl

from eval import holdout
from eval.holdout import seal_list
from eval.run import split_denominator
from eval.tasks.schema import SCRIPT_FROM_ROW, SCRIPT_MISSING, task_from_row
from eval.tasks.sealed import SealedTaskError, file_sha256, ids_sha256, read_manifest
from eval.tasks.splits import load_tasks
from eval.tasks.trialspec import task_trial_spec

# (repo, version, swebench's parser for the repo) — real SWE-bench Verified repo/version pairs
REPOS = [("astropy/astropy", "5.1", "parse_log_pytest_v2"),
         ("django/django", "4.0", "parse_log_django"),
         ("sympy/sympy", "1.11", "parse_log_sympy"),
         ("pytest-dev/pytest", "7.2", "parse_log_pytest")]


def verified_row(i: int, *, script: bool = True, **over) -> dict:
    """A row shaped like ``SWE-bench/SWE-bench_Verified`` (swebench 5): ``image``,
    ``eval_script``, ``log_parser`` included; list fields as JSON strings."""
    repo, version, parser = REPOS[i % len(REPOS)]
    iid = f"{repo.replace('/', '__')}-{12000 + i}"
    base = f"{i:040x}"
    row = {
        "repo": repo, "instance_id": iid, "base_commit": base, "version": version,
        "patch": "diff --git a/m.py b/m.py\n", "test_patch": "diff --git a/t/test_m.py b/t/test_m.py\n",
        "problem_statement": f"issue {i}", "hints_text": "", "created_at": "2022-03-01T00:00:00Z",
        "environment_setup_commit": "c" * 40, "difficulty": "15 min - 1 hour",
        "FAIL_TO_PASS": json.dumps([f"t/test_m.py::test_new_{i}"]),
        "PASS_TO_PASS": json.dumps(["t/test_m.py::test_old"]),
        "image": f"swebench/sweb.eval.x86_64.{iid.replace('__', '_1776_').lower()}:latest",
        "log_parser": parser, "eval_type": "pass_and_fail",
    }
    if script:
        row["eval_script"] = (
            "#!/bin/bash\nset -uxo pipefail\nsource /opt/miniconda3/bin/activate\n"
            f"conda activate testbed\ncd /testbed\ngit checkout {base} t/test_m.py\n"
            "git apply -v - <<'EOF_114329324912'\n--- a/t\n+++ b/t\nEOF_114329324912\n"
            ": '>>>>> Start Test Output'\npytest -rA t/test_m.py\n"
            f": '>>>>> End Test Output'\ngit checkout {base} t/test_m.py\n")
    row.update(over)
    return row




@pytest.fixture
def verified(tmp_path):
    """A local 500-row export of SWE-bench Verified (made here)."""
    return write_jsonl(tmp_path / "verified.jsonl", [verified_row(i) for i in range(500)])


# ---------------------------------------------------------------------------
# official500
# ---------------------------------------------------------------------------

def test_official500_keeps_image_eval_script_and_log_parser(verified):
    tasks = load_tasks(f"official500:{verified}")
    assert len(tasks) == 500
    astropy, django = tasks[0], tasks[1]
    assert astropy.image == ("docker.io/swebench/sweb.eval.x86_64."
                             "astropy_1776_astropy-12000:latest")
    assert astropy.log_parser == "parse_log_pytest_v2" and django.log_parser == "parse_log_django"
    # the row's own script, with the test exit code recorded by swebench's make_test_spec
    lines = astropy.eval_script.splitlines()
    assert "pytest -rA t/test_m.py" in lines and "git checkout " + "0" * 40 + " t/test_m.py" in lines
    i = lines.index(": '>>>>> End Test Output'")
    assert lines[i - 1] == "SWEBENCH_TEST_EXIT_CODE=$?"
    assert astropy.eval_script_source == SCRIPT_FROM_ROW
    assert not astropy.log_parser_fallback and not astropy.checkout_base
    assert astropy.extra["difficulty"] == "15 min - 1 hour"


def test_row_without_eval_script_is_marked_missing_because_swebench5_cannot_make_one():
    """swebench 5.0.2's make_test_spec reads the row's eval_script; it has no per-repo table
    to build one from repo/version (MAP_REPO_VERSION_TO_SPECS of swebench <= 4 is gone)."""
    import swebench.harness.constants as constants
    from swebench.harness.utils import make_test_spec

    old = verified_row(1, script=False)
    with pytest.raises(KeyError, match="eval_script"):
        make_test_spec(old)
    assert not hasattr(constants, "MAP_REPO_VERSION_TO_SPECS")
    t = task_from_row(old, 1, official=True)
    assert t.eval_script == "" and t.eval_script_source == SCRIPT_MISSING
    assert t.to_dict()["eval_script_source"] == SCRIPT_MISSING
    with pytest.raises(ValueError, match="eval_script: task django__django-12001 has none"):
        task_trial_spec(t, "", "t1")


def test_official500_still_checks_the_500_ids(tmp_path):
    rows = [verified_row(i) for i in range(500)]
    rows[7] = dict(rows[8])
    path = write_jsonl(tmp_path / "v.jsonl", rows)
    with pytest.raises(ValueError, match=r"found 500 rows with 499 unique ids; duplicated: "
                                         r"astropy__astropy-12008"):
        load_tasks(f"official500:{path}")


# ---------------------------------------------------------------------------
# seal --from
# ---------------------------------------------------------------------------

def _ids(n, start=0):
    return [verified_row(i)["instance_id"] for i in range(start, start + n)]


def test_seal_ids_from_a_text_list_takes_rows_from_official500(tmp_path, ds_dir, verified):
    ids = _ids(100, start=50)
    lst = tmp_path / "mine.txt"
    lst.write_text("# my held-out instances\n\n" + "\n".join(reversed(ids)) + "\n")
    man = seal_list("holdout100", lst, rows=f"official500:{verified}")
    out = ds_dir / "holdout100.json"
    assert read_manifest(out) == man
    assert man["ids"] == sorted(ids) and man["sha256"] == ids_sha256(ids) and man["n"] == 100
    assert man["rows_file"] == "holdout100.rows.jsonl"
    assert man["rows_sha256"] == file_sha256(ds_dir / "holdout100.rows.jsonl")
    assert man["seed"] is None and man["from"] == str(lst)
    held = load_tasks("holdout100")
    pool = {t.instance_id: t for t in load_tasks(f"official500:{verified}")}
    assert [t.instance_id for t in held] == sorted(ids)
    assert all(t == pool[t.instance_id] for t in held)  # the rows as official500 loads them
    assert split_denominator("holdout100", len(held)) == 100
    # from now on training refuses them; the rest of the pool trains
    with pytest.raises(SealedTaskError, match="100 task"):
        load_tasks(f"official500:{verified}", purpose="train")
    # a second identical seal is a no-op; another list is refused without --force
    assert seal_list("holdout100", lst, rows=f"official500:{verified}") == man
    other = tmp_path / "other.json"
    other.write_text(json.dumps(_ids(100, start=0)))
    with pytest.raises(FileExistsError, match="different sealed manifest"):
        seal_list("holdout100", other, rows=f"official500:{verified}")
    assert read_manifest(out) == man


def test_sealed_rows_file_is_checked(tmp_path, ds_dir, verified):
    lst = tmp_path / "ids.json"
    lst.write_text(json.dumps(_ids(100)))
    seal_list("holdout100", lst, rows=f"official500:{verified}")
    rows = ds_dir / "holdout100.rows.jsonl"
    rows.write_text(rows.read_text().replace("issue 3", "issue three"))
    with pytest.raises(ValueError, match="changed since .* was sealed"):
        load_tasks("holdout100")
    rows.unlink()
    with pytest.raises(FileNotFoundError, match="holdout100.rows.jsonl"):
        load_tasks("holdout100")


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_seal_rows_given_directly(tmp_path, ds_dir, suffix):
    rows = [verified_row(i) for i in range(100)]
    path = tmp_path / f"held.{suffix}"
    if suffix == "jsonl":
        write_jsonl(path, rows)
    else:
        from datasets import Dataset

        Dataset.from_list(rows).to_parquet(str(path))
    man = seal_list("holdout100", path)
    assert man["pool"] == str(path) and man["n"] == 100
    held = load_tasks("holdout100")
    assert {t.instance_id for t in held} == {r["instance_id"] for r in rows}
    assert held[0].image.startswith("docker.io/swebench/") and held[0].eval_script_source == "row"


def test_holdout100_size_is_refused_unless_allowed_and_nothing_is_written(tmp_path, ds_dir,
                                                                          verified):
    lst = tmp_path / "ids.txt"
    lst.write_text("\n".join(_ids(99)) + "\n")
    with pytest.raises(ValueError, match="holdout100 takes 100 ids .* the list holds 99; pass "
                                         "--allow-size"):
        seal_list("holdout100", lst, rows=f"official500:{verified}")
    assert list(ds_dir.iterdir()) == []
    man = seal_list("holdout100", lst, rows=f"official500:{verified}", allow_size=True)
    assert man["n"] == 99
    with pytest.raises(Exception, match="fixed denominator is 100 tasks but 99"):
        split_denominator("holdout100", len(load_tasks("holdout100")))
    # other names take any size
    assert seal_list("mine", lst, rows=f"official500:{verified}")["n"] == 99


@pytest.mark.parametrize("content, needle", [
    ("a\nb\na\n", "ids repeat: a"),
    ("", "no ids in the list"),
    ('["ok", 3]', "not an instance id: 3"),
])
def test_bad_lists_are_refused(tmp_path, ds_dir, content, needle):
    lst = tmp_path / ("l.json" if content.startswith("[") else "l.txt")
    lst.write_text(content)
    with pytest.raises(ValueError, match=needle):
        seal_list("mine", lst)
    assert list(ds_dir.iterdir()) == []


def test_unknown_ids_and_malformed_rows_write_nothing(tmp_path, ds_dir, verified):
    lst = tmp_path / "ids.txt"
    lst.write_text("\n".join(_ids(98) + ["nope__nope-1", "nope__nope-2"]))
    with pytest.raises(ValueError, match=r"2 id\(s\) not in --rows .*nope__nope-1, nope__nope-2"):
        seal_list("holdout100", lst, rows=f"official500:{verified}")
    rows = [verified_row(i) for i in range(100)]
    del rows[4]["base_commit"]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(ValueError, match=r"rows.jsonl row 5: field 'base_commit' missing"):
        seal_list("holdout100", path)
    assert list(ds_dir.iterdir()) == []


def test_a_failed_manifest_write_leaves_no_rows_file(tmp_path, ds_dir, verified, monkeypatch):
    lst = tmp_path / "ids.txt"
    lst.write_text("\n".join(_ids(100)))

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(holdout, "write_manifest", boom)
    with pytest.raises(OSError, match="disk full"):
        seal_list("holdout100", lst, rows=f"official500:{verified}")
    assert list(ds_dir.iterdir()) == []


def test_seal_from_cli(tmp_path, ds_dir, verified, capsys):
    lst = tmp_path / "ids.txt"
    lst.write_text("\n".join(_ids(100)))
    argv = ["seal", "--name", "holdout100", "--from", str(lst), "--rows", f"official500:{verified}"]
    assert holdout.main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["n"] == 100 and printed["sha256"] == ids_sha256(_ids(100))
    assert printed["rows_sha256"] == file_sha256(ds_dir / "holdout100.rows.jsonl")
    assert holdout.main(["check", "--source", f"official500:{verified}"]) == 1
    assert "sealed for evaluation" in capsys.readouterr().err
    short = tmp_path / "short.txt"
    short.write_text("\n".join(_ids(3)))
    assert holdout.main(["seal", "--name", "holdout100", "--from", str(short), "--force"]) == 1
    assert "holdout100 takes 100 ids" in capsys.readouterr().err
    # rows from the hub (HF_HUB_OFFLINE=1 in tests): one error line, exit 1, nothing written
    before = sorted(p.name for p in ds_dir.iterdir())
    assert holdout.main(["seal", "--name", "other", "--from", str(lst)]) == 1
    assert capsys.readouterr().err.startswith("error: ")
    assert sorted(p.name for p in ds_dir.iterdir()) == before
    with pytest.raises(SystemExit):
        holdout.main(["seal", "--from", str(lst)])  # --name missing
    assert "--from needs --name" in capsys.readouterr().err


def test_rows_with_image_assets_are_refused_and_empty_ones_load():
    """swebench's harness downloads image_assets at eval time; skipping them would grade
    against missing files."""
    assets = {"test_patch": [{"path": "lib/tests/baseline/x.png", "url": "https://e/x.png"}]}
    with pytest.raises(ValueError, match=r"row 3: field 'image_assets' lists 1 binary test file"):
        task_from_row(verified_row(1, image_assets=json.dumps(assets)), 3, official=True)
    empty = json.dumps({"test_patch": [], "patch": []})
    assert task_from_row(verified_row(1, image_assets=empty), 3, official=True).extra[
        "image_assets"] == empty
