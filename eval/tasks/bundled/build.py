"""Build orchestration of the bundled tasks: sources → candidates → screening → controls →
tasks (see :mod:`eval.tasks.bundled` for the pipeline); the build cache is :mod:`.cache`."""

from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from eval.grading.flaky import varying_statuses
from eval.integrity.retry import RetryPolicy
from eval.tasks.bundled.multi import (
    apply_all,
    interleave_tests,
    pair_components,
    pair_id,
    single_id,
)
from eval.tasks.bundled.mutations import Mutation, choose_candidates
from eval.tasks.bundled.recipe import (
    BUILDER_VERSION,
    PARSER,
    BuildError,
    ProjectRecipe,
    Recipe,
    cache_dir,
    recipe_hash,
)
from eval.tasks.bundled.record import (
    ScreeningRecord,
    mutation_key,
    recordable,
)
from eval.tasks.bundled.screening import Candidate, control, listable_ids, screen
from eval.tasks.bundled.scripts import failure_messages, make_eval_script, make_problem_statement
from eval.tasks.bundled.sources import GitRepo, fetch_sdist, unpack_sdist
from eval.tasks.bundled.world import instance_split
from eval.tasks.schema import Task, read_rows, tasks_from_rows
from sandbox.backend import make_runtime
from sandbox.images import build_offline, default_image
from sandbox.trials.pool import VerifierPool
from sandbox.trials.trial import TrialSpec


def build(recipe: Recipe, out: Path, *, concurrency: int = 2, runtime=None, log=print,
          image: str | None = None, record: ScreeningRecord | None = None,
          write_record: str | Path | None = None) -> list[Task]:
    """Build the bundled tasks of ``recipe`` into ``out`` (see :mod:`eval.tasks.bundled`).

    Args:
        out: output folder; written as ``out.tmp-<pid>`` and renamed when complete.
        concurrency: verifier trials at once (Podman containers).
        runtime: a sandbox runtime (default: a private Podman runtime, closed at the end).
        log: progress printer (one line per step).
        image: sandbox image (default :func:`sandbox.images.default_image`, built if absent).
        record: screening rejections of an earlier build (:mod:`.record`): those candidates
            take their recorded outcome without a trial; ignored (and said so) when it is
            for another recipe hash. None: every candidate is screened.
        write_record: write this build's screening rejections there (recorded ones
            included) once the build is complete.

    Returns: the tasks, in project then candidate order.

    Raises: BuildError (download, sha256, git, too few validated tasks, pristine tests
    failing, infra errors that persist after retries).
    """
    out = Path(out)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    try:
        return _build(recipe, out, tmp, concurrency=concurrency, runtime=runtime, log=log,
                      image=image, record=record, write_record=write_record)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after the rename; else a failed build


@dataclass
class Workspace:
    """What step 1 prepares, per project name: the git repository, its pristine commit, the
    recipe's files (bytes) and the ordered candidate mutations."""

    recipe: Recipe
    image: str
    repos: dict[str, GitRepo] = field(default_factory=dict)
    pristine: dict[str, str] = field(default_factory=dict)
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)
    cands: dict[str, list[Mutation]] = field(default_factory=dict)
    record: ScreeningRecord | None = None


class _Trials:
    """Verifier trials of the build: counts them and refuses infra errors."""

    def __init__(self, pool, ws: Workspace) -> None:
        self.pool, self.ws, self.n = pool, ws, 0

    def run(self, specs):
        self.n += len(specs)
        res = self.pool.map(specs)
        bad = [r for r in res if r.exit_class == "infra_error"]
        if bad:
            raise BuildError(f"{len(bad)} verifier trial(s) hit infra errors, e.g. "
                             f"{bad[0].trial_id}: {bad[0].error}")
        return res

    def spec(self, tid, p: ProjectRecipe, commit, script, artifact=""):
        return TrialSpec(trial_id=tid, image=self.ws.image, eval_script=script,
                         artifact=artifact, repo_archive=self.ws.repos[p.name].archive(commit),
                         timeout_s=self.ws.recipe.trial_timeout_s)


