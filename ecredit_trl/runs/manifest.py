"""Run manifest: what a run was made of, hashed so a resume can be bound to it (design page,
"Run records").

``runs/<name>/manifest.json`` is written once, at the start of a run::

    {"schema": 1, "run_name": ..., "created": ISO time, "argv": [...],
     "config": {...resolved...}, "config_sha256": ...,
     "tasks": {"source": ..., "ids": [...], "ids_sha256": ..., "sha256": ...},
     "code": {"sha256": ..., "files": n, "git_describe": ..., "git_commit": ..., "dirty": bool},
     "packages": {name: version}, "images": {name: digest or null},
     "sealed_holdouts": {file: {"name", "sha256", "n", "pool"}},
     "world_size": n, "model": {...}}

A resume must match the *bound* fields: ``config`` (every field except
:data:`UNBOUND_CONFIG_FIELDS`), ``tasks`` (task content), ``code`` (source
hash) and ``world_size``; :func:`binding_differences` lists the ones that differ.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import subprocess
import time
from pathlib import Path

from eval.files import datasets_dir
from eval.tasks.sealed import ids_sha256, manifests
from sandbox.runtimes.podman_store import local_image_ids

SCHEMA = 1
REPO_ROOT = Path(__file__).resolve().parents[2]
CODE_PACKAGES = ("ecredit_trl", "sandbox", "eval")
CODE_SUFFIXES = (".py", ".jinja", ".conf", "Containerfile")

UNBOUND_CONFIG_FIELDS = frozenset({
    # where the run lives and how it is watched: not part of what is trained
    "output_dir", "logging_dir", "run_name", "runs_dir", "disable_tqdm", "report_to",
    # where sandboxes run: results do not depend on which Podman endpoint serves them
    "podman_endpoints", "agent_endpoints", "verifier_endpoints",
    # ... nor on which backend dispatches them (a resume may switch local <-> ray)
    "sandbox_backend", "ray_address", "sandbox_max_in_flight", "ray_podman_url",
    "ray_image_registry",
    # ... nor on whether the cluster demanded Ray's token (recorded: a run on an open test
    # cluster says so; a resume may move onto a token cluster)
    "sandbox_allow_unauthenticated",
    # secrets never belong in a record
    "hub_token", "push_to_hub_token",
})
"""Config fields recorded in the manifest but not bound by a resume (with the reason)."""

PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "tokenizers",
            "safetensors", "numpy", "podman", "GitPython", "swebench", "ecredit-trl")


def sha256_json(obj) -> str:
    """sha256 (hex) of the canonical JSON of ``obj`` (sorted keys, no spaces, str() fallback)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def bound_config(config: dict) -> dict:
    """``config`` without the :data:`UNBOUND_CONFIG_FIELDS` (top level and ``ecredit``/``model``)."""
    out = {}
    for key, value in config.items():
        if key in UNBOUND_CONFIG_FIELDS:
            continue
        if isinstance(value, dict) and key in ("ecredit", "model"):
            value = {k: v for k, v in value.items() if k not in UNBOUND_CONFIG_FIELDS}
        out[key] = value
    return out


def tasks_record(tasks, source: str) -> dict:
    """Ids and content hash of the task list.

    ``sha256`` covers every task's fields except ``repo_dir`` (a machine-local
    cache path); ``ids_sha256`` is :func:`eval.tasks.sealed.ids_sha256` of the ids.
    """
    rows = []
    for t in tasks:
        d = t.to_dict() if hasattr(t, "to_dict") else dict(t)
        d.pop("repo_dir", None)
        rows.append(d)
    ids = [r["instance_id"] for r in rows]
    return {"source": source, "n": len(ids), "ids": ids, "ids_sha256": ids_sha256(ids),
            "sha256": sha256_json(rows)}


def code_version(root: str | Path = REPO_ROOT) -> dict:
    """Source hash of the three packages plus git's view of the checkout.

    ``sha256`` hashes (relative path, content) of every ``.py``/template/config
    file under ``ecredit_trl/``, ``sandbox/``, ``eval/`` and ``pyproject.toml``,
    so it works without git too. ``git_describe`` is ``git describe --always
    --dirty --tags`` (None outside a checkout); ``dirty`` is True when tracked
    files differ from the commit.
    """
    root = Path(root)
    h = hashlib.sha256()
    n = 0
    files = [root / "pyproject.toml"] if (root / "pyproject.toml").exists() else []
    for pkg in CODE_PACKAGES:
        files += [p for p in (root / pkg).rglob("*")
                  if p.is_file() and p.name.endswith(CODE_SUFFIXES) and "__pycache__" not in p.parts]
    for p in sorted(files):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
        n += 1
    out = {"sha256": h.hexdigest(), "files": n, "git_describe": None, "git_commit": None,
           "dirty": None}

    def git(*args):
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else None

    out["git_describe"] = git("describe", "--always", "--dirty", "--tags")
    out["git_commit"] = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    out["dirty"] = None if status is None else bool(status)
    return out


