"""What a task world holds and what a skill could reach on its held-out side.

``python benchmarks/world_stats.py [--recipe datasets/procedural.yaml] [--json OUT]`` loads
the world's tasks (building them on first use: 18 min measured on 2 cores, then cached)
and prints:

* instances and units of code per split, project and mutation kind; how many modules hold
  instances of both sides;
* for the held-out instances, two reference rates that need no model:
  - ``named``: the share whose broken function's name (its last part, e.g. ``popitem`` of
    ``LRUCache.popitem``) appears as a word in the problem statement: where the statement
    alone points at the code to read;
  - ``flip ceiling``: the mean, over held-out instances, of ``1 / n`` when the fix is one of
    the ``n`` one-line mutation sites (the world's kinds) of the broken function in the
    broken file, else 0: the resolved rate of a policy that finds the broken function
    exactly and applies one of its sites' edits at random. A policy that reads the code no
    better than that, and finds the function less often, solves less.

The figures come from the built tasks and git alone (no Podman, no model).
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval.files import datasets_dir  # noqa: E402
from eval.tasks.bundled.cache import ensure_built  # noqa: E402
from eval.tasks.bundled.mutations import find_mutations  # noqa: E402
from eval.tasks.bundled.recipe import load_recipe  # noqa: E402
from sandbox.bounds import ArgumentParser, InFile, OutFile  # noqa: E402


def git_show(repo: str, commit: str, path: str) -> str:
    """Text of ``path`` at ``commit`` of the repository ``repo``.

    Raises: subprocess.CalledProcessError when git cannot show it.
    """
    return subprocess.run(["git", "-C", repo, "show", f"{commit}:{path}"], capture_output=True,
                          text=True, check=True).stdout


def flip_odds(task, kinds) -> tuple[int, bool]:
    """``(n, fix_is_a_site)`` for a single-mutation world task: ``n`` one-line mutation
    sites of ``kinds`` in the broken function of the broken file, and whether applying one
    of them gives back the pristine file."""
    m = task.extra["mutation"]
    func = task.extra["unit"].partition("::")[2]
    broken = git_show(task.repo_dir, task.base_commit, m["path"])
    pristine = git_show(task.repo_dir, task.environment_setup_commit, m["path"])
    sites = [s for s in find_mutations(m["path"], broken, kinds) if s.function == func]
    return len(sites), any(s.apply(broken) == pristine for s in sites)


def named(task) -> bool:
    """The broken function's last name part appears as a word in the problem statement."""
    name = task.extra["unit"].rpartition("::")[2].rpartition(".")[2]
    return re.search(rf"\b{re.escape(name)}\b", task.problem_statement) is not None


def world_stats(tasks, kinds) -> dict:
    """Counts per split / project / kind, units per split, and the held-out reference rates
    (module docstring) of a world split by function. Tasks without ``extra["split"]``, or
    whose unit names no function (a split by module), are refused (ValueError)."""
    plain = [t.instance_id for t in tasks if "split" not in t.extra]
    if plain:
        raise ValueError(f"not a world build: {len(plain)} task(s) without a split, "
                         f"e.g. {plain[0]}")
    by_module = [t.instance_id for t in tasks if "::" not in t.extra["unit"]]
    if by_module:
        raise ValueError(f"a split by module ({by_module[0]}): the reference rates are defined "
                         "for a split by function")
    out: dict = {"instances": len(tasks), "splits": {}}
    for side in ("train", "heldout"):
        mine = [t for t in tasks if t.extra["split"] == side]
        out["splits"][side] = {
            "instances": len(mine), "units": len({t.extra["unit"] for t in mine}),
            "projects": dict(sorted(Counter(t.extra["project"] for t in mine).items())),
            "kinds": dict(sorted(Counter(t.extra["mutation"]["kind"] for t in mine).items()))}
    sides_of: dict[str, set[str]] = {}
    for t in tasks:
        sides_of.setdefault(t.extra["mutation"]["path"], set()).add(t.extra["split"])
    out["modules"] = {"all": len(sides_of),
                      "both_sides": sum(len(s) == 2 for s in sides_of.values())}
    held = [t for t in tasks if t.extra["split"] == "heldout"]
    odds = [flip_odds(t, kinds) for t in held]
    out["heldout_reference"] = {
        "named": round(sum(map(named, held)) / max(1, len(held)), 3),
        "flip_ceiling": round(sum(1 / n for n, ok in odds if ok) / max(1, len(held)), 3),
        "fix_is_a_site": round(sum(ok for _, ok in odds) / max(1, len(held)), 3),
        "sites_per_function_median": statistics.median(n for n, _ in odds) if odds else 0}
    return out


def main(argv=None) -> int:
    ap = ArgumentParser(prog="benchmarks/world_stats.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", type=InFile("yaml"), default=str(datasets_dir() / "procedural.yaml"),
                    help="world recipe (default datasets/procedural.yaml)")
    ap.add_argument("--json", type=OutFile(), default=None,
                    help="also write the figures to this file")
    args = ap.parse_args(argv)
    recipe = load_recipe(args.recipe)
    if recipe.heldout is None:
        print(f"error: {args.recipe}: not a world recipe (no 'heldout' field)", file=sys.stderr)
        return 2
    if recipe.heldout.by != "function":
        print(f"error: {args.recipe}: heldout.by is {recipe.heldout.by!r}; the reference rates "
              "are defined for a split by function", file=sys.stderr)
        return 2
    tasks = ensure_built(args.recipe)
    stats = world_stats(tasks, recipe.kinds)
    for side, s in stats["splits"].items():
        print(f"{side:8s} {s['instances']:4d} instances in {s['units']:3d} units; "
              f"projects {s['projects']}; kinds {s['kinds']}")
    print(f"modules: {stats['modules']['both_sides']} of {stats['modules']['all']} hold "
          "instances of both sides (the split is by function)")
    ref = stats["heldout_reference"]
    print(f"held-out: named in the statement {ref['named']:.3f}; fix is one of the function's "
          f"sites {ref['fix_is_a_site']:.3f} (median {ref['sites_per_function_median']:g} sites); "
          f"flip ceiling {ref['flip_ceiling']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(stats, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