def _build(recipe: Recipe, out: Path, tmp: Path, *, concurrency: int, runtime, log,
           image: str | None, record: ScreeningRecord | None,
           write_record: str | Path | None) -> list[Task]:
    t_start = time.monotonic()
    image = image or default_image()
    if runtime is None:
        build_offline(log=lambda *a: None)
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "repos").mkdir(parents=True)
    rhash = recipe_hash(recipe, image)
    stats: dict = {"recipe_hash": rhash, "builder": BUILDER_VERSION,
                   "image": image, "projects": {}, "candidates": [], "timings_s": {}}
    ws = prepare_sources(recipe, image, tmp, stats, t_start, log)
    ws.record = _usable(record, rhash, log)
    own_runtime = runtime is None
    rt = make_runtime() if own_runtime else runtime
    try:
        with VerifierPool(rt, max_concurrency=concurrency,
                          retry=RetryPolicy(max_retries=2)) as pool:
            trials = _Trials(pool, ws)
            base_status = run_pristine(ws, trials, stats, log)
            kept, parts, all_cands = screen_and_control(ws, trials, base_status, log)
            pairs, pair_cands = screen_pairs(ws, trials, parts, base_status, log)
    finally:
        if own_runtime:
            rt.close()
    kept = {name: v + pairs[name] for name, v in kept.items()}
    rows = task_rows(ws, kept, stats["recipe_hash"])
    stats["trials"] = trials.n
    stats["record"] = {"path": ws.record.path if ws.record else None,
                       "skipped": sum(c.recorded for c in all_cands)}
    write_build(tmp, out, rows, stats, kept, all_cands + pair_cands, t_start, log)
    if write_record is not None:
        new = ScreeningRecord(rhash)
        for c in all_cands:  # singles only: a pair's outcome depends on two parts
            if recordable(c.outcome):
                new.add(c.instance_id, mutation_key(c.project.sha256, c.mutation), c.outcome)
        log(f"screening record: {len(new.rejections)} rejections -> {new.save(write_record)}")
    return load_built(out)


def _usable(record: ScreeningRecord | None, rhash: str, log) -> ScreeningRecord | None:
    """``record`` when it is for recipe hash ``rhash``; else None (said in the log)."""
    if record is None:
        return None
    if record.recipe_hash != rhash:
        log(f"screening record {record.path} is for recipe hash {record.recipe_hash}, this "
            f"build is {rhash}: stale, every candidate is screened")
        return None
    log(f"screening record {record.path}: {len(record.rejections)} rejections need no trial")
    return record


def prepare_sources(recipe: Recipe, image: str, tmp: Path, stats: dict, t_start: float,
                    log) -> Workspace:
    """Step 1: fetch every sdist, unpack it into a pristine git repository under
    ``tmp/repos`` and list its candidate mutations.

    Raises: BuildError when the recipe names files the sdist lacks.
    """
    cache = cache_dir()
    with ThreadPoolExecutor(max_workers=len(recipe.projects)) as ex:
        sdists = list(ex.map(lambda p: fetch_sdist(p, cache, log), recipe.projects))
    stats["timings_s"]["download"] = round(time.monotonic() - t_start, 2)
    ws = Workspace(recipe, image)
    for p, sd in zip(recipe.projects, sdists, strict=True):
        repo = GitRepo(tmp / "repos" / p.name)
        unpack_sdist(sd, repo.path)
        needed = p.source_files
        missing = [f for f in needed if not (repo.path / f).is_file()]
        if missing:
            raise BuildError(f"{p.name}: recipe names files the sdist lacks: {missing}")
        ws.files[p.name] = {f: (repo.path / f).read_bytes() for f in needed}
        ws.pristine[p.name] = repo.init_pristine(
            f"{p.name} {p.version}: pristine sdist {p.sdist} (sha256 {p.sha256[:16]})")
        ws.repos[p.name] = repo
        text = {f: b.decode("utf-8") for f, b in ws.files[p.name].items()}
        ws.cands[p.name] = choose_candidates(p, text, recipe)
        log(f"[{p.name}] pristine {ws.pristine[p.name][:12]}, {len(ws.cands[p.name])} candidates")
    stats["timings_s"]["prepare"] = round(time.monotonic() - t_start, 2)
    return ws


