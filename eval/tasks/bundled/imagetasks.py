"""Stand-in image-held tasks: the bundled tasks baked into Podman images.

``python -m eval.build_tasks --image-tasks`` (:func:`ensure_image_tasks`) turns the built
bundled tasks (:mod:`eval.tasks.bundled.build`) into tasks shaped like SWE-bench's: no
``repo_dir``; the repository lives in the task's image at ``/testbed``, with an environment
activated the way the SWE-bench harness does it and an untracked build output the tests need.
Nothing is pulled: every image is built offline on top of the sandbox image
(:func:`sandbox.images.default_image`).

Images (names follow swebench's env/eval split, ``localhost/`` because Podman refuses short
names; ``<tag>`` = :func:`image_tag`):

* ``localhost/ecredit-env.x86_64.<project>:<tag>``, one per project (swebench's
  ``sweb.env.*``): a venv ``/opt/testbed-env`` (``--system-site-packages``, so the base
  image's pytest is in it) with the project installed "editable" (a ``.pth`` naming
  ``/testbed`` or ``/testbed/src``), put on ``PATH`` by ``/etc/profile.d/testbed.sh``. A login
  shell (``bash -lc``) reads it, so ``which python`` resolves inside the venv; a plain
  ``sh -c`` does not (Debian has no bare ``python``). The build step of the project,
  ``/opt/ecredit-build/make_build_info.py``, is copied in too.
* ``localhost/ecredit-eval.x86_64.<instance id, __ -> _1776_>:<tag>``, one per task
  (swebench's ``sweb.eval.*``): ONE layer over the project image that copies the task's
  repository into ``/testbed`` (git history, ``HEAD`` = ``base_commit``) and runs the build
  step, which writes ``<package>/_build_info.py``. That file is listed in ``.gitignore``
  and imported by the repository's ``conftest.py``: without it every test errors, exactly
  what a ``git clone`` of the repository would lose (like a compiled extension).

Why one image per task: SWE-bench rows carry one image per instance whose ``/testbed`` is at
the instance's base, and consumers (the verifier with ``repo_archive=None``, the agent env)
rely on that; a per-project image would need a checkout at every trial and rollout start.
A per-task layer is cheap (a bind-mounted copy of a ~1 MB repository + one Python run, about
1 s alone), so the whole set stays within the ~2 min budget: 3 project images + 39 task
images, two builds at once, took 72 s cold on this 2-core machine while other jobs ran
(``build.json`` records the timings); loading a built set only lists the local images.
The layer cache keys a ``RUN`` by its text, so each task's ``RUN`` names its
``base_commit`` (:func:`eval_containerfile`).

Each task's repository has its own two-commit history: ``<project> <version>: sdist import``
(the bundled base tree) and ``build setup`` (``.gitignore`` + ``conftest.py``) = the
``base_commit``. Its history does not hold the pristine tree (a bundled base commit's parent
is the fix, which ``git show`` would reveal), nor other tasks' commits. Commits carry fixed
identities and dates, so ``base_commit`` is reproducible; the gold ``patch`` is the bundled
one (same file blobs). ``environment_setup_commit`` stays the bundled pristine commit, the
tree the project image's environment stands for.

Rows keep the bundled ``instance_id`` s on purpose: the sealed manifest
``datasets/bundled_holdout.json`` then binds these tasks too (training refuses its ids via
:func:`eval.tasks.sealed.check_not_sealed`), and ``bundled-image:train|holdout`` is the same
partition as ``bundled:train|holdout``. Output: ``$ECREDIT_CACHE/bundled-image/<tag>/``
(``tasks.jsonl``, ``build.json`` with timings and image ids), written under a temporary name
and renamed when complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eval.tasks.bundled.cache import build_log, cache_lock, ensure_built
from eval.tasks.bundled.recipe import (
    BuildError,
    ProjectRecipe,
    Recipe,
    cache_dir,
    load_recipe,
    recipe_hash,
)
from eval.tasks.bundled.scripts import make_eval_script
from eval.tasks.bundled.sources import GitRepo
from eval.tasks.schema import Task, read_rows, tasks_from_rows
from sandbox.images import build_offline, default_image
from sandbox.runtimes.podman_runtime import podman_env

#: Bump when the output for the same bundled set changes (part of :func:`image_tag`).
#: 2: task layers keyed by base_commit (1 shared one cached layer per project).
IMAGE_BUILDER_VERSION = 2
ENV_DIR = "/opt/testbed-env"
PROFILE = "/etc/profile.d/testbed.sh"
BUILD_SCRIPT = "/opt/ecredit-build/make_build_info.py"
BUILD_OUTPUT = "_build_info.py"
ENV_REPO = "localhost/ecredit-env.x86_64"
EVAL_REPO = "localhost/ecredit-eval.x86_64"
#: The line an image task's eval script activates its environment with (swebench:
#: ``source /opt/miniconda3/bin/activate`` + ``conda activate testbed``).
ACTIVATE = f"source {PROFILE}"


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a project's package lives: ``root`` is the sys.path entry relative to the
    repository (``""`` or ``"src"``), ``package`` the top-level import name."""

    root: str
    package: str

    @property
    def build_output(self) -> str:
        """Repository-relative path of the generated module, e.g. ``src/cachetools/_build_info.py``."""
        return "/".join(x for x in (self.root, self.package, BUILD_OUTPUT) if x)


