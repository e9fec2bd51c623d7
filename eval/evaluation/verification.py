"""Verification stage of an evaluation: one factual trial per slot in a fresh sandbox
(:class:`sandbox.trials.pool.VerifierPool`), the task's empty-patch control (one per task,
cached in ``DIR/controls/``; it also answers empty artifacts), and grading with
:func:`eval.grading.grader.grade` against the task's fixed lists (design page, "Evaluation").
With an opt-in verdict store (:mod:`eval.evaluation.verdicts`) identical clean trials are
reused.

This module is the evaluation's one adapter to the integrity rules (:mod:`eval.integrity`):
what each exit class decides, the artifact rule, the agent rule's failure slot, the control
facts and the retry policy of the evaluation's pools (:func:`trial_retry`), the same rules
training uses (design page, "Who caused a failure decides the reward")."""

from __future__ import annotations

import hashlib
import json
import random
import time
import uuid
from collections import Counter
from pathlib import Path

from eval.evaluation.slots import (
    RETRY_REASONS,
    EvalInputError,
    read_rows,
    slug,
    text_sha256,
    unknown_slot,
)
from eval.files import append_jsonl, atomic_write_text, write_json
from eval.integrity.agent import AGENT_DISK_BUDGET, agent_failure_slot
from eval.integrity.attribution import attribute_failure
from eval.integrity.controls import control_facts
from eval.integrity.exits import ATTRIBUTABLE, EXIT_RULE, INFRASTRUCTURE
from eval.integrity.failure_value import failure_utility
from eval.integrity.nodes import on_unheld_node
from eval.integrity.retry import RetryPolicy
from eval.tasks.protection import verdict_fields
from eval.tasks.trialspec import task_trial_spec
from sandbox.trials.trial import INFRA_ERROR, OK


def trial_retry(max_retries: int) -> RetryPolicy:
    """The retry policy of an evaluation's pool: ``max_retries`` infra retries and the
    artifact rule's one failure retry (:class:`eval.integrity.retry.RetryPolicy`)."""
    return RetryPolicy(max_retries=max_retries)


def control_key(task) -> str:
    """sha256 (hex) of what makes a cached empty-patch control valid for ``task``: id, image,
    base commit, eval script and the fixed lists."""
    blob = json.dumps([task.instance_id, task.image, task.base_commit,
                       text_sha256(task.eval_script), task.FAIL_TO_PASS, task.PASS_TO_PASS])
    return hashlib.sha256(blob.encode()).hexdigest()


def _attributed_failure(task, res, control: dict | None, base: dict) -> dict:
    """Slot fields of a trial in an attributable class (:mod:`eval.integrity.attribution`, the
    rule training uses): the contract's failure value, or unknown ``trial_unattributed``."""
    controls = ([control_facts({**(control.get("trial") or {}),
                                "exit_class": control["exit_class"]})] if control else [])
    att = attribute_failure(res.exit_class, failed_attempts=getattr(res, "failed_attempts", []),
                            limits=getattr(res, "limits", None),
                            test_s=getattr(res, "test_s", None), controls=controls,
                            retry_limits=getattr(res, "retry_limits", None))
    att = on_unheld_node(att, getattr(res, "node_unheld", None))
    if att.failure_class is None:
        return {**unknown_slot("", 0, "trial_unattributed"), **base, "failure_class": None,
                "failure_evidence": {**att.evidence, "unattributed": att.unattributed}}
    return {**base, "resolved": False,
            "utility": failure_utility(task.FAIL_TO_PASS, task.PASS_TO_PASS),
            "complete": False, "attributed": True,
            "classification": {"raw": False, "report_binary": False, "strict": False,
                               "unknown": False},
            "unknown_reason": None, "failure_class": att.failure_class,
            "failure_evidence": att.evidence, "resolved_swebench": False}