def make_candidate(ws: Workspace, p: ProjectRecipe, k: int) -> Candidate:
    """Candidate ``k`` of project ``p``: its mutant commit (parent: pristine) and eval script;
    or, when the screening record holds it, its recorded outcome (``recorded``; no commit,
    no trial)."""
    m = ws.cands[p.name][k]
    mod = next(x for x in p.modules if x.path == m.path)
    c = Candidate(p, k, m, mod, single_id(p.name, p.version, k, ws.recipe.id_prefix))
    known = ws.record and ws.record.outcome(c.instance_id, mutation_key(p.sha256, m))
    if known:
        c.outcome, c.recorded = known, True
        return c
    text = ws.files[p.name][m.path].decode("utf-8")
    c.commit = ws.repos[p.name].commit_file(ws.pristine[p.name], m.path,
                                            m.apply(text).encode("utf-8"), c.instance_id,
                                            f"refs/ecredit/{c.instance_id}")
    c.eval_script = make_eval_script(p, mod.tests, ws.files[p.name])
    return c


def run_pristine(ws: Workspace, trials: _Trials, stats: dict, log) -> dict[str, dict[str, str]]:
    """Step 2: all the recipe's tests on each pristine tree, twice; returns
    project → {listable test id: "PASSED"}: listable and PASSED in both runs. Tests whose
    status differs between the two runs are flaky (``eval.grading.flaky``): never listed, and named
    in ``build.json`` (``pristine_flaky``).

    Raises: BuildError when a pristine run fails or passes no listable test.
    """
    from eval.grading.grader import parse_log  # start-up: swebench, ~1 s

    recipe = ws.recipe
    pre_specs = [trials.spec(f"pristine{rep}-{p.name}", p, ws.pristine[p.name],
                             make_eval_script(p, p.all_tests, ws.files[p.name]))
                 for rep in ("", "2") for p in recipe.projects]
    results = trials.run(pre_specs)
    n = len(recipe.projects)
    base_status: dict[str, dict[str, str]] = {}
    for p, r, r2 in zip(recipe.projects, results[:n], results[n:], strict=True):
        parsed, parsed2 = parse_log(r.log, PARSER), parse_log(r2.log, PARSER)
        ok = listable_ids(parsed) & listable_ids(parsed2)
        either = sorted(listable_ids(parsed) | listable_ids(parsed2))
        flaky = varying_statuses([{i: x.status_map.get(i, "MISSING") for i in either}
                                  for x in (parsed, parsed2)])
        base_status[p.name] = {i: s for i, s in parsed.status_map.items()
                               if i in ok and i not in flaky and s == "PASSED"}
        n_fail = sum(1 for s in parsed.status_map.values() if s in ("FAILED", "ERROR"))
        if r.exit_class != "ok" or r2.exit_class != "ok" or not base_status[p.name]:
            raise BuildError(f"{p.name}: pristine test run {r.exit_class}/{r2.exit_class}, "
                             f"{len(base_status[p.name])} passing: {r.log[-1500:]}")
        stats["projects"][p.name] = {
            "pristine_commit": ws.pristine[p.name], "pristine_passed": len(base_status[p.name]),
            "pristine_failed": n_fail, "pristine_test_s": round(r.test_s, 2),
            "pristine_flaky": sorted(flaky), "candidates": len(ws.cands[p.name])}
        log(f"[{p.name}] pristine (twice): {len(base_status[p.name])} listable tests pass, "
            f"{n_fail} fail, {len(flaky)} flaky ({r.test_s:.2f} s)")
    return base_status


def plan_round(ws: Workspace, all_cands: list[Candidate], cursor: dict[str, int]
               ) -> tuple[list[Candidate], list[Candidate]]:
    """One round's work: controls for the first waiting survivors while fewer than
    ``target_per_project`` are kept, and screening of more candidates while the screened ones
    cannot cover those controls plus the pair parts (``singles_needed - target_per_project``,
    screened only: a pair is controlled as a whole, :func:`screen_pairs`); batch size from the
    screening pass rate so far. Advances ``cursor``; returns ``(to_screen, to_control)``."""
    recipe = ws.recipe
    to_screen: list[Candidate] = []
    to_control: list[Candidate] = []
    parts = recipe.singles_needed - recipe.target_per_project
    for p in recipe.projects:
        mine = [c for c in all_cands if c.project is p]
        need = max(0, recipe.target_per_project - sum(c.outcome == "kept" for c in mine))
        waiting = [c for c in mine if c.outcome == "screened"]
        to_control += waiting[:need]
        short = need + parts - len(waiting)
        if short <= 0:
            continue
        ok = sum(c.outcome in ("screened", "kept") or c.outcome.startswith("control_failed")
                 for c in mine)
        rate = max(0.25, (ok + 1) / (len(mine) + 2)) if mine else 0.7
        size = min(max(3, int(short / rate + 0.999) + 1),
                   len(ws.cands[p.name]) - cursor[p.name])
        for k in range(cursor[p.name], cursor[p.name] + size):
            to_screen.append(make_candidate(ws, p, k))
        cursor[p.name] += size
    return to_screen, to_control


