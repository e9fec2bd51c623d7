"""The training pool never overlaps an evaluation split (design page, "Evaluation").

``study run`` calls :func:`check_train_pool` before it writes anything: it loads the ids of
``train.tasks`` (the first ``train.max_tasks`` of them, as train.py trains on) and of every
``eval.tasks.splits`` entry, and refuses, in one line naming the overlap count and a few ids, any
split that shares an id with the pool, or whose tasks fix the same change as a training task
under another id (their gold patches share a change: :mod:`eval.tasks.fingerprints`), unless
the split is listed in ``eval.in_distribution``
(an in-distribution evaluation on purpose, as the embedded study's ``bundled:train``; the
report labels such a split "training tasks"). ``official500`` and ``holdout100`` are
evaluation-only: a ``train.tasks`` naming them is refused without loading anything.
train.py's own guard (``load_tasks(..., purpose="train")`` refusing sealed ids) is unchanged
and still applies to every run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ecredit_trl.config import ECreditConfig
from ecredit_trl.study.config import StudyConfig, StudyConfigError
from eval.tasks.fingerprints import shared_changes
from eval.tasks.splits import load_tasks

__all__ = ["EVAL_ONLY", "check_train_pool", "overlap_message", "shared_change_message",
           "train_source"]

#: Task sources that only evaluation may use (fixed denominators 500 / 100).
EVAL_ONLY = ("official500", "holdout100")
_SHOW = 3  # ids named in the message


def train_source(cfg: StudyConfig) -> str:
    """``train.tasks`` of the study, or ECreditConfig's default when unset."""
    if cfg.train.get("tasks"):
        return str(cfg.train["tasks"])
    import dataclasses

    return next(f.default for f in dataclasses.fields(ECreditConfig) if f.name == "tasks")


def overlap_message(train_ids: Sequence[str], split_ids: Mapping[str, Sequence[str]], *,
                    in_distribution: Sequence[str] = (), where: str = "config") -> str | None:
    """The one-line refusal for a pool that shares ids with an evaluation split (pure).

    Args:
        train_ids: the training pool's task ids.
        split_ids: eval split → its task ids.
        in_distribution: splits allowed to overlap (``eval.in_distribution``).

    Returns: None when no split outside ``in_distribution`` shares an id, else
        ``"<where>: train.tasks: N task id(s) also in eval split 'S' (a, b, c, ...); ..."``.
    """
    pool = set(train_ids)
    parts = []
    for split, ids in split_ids.items():
        if split in in_distribution:
            continue
        common = sorted(pool.intersection(ids))
        if common:
            parts.append(f"{len(common)} task id(s) also in eval split {split!r} "
                         f"({_shown(common)})")
    return _refusal(where, parts)


#: What every overlap refusal tells the user to do.
_REMEDY = ("train on a pool disjoint from the evaluation splits, or list the split under "
           "eval.in_distribution to evaluate on training tasks on purpose")


def _shown(items: Sequence[str]) -> str:
    """The first ``_SHOW`` items, comma-joined, with ``, ...`` when there are more."""
    return ", ".join(items[:_SHOW]) + (", ..." if len(items) > _SHOW else "")


def _refusal(where: str, parts: list[str], lead: str = "") -> str | None:
    """``"<where>: train.tasks: <parts>; ... — <lead><remedy>"``, None without parts."""
    if not parts:
        return None
    return f"{where}: train.tasks: " + "; ".join(parts) + f" — {lead}{_REMEDY}"


def check_train_pool(cfg: StudyConfig, *, load: Callable[[str], list] | None = None) -> None:
    """Refuse a study whose training pool overlaps an evaluation split (module docstring).

    Args:
        cfg: the study config.
        load: source → tasks with ``instance_id`` (default :func:`eval.tasks.splits.load_tasks`
            with ``purpose="eval"``: the ids are compared here, train.py guards sealed ids).

    Raises: StudyConfigError (one line) for an evaluation-only ``train.tasks``, an overlap,
        or a split whose ids cannot be read (the overlap cannot be checked then).
    """
    where = cfg.path or "config"
    source = train_source(cfg)
    if source.partition(":")[0] in EVAL_ONLY:
        raise StudyConfigError(f"{where}: train.tasks: {source!r} is evaluation-only "
                               f"({' and '.join(EVAL_ONLY)} are never trained on); "
                               "train on a pool such as swegym:PATH, swesmith:PATH or "
                               "your own rows file")
    if load is None:
        def load(s):
            return load_tasks(s, purpose="eval")

    ind = cfg.eval.get("in_distribution") or []
    checked = [s for s in cfg.eval["splits"] if s not in ind]
    if not checked:
        return

    def tasks(s: str, what: str) -> list:
        try:
            return list(load(s))
        except (ValueError, FileNotFoundError, RuntimeError) as exc:
            raise StudyConfigError(f"{where}: {what}: cannot read the task ids of {s!r} to "
                                   f"check the train/eval overlap ({exc})") from None

    train_tasks = tasks(source, "train.tasks")
    cap = cfg.train.get("max_tasks")
    if cap:
        train_tasks = train_tasks[:cap]
    split_tasks = {s: tasks(s, "eval.tasks.splits") for s in checked}
    msg = overlap_message([t.instance_id for t in train_tasks],
                          {s: [t.instance_id for t in ts] for s, ts in split_tasks.items()},
                          in_distribution=ind, where=where)
    msg = msg or shared_change_message(train_tasks, split_tasks, where=where)
    if msg:
        raise StudyConfigError(msg)


def shared_change_message(train_tasks: Sequence, split_tasks: Mapping[str, Sequence], *,
                          where: str = "config") -> str | None:
    """The one-line refusal for an eval split whose tasks fix the same change as a training
    task under another id (:func:`eval.tasks.fingerprints.shared_changes`: same repository,
    same removed and added lines), e.g. a renamed copy of a held-out row or one mutation built
    by two recipes. Tasks without a ``patch`` are not compared.

    Returns: None, or ``"<where>: train.tasks: N task(s) of eval split 'S' fix a change a
    training task fixes (eval id ~ training id, ...); ..."``.
    """
    def by_id(ts):
        return {t.instance_id: (getattr(t, "repo", ""), t.patch) for t in ts
                if getattr(t, "patch", None)}

    train = by_id(train_tasks)
    parts = []
    for split, ts in split_tasks.items():
        pairs = shared_changes(train, by_id(ts))
        if pairs:
            parts.append(f"{len({e for e, _ in pairs})} task(s) of eval split {split!r} fix a "
                         f"change a training task fixes "
                         f"({_shown([f'{e} ~ {t}' for e, t in pairs])})")
    return _refusal(where, parts, lead="the same bug under two ids; ")