def layout(project: ProjectRecipe) -> Layout:
    """The package of ``project``: the top folder of its first mutated module (a leading
    ``src/`` is the sys.path root).

    Raises: BuildError when that module is a top-level file (no package to put the build
    output in)."""
    parts = Path(project.modules[0].path).parts
    root = "src" if parts[0] == "src" else ""
    rest = parts[1:] if root else parts
    if len(rest) < 2:
        raise BuildError(f"{project.name}: module {project.modules[0].path} is not inside a "
                         "package; image tasks need one for the build output")
    return Layout(root, rest[0])


def image_tag(bundled_hash: str) -> str:
    """16 hex digits over the bundled set's recipe hash and :data:`IMAGE_BUILDER_VERSION`."""
    return hashlib.sha256(f"{bundled_hash}:{IMAGE_BUILDER_VERSION}".encode()).hexdigest()[:16]


def env_image_name(project: str, tag: str) -> str:
    """``localhost/ecredit-env.x86_64.<project>:<tag>`` (lowercase)."""
    return f"{ENV_REPO}.{project.lower()}:{tag}"


def eval_image_name(instance_id: str, tag: str) -> str:
    """``localhost/ecredit-eval.x86_64.<id>:<tag>`` with swebench's ``__`` -> ``_1776_``."""
    return f"{EVAL_REPO}.{instance_id.replace('__', '_1776_').lower()}:{tag}"


# ---------------------------------------------------------------------------
# file contents (pure)
# ---------------------------------------------------------------------------

def conftest_text(lay: Layout) -> str:
    """The repository's root ``conftest.py``: imports the generated build module, so every
    test errors (pytest exit 4, nothing collected) when the build step did not run."""
    return (f'"""pytest setup: {lay.package}.{BUILD_OUTPUT[:-3]} is generated when the '
            'environment is built\n(not tracked, see .gitignore); without it the tests '
            'cannot run, as with a compiled extension."""\n\n'
            "import importlib\n\n"
            f'BUILD_INFO = importlib.import_module("{lay.package}.{BUILD_OUTPUT[:-3]}")\n')


def gitignore_text(lay: Layout) -> str:
    return f"__pycache__/\n*.pyc\n{lay.build_output}\n"


def build_script_text(project: ProjectRecipe, lay: Layout) -> str:
    """The project's build step (run in ``/testbed`` by the login shell's python): writes
    the build output with the project, its version, ``HEAD`` and the interpreter."""
    header = f"# Generated by {BUILD_SCRIPT} at image build; not tracked (.gitignore).\n"
    fixed = f"PROJECT = {project.name!r}\nVERSION = {project.version!r}\n"
    return (
        '"""Build step of this environment: writes the untracked generated module."""\n'
        "import subprocess\nimport sys\nfrom pathlib import Path\n\n"
        "head = subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True, text=True,\n"
        "                      check=True).stdout.strip()\n"
        f"text = {header!r} + {fixed!r}\n"
        "text += f'BASE_COMMIT = {head!r}\\nPYTHON = {sys.executable!r}\\n'\n"
        f"Path({lay.build_output!r}).write_text(text)\n")