def run_round(ws: Workspace, trials: _Trials, to_screen: list[Candidate],
              to_control: list[Candidate], base_status: dict[str, dict[str, str]]) -> None:
    """Screen ``to_screen`` and run gold (twice: the flaky check) + empty controls of
    ``to_control`` in one batch of trials; sets each candidate's outcome (and a screened
    candidate's gold patch)."""
    from eval.grading.grader import grade, parse_log  # start-up: swebench, ~1 s

    to_screen = [c for c in to_screen if not c.recorded]
    specs = [trials.spec(f"screen-{c.project.name}-{c.tag}", c.project, c.commit,
                         c.eval_script) for c in to_screen]
    for c in to_control:
        specs.append(trials.spec(f"gold-{c.project.name}-{c.tag}", c.project,
                                 c.commit, c.eval_script, c.gold))
        specs.append(trials.spec(f"empty-{c.project.name}-{c.tag}", c.project,
                                 c.commit, c.eval_script, ""))
        specs.append(trials.spec(f"gold2-{c.project.name}-{c.tag}", c.project,
                                 c.commit, c.eval_script, c.gold))
    results = trials.run(specs)
    for c, r in zip(to_screen, results, strict=False):
        screen(c, r, base_status[c.project.name], ws.recipe, parse_log)
        if c.outcome == "screened":
            c.gold = ws.repos[c.project.name].diff(c.commit, ws.pristine[c.project.name])
    ctrl = results[len(to_screen):]
    for j, c in enumerate(to_control):
        control(c, ctrl[3 * j], ctrl[3 * j + 1], grade, gold2=ctrl[3 * j + 2])


def screen_and_control(ws: Workspace, trials: _Trials, base_status: dict[str, dict[str, str]],
                       log) -> tuple[dict[str, list[Candidate]], dict[str, list[Candidate]],
                                     list[Candidate]]:
    """Step 3: rounds of :func:`plan_round` + :func:`run_round` until every project has its
    ``target_per_project`` kept candidates and ``singles_needed - target_per_project``
    further screened ones (pair parts), or none are left. Returns (project → kept, project →
    screened parts, both in candidate order; every candidate tried)."""
    recipe = ws.recipe
    kept: dict[str, list[Candidate]] = {p.name: [] for p in recipe.projects}
    all_cands: list[Candidate] = []
    cursor = {p.name: 0 for p in recipe.projects}
    rnd = 0
    while True:
        rnd += 1
        to_screen, to_control = plan_round(ws, all_cands, cursor)
        if not to_screen and not to_control:
            break
        all_cands += to_screen
        t0 = time.monotonic()
        run_round(ws, trials, to_screen, to_control, base_status)
        for p in recipe.projects:
            ok = sorted((c for c in all_cands if c.project is p and c.outcome == "kept"),
                        key=lambda c: c.index)
            kept[p.name] = ok[:recipe.target_per_project]
        known = sum(c.recorded for c in to_screen)
        log(f"round {rnd}: {len(to_screen)} screened ({known} by the record), "
            f"{len(to_control)} controlled in "
            f"{time.monotonic() - t0:.1f} s; kept "
            + ", ".join(f"{k} {len(v)}" for k, v in kept.items()))
    parts = {p.name: sorted((c for c in all_cands if c.project is p and c.outcome == "screened"),
                            key=lambda c: c.index)
             for p in recipe.projects}
    return kept, parts, all_cands