def _over_limit(res) -> bool:
    """An ``ok`` retry of a timeout that finished only under the raised limit
    (:func:`eval.integrity.attribution.attribute_failure`: ``retry_over_limit``)."""
    return attribute_failure(res.exit_class, failed_attempts=getattr(res, "failed_attempts", []),
                             limits=getattr(res, "limits", None),
                             test_s=getattr(res, "test_s", None), controls=[],
                             retry_limits=getattr(res, "retry_limits", None)
                             ).unattributed == "retry_over_limit"


def grade_trial(task, res, control_log: str | None, control: dict | None = None) -> dict:
    """Grade one trial result of ``task`` into slot fields (no task/rollout ids).

    Each exit class as :data:`eval.integrity.exits.EXIT_RULE` decides: ``infra_error`` →
    unknown (``trial_infra_error``). An attributable class
    (:data:`eval.integrity.exits.ATTRIBUTABLE_CLASSES`), or an ``ok`` retry of a timeout that
    finished past the original limit, follows
    :func:`eval.integrity.attribution.attribute_failure` with ``control`` (the task's control
    record: ``exit_class`` and its ``trial`` row; None = no control, nothing attributed): resolved
    False with the failure value and ``failure_class``, or unknown ``trial_unattributed``.
    An ``ok`` trial is graded from its log, with ``control_log`` for missing tests.
    ``resolved`` is the verdict with the protected set; ``resolved_swebench`` the harness's
    own (swebench's parser, no protection) and ``protected_touched`` the protected paths the
    artifact changed (:func:`eval.tasks.protection.verdict_fields`).
    """
    from eval.grading.grader import grade  # start-up: swebench, ~1 s

    base = {"exit_class": res.exit_class, "trial_id": res.trial_id}
    decision = EXIT_RULE.get(res.exit_class)
    if decision == INFRASTRUCTURE:
        return {**unknown_slot("", 0, "trial_infra_error"), **base, "error": res.error}
    if decision == ATTRIBUTABLE or _over_limit(res):  # an ok retry past the limit: not graded
        return _attributed_failure(task, res, control, base)
    rep = grade(res.log, f2p=list(task.FAIL_TO_PASS), p2p=list(task.PASS_TO_PASS),
                parser=task.log_parser, control_log=control_log,
                harness_exit=None if res.exit_class == OK else res.exit_class)
    out = {**base, "resolved": bool(rep.resolved), "utility": rep.utility,
           "complete": rep.complete, "attributed": rep.attributed,
           "classification": dict(rep.classification),
           "unknown_reason": "incomplete_report" if rep.classification["unknown"] else None,
           "f2p": dict(rep.f2p), "p2p": dict(rep.p2p), "missing": list(rep.missing),
           "log_rejected": rep.log_rejected, "resolution_status": rep.resolution_status,
           "failure_class": None,
           "failure_evidence": ({"not_reproduced": res.failed_attempts[0]}
                                if getattr(res, "failed_attempts", None) else None)}
    out.update(verdict_fields(task, res, rep))
    return out


def agent_failure_class(r: dict) -> str | None:
    """Who broke a rollout row's episode, when it was the policy: its ``failure_class``;
    rows written before it existed that ended on ``disk_budget`` (always the policy's)
    give ``agent_disk_budget``; None otherwise."""
    if r.get("failure_class"):
        return r["failure_class"]
    failure = r.get("failure") or []
    return AGENT_DISK_BUDGET if failure and failure[0] == "disk_budget" else None


def trial_row(res) -> dict:
    """The timing / attempt fields of a trial result recorded in a slot row (seconds), and
    the Ray node that served it (``node``, "" on the local backend)."""
    return {k: getattr(res, k) for k in ("queue_wait_s", "setup_s", "apply_s", "test_s",
                                         "cleanup_s", "attempts", "applied_with",
                                         "test_exit_code", "limits", "failed_attempts")} | {
        "retry_limits": getattr(res, "retry_limits", None),
        "service_s": res.service_s, "node": getattr(res, "node", "")}


