"""The screening record (eval.tasks.bundled.record): a build skips the trials of candidates its
recipe's reference build rejected at screening, and writes the same tasks.

Unit tests read and write records; the ``podman`` test rebuilds one project with the
committed record and compares its rows with the cached build's byte for byte.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from eval.tasks.bundled.mutations import Mutation
from eval.tasks.bundled.recipe import default_recipe_path, load_recipe, recipe_hash
from eval.tasks.bundled.record import (
    ScreeningRecord,
    load_record,
    mutation_key,
    record_path,
    recordable,
)

M = Mutation(path="pkg/mod.py", kind="compare", line=3, start=10, end=11, original="<",
             replacement="<=", description="x")


@pytest.mark.parametrize("name", ["bundled", "procedural_localized"])
def test_the_record_sits_beside_its_recipe_and_is_committed(name):
    from sandbox.images import default_image

    recipe = default_recipe_path().with_name(f"{name}.yaml")
    path = record_path(recipe)
    assert path.name == f"{name}.screening.json" and path.parent == recipe.parent
    rec = load_record(path)
    assert rec is not None and rec.rejections
    # the committed record is for the committed recipe: a stale one would save nothing
    assert rec.recipe_hash == recipe_hash(load_recipe(recipe), default_image())
    prefix = load_recipe(recipe).id_prefix + "__"
    assert all(recordable(e["outcome"]) and i.startswith(prefix)
               for i, e in rec.rejections.items())


def test_round_trip_and_mutation_match(tmp_path):
    rec = ScreeningRecord("abc")
    key = mutation_key("sha", M)
    rec.add("p-1.0-0003", key, "no_failure")
    rec.add("p-1.0-0004", key, "rejected(timeout)")
    back = load_record(rec.save(tmp_path / "r.screening.json"))
    assert back.recipe_hash == "abc" and back.rejections == rec.rejections
    assert back.outcome("p-1.0-0003", key) == "no_failure"
    # another mutation under the same id (a recipe or sdist change): not this record's
    assert back.outcome("p-1.0-0003", mutation_key("sha2", M)) is None
    assert back.outcome("p-1.0-0003", mutation_key("sha", dataclasses.replace(M, line=4))) is None
    assert back.outcome("p-1.0-0009", key) is None
    assert not list(tmp_path.glob("*.tmp-*"))


@pytest.mark.parametrize("outcome", ["kept", "screened", "control_failed(gold ok)", "pending"])
def test_a_record_never_holds_anything_but_a_screening_rejection(tmp_path, outcome):
    """A record only skips: an entry that would stand for a kept or screened candidate is
    refused when added and when read."""
    with pytest.raises(ValueError, match="not a screening rejection"):
        ScreeningRecord("abc").add("p-1.0-0001", "k", outcome)
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema": 1, "recipe_hash": "abc", "rejections": {
        "p-1.0-0001": {"mutation": "k", "outcome": outcome}}}))
    with pytest.raises(ValueError, match=r"rejections\.p-1\.0-0001\.outcome"):
        load_record(path)


@pytest.mark.parametrize("text, field", [
    ("{", "not a screening record"),
    ('{"schema": 2, "recipe_hash": "a", "rejections": {}}', "schema"),
    ('{"schema": 1, "recipe_hash": 5, "rejections": {}}', "recipe_hash"),
    ('{"schema": 1, "recipe_hash": "a", "rejections": []}', "rejections"),
    ('{"schema": 1, "recipe_hash": "a", "rejections": {"x": {"outcome": "no_failure"}}}',
     "rejections.x"),
])
def test_a_malformed_record_names_its_path_and_field(tmp_path, text, field):
    path = tmp_path / "bad.screening.json"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        load_record(path)
    assert str(path) in str(err.value) and field in str(err.value)


def test_no_record_file_is_no_record(tmp_path):
    assert load_record(tmp_path / "absent.screening.json") is None


def test_a_stale_record_is_ignored_and_said_so():
    from eval.tasks.bundled.build import _usable

    said: list[str] = []
    rec = ScreeningRecord("0123", {"a": {"mutation": "k", "outcome": "no_failure"}}, "r.json")
    assert _usable(rec, "4567", said.append) is None
    assert "stale" in said[-1] and "every candidate is screened" in said[-1]
    assert _usable(rec, "0123", said.append) is rec
    assert _usable(None, "0123", said.append) is None


@pytest.mark.podman
@pytest.mark.slow
def test_a_build_with_the_record_skips_its_trials_and_writes_the_same_tasks(tmp_path,
                                                                            monkeypatch):
    """One project (inflection) rebuilt cold with the committed record's entries: each
    recorded candidate takes its recorded outcome without a trial (build.json says
    ``recorded``), and the rows equal the cached build's byte for byte, whichever way that
    one was built (with or without a record). The record is the committed one, keyed to
    the one-project recipe's hash (its entries are per mutation, so they carry over); a
    written record of this build holds the same rejections. The no-record path is
    ``test_build_tasks.py::test_cold_rebuild_gives_identical_tasks``."""
    from eval.tasks.bundled.build import build
    from eval.tasks.bundled.cache import built_dir, ensure_built
    from eval.tasks.bundled.recipe import cache_dir
    from sandbox.images import default_image

    full = load_recipe()
    src = built_dir(full)
    ensure_built()
    committed = load_record(record_path(default_recipe_path()))
    sd = cache_dir() / "sdists"
    monkeypatch.setenv("ECREDIT_CACHE", str(tmp_path / "cache"))
    shutil.copytree(sd, tmp_path / "cache" / "sdists")
    project = full.projects[0]
    one = dataclasses.replace(full, projects=(project,), min_total=full.min_per_project)
    mine = {i: e for i, e in committed.rejections.items() if f"__{project.name}-" in i}
    assert mine  # inflection's reference build rejected some candidates
    rec = ScreeningRecord(recipe_hash(one, default_image()), dict(mine), "test")
    out = built_dir(one)
    build(one, out, record=rec, write_record=tmp_path / "again.screening.json",
          log=lambda msg: print(f"[build_tasks] {msg}", flush=True))
    want = [line for line in (src / "tasks.jsonl").read_text().splitlines()
            if json.loads(line)["extra"]["project"] == project.name]
    got = (out / "tasks.jsonl").read_text().replace(out.name, src.name).splitlines()
    assert want and got == want
    stats = json.loads((out / "build.json").read_text())
    skipped = {c["instance_id"]: c["outcome"] for c in stats["candidates"] if c["recorded"]}
    assert skipped == {i: e["outcome"] for i, e in mine.items()}
    assert stats["record"]["skipped"] == len(mine)
    screened = [c for c in stats["candidates"] if not c["recorded"] and not c["parts"]]
    # every trial of the build: 2 pristine, one screening trial per screened single,
    # 3 per controlled single (gold, empty, gold again) and 3 per pair; none for a skip
    controlled = sum(c["outcome"] == "kept" or c["outcome"].startswith(("control_failed",
                     "rejected(flaky")) for c in screened)
    pairs = sum(1 for c in stats["candidates"] if c["parts"])
    assert stats["trials"] == 2 + len(screened) + 3 * controlled + 3 * pairs
    assert load_record(tmp_path / "again.screening.json").rejections == mine
