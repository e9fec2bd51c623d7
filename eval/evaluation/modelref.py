"""Which policy an evaluation ran: resolve a model path or run directory, fingerprint it.

Shared by :mod:`eval.run` (binding of result slots) and ``ecredit_trl.agent.rollouts`` (which
loads the weights); stdlib only, so ``eval`` stays free of TRL / peft imports (design page,
"Layers").

Accepted paths:

* a model directory (``config.json`` + weights, or a peft adapter: ``adapter_config.json``);
* a training run directory ``runs/<name>/`` (``ecredit_trl/train.py`` writes
  ``checkpoint-final/`` and the resolved ``config.json`` there): its ``checkpoint-final/``
  is the model, its ``config.json`` gives arm, seed and generation settings, its
  ``ledger.jsonl`` the training cost.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from eval.files import read_json_object

__all__ = ["ModelRef", "dir_fingerprint", "hub_cache_dir", "hub_snapshot", "looks_like_hub_id",
           "resolve_model"]

#: Files never part of a model's identity (editor/OS litter, lock files).
_SKIP_SUFFIXES = (".lock", ".tmp")


@dataclass
class ModelRef:
    """A resolved policy.

    Attributes:
        given: the path as the user gave it.
        model_dir: directory holding the weights (or adapter) and tokenizer.
        run_dir: the training run directory, or None when a bare model dir was given.
        run_config: the run's ``config.json`` (dict) or None.
        adapter: True when ``model_dir`` holds a peft adapter (``adapter_config.json``).
        base_model: the adapter's base model (path or hub id), None for a full model.
        sha256: :func:`dir_fingerprint` of ``model_dir`` (plus the base model's for an
            adapter whose base is a local directory, else the base's name).
    """

    given: str
    model_dir: str
    run_dir: str | None
    run_config: dict | None
    adapter: bool
    base_model: str | None
    sha256: str
    extra: dict = field(default_factory=dict)

    @property
    def arm(self) -> str | None:
        """The training arm (O/B/M/E) from the run config, or None."""
        cfg = (self.run_config or {}).get("ecredit") or {}
        return cfg.get("arm")

    @property
    def seed(self) -> int | None:
        """The training seed from the run config, or None."""
        cfg = (self.run_config or {}).get("ecredit") or {}
        return cfg.get("seed")

    def generation_defaults(self) -> dict:
        """Rollout settings of the training run (what eval should reuse by default).

        Returns a dict with any of ``max_turns``, ``max_new_tokens`` (the run's
        ``max_completion_length``: one budget for the whole episode), ``temperature``,
        ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty``, ``bash_timeout_s`` found
        in the run config; empty for a bare model directory.
        """
        cfg = (self.run_config or {}).get("ecredit") or {}
        names = {"max_turns": "max_turns", "max_completion_length": "max_new_tokens",
                 "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                 "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                 "bash_timeout_s": "bash_timeout_s"}
        return {ours: cfg[theirs] for theirs, ours in names.items() if cfg.get(theirs) is not None}

    def scaffold_defaults(self) -> dict:
        """The training run's scaffold (what eval uses when none is given, as it reuses the
        run's rollout settings): ``{"scaffold": name, "scaffold_config": path or None}``
        from the run config; empty for a bare model directory or a run without a scaffold
        recorded. The config path is the one the run used (for the embedded policy, the
        compact mini-swe-agent config: design page, "Generation engines and scaffolds")."""
        cfg = (self.run_config or {}).get("ecredit") or {}
        if not cfg.get("scaffold"):
            return {}
        return {"scaffold": cfg["scaffold"], "scaffold_config": cfg.get("scaffold_config")}

    def to_json(self) -> dict:
        return {"given": self.given, "model_dir": self.model_dir, "run_dir": self.run_dir,
                "adapter": self.adapter, "base_model": self.base_model, "sha256": self.sha256,
                "arm": self.arm, "seed": self.seed}


def dir_fingerprint(path: str | Path) -> str:
    """sha256 (hex) over every regular file under ``path``: relative POSIX path, size and
    content sha256, in path order. Hidden entries (``.name``) and ``*.lock``/``*.tmp`` are
    skipped. Reads every byte (about 1–2 s per GB).

    Raises: FileNotFoundError naming ``path`` when it is not a directory.
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"model: not a directory: {root}")
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = f.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or f.name.endswith(_SKIP_SUFFIXES):
            continue
        fh = hashlib.sha256()
        with open(f, "rb") as src:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                fh.update(chunk)
        h.update(f"{rel.as_posix()}\0{f.stat().st_size}\0{fh.hexdigest()}\n".encode())
    return h.hexdigest()