def make_pair(ws: Workspace, p: ProjectRecipe, a: Candidate, b: Candidate) -> Candidate:
    """The pair candidate of screened singles ``a`` and ``b``: one commit (parent: pristine)
    holding both mutations, its gold patch, and an eval script running both modules' test
    files."""
    tests = tuple(dict.fromkeys(a.module.tests + b.module.tests))
    iid = pair_id(p.name, p.version, a.index, b.index, ws.recipe.id_prefix)
    c = Candidate(p, a.index, a.mutation, a.module, iid, parts=(a, b), tests=tests)
    texts = {m.path: ws.files[p.name][m.path].decode("utf-8") for m in c.mutations}
    new = {k: v.encode("utf-8") for k, v in apply_all(c.mutations, texts).items()}
    c.commit = ws.repos[p.name].commit_files(ws.pristine[p.name], new, iid, f"refs/ecredit/{iid}")
    c.eval_script = make_eval_script(p, tests, ws.files[p.name])
    c.gold = ws.repos[p.name].diff(c.commit, ws.pristine[p.name])
    return c


def screen_pairs(ws: Workspace, trials: _Trials, parts: dict[str, list[Candidate]],
                 base_status: dict[str, dict[str, str]], log
                 ) -> tuple[dict[str, list[Candidate]], list[Candidate]]:
    """Step 3b (``multi_per_project`` > 0): pair tasks from each project's screened parts
    (:func:`eval.tasks.bundled.multi.pair_components`, in pair order). Each round tries, per
    project, only as many untried pairs as it still lacks: three trials per pair in one
    batch, the mutant with the empty patch (its screening, which is also its empty control:
    same commit, script and artifact) and the gold patch twice (flaky check). The parts'
    own screening already gave their failing tests, so they get no controls of their own.
    Returns (project → its first ``multi_per_project`` kept pairs, every pair tried)."""
    from eval.grading.grader import grade, parse_log  # start-up: swebench, ~1 s

    recipe = ws.recipe
    out: dict[str, list[Candidate]] = {p.name: [] for p in recipe.projects}
    if not recipe.multi_per_project:
        return out, []
    todo: dict[str, list[tuple[Candidate, Candidate]]] = {}
    for p in recipe.projects:
        comps = parts[p.name]
        texts = {f: b.decode("utf-8") for f, b in ws.files[p.name].items()}
        todo[p.name] = [(comps[i], comps[j])
                        for i, j in pair_components([c.mutation for c in comps], texts)]
    tried: list[Candidate] = []
    t0 = time.monotonic()
    while True:
        batch = []
        for p in recipe.projects:
            lack = recipe.multi_per_project - len(out[p.name])
            batch += [make_pair(ws, p, a, b) for a, b in todo[p.name][:max(0, lack)]]
            todo[p.name] = todo[p.name][max(0, lack):]
        if not batch:
            break
        specs = []
        for c in batch:
            for kind, art in (("screen", ""), ("gold", c.gold), ("gold2", c.gold)):
                specs.append(trials.spec(f"{kind}-{c.project.name}-{c.tag}", c.project,
                                         c.commit, c.eval_script, art))
        res = trials.run(specs)
        for k, c in enumerate(batch):
            r, g, g2 = res[3 * k: 3 * k + 3]
            screen(c, r, base_status[c.project.name], recipe, parse_log)
            if c.outcome == "screened":
                control(c, g, r, grade, gold2=g2)
            if c.outcome == "kept":
                out[c.project.name].append(c)
        tried += batch
    log(f"pairs: {len(tried)} screened and controlled in {time.monotonic() - t0:.1f} s; kept "
        + ", ".join(f"{k} {len(v)}" for k, v in out.items()))
    return out, tried


