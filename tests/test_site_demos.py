"""Site demonstrations (the localized world's copy curriculum): which sites, what each
demonstration shows, that no held-out function is touched, and the warm-start recipe fields.
Real git repositories and the real editor; no container is needed (no verifier trial)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ecredit_trl.policy.demos import DemoError
from ecredit_trl.policy.site_demos import (
    FRAME_HEADER,
    PADDING_LINE,
    SiteCurriculum,
    site_demonstrations,
    training_sites,
    with_frame,
)
from ecredit_trl.policy.warmstart import policy_key, recipe_for, site_curriculum
from eval.tasks.bundled.mutations import find_mutations

MODULE = '''\
def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def scale(x, k):
    return x * k + 1


def secret(x):
    return x - 2
'''

TAIL = ("Fix the library so that these tests pass again without breaking the other tests; "
        "the tests themselves are correct.\n")


def statement(line: int, function: str, text: str) -> str:
    return ("demo 1.0: 1 test fails after a recent change to the library code.\n\n"
            "Reproduce from the repository root with `python3 -m pytest test_m.py`.\n\n"
            "Failing tests:\n- test_m.py::test_x\n    AssertionError\n\n"
            f'{FRAME_HEADER}\n  File "pkg/m.py", line {line}, in {function}\n'
            f"    {text.strip()}\n\n{TAIL}")


@dataclass
class FakeTask:
    instance_id: str
    repo_dir: str
    problem_statement: str
    extra: dict = field(default_factory=dict)
    base_commit: str = ""
    patch: str = ""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                                          "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
                                          "PATH": "/usr/bin:/bin"}).stdout.strip()


@pytest.fixture()
def world(tmp_path):
    """A project repository (pristine commit) and two training tasks: one in ``clamp``
    (compare) and one in ``scale`` (arith); ``secret`` stands for a held-out function."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "m.py").write_text(MODULE)
    _git(tmp_path, "init", "-q", str(repo))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "pristine")
    pristine = _git(repo, "rev-parse", "HEAD")

    def task(iid, unit, kind, line, text):
        return FakeTask(iid, str(repo), statement(line, unit.split("::")[1], text), {
            "split": "train", "unit": unit, "project": "demo", "pristine_commit": pristine,
            "mutations": [{"kind": kind, "path": "pkg/m.py", "line": line}]})

    tasks = [task("localized__demo-1.0-0001", "pkg/m.py::clamp", "compare", 2,
                  "    if x <= lo:"),
             task("localized__demo-1.0-0002", "pkg/m.py::scale", "arith", 10,
                  "    return x * k - 1")]
    return repo, pristine, tasks


def test_with_frame_replaces_only_the_frame():
    s = statement(2, "clamp", "    if x <= lo:")
    out = with_frame(s, ("pkg/m.py", 57, "scale", "    return x // k + 1"))
    assert out == s.replace('line 2, in clamp\n    if x <= lo:',
                            'line 57, in scale\n    return x // k + 1')
    with pytest.raises(DemoError, match="trace to this library code"):
        with_frame("no frames here\n", ("pkg/m.py", 1, "f", "x"))


def test_sites_are_the_training_functions_of_the_training_kinds(world):
    _, _, tasks = world
    sites = training_sites(tasks)
    expected = [m for m in find_mutations("pkg/m.py", MODULE, ("arith", "compare"))
                if m.function in ("clamp", "scale")]
    assert [m for _, m, _ in sites] == expected
    assert {m.function for _, m, _ in sites} == {"clamp", "scale"}  # never "secret"
    assert {m.kind for _, m, _ in sites} == {"compare", "arith"}
    assert all(text == MODULE for _, _, text in sites)
    assert {t.instance_id for t, m, _ in sites if m.function == "scale"} == {
        "localized__demo-1.0-0002"}


def test_sites_refuse_what_is_not_a_world_training_instance(world):
    _, _, tasks = world
    tasks[1].extra["split"] = "heldout"
    with pytest.raises(ValueError, match="0002: extra.split is 'heldout'"):
        training_sites(tasks)
    tasks[1].extra["split"] = "train"
    del tasks[0].extra["unit"]
    with pytest.raises(ValueError, match="0001: extra.unit missing"):
        training_sites(tasks)
    tasks[0].extra["unit"] = "pkg/m.py::clamp"
    tasks[0].extra["pristine_commit"] = "0" * 40
    with pytest.raises(ValueError, match="another repository or pristine commit"):
        training_sites(tasks)


