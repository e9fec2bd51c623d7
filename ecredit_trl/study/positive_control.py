"""The study's starting policy: the positive control, and the step-0 baseline.

* :func:`control_policy` — with ``warmstart`` set and ``model: null``, every run and
  evaluation of the study uses the embedded policy warm-started with those recipe
  overrides (built once, cached; a harmful block is screened with real trials first); the
  report's detector then reads ``<out>/harmful.json`` (:mod:`ecredit_trl.study.report_control`).
* :func:`baseline_model` — the policy the runs start from, resolved exactly as the main job
  resolves it (:func:`ecredit_trl.policy.run_inputs.tasks_and_policy`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from git import Repo

from ecredit_trl.policy.run_inputs import tasks_and_policy
from ecredit_trl.policy.warmstart import default_policy_tasks, ensure_default_policy
from ecredit_trl.study.config import StudyConfig
from ecredit_trl.train import parse_args
from eval.files import atomic_write_text
from eval.tasks.splits import load_tasks

CONTROL_KEYS = ("key", "harmful", "harmful_screened", "variants")
"""Fields of the warm start's ``warmstart.json`` copied into ``harmful.json``."""


def train_flags(train: dict) -> list[str]:
    """The study's ``train:`` section as main-job flags (None values left out)."""
    argv: list[str] = []
    for k, v in train.items():
        if v is None:
            continue
        argv += [f"--{k}", *map(str, v)] if isinstance(v, list) else [f"--{k}", str(v)]
    return argv


def main_job_args(cfg: StudyConfig):
    """The main job's ``(ECreditConfig, ModelArguments)`` for the study's train fields (the
    first arm), as train.py would parse them."""
    return parse_args(["--arm", cfg.arms[0], *train_flags(cfg.train)])


def baseline_model(cfg: StudyConfig) -> str:
    """The starting policy: ``cfg.model``, or the embedded warm-started default resolved
    exactly as train.py resolves it for these train fields (built once, cached)."""
    if cfg.model is not None:
        return cfg.model
    return str(tasks_and_policy(*main_job_args(cfg))[1])


def base_text(repo_dir: str | Path, commit: str, path: str) -> str:
    """The text of ``path`` at ``commit`` in a task's source repository (exact bytes, UTF-8).

    The repository is the task's own checkout (built by us, never an agent's working tree),
    read through GitPython's object database.

    Raises: KeyError (no such path at the commit), ValueError (bad commit),
    UnicodeDecodeError (not UTF-8 text).
    """
    blob = Repo(repo_dir).commit(commit).tree / path
    return blob.data_stream.read().decode("utf-8")


def control_policy(cfg: StudyConfig, out: Path, say) -> StudyConfig:
    """``cfg``, or (``warmstart`` set, ``model: null``) ``cfg`` with ``model`` = the embedded
    policy warm-started with those recipe overrides, so every run and evaluation uses it.

    Writes ``<out>/harmful.json`` (the policy's key, the harmful edits its demonstrations
    carry, the screened ids, every task's variant, and ``base_texts``: task id → the edited
    file's text at base, from which the report rebuilds a trajectory's final diff; temp +
    rename) for the report's detector. The study's bound config (``study.json``) keeps
    ``model: null``.

    Raises: what :func:`ecredit_trl.policy.warmstart.ensure_default_policy` raises.
    """
    if not cfg.warmstart or cfg.model is not None:
        return cfg
    tcfg, margs = main_job_args(cfg)
    kw = {"steps": margs.warmstart_steps} if margs.warmstart_steps else {}
    tasks = default_policy_tasks(tcfg.tasks, load_tasks(tcfg.tasks, purpose="train"))
    path = ensure_default_policy(tasks, log=say, **kw, **cfg.warmstart)
    meta = json.loads((Path(path) / "warmstart.json").read_text(encoding="utf-8"))
    by_id = {t.instance_id: t for t in tasks}
    base = {i: base_text(by_id[i].repo_dir, by_id[i].base_commit, e["path"])
            for i, e in (meta.get("harmful") or {}).items()}
    atomic_write_text(out / "harmful.json", json.dumps(
        {**{k: meta.get(k) for k in CONTROL_KEYS}, "base_texts": base},
        indent=1, sort_keys=True))
    say(f"study: policy {Path(path).name[:12]} (warmstart {cfg.warmstart}); "
        f"{len(meta.get('harmful') or {})} demonstrations carry a harmful block")
    return dataclasses.replace(cfg, model=str(path))


__all__ = ["CONTROL_KEYS", "base_text", "baseline_model", "control_policy", "main_job_args",
           "train_flags"]