def env_containerfile(base_image: str, lay: Layout) -> str:
    """Containerfile of a project image (context: a folder holding ``make_build_info.py``)."""
    site = "/testbed" + (f"/{lay.root}" if lay.root else "")
    return (
        f"FROM {base_image}\n"
        f"RUN python3 -m venv --system-site-packages --without-pip {ENV_DIR} \\\n"
        f" && printf '%s\\n' '# testbed environment (like conda activate testbed)' "
        f"'export VIRTUAL_ENV={ENV_DIR}' 'export PATH={ENV_DIR}/bin:$PATH' > {PROFILE} \\\n"
        f" && {ENV_DIR}/bin/python -c 'import sysconfig, sys; open(sysconfig.get_paths()"
        f"[\"purelib\"] + \"/__editable__.{lay.package}.pth\", \"w\").write(sys.argv[1] + "
        f"\"\\n\")' {site}\n"
        f"COPY make_build_info.py {BUILD_SCRIPT}\n")


def eval_containerfile(env_image: str, base_commit: str) -> str:
    """Containerfile of a task image (context: the task's repository): one layer.

    The layer cache keys a ``RUN`` by its text, not by what its bind mount holds, so the
    command names ``base_commit`` (and checks ``HEAD`` against it): two tasks of a project
    never share a cached layer, and a rebuild of the same task reuses its own."""
    return (f"FROM {env_image}\n"
            "RUN --mount=type=bind,source=.,target=/ctx cp -a /ctx/. /testbed/ \\\n"
            f" && test \"$(git -C /testbed rev-parse HEAD)\" = {base_commit} \\\n"
            f" && bash -lc 'cd /testbed && python {BUILD_SCRIPT}'\n")


def image_eval_script(project: ProjectRecipe, tests: tuple[str, ...], files: dict[str, bytes],
                      conftest: bytes) -> str:
    """The bundled eval script (:func:`eval.tasks.bundled.scripts.make_eval_script`) with the
    environment activated first and ``conftest.py`` restored with the test files."""
    p = dataclasses.replace(project, test_support=(*project.test_support, "conftest.py"))
    return make_eval_script(p, tests, {**files, "conftest.py": conftest},
                            setup_lines=(ACTIVATE,))


# ---------------------------------------------------------------------------
# repositories and images (I/O)
# ---------------------------------------------------------------------------

def make_task_repo(bundled_repo: str | Path, bundled_base: str, project: ProjectRecipe,
                   dest: Path) -> tuple[str, str]:
    """Write the task's repository into ``dest`` (see module doc): ``(import commit,
    base_commit)``, both reproducible; the work tree is left at ``base_commit``.

    Raises: BuildError (git failures, a tree that already has the files we add)."""
    src = GitRepo(bundled_repo)
    proc = subprocess.run(["git", "-C", str(src.path), "archive", "--format=tar", bundled_base],
                          capture_output=True)
    if proc.returncode != 0:
        raise BuildError(f"{project.name}: git archive {bundled_base} in {src.path} failed: "
                         f"{proc.stderr.decode(errors='replace')[:300]}")
    dest.mkdir(parents=True)
    untar = subprocess.run(["tar", "-x", "-C", str(dest)], input=proc.stdout,
                           capture_output=True)
    if untar.returncode != 0:
        raise BuildError(f"{project.name}: unpacking {bundled_base} into {dest} failed: "
                         f"{untar.stderr.decode(errors='replace')[:300]}")
    lay = layout(project)
    clash = [f for f in (".gitignore", "conftest.py", lay.build_output) if (dest / f).exists()]
    if clash:
        raise BuildError(f"{project.name}: the sdist already has {clash}; image tasks add them")
    repo = GitRepo(dest)
    first = repo.init_pristine(f"{project.name} {project.version}: sdist import")
    (dest / ".gitignore").write_text(gitignore_text(lay))
    (dest / "conftest.py").write_text(conftest_text(lay))
    repo.git("add", "-A", ".")
    tree = repo.git("write-tree").strip()
    base = repo.git("commit-tree", tree, "-p", first, "-m",
                    f"build setup: {lay.build_output} is generated (ignored), conftest.py "
                    "imports it").strip()
    repo.git("update-ref", "refs/heads/main", base)
    return first, base