def task_rows(ws: Workspace, kept: dict[str, list[Candidate]], rhash: str) -> list[dict]:
    """Step 4: the task rows (:meth:`Task.to_dict`) of the kept candidates.

    Raises: BuildError when fewer than ``min_per_project`` / ``min_total`` were kept.
    """
    recipe = ws.recipe
    short = {k: len(v) for k, v in kept.items() if len(v) < recipe.min_per_project}
    total = sum(len(v) for v in kept.values())
    if short or total < recipe.min_total:
        raise BuildError(f"too few validated tasks: {dict((k, len(v)) for k, v in kept.items())} "
                         f"(need >= {recipe.min_per_project} per project, >= {recipe.min_total} "
                         f"in all); raise max_candidates_per_project or change the seed")
    rows = []
    for p in recipe.projects:
        for c in kept[p.name]:
            world = {}
            if recipe.heldout is not None:  # load_recipe refuses pairs in a split world
                unit, split = instance_split(recipe.seed, p.name, c.mutation, recipe.heldout)
                world = {"unit": unit, "split": split}
            msgs = failure_messages(c.screen_log, c.f2p)
            quoted = interleave_tests(c.f2p, [q.f2p for q in c.parts]) if c.parts else c.f2p
            frames = _frames(ws, p, c) if recipe.locate else ()
            rows.append(Task(
                instance_id=c.instance_id, repo=f"pypi/{p.name}", base_commit=c.commit,
                problem_statement=make_problem_statement(p, c.test_files, quoted, msgs,
                                                         recipe.max_problem_tests, frames),
                patch=c.gold, test_patch="", FAIL_TO_PASS=c.f2p, PASS_TO_PASS=c.p2p,
                version=p.version, environment_setup_commit=ws.pristine[p.name],
                image=ws.image, eval_script=c.eval_script, log_parser=PARSER,
                repo_dir=f"repos/{p.name}",
                extra={"bundled": True, "project": p.name, "sdist_sha256": p.sha256,
                       "pristine_commit": ws.pristine[p.name],
                       "test_files": list(c.test_files), "recipe_hash": rhash,
                       "blocks": len(c.mutations),
                       # build metadata; reveals the bug, never put it in a prompt
                       # ("mutation": the first of "mutations")
                       "mutation": _mutation_meta(c.mutation),
                       "mutations": [_mutation_meta(m) for m in c.mutations], **world}
                ).to_dict())
    return rows


def _frames(ws: Workspace, p: ProjectRecipe, c: Candidate) -> tuple:
    """``(path, line, function, mutated line text)`` of each of ``c``'s mutations."""
    texts = {m.path: ws.files[p.name][m.path].decode("utf-8") for m in c.mutations}
    mutated = apply_all(c.mutations, texts)
    return tuple((m.path, m.line, m.function, mutated[m.path].splitlines()[m.line - 1])
                 for m in c.mutations)


def _mutation_meta(m: Mutation) -> dict:
    return {"kind": m.kind, "path": m.path, "line": m.line, "description": m.description}


def write_build(tmp: Path, out: Path, rows: list[dict], stats: dict,
                kept: dict[str, list[Candidate]], all_cands: list[Candidate], t_start: float,
                log) -> None:
    """Step 5: ``tasks.jsonl`` and ``build.json`` into ``tmp``, then ``tmp`` renamed to ``out``."""
    with open(tmp / "tasks.jsonl", "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n")
    stats["candidates"] = [
        {"instance_id": c.instance_id, "kind": c.mutation.kind, "path": c.mutation.path,
         "line": c.mutation.line, "outcome": c.outcome, "f2p": len(c.f2p), "p2p": len(c.p2p),
         "parts": [q.instance_id for q in c.parts], "recorded": c.recorded}
        for c in all_cands]
    stats["counts"] = {k: len(v) for k, v in kept.items()}
    splits = [r["extra"]["split"] for r in rows if "split" in r["extra"]]
    if splits:
        stats["split_counts"] = {s: splits.count(s) for s in ("train", "heldout")}
        stats["split_units"] = {s: len({r["extra"]["unit"] for r in rows
                                        if r["extra"].get("split") == s})
                                for s in ("train", "heldout")}
    stats["timings_s"]["total"] = round(time.monotonic() - t_start, 2)
    (tmp / "build.json").write_text(json.dumps(stats, indent=1, sort_keys=True) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    total = sum(len(v) for v in kept.values())
    log(f"built {total} tasks ({', '.join(f'{k} {len(v)}' for k, v in kept.items())}) in "
        f"{stats['timings_s']['total']:.1f} s -> {out}")


def load_built(out: Path) -> list[Task]:
    """Tasks of a built folder (``tasks.jsonl``; ``repo_dir`` resolved against ``out``).

    Raises: FileNotFoundError, ValueError (malformed rows).
    """
    path = Path(out) / "tasks.jsonl"
    rows, nums = read_rows(path)
    return tasks_from_rows(rows, source=str(path), base_dir=Path(out).resolve(), row_numbers=nums)
