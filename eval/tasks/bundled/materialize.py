"""Candidate commits re-created without running a test: what a determinism check compares
against a build (:mod:`eval.tasks.bundled`, pipeline steps 1-2 only)."""

from __future__ import annotations

from pathlib import Path

from eval.tasks.bundled.multi import apply_all, pair_id, parse_pair_id, single_id
from eval.tasks.bundled.mutations import choose_candidates
from eval.tasks.bundled.recipe import Recipe, cache_dir
from eval.tasks.bundled.sources import GitRepo, fetch_sdist, unpack_sdist


def materialize(recipe: Recipe, out: Path, log=print, ids: set[str] | None = None
                ) -> dict[str, dict]:
    """Re-create the repositories and candidate commits without running any test.

    For determinism checks: returns ``{instance_id: {"base_commit", "patch",
    "environment_setup_commit"}}`` for every single candidate (or only ``ids``) of every
    project, with the ids :func:`build` gives them, and for each pair id in ``ids`` (which
    pairs exist depends on test results, so only named ones). Needs only git and the
    (cached) sdists.
    """
    cache = cache_dir()
    res: dict[str, dict] = {}
    for p in recipe.projects:
        repo = GitRepo(Path(out) / p.name)
        unpack_sdist(fetch_sdist(p, cache, log), repo.path)
        needed = p.source_files
        files = {f: (repo.path / f).read_text(encoding="utf-8") for f in needed}
        base = repo.init_pristine(
            f"{p.name} {p.version}: pristine sdist {p.sdist} (sha256 {p.sha256[:16]})")
        cands = choose_candidates(p, files, recipe)
        want = [(single_id(p.name, p.version, k, recipe.id_prefix), (m,))
                for k, m in enumerate(cands)]
        for iid in sorted(ids or ()):
            ij = parse_pair_id(iid)
            if ij and iid == pair_id(p.name, p.version, *ij, recipe.id_prefix):
                want.append((iid, (cands[ij[0]], cands[ij[1]])))
        for iid, muts in want:
            if ids is not None and iid not in ids:
                continue
            new = {k: v.encode("utf-8") for k, v in apply_all(muts, files).items()}
            sha = repo.commit_files(base, new, iid, f"refs/ecredit/{iid}")
            res[iid] = {"base_commit": sha, "patch": repo.diff(sha, base),
                        "environment_setup_commit": base}
    return res