def rollout_fields(r: dict) -> dict:
    """The fields of a rollout row recorded in its slot row."""
    return {"format_error": r.get("format_error"), "stop_reason": r.get("stop_reason"),
            "generated_tokens": r.get("generated_tokens"),
            "setup_error": r.get("setup_error"),
            "tool_calls": len(r.get("tool_calls") or []),
            "artifact_sha256": r.get("artifact_sha256") or text_sha256(r.get("artifact") or ""),
            "artifact_bytes": len((r.get("artifact") or "").encode("utf-8",
                                                                   "surrogateescape")),
            "rollout_timings": r.get("timings")}


class _ControlTrial:
    """A task's empty-patch control trial, graded as a slot's factual trial."""

    def __init__(self, c: dict) -> None:
        self.exit_class, self.log, self.trial_id = c["exit_class"], c["log"], c["trial_id"]
        self.error = None


class SlotVerifier:
    """Verifies and grades the slots of one evaluation as their rollouts arrive.

    Args:
        out: the evaluation folder (``logs/``, ``controls/``, ``artifacts/``, ``slots.jsonl``).
        by_id: task id → task of the split.
        binding: the evaluation's binding (written on every slot row; subprocess rollout
            rows of another binding are ignored when ``source == "subprocess"``).
        todo: slots ``(task id, rollout index)`` still to grade; ``final``: graded slot rows
            by slot (updated in place).
        timeout_s: wall-clock limit of one trial, seconds.

        store: an :class:`eval.evaluation.verdicts.VerdictStore` (opt-in): a slot whose
            (task, artifact) key has a trusted entry is graded from its log, without a trial
            (``verdict_reused_from`` on the row); identical artifacts of one task in flight
            at once are verified once; clean results (``ok``, not unknown) are stored, the
            empty-patch controls included. None (default): every slot runs its own trial.

    ``stats`` counts trials (``trials_factual``, ``trials_control``: only trials run),
    ``retries``, ``service_s``, ``slots_from_empty_control``, ``slots_from_reused_verdict``
    (slots graded from a stored or concurrent identical trial, empty ones answered by a
    reused control included) and ``controls_from_reused_verdict``.
    """

    def __init__(self, *, out: Path, by_id: dict, binding: str, source: str, todo: set,
                 final: dict, timeout_s: float, store=None) -> None:
        self.out, self.by_id, self.binding, self.source = out, by_id, binding, source
        self.todo, self.final, self.timeout_s = todo, final, timeout_s
        self.slots_path = out / "slots.jsonl"
        self.new_rows: list[dict] = []
        self.controls: dict[str, dict] = {}
        self.ctrl_fut: dict = {}
        self.pending: dict = {}  # future -> (key, rollout row, store key or None)
        # slots waiting for their task's control: (key, row, None) empty artifact, or
        # (key, row, store entry) a reused verdict
        self.waiting_ctrl: list[tuple[tuple[str, int], dict, dict | None]] = []
        self.store, self.pool = store, None
        self.inflight: dict[str, list] = {}  # store key -> slots waiting for its trial
        self.seen_rollouts: dict[tuple[str, int], dict] = {}
        self.stats = Counter()

    def _count(self, res, kind: str) -> Path:
        self.stats[kind] += 1
        self.stats["retries"] += res.attempts - 1
        self.stats["failure_retries"] += len(getattr(res, "failed_attempts", None) or [])
        self.stats["service_s"] += res.service_s
        lp = self.out / "logs" / f"{res.trial_id}.log"
        atomic_write_text(lp, res.log)
        return lp

    def control_of(self, tid: str, block: bool) -> dict | None:
        """The task's control record, waiting for its trial when ``block``; None while it
        runs (or was never started)."""
        if tid in self.controls:
            return self.controls[tid]
        fut = self.ctrl_fut.get(tid)
        if fut is None or (not block and not fut.done()):
            return None
        res = fut.result()
        self._count(res, "trials_control")
        c = {"key": control_key(self.by_id[tid]), "trial_id": res.trial_id,
             "exit_class": res.exit_class, "log": res.log, "trial": trial_row(res)}
        if res.exit_class == "ok":
            write_json(self.out / "controls" / f"{slug(tid)}.json", c)
            self._store(tid, "", res, c["trial"], grade_trial(self.by_id[tid], res, res.log))
        self.controls[tid] = c
        return c

    def ensure_control(self, pool, tid: str) -> None:
        """Reuse the task's cached ok control when its key matches, else (with a store) a
        trusted stored control; else submit one."""
        if tid in self.controls or tid in self.ctrl_fut:
            return
        cpath = self.out / "controls" / f"{slug(tid)}.json"
        if cpath.exists():
            try:
                c = json.loads(cpath.read_text())
            except (OSError, json.JSONDecodeError):
                c = None
            if c and c.get("key") == control_key(self.by_id[tid]) and c.get("exit_class") == "ok":
                self.controls[tid] = c
                return
        e = self._stored(tid, "")
        if e is not None:
            self.stats["controls_from_reused_verdict"] += 1
            c = {"key": control_key(self.by_id[tid]), "trial_id": e["trial_id"],
                 "exit_class": "ok", "log": e["log"], "trial": e.get("trial"),
                 "verdict_reused_from": self.store.origin(e)}
            self._copy_log(e)
            write_json(cpath, c)
            self.controls[tid] = c
            return
        spec = task_trial_spec(self.by_id[tid], "", f"evctl-{self.binding[:8]}-{slug(tid)}-"
                               f"{uuid.uuid4().hex[:6]}", timeout_s=self.timeout_s,
                               labels={"ecredit.role": "control"})
        self.ctrl_fut[tid] = pool.submit(spec)

    def _skey(self, tid: str, art: str) -> str:
        return self.store.key(self.by_id[tid], self.timeout_s, text_sha256(art))

    def _stored(self, tid: str, art: str) -> dict | None:
        """The trusted store entry of ``art`` on ``tid`` (None without a store)."""
        if self.store is None:
            return None
        return self.store.get(self._skey(tid, art), tid, text_sha256(art))

    def _store(self, tid: str, art: str, res, trial: dict, graded: dict) -> dict | None:
        """Store a clean result (``ok``, grade not unknown); returns the entry or None."""
        if self.store is None or res.exit_class != "ok" or graded.get("unknown_reason"):
            return None
        return self.store.put(self._skey(tid, art), tid, text_sha256(art), res, trial)

    def _copy_log(self, e: dict) -> str:
        """Copy a reused entry's log into ``logs/`` (the slot row's ``log_path``)."""
        lp = self.out / "logs" / f"{e['trial_id']}.log"
        if not lp.exists():
            atomic_write_text(lp, e["log"])
        return str(lp.relative_to(self.out))

    def _submit(self, pool, key, r: dict, art: str) -> None:
        """Submit the factual trial of slot ``key`` (or, with a store, reuse a stored or
        in-flight identical trial)."""
        skey = None
        if self.store is not None:
            skey = self._skey(key[0], art)
            if skey in self.inflight:
                self.inflight[skey].append((key, r))
                return
            e = self.store.get(skey, key[0], text_sha256(art))
            if e is not None:
                self.waiting_ctrl.append((key, r, e))
                return
            self.inflight[skey] = []
        spec = task_trial_spec(self.by_id[key[0]], art, f"ev-{self.binding[:8]}-{slug(key[0])}-"
                               f"r{key[1]}-{uuid.uuid4().hex[:6]}", timeout_s=self.timeout_s,
                               labels={"ecredit.role": "factual"})
        self.pending[pool.submit(spec)] = (key, r, skey)

    def finish(self, key, row: dict) -> None:
        """Record a graded slot row (appended to ``slots.jsonl``)."""
        row.update(task_id=key[0], rollout_index=key[1], repo=self.by_id[key[0]].repo,
                   binding=self.binding, graded_at=time.time())
        append_jsonl(self.slots_path, [row])
        self.new_rows.append(row)
        self.final[key] = row

    def take_rollout(self, pool, r: dict) -> None:
        """Route one rollout row (the training rule, :mod:`eval.integrity.agent`): an episode
        the policy broke (:func:`agent_failure_class`) → a failure slot with the failure
        value; an infra-failed one (setup, sandbox, snapshot) → unknown
        (``agent_sandbox_error``); empty artifact → wait for the control; else submit its
        factual trial."""
        key = (r.get("task_id"), r.get("rollout_index"))
        if key not in self.todo or key in self.seen_rollouts:
            return
        if self.source == "subprocess" and r.get("binding") != self.binding:
            return
        self.seen_rollouts[key] = r
        self.pool = pool
        art = r.get("artifact") or ""
        fields = rollout_fields(r)
        if art:
            atomic_write_text(self.out / "artifacts" / f"{fields['artifact_sha256']}.patch", art)
        self.ensure_control(pool, key[0])
        cls = agent_failure_class(r)
        if cls is not None:  # the policy broke its own sandbox: a scored failure, no trial
            self.finish(key, {**agent_failure_slot(self.by_id[key[0]], cls,
                                                   r.get("failure_evidence")), **fields})
            return
        if r.get("setup_error") or r.get("failure"):  # infrastructure: unknown (training
            # excludes the same rollouts); its partial artifact is not a submission
            self.finish(key, {**unknown_slot(*key, "agent_sandbox_error"), **fields,
                              "failure": r.get("failure"), "trial_source": None})
            return
        if not art:
            self.waiting_ctrl.append((key, r, None))
            return
        self._submit(pool, key, r, art)

    def drain(self, block: bool) -> None:
        """Grade finished factual trials, then slots whose control is in (empty artifacts,
        reused verdicts); when ``block``, all of them, waiting (also for trials submitted
        again for the slots that waited on an identical trial that did not end clean)."""
        while True:
            self._drain_factual(block)
            if not (block and self.pending):
                break
        for key, r, e in list(self.waiting_ctrl):
            c = self.control_of(key[0], block=block)
            if c is None:
                continue
            self.waiting_ctrl.remove((key, r, e))
            if e is not None:
                self._finish_reused(key, r, e, c)
                continue
            self.stats["slots_from_empty_control"] += 1
            extra = {}
            if c.get("verdict_reused_from"):  # answered by a control from the store
                self.stats["slots_from_reused_verdict"] += 1
                extra = {"verdict_reused_from": c["verdict_reused_from"]}
            if c["exit_class"] == INFRA_ERROR:
                self.finish(key, {**unknown_slot(*key, "control_infra_error"),
                                  **rollout_fields(r), "trial_source": "empty_control",
                                  "trial_id": c["trial_id"], "trial": c.get("trial")})
                continue
            g = grade_trial(self.by_id[key[0]], _ControlTrial(c),
                            c["log"] if c["exit_class"] == "ok" else None)
            # the control's trial row (limits included) answers this slot: recorded on it
            self.finish(key, {**g, **rollout_fields(r), "trial_source": "empty_control",
                              "trial": c.get("trial"), "log_path": f"logs/{c['trial_id']}.log",
                              **extra})

    def _drain_factual(self, block: bool) -> None:
        """Grade the finished (all, when ``block``) factual trials; with a store, store a
        clean one and answer the slots that waited on it, or submit theirs again."""
        for fut in [f for f in list(self.pending) if block or f.done()]:
            key, r, skey = self.pending.pop(fut)
            res = fut.result()
            lp = self._count(res, "trials_factual")
            c = self.control_of(key[0], block=True)
            ctrl_log = c["log"] if c and c["exit_class"] == "ok" else None
            g = grade_trial(self.by_id[key[0]], res, ctrl_log, c)
            trial = trial_row(res)
            self.finish(key, {**g, **rollout_fields(r), "trial_source": "factual",
                              "trial": trial, "log_path": str(lp.relative_to(self.out))})
            if skey is None:
                continue
            waiters = self.inflight.pop(skey, [])
            art = r.get("artifact") or ""
            e = self._store(key[0], art, res, trial, g)
            for wkey, wr in waiters:
                if e is not None:
                    self.waiting_ctrl.append((wkey, wr, e))
                else:  # not clean: never reused; each waiting slot gets its own trial
                    self._submit(self.pool, wkey, wr, art)

    def _finish_reused(self, key, r: dict, e: dict, c: dict) -> None:
        """Grade slot ``key`` from store entry ``e`` (with its task's control ``c``)."""
        self.stats["slots_from_reused_verdict"] += 1
        ctrl_log = c["log"] if c and c["exit_class"] == "ok" else None
        g = grade_trial(self.by_id[key[0]], self.store.trial(e), ctrl_log, c)
        self.finish(key, {**g, **rollout_fields(r), "trial_source": "factual",
                          "trial": e.get("trial"), "log_path": self._copy_log(e),
                          "verdict_reused_from": self.store.origin(e)})