def test_each_demonstration_copies_the_frame_and_restores_the_file(world, tmp_path):
    repo, _, tasks = world
    cur = SiteCurriculum(per_site=3, max_shift=40, seed=5)
    demos = site_demonstrations(tasks, cur, log=None)
    sites = training_sites(tasks)
    assert len(demos) == 3 * len(sites)
    assert len({d["instance_id"] for d in demos}) == len(demos)
    shifts = set()
    for d, (_, m, text) in zip(demos, [s for s in sites for _ in range(3)], strict=True):
        msgs = d["messages"]
        assert d["variant"] == "site" and json.loads(d["tools"])
        shift = int(d["instance_id"].rsplit("+", 1)[1])
        assert 0 <= shift <= 40
        shifts.add(shift)
        broken = m.apply(text).split("\n")[m.line - 1]
        frame = (f'  File "{m.path}", line {m.line + shift}, in {m.function}\n'
                 f"    {broken.strip()}\n")
        assert frame in msgs[0]["content"] and msgs[0]["content"].count(FRAME_HEADER) == 1
        calls = [json.loads(x["tool_calls"][0]["function"]["arguments"]) | {
            "name": x["tool_calls"][0]["function"]["name"]}
            for x in msgs if x["role"] == "assistant" and x.get("tool_calls")]
        assert [c["name"] for c in calls] == ["view", "str_replace", "submit"]
        assert calls[0] == {"name": "view", "path": m.path, "line": m.line + shift}
        assert calls[1]["old_str"] == broken.strip()
        # the edit undoes the mutation of the shifted file: the real editor's result
        padded = PADDING_LINE + "\n"
        assert (padded * shift + m.apply(text)).replace(
            calls[1]["old_str"], calls[1]["new_str"], 1) == padded * shift + text
        assert msgs[-1] == {"role": "assistant", "content": "Done."}
    assert len(shifts) > 1
    # the repository is untouched and the output is the same every time
    assert _git(repo, "status", "--porcelain") == ""
    assert site_demonstrations(tasks, cur, log=None) == demos
    assert site_demonstrations(tasks, SiteCurriculum(per_site=0), log=None) == []


@pytest.mark.parametrize("bad", [{"per_site": -1}, {"max_shift": -2}, {"per_site": True},
                                 {"seed": "0"}])
def test_bad_curriculum_names_the_field(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SiteCurriculum(**bad)


def test_recipe_fields_change_the_key_only_when_on(world):
    _, _, tasks = world
    plain = recipe_for(10)
    assert recipe_for(10, site_demos=0) == plain
    assert "site_demos" not in plain and site_curriculum(plain).per_site == 0
    on = recipe_for(10, site_demos=2)
    assert on["site_max_shift"] == SiteCurriculum().max_shift
    assert site_curriculum(on) == SiteCurriculum(2, SiteCurriculum().max_shift, 0)
    assert policy_key(tasks, on) != policy_key(tasks, plain)
    assert site_curriculum(recipe_for(10, seed=3, site_demos=1, site_max_shift=7)) == \
        SiteCurriculum(1, 7, 3)
    with pytest.raises(ValueError, match="site_max_shift: given without site_demos"):
        recipe_for(10, site_max_shift=5)
    with pytest.raises(ValueError, match="per_site"):
        recipe_for(10, site_demos=-1)


def test_frame_copy_counts(tmp_path):
    """benchmarks/frame_copy.py: each count on episodes made by hand, from both inputs."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from frame_copy import frame_of, quality_episodes, rollout_episodes, tally

    frame = frame_of(statement(12, "scale", "    return x * k - 1"), "a")
    assert frame == ("pkg/m.py", 12, "return x * k - 1")
    with pytest.raises(ValueError, match="task b: the problem statement quotes no frame"):
        frame_of("no frame\n", "b")
    frames = {"a": frame, "b": ("pkg/m.py", 3, "if x <= lo:")}
    view = lambda path, line: {"name": "view", "arguments": {"path": path, "line": line}}  # noqa: E731
    rows = [{"task_id": "a", "tool_calls": [
                view("pkg/m.py", 12), view("pkg/m.py", 16), view("pkg/n.py", 40),
                {"name": "str_replace", "ok": True, "arguments": {
                    "path": "pkg/m.py", "old_str": "return x * k - 1", "new_str": "x"}}]},
            {"task_id": "b", "tool_calls": [
                view("pkg/m.py", "3"), {"name": "str_replace", "ok": False,
                                        "arguments": {"old_str": "if x < lo:"}}]},
            {"task_id": "b", "tool_calls": [view("pkg/m.py", "x")]}]
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = tally(rollout_episodes(tmp_path / "rollouts.jsonl"), frames)
    assert dict(c) == {"episodes": 3, "view": 5, "view_path": 4, "view_line": 2,
                       "view_line_within_5": 3, "str_replace": 2, "old_str_is_frame_text": 1,
                       "str_replace_applied": 1, "episodes_with_view_line": 2}

    def turn(call, valid):
        return {"text": f"<think>\n\n</think>\n\n<tool_call>\n{json.dumps(call)}\n</tool_call>",
                "valid": valid}
    quality = {"episodes": {"greedy": {"a": [{"turns": [
        turn(view("pkg/m.py", 12), True), {"text": "Done.", "valid": False}]}]}}}
    (tmp_path / "wq.json").write_text(json.dumps(quality))
    eps = quality_episodes(tmp_path / "wq.json")
    assert dict(tally(eps["greedy"], frames)) == {
        "episodes": 1, "view": 1, "view_path": 1, "view_line": 1, "view_line_within_5": 1,
        "episodes_with_view_line": 1}