#: A hub repository id: ``name`` or ``org/name`` (letters, digits, ``-_.``), as huggingface_hub
#: validates them (``validate_repo_id``), and not a path that starts like one.
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")


def looks_like_hub_id(model: str) -> bool:
    """True when ``model`` reads as a hub id (``org/name``), not as a path (``/``, ``.``,
    ``~`` first, or more than one ``/``)."""
    return bool(_HUB_ID.match(model)) and not model.startswith((".", "~")) and ".." not in model


def hub_cache_dir() -> Path:
    """The hub cache huggingface_hub reads: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``~/.cache/huggingface/hub`` (huggingface_hub's ``constants.HF_HUB_CACHE`` rule)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def hub_snapshot(repo_id: str, revision: str = "main") -> Path:
    """The local snapshot of hub model ``repo_id`` in the hub cache layout
    (``models--org--name/refs/<revision>`` holds a commit hash; the files are under
    ``models--org--name/snapshots/<hash>/``), without any network access.

    Returns: the snapshot directory (it holds ``config.json`` or ``adapter_config.json``).

    Raises: FileNotFoundError, one line naming the model and the directory looked in, when
        the snapshot is absent or incomplete.
    """
    repo = hub_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / revision
    rev = ref.read_text(encoding="utf-8").strip() if ref.is_file() else revision
    snap = repo / "snapshots" / rev
    if not ((snap / "config.json").is_file() or (snap / "adapter_config.json").is_file()):
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        raise FileNotFoundError(
            f"--model {repo_id}: not in the local hub cache (looked for "
            f"{repo}/refs/{revision} -> snapshots/<commit>/config.json"
            f"{'; HF_HUB_OFFLINE=1, so nothing is downloaded' if offline else ''}); fetch it "
            f"with `hf download {repo_id}` (set HF_HOME or HF_HUB_CACHE to the cache it went "
            "to) or pass a model directory")
    return snap


def resolve_model(path: str | Path) -> ModelRef:
    """Resolve ``path`` (model dir or run dir, see the module doc, or a hub id whose snapshot
    is in the local hub cache: :func:`hub_snapshot`) and fingerprint it.

    Raises:
        FileNotFoundError: ``path`` does not exist (a hub id: not in the hub cache), or a run dir without
            ``checkpoint-final/``, or a directory with neither ``config.json`` nor
            ``adapter_config.json``.
        ValueError: an unreadable ``config.json`` / ``adapter_config.json``.
    """
    given = str(path)
    p = Path(path).expanduser()
    if not p.exists() and looks_like_hub_id(given):
        p = hub_snapshot(given)
    if not p.exists():
        raise FileNotFoundError(f"model: no such path {p}")
    run_dir: Path | None = None
    run_config = None
    if (p / "checkpoint-final").is_dir():
        run_dir, model_dir = p, p / "checkpoint-final"
    elif p.name == "checkpoint-final" and (p.parent / "config.json").is_file() and (
            (p.parent / "ledger.jsonl").exists() or "ecredit" in read_json_object(p.parent / "config.json",
                                                                   what="run config")):
        run_dir, model_dir = p.parent, p
    elif (p / "ledger.jsonl").exists() or (p / "receipts").is_dir():
        raise FileNotFoundError(f"model: {p} looks like a run directory but has no "
                                "checkpoint-final/ (the run did not finish?)")
    else:
        model_dir = p
    if run_dir is not None and (run_dir / "config.json").is_file():
        run_config = read_json_object(run_dir / "config.json", what="run config")
    adapter = (model_dir / "adapter_config.json").is_file()
    base = None
    if adapter:
        acfg = read_json_object(model_dir / "adapter_config.json", what="adapter config")
        base = acfg.get("base_model_name_or_path")
        if not base and run_config:
            base = ((run_config.get("model") or {}).get("path"))
        if not base:
            raise ValueError(f"adapter config {model_dir / 'adapter_config.json'}: field "
                             "'base_model_name_or_path' missing and the run config names no "
                             "model path")
    elif not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"model: {model_dir} holds neither config.json nor "
                                "adapter_config.json")
    sha = dir_fingerprint(model_dir)
    if adapter:
        base_id = dir_fingerprint(base) if Path(base).is_dir() else f"hub:{base}"
        sha = hashlib.sha256(f"{sha}\0{base_id}".encode()).hexdigest()
    return ModelRef(given=given, model_dir=str(model_dir.resolve()),
                    run_dir=str(run_dir.resolve()) if run_dir else None, run_config=run_config,
                    adapter=adapter, base_model=base, sha256=sha)