def replay_selection(src: Path, results: dict, tasks: dict, sample: int | None,
                      seed: int) -> tuple[list[dict], dict]:
    """The slot rows to replay (graded, of this binding, on a known task; ``sample`` of
    them with ``random.Random(seed)``) and task id → stored control log."""
    slots = {(r["task_id"], r["rollout_index"]): r for r in read_rows(src / "slots.jsonl")
             if r.get("binding") == results.get("binding")}
    chosen = [r for k, r in sorted(slots.items())
              if r.get("unknown_reason") not in ("no_rollout", "agent_sandbox_error",
                                                 *RETRY_REASONS) and k[0] in tasks]
    if sample is not None and sample < len(chosen):
        chosen = sorted(random.Random(seed).sample(chosen, sample),
                        key=lambda r: (r["task_id"], r["rollout_index"]))
    controls = {}
    for tid in {r["task_id"] for r in chosen}:
        c = src / "controls" / f"{slug(tid)}.json"
        if c.is_file():
            controls[tid] = json.loads(c.read_text()).get("log")
    return chosen, controls



def replay_trials(pool, src: Path, chosen: list[dict], tasks: dict, controls: dict,
                   timeout_s: float) -> tuple[list, list[dict]]:
    """One fresh trial per chosen slot of its stored artifact; returns the (original,
    replay) grade pairs and one summary row per slot.

    Raises: EvalInputError naming a missing artifact file.
    """
    futs = []
    for r in chosen:
        art = ""
        if r.get("artifact_bytes"):
            ap = src / "artifacts" / f"{r['artifact_sha256']}.patch"
            if not ap.is_file():
                raise EvalInputError(f"--replay: artifact {ap} missing for "
                                     f"{r['task_id']} #{r['rollout_index']}")
            art = ap.read_text(encoding="utf-8", errors="surrogateescape")
        spec = task_trial_spec(tasks[r["task_id"]], art,
                               f"rp-{slug(r['task_id'])}-r{r['rollout_index']}-"
                               f"{uuid.uuid4().hex[:6]}", timeout_s=timeout_s,
                               labels={"ecredit.role": "replay"})
        futs.append((r, pool.submit(spec)))
    pairs, rows = [], []
    for r, fut in futs:
        res = fut.result()
        g = grade_trial(tasks[r["task_id"]], res, controls.get(r["task_id"]))
        g.update(task_id=r["task_id"], rollout_index=r["rollout_index"])
        pairs.append((r, g))
        rows.append({"task_id": r["task_id"], "rollout_index": r["rollout_index"],
                     "original_resolved": r.get("resolved"),
                     "replay_resolved": g.get("resolved"),
                     "replay_exit_class": res.exit_class,
                     "replay_unknown_reason": g.get("unknown_reason")})
    return pairs, rows