def _podman(*args: str, timeout: float = 300) -> str:
    try:
        proc = subprocess.run(["podman", *args], capture_output=True, text=True,
                              env=podman_env(), timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BuildError(f"podman {' '.join(args[:2])} timed out after {timeout} s") from None
    if proc.returncode != 0:
        raise BuildError(f"podman {' '.join(args[:4])} failed (exit {proc.returncode}): "
                         f"{(proc.stdout + proc.stderr).strip()[-1500:]}")
    return proc.stdout


def podman_build(name: str, containerfile: str, context: Path) -> str:
    """``podman build -t name`` of ``containerfile`` (written beside ``context``, not in it)
    with ``context``; returns the image id. Raises: BuildError with podman's output."""
    cf = context.parent / f"{context.name}.Containerfile"
    cf.write_text(containerfile)
    _podman("build", "-q", "--network", "none", "-t", name, "-f", str(cf), str(context))
    return _podman("image", "inspect", "--format", "{{.Id}}", name).strip()


def local_images() -> set[str]:
    """Every ``repository:tag`` in local storage (one ``podman images`` call)."""
    out = _podman("images", "--format", "{{.Repository}}:{{.Tag}}")
    return {line.strip() for line in out.splitlines() if line.strip()}


def missing_images(tasks: list[Task]) -> list[str]:
    """The tasks' images (sorted, unique) that local storage lacks."""
    have = local_images()
    return sorted({t.image for t in tasks} - have)


# ---------------------------------------------------------------------------
# the build
# ---------------------------------------------------------------------------

def image_built_dir(recipe: Recipe, image: str | None = None) -> Path:
    """``$ECREDIT_CACHE/bundled-image/<image tag>`` of ``recipe`` on sandbox ``image``."""
    return cache_dir() / "bundled-image" / image_tag(recipe_hash(recipe, image or default_image()))


def image_task_row(bt: Task, project: ProjectRecipe, base: str, image: str, env_image: str,
                   eval_script: str) -> dict:
    """The swebench-5-format row (:meth:`Task.to_dict`) of bundled task ``bt`` as an image
    task: same id, problem, gold patch and test lists; ``base_commit`` / ``image`` /
    ``eval_script`` of the image; no ``repo_dir``."""
    lay = layout(project)
    extra = {**bt.extra, "image_task": True, "env_image": env_image,
             "bundled_base_commit": bt.base_commit, "build_output": lay.build_output,
             "image_builder": IMAGE_BUILDER_VERSION}
    return dataclasses.replace(bt, base_commit=base, image=image, eval_script=eval_script,
                               repo_dir=None, workdir="/testbed", extra=extra).to_dict()


def _build_env_images(recipe: Recipe, base_image: str, tag: str, work: Path) -> dict[str, str]:
    ids = {}
    for p in recipe.projects:
        ctx = work / "env" / p.name
        ctx.mkdir(parents=True)
        lay = layout(p)
        (ctx / "make_build_info.py").write_text(build_script_text(p, lay))
        name = env_image_name(p.name, tag)
        ids[name] = podman_build(name, env_containerfile(base_image, lay), ctx)
    return ids


def build_image_tasks(recipe: Recipe, bundled: list[Task], out: Path, *, base_image: str,
                      concurrency: int = 2, log=print) -> list[Task]:
    """Build the project and task images of ``bundled`` and write ``out`` (see module doc).

    Args:
        recipe: the bundled recipe ``bundled`` was built from.
        bundled: the bundled tasks (:func:`eval.tasks.bundled.cache.ensure_built`).
        out: output folder, written as ``out.tmp-<pid>`` and renamed when complete.
        base_image: the offline sandbox image the project images start from.
        concurrency: task images built at once.

    Returns: the image tasks, in the bundled order.

    Raises: BuildError (git, podman build, a project the recipe lacks).
    """
    t0 = time.monotonic()
    out = Path(out)
    tag = image_tag(recipe_hash(recipe, base_image))
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    projects = {p.name: p for p in recipe.projects}
    try:
        tmp.mkdir(parents=True)
        image_ids = _build_env_images(recipe, base_image, tag, tmp)
        t_env = time.monotonic() - t0
        log(f"{len(image_ids)} project images in {t_env:.1f} s")

        def one(bt: Task) -> dict:
            p = projects.get(bt.extra.get("project", ""))
            if p is None:
                raise BuildError(f"{bt.instance_id}: project {bt.extra.get('project')!r} is "
                                 "not in the recipe")
            ctx = tmp / "repos" / bt.instance_id
            _, base = make_task_repo(bt.repo_dir, bt.base_commit, p, ctx)
            files = {f: (ctx / f).read_bytes()
                     for f in (*p.test_support, *bt.extra["test_files"])}
            script = image_eval_script(p, tuple(bt.extra["test_files"]), files,
                                       (ctx / "conftest.py").read_bytes())
            name, env = eval_image_name(bt.instance_id, tag), env_image_name(p.name, tag)
            image_ids[name] = podman_build(name, eval_containerfile(env, base), ctx)
            return image_task_row(bt, p, base, name, env, script)

        ex = ThreadPoolExecutor(max_workers=max(1, concurrency))
        try:
            rows = list(ex.map(one, bundled))
        finally:  # a failed task build stops the queue (the running builds end first)
            ex.shutdown(wait=True, cancel_futures=True)
        with open(tmp / "tasks.jsonl", "w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n")
        shutil.rmtree(tmp / "repos")
        shutil.rmtree(tmp / "env")
        for cf in tmp.glob("*.Containerfile"):
            cf.unlink()
        stats = {"image_builder": IMAGE_BUILDER_VERSION, "base_image": base_image, "tag": tag,
                 "bundled_recipe_hash": recipe_hash(recipe, base_image), "tasks": len(rows),
                 "images": dict(sorted(image_ids.items())),
                 "timings_s": {"env_images": round(t_env, 2),
                               "total": round(time.monotonic() - t0, 2)}}
        (tmp / "build.json").write_text(json.dumps(stats, indent=1, sort_keys=True) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"built {len(rows)} image tasks ({len(image_ids)} images) in "
        f"{time.monotonic() - t0:.1f} s -> {out}")
    return load_image_tasks(out)


def load_image_tasks(out: Path) -> list[Task]:
    """Tasks of a built folder's ``tasks.jsonl``. Raises: FileNotFoundError, ValueError."""
    path = Path(out) / "tasks.jsonl"
    rows, nums = read_rows(path)
    return tasks_from_rows(rows, source=str(path), row_numbers=nums)


def ensure_image_tasks(recipe_path: str | Path | None = None, *, out: str | Path | None = None,
                       concurrency: int = 2, force: bool = False, log=None) -> list[Task]:
    """The image tasks of the recipe: loaded from ``out`` (default :func:`image_built_dir`)
    when built there and every image is in local storage, else built now (the bundled
    tasks first when needed: :func:`eval.tasks.bundled.cache.ensure_built`). A file lock
    serialises concurrent builders.

    Raises: see :func:`build_image_tasks`, :func:`eval.tasks.bundled.cache.ensure_built`.
    """
    log = log or build_log
    recipe = load_recipe(recipe_path)
    out = Path(out) if out else image_built_dir(recipe)
    with cache_lock(out.with_name(out.name + ".lock")):
        if not force and (out / "tasks.jsonl").is_file():
            tasks = load_image_tasks(out)
            missing = missing_images(tasks)
            if not missing:
                return tasks
            log(f"{len(missing)} image(s) of {out} are missing (e.g. {missing[0]}); rebuilding")
        bundled = ensure_built(recipe_path, concurrency=concurrency, log=log)
        base_image = build_offline(log=lambda *a: None)
        if base_image != default_image():
            raise BuildError(f"sandbox image {base_image} is not the default {default_image()}")
        log(f"building image tasks of {len(bundled)} bundled tasks into {out}")
        return build_image_tasks(recipe, bundled, out, base_image=base_image,
                                 concurrency=concurrency, log=log)