def package_versions() -> dict:
    """Versions of the packages a run depends on (None when not installed), plus Python and Podman."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    out["python"] = platform.python_version()
    try:
        proc = subprocess.run(["podman", "--version"], capture_output=True, text=True, timeout=30)
        out["podman-cli"] = proc.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        out["podman-cli"] = None
    return out


def image_digests(images) -> dict:
    """image name → digest (``sha256:...``, the image id) of every distinct task image, via
    :func:`sandbox.runtimes.podman_store.local_image_ids` (one ``podman images`` call for all of them);
    None when the image is not in local storage (remote endpoints, not pulled yet)."""
    return local_image_ids(images)


def sealed_holdouts() -> dict:
    """Every sealed holdout manifest (:func:`eval.tasks.sealed.manifests`): file → name, sha256, n, pool."""
    out = {}
    root = datasets_dir()
    for path, man in manifests().items():
        try:
            key = str(path.relative_to(root))
        except ValueError:
            key = str(path)
        out[key] = {k: man.get(k) for k in ("name", "sha256", "n", "pool")}
    return out


def build_manifest(*, run_name: str, argv: list[str], config: dict, tasks, task_source: str,
                   images, world_size: int, model: dict, runtime: str,
                   image_ids=None, scaffold: dict | None = None) -> dict:
    """The manifest dict of a starting run (see the module docstring); nothing is written.

    Args:
        config: the resolved configuration (``{"ecredit": ..., "model": ...}``).
        tasks: the training tasks (``eval.tasks.schema.Task``).
        images: image names the run's sandboxes use (digests are looked up when
            ``runtime == "podman"``: by ``image_ids(images)`` when given, e.g. the Ray
            backend's sandbox nodes, else this machine's Podman).
        world_size: accelerate processes.
        model: what the policy is (path, and whatever identifies its weights).
        scaffold: the scaffold's record (``Scaffold.record()``: name, config hash, config
            source); None: the built-in ``ecredit`` tools.
    """
    return {
        "schema": SCHEMA, "run_name": run_name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": list(argv),
        "config": config, "config_sha256": sha256_json(bound_config(config)),
        "tasks": tasks_record(tasks, task_source), "code": code_version(),
        "packages": package_versions(),
        "images": (image_ids or image_digests)(images) if runtime == "podman"
        else {i: None for i in set(images)},
        "sealed_holdouts": sealed_holdouts(), "world_size": int(world_size), "model": model,
        # the LoRA actually applied (architecture defaults resolved), None = full
        "lora": (config.get("model") or {}).get("lora"),
        "scaffold": scaffold or {"name": "ecredit"},
    }


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def binding_differences(old: dict, new: dict) -> list[dict]:
    """Bound fields that differ between two manifests, as
    ``[{"field", "was", "now"}]`` (``field``: a config field name such as
    ``learning_rate`` or ``model.lora_r``, or ``tasks``, ``code``, ``world_size``).

    Config fields are compared one by one (so the list names them); tasks and
    code by their hashes.
    """
    diffs = []
    a = _flatten(bound_config(old.get("config", {})))
    b = _flatten(bound_config(new.get("config", {})))
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            name = key.removeprefix("ecredit.")
            diffs.append({"field": name, "was": a.get(key, "<absent>"),
                          "now": b.get(key, "<absent>")})
    if old.get("tasks", {}).get("sha256") != new.get("tasks", {}).get("sha256"):
        ot, nt = old.get("tasks", {}), new.get("tasks", {})
        gone = sorted(set(ot.get("ids", [])) - set(nt.get("ids", [])))
        added = sorted(set(nt.get("ids", [])) - set(ot.get("ids", [])))
        diffs.append({"field": "tasks", "was": ot.get("sha256"), "now": nt.get("sha256"),
                      "removed_ids": gone, "added_ids": added})
    if old.get("code", {}).get("sha256") != new.get("code", {}).get("sha256"):
        diffs.append({"field": "code", "was": old.get("code", {}).get("git_describe"),
                      "now": new.get("code", {}).get("git_describe"),
                      "was_sha256": old.get("code", {}).get("sha256"),
                      "now_sha256": new.get("code", {}).get("sha256")})
    if old.get("world_size") != new.get("world_size"):
        diffs.append({"field": "world_size", "was": old.get("world_size"),
                      "now": new.get("world_size")})
    return diffs


def informational_differences(old: dict, new: dict) -> list[dict]:
    """Recorded-but-unbound differences (packages, image digests, unbound config fields)."""
    diffs = []
    for section in ("packages", "images"):
        a, b = old.get(section, {}) or {}, new.get(section, {}) or {}
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                diffs.append({"field": f"{section}.{key}", "was": a.get(key), "now": b.get(key)})
    a = {k: v for k, v in old.get("config", {}).get("ecredit", {}).items()
         if k in UNBOUND_CONFIG_FIELDS}
    b = {k: v for k, v in new.get("config", {}).get("ecredit", {}).items()
         if k in UNBOUND_CONFIG_FIELDS}
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            diffs.append({"field": key, "was": a.get(key), "now": b.get(key)})
    return diffs


def format_differences(diffs: list[dict]) -> str:
    """One line per difference: ``field: was → now``."""
    lines = []
    for d in diffs:
        extra = ""
        if d.get("removed_ids") or d.get("added_ids"):
            extra = f" (removed {d.get('removed_ids')}, added {d.get('added_ids')})"
        lines.append(f"  {d['field']}: {_short(d['was'])} -> {_short(d['now'])}{extra}")
    return "\n".join(lines)


def _short(v, limit: int = 120) -> str:
    s = json.dumps(v, default=str) if not isinstance(v, str) else v
    return s if len(s) <= limit else s[: limit - 3] + "..."


__all__ = ["UNBOUND_CONFIG_FIELDS", "binding_differences", "bound_config", "build_manifest",
           "code_version", "format_differences", "informational_differences", "sha256_json",
           "tasks_record"]
