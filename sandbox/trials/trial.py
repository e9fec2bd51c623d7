"""One verifier trial: records in, records out, and the in-sandbox script.

A trial = fresh environment from the task image → repository at base → apply
the artifact all or nothing (``git apply``, else ``patch --forward --fuzz=5``, each
checked by a dry run on the pristine base first) → put the protected set back to
base (:mod:`sandbox.trials.protect`) → run the task's eval script → collect the full log →
remove the environment. The script itself is :mod:`sandbox.trials.script`. Runtimes
(:mod:`sandbox.runtimes.podman_runtime`, :mod:`sandbox.runtimes.local_runtime`) execute the same
script, so a trial means the same thing in both.
"""

from __future__ import annotations

import base64
import io
import re
import tarfile
import time
from dataclasses import asdict, dataclass, field

from sandbox.trials.protect import artifact_paths, check_pattern, matches
from sandbox.trials.script import (
    APPLY_FAILED_EXIT,
    APPLY_UNEXPECTED_EXIT,
    CHECKOUT_FAILED_EXIT,
    PROTECT_FAILED_EXIT,
    TRIAL_SCRIPT,
    UNPACK_FAILED_EXIT,
)

# Same marker strings as swebench.harness.constants, so SWE-bench tooling can
# read our logs. Kept literal here: `sandbox` must not depend on swebench.
APPLY_PATCH_FAIL = ">>>>> Patch Apply Failed"
APPLY_PATCH_PASS = ">>>>> Applied Patch"
_APPLY_START = ">>>>> ecredit apply-start"
_TEST_START = ">>>>> ecredit test-start"
_TEST_END = ">>>>> ecredit test-end"

OK, APPLY_FAILED, TIMEOUT, INFRA_ERROR = "ok", "apply_failed", "timeout", "infra_error"
OOM, PIDS, OUTPUT_LIMIT, TRUNCATED_LOG = "oom", "pids", "output_limit", "truncated_log"
EXIT_CLASSES = (OK, APPLY_FAILED, TIMEOUT, INFRA_ERROR, OOM, PIDS, OUTPUT_LIMIT, TRUNCATED_LOG)
"""How a trial ended (:func:`classify`; :attr:`TrialResult.exit_class`): the one list of exit
classes. Facts only, first match wins in :func:`classify`:

* ``ok``: the eval script ran to its end marker and exited 0; the log is graded.
* ``apply_failed``: the artifact did not apply to the base (every apply command refused it).
* ``timeout``: the wall clock passed ``timeout_s``; the sandbox was killed.
* ``infra_error``: the sandbox could not be made, died, or lost its end marker without a
  deadline (a dead service, a removed container, a missing branch: :data:`CHECKOUT_ERROR`);
  nothing about the tests is inferred from it.
* ``oom``: the memory limit's OOM killer acted during the trial.
* ``pids``: a fork was refused at the pids limit and the trial did not end ``ok``.
* ``output_limit``: the eval script printed more than ``max_output_bytes``.
* ``truncated_log``: the trial ran to its end but the test log holds SWE-bench's start marker
  without its end marker (the eval script was cut from inside the container).

What each class decides (scored, charged to the artifact, or unavailable) is not the
sandbox's: :mod:`eval.integrity.exits` (design page, "Who caused a failure decides the
reward")."""
RESOURCE_CLASSES = (TIMEOUT, OOM, PIDS, OUTPUT_LIMIT)
"""Exit classes of a trial that ran out of one of its limits (wall clock, memory, process
count, output bytes): code that runs in the trial can cause each of them."""
CHECKOUT_ERROR = "checkout:"
"""Prefix of the ``error`` of an ``infra_error`` trial whose image lacks the task's base branch
(:attr:`TrialSpec.checkout`)."""
_SWEBENCH_START = ">>>>> Start Test Output"
_SWEBENCH_END = ">>>>> End Test Output"
"""swebench.harness.constants START/END_TEST_OUTPUT, kept literal (``sandbox`` must not
depend on swebench); :func:`eval.grading.log_parsing.parse_log` calls a log *truncated* on the same
test (START anywhere in the log, END nowhere)."""
DEFAULT_OUTPUT_BYTES = 64 * 2**20
"""Default limit (bytes) on the eval script's output (stdout + stderr) kept in a trial log;
SWE-bench test logs are a few MB at most."""

_SWEBENCH_PASS = ">>>>> ecredit swebench-pass"
_OOM_START = ">>>>> ecredit oom-kills-start"
_PIDS_START = ">>>>> ecredit pids-max-start"
_PIDS_HIT = ">>>>> ecredit pids-max-hit"
_PIDS_END = ">>>>> ecredit pids-max-end"
_OUTPUT_OVER = ">>>>> ecredit output-over"
_OOM_END = ">>>>> ecredit oom-kills-end"
_TOUCHED = ">>>>> ecredit protected-touched"
_CHECKOUT_FAILED = ">>>>> ecredit checkout-failed"
CHECKOUT_HELP = ("images without the instance branches (SWE-smith's published images: SWE-smith "
                 "fetches each branch from its GitHub mirror when a container starts) need them "
                 "fetched into a derived image first (e.g. a Containerfile FROM the image that "
                 "runs `git fetch` of the branches into /testbed)")
"""What to do about an image that lacks a task's base branch (in every such error)."""
_BRANCH_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+@/-]*")
SWEBENCH_LOG = "swebench.log"
"""File (in the control directory) holding the unprotected SWE-bench pass's output."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox: memory (bytes string as podman takes it,
    e.g. ``"2g"``), process count, CPUs (fractional allowed)."""

    memory: str = "2g"
    pids: int = 1024
    cpus: float = 1.0


@dataclass
class TrialSpec:
    """Everything one verifier trial needs.

    Attributes:
        trial_id: unique name (used in the container name and log file name).
        image: fully-qualified image name (``localhost/...`` or ``docker.io/...``).
        eval_script: bash run in ``workdir`` after the artifact is applied; its
            output between SWE-bench's test-output markers is what graders parse.
        artifact: patch text (``git diff`` from base), may be empty.
        repo_archive: tar bytes of the base tree to unpack at ``workdir``; ``None``
            when the image already holds the repository at base (SWE-bench images).
        workdir: repository path inside the sandbox.
        timeout_s: wall-clock limit (seconds) for apply + eval; past it the
            sandbox is killed and the trial is ``timeout``.
        limits: memory / pids / CPU limits.
        labels: extra container labels (the runtime adds run and trial ids).
        protected: the protected set (patterns of :func:`sandbox.trials.protect.matches`): every
            path the artifact names that matches is put back to its base content before
            the tests run. ``.git/`` is always added. Empty = nothing
            protected but ``.git/``.
        swebench_pass: run the eval script a second time without protection when the
            artifact touched a protected path (SWE-bench harness semantics, for
            ``resolved_swebench``); otherwise the one log serves both verdicts.
        limits_source: where ``timeout_s`` / ``limits`` came from (recorded with them on
            the result, e.g. ``"harness"``, ``"bundled+timeout_s"``); "" when not said.
        checkout: a branch of the image's repository at ``workdir`` (local, or
            else a new local one from ``origin/<branch>``) to check out
            before the artifact is applied (SWE-smith: one branch per instance); None: the
            image's tree as it is. A branch the image lacks ends the trial as
            ``infra_error`` with a ``checkout:`` error (exit 94), never a grade of another
            tree.
        max_output_bytes: limit (bytes) on the eval script's output kept in the log; past it
            the rest is drained unread and the trial is ``output_limit``.
    """

    trial_id: str
    image: str
    eval_script: str
    artifact: str = ""
    repo_archive: bytes | None = None
    workdir: str = "/testbed"
    timeout_s: float = 600.0
    limits: Limits = field(default_factory=Limits)
    labels: dict[str, str] = field(default_factory=dict)
    protected: tuple[str, ...] = ()
    swebench_pass: bool = False
    limits_source: str = ""
    checkout: str | None = None
    max_output_bytes: int = DEFAULT_OUTPUT_BYTES

    def limits_record(self) -> dict:
        """``{"timeout_s", "memory", "pids", "cpus", "output_bytes", "source"}``: what the
        trial ran under."""
        return {"timeout_s": self.timeout_s, **asdict(self.limits),
                "output_bytes": self.max_output_bytes, "source": self.limits_source}

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.trial_id or ""):
            raise ValueError(f"trial_id: must match [A-Za-z0-9][A-Za-z0-9_.-]*, got {self.trial_id!r}")
        if not self.image:
            raise ValueError("image: empty")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s: must be > 0, got {self.timeout_s}")
        if not isinstance(self.max_output_bytes, int) or self.max_output_bytes < 1:
            raise ValueError(f"max_output_bytes: must be an int >= 1, got {self.max_output_bytes!r}")
        if isinstance(self.protected, str):
            raise ValueError("protected: expected a sequence of patterns, got a string")
        for i, pat in enumerate(self.protected):
            check_pattern(pat, f"protected[{i}]")
        self.protected = tuple(dict.fromkeys([*self.protected, ".git/"]))
        if self.checkout is not None:
            check_branch(self.checkout, "checkout")
            if self.repo_archive is not None:
                raise ValueError("checkout: a branch is checked out in an image's repository; "
                                 "this spec ships its own tree (repo_archive)")

    def artifact_paths(self) -> list[str]:
        """Every path the artifact could touch (:func:`sandbox.trials.protect.artifact_paths`)."""
        return artifact_paths(self.artifact)

    def protected_named(self) -> list[str]:
        """The artifact's paths that are in the protected set (stashed and restored)."""
        return [p for p in self.artifact_paths() if matches(p, self.protected)]


def check_branch(branch: str, field: str) -> str:
    """``branch`` if it is a plain branch name we pass to ``git checkout`` (letters, digits,
    ``._+@/-``, not starting with ``-``/``.``, no ``..``, no ``.lock`` end: a subset of
    git-check-ref-format(1)); else ValueError naming ``field``."""
    if (not isinstance(branch, str) or not _BRANCH_RE.fullmatch(branch) or ".." in branch
            or branch.endswith((".lock", "/", ".")) or "//" in branch or "/." in branch):
        raise ValueError(f"{field}: not a branch name git can check out: {branch!r}")
    return branch


@dataclass
class TrialResult:
    """Outcome of one verifier trial.

    Attributes:
        trial_id: from the spec.
        exit_class: one of :data:`EXIT_CLASSES` (the list says what each means).
        log: full combined stdout/stderr of the trial script ("" if none).
        log_path: where the log was written, when the caller asked for it.
        applied_with: the apply command that succeeded, ``"empty artifact"``, or None.
        test_exit_code: exit status of the eval script (None when it did not end).
        endpoint: which runtime endpoint ran it.
        error: infra error message, if any.
        queue_wait_s, setup_s, apply_s, test_s, cleanup_s: seconds. ``queue_wait_s``
            is filled by :class:`sandbox.trials.pool.VerifierPool` (plus, under the ``ray`` backend,
            the wait for a cluster slot and for Ray to start the task); the rest are
            service time.
        attempts: number of tries (1 + infra retries).
        retried_errors: the error messages of the retried attempts.
        protected: the protected set the trial used (patterns).
        protected_touched: protected paths whose content, mode or existence the artifact
            changed (each was put back to base before the tests ran), sorted.
        log_swebench: output of the unprotected SWE-bench pass (see
            :attr:`TrialSpec.swebench_pass`); None when it did not run (then ``log`` is
            also the SWE-bench verdict's log, protection having changed nothing).
        oom_kills: OOM kills of any process in the sandbox during the trial (cgroup
            ``oom_kill`` counter difference), None where the counter was not readable.
        limits: :meth:`TrialSpec.limits_record` of the spec (timeout, memory, pids, CPUs
            and their source), filled by :class:`sandbox.trials.pool.VerifierPool`.
        pids_max_hits: forks refused at the pids limit during the tests (cgroup ``max``
            event counter difference, or 1 when only the watcher's line was seen), None
            where the counter was not readable.
        output_over: the eval script's output passed ``max_output_bytes``.
        failed_attempts: earlier attempts of this trial that the pool's retry policy ran
            again as failure retries (:class:`sandbox.trials.pool.VerifierPool`), each
            ``{"exit_class", "test_s", "service_s", "oom_kills", "pids_max_hits",
            "error"}``; this result is the retry.
        retry_limits: :meth:`TrialSpec.limits_record` of the spec a failure retry ran
            under when the retry policy changed it (a raised timeout), else None; filled by
            :class:`sandbox.trials.pool.VerifierPool`.
        node: the Ray node id (hex) that served the trial's last attempt under the ``ray``
            sandbox backend (:mod:`sandbox.cluster.dispatch`); "" for local runtimes.
        image_pull: ``"pulled"`` when the serving node pulled the image for this trial,
            ``"present"`` when it held it; "" for local runtimes.
        node_unheld: the doctor probes that did not hold on the serving node, when it
            served only because the run allowed it (``sandbox_allow_unheld``); empty
            otherwise (:mod:`sandbox.doctor.gate`).
    """

    trial_id: str
    exit_class: str
    log: str = ""
    log_path: str | None = None
    applied_with: str | None = None
    test_exit_code: int | None = None
    endpoint: str = ""
    error: str | None = None
    queue_wait_s: float = 0.0
    setup_s: float = 0.0
    apply_s: float = 0.0
    test_s: float = 0.0
    cleanup_s: float = 0.0
    attempts: int = 1
    retried_errors: list[str] = field(default_factory=list)
    protected: list[str] = field(default_factory=list)
    protected_touched: list[str] = field(default_factory=list)
    log_swebench: str | None = None
    oom_kills: int | None = None
    limits: dict | None = None
    pids_max_hits: int | None = None
    output_over: bool = False
    failed_attempts: list[dict] = field(default_factory=list)
    retry_limits: dict | None = None
    node: str = ""
    image_pull: str = ""
    node_unheld: list[str] = field(default_factory=list)

    @property
    def service_s(self) -> float:
        """Seconds of service (setup + apply + test + cleanup), queue excluded."""
        return self.setup_s + self.apply_s + self.test_s + self.cleanup_s

    @property
    def retries(self) -> int:
        """Infra retries (``attempts - 1``); failure retries are ``failed_attempts``."""
        return self.attempts - 1

    def attempt_summary(self) -> dict:
        """This attempt's fate, as :attr:`failed_attempts` entries hold it."""
        return {"exit_class": self.exit_class, "test_s": round(self.test_s, 3),
                "service_s": round(self.service_s, 3), "oom_kills": self.oom_kills,
                "pids_max_hits": self.pids_max_hits, "error": self.error}

    def to_json(self, with_log: bool = False) -> dict:
        d = asdict(self)
        if not with_log:
            d.pop("log")
            d.pop("log_swebench")
        d["service_s"] = self.service_s
        return d


def control_files(spec: TrialSpec) -> bytes:
    """Tar (bytes) holding ``ecredit/``: ``trial.sh``, ``eval.sh``, ``artifact.patch``,
    ``paths.list`` (every path the artifact names) and ``protected.list`` (those in the
    protected set), both NUL-separated, ``swebench.pass`` when asked for, and ``checkout``
    (the branch name) when the spec has one, and ``output_limit`` (bytes)."""
    buf = io.BytesIO()
    named = spec.artifact_paths()
    protected = [p for p in named if matches(p, spec.protected)]
    with tarfile.open(fileobj=buf, mode="w") as tar:
        _add(tar, "ecredit", None, mode=0o755)
        _add(tar, "ecredit/trial.sh", TRIAL_SCRIPT.encode(), mode=0o755)
        _add(tar, "ecredit/eval.sh", spec.eval_script.encode(), mode=0o755)
        _add(tar, "ecredit/artifact.patch",
             spec.artifact.encode("utf-8", errors="surrogateescape"), mode=0o644)
        for name, paths in (("paths.list", named), ("protected.list", protected)):
            data = b"".join(p.encode("utf-8", errors="surrogateescape") + b"\0" for p in paths)
            _add(tar, f"ecredit/{name}", data, mode=0o644)
        if spec.swebench_pass:
            _add(tar, "ecredit/swebench.pass", b"", mode=0o644)
        if spec.checkout is not None:
            _add(tar, "ecredit/checkout", spec.checkout.encode(), mode=0o644)
        _add(tar, "ecredit/output_limit", str(spec.max_output_bytes).encode(), mode=0o644)
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes | None, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.mode = mode
    info.mtime = int(time.time())
    if data is None:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def parse_script_log(log: str) -> dict:
    """Read the trial script's own markers out of a log.

    Apply, protection and OOM-baseline markers are read only *before* the first
    ``test-start`` marker: the script prints them before any code of the artifact runs,
    so nothing a test prints can forge them.

    Returns a dict with ``apply_start``, ``test_start``, ``test_end`` (epoch seconds or
    None), ``test_exit_code`` (int or None), ``applied_with`` (str or None),
    ``apply_failed`` (bool), ``protected_touched`` (list of paths), ``oom_start`` /
    ``oom_end`` (int counters or None), ``swebench_pass`` (bool), ``pids_start`` (int or
    None), ``pids_end`` (the highest counter any ``pids-max-hit`` / ``pids-max-end`` line
    claims, or None) and ``output_over`` (bool). The last two are read after
    ``test-start`` too: a test that prints them can only claim a failure.
    """
    out: dict = {"apply_start": None, "test_start": None, "test_end": None,
                 "test_exit_code": None, "applied_with": None, "apply_failed": False,
                 "protected_touched": [], "oom_start": None, "oom_end": None,
                 "swebench_pass": False, "pids_start": None, "pids_end": None,
                 "output_over": False}
    before_tests = True
    for line in log.splitlines():
        if before_tests:
            if line.startswith(_TEST_START):
                out["test_start"] = _float(line[len(_TEST_START):])
                before_tests = False
            elif line.startswith(_APPLY_START):
                out["apply_start"] = _float(line[len(_APPLY_START):])
            elif line.startswith(_OOM_START):
                out["oom_start"] = _int(line[len(_OOM_START):])
            elif line.startswith(_PIDS_START):
                out["pids_start"] = _int(line[len(_PIDS_START):])
            elif line.startswith(_TOUCHED):
                out["protected_touched"].append(_b64(line[len(_TOUCHED):]))
            elif line.startswith(APPLY_PATCH_FAIL):
                out["apply_failed"] = True
            elif line.startswith(APPLY_PATCH_PASS + " (") and out["applied_with"] is None:
                out["applied_with"] = line[len(APPLY_PATCH_PASS) + 2:].rstrip(")")
        elif line.startswith(_TEST_END):
            parts = line[len(_TEST_END):].split()
            if parts:
                out["test_end"] = _float(parts[0])
            if len(parts) > 1 and parts[1].lstrip("-").isdigit():
                out["test_exit_code"] = int(parts[1])
        elif line.startswith(_OOM_END):
            # the last one the script printed; a forged one can only claim *more* kills
            end = _int(line[len(_OOM_END):])
            if end is not None:
                out["oom_end"] = max(end, out["oom_end"] or 0)
        elif line.rstrip() == _SWEBENCH_PASS:
            out["swebench_pass"] = True
        elif line.startswith((_PIDS_HIT, _PIDS_END)):
            n = _int(line.split(" ", 3)[-1])
            if n is not None:
                out["pids_end"] = max(n, out["pids_end"] or 0)
        elif line.startswith(_OUTPUT_OVER):
            out["output_over"] = True
    out["protected_touched"] = sorted(set(out["protected_touched"]))
    return out


def finish(res: TrialResult, log: str, *, run_s: float, exit_code: int | None,
           timed_out: bool, oom: bool, output_over: bool = False) -> None:
    """Fill ``res`` from the trial log and the sandbox's fate (in place).

    ``run_s``: seconds from sandbox start to its end. The script's own markers
    split it into apply and test time; the remainder (process start-up) is
    added to ``setup_s``. ``oom``: the runtime saw the sandbox's main process
    OOM-killed; an OOM kill of any other process is read from the cgroup counter
    the script reports (``oom_kills``), and either makes the trial ``oom``.
    ``output_over``: the runtime killed the sandbox because its log passed the host-side cap
    (:mod:`sandbox.trials.watch`); the trial is ``output_limit``, as when the script's own
    ``output-over`` line is in the log.
    """
    markers = parse_script_log(log)
    markers["output_over"] = markers["output_over"] or output_over
    markers["log_cut"] = _SWEBENCH_START in log and _SWEBENCH_END not in log
    res.log = log
    res.applied_with = markers["applied_with"]
    res.test_exit_code = markers["test_exit_code"]
    res.protected_touched = markers["protected_touched"]
    if markers["oom_start"] is not None and markers["oom_end"] is not None:
        res.oom_kills = max(0, markers["oom_end"] - markers["oom_start"])
    if markers["pids_start"] is not None:
        res.pids_max_hits = max(0, (markers["pids_end"] or 0) - markers["pids_start"])
    res.output_over = markers["output_over"]
    if markers["apply_start"] and markers["test_start"]:
        res.apply_s = max(0.0, markers["test_start"] - markers["apply_start"])
        res.test_s = max(0.0, (markers["test_end"] or time.time()) - markers["test_start"])
        res.setup_s += max(0.0, run_s - res.apply_s - res.test_s)
    else:
        res.test_s = run_s
    res.exit_class = classify(markers, exit_code=exit_code, timed_out=timed_out,
                              oom=oom or bool(res.oom_kills),
                              pids=bool(res.pids_max_hits))
    if res.exit_class == INFRA_ERROR and res.error is None:
        failed = [ln for ln in log.splitlines() if ln.startswith(_CHECKOUT_FAILED)]
        res.error = (f"the trial's protected set could not be stashed or restored (exit "
                     f"{exit_code})" if exit_code == PROTECT_FAILED_EXIT else
                     f"the trial's inputs could not be unpacked in the sandbox (exit {exit_code}; "
                     "the image needs /bin/sh and tar): "
                     f"{log.strip()[-300:]}" if exit_code == UNPACK_FAILED_EXIT else
                     f"{CHECKOUT_ERROR} {failed[0][len(_CHECKOUT_FAILED):].strip()}; "
                     f"{CHECKOUT_HELP}"
                     if exit_code == CHECKOUT_FAILED_EXIT and failed else
                     f"sandbox ended with exit code {exit_code} before the eval script finished")


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def _b64(text: str) -> str:
    try:
        return base64.b64decode(text.strip(), validate=True).decode("utf-8", "surrogateescape")
    except (ValueError, UnicodeDecodeError):
        return text.strip()


def _float(text: str) -> float | None:
    try:
        return float(text.strip().split()[0])
    except (ValueError, IndexError):
        return None


def classify(markers: dict, *, exit_code: int | None, timed_out: bool, oom: bool,
             error: str | None = None, pids: bool = False) -> str:
    """Exit class of a trial from its script markers and the sandbox's fate.

    A trial is ``ok`` only when the eval script's end marker is in the log: a
    sandbox that died before that (killed, crashed, service lost) is an
    ``infra_error`` and nothing about the tests is inferred from it.

    Resource classes, first match wins: ``output_limit`` (the output passed
    its limit: the log is cut, whatever happened next), ``pids`` (``pids``: a fork was
    refused at the limit, and the trial did not otherwise end ``ok``: tests that met the
    limit and still finished are graded from their log), ``timeout``, then ``oom`` (any OOM
    kill). A trial that ran to its end (the script's ``test-end`` marker, exit 0) whose log
    holds SWE-bench's start marker without its end marker (``markers["log_cut"]``, set by
    :func:`finish`) is ``truncated_log``: the script itself survived, so the eval script was
    cut from inside the container — by code the tests ran (an artifact that kills its
    parent shell or truncates ``eval.sh`` while bash reads it) or by the task itself, which
    its control then shows — never by the infrastructure. Without this class
    such a trial would be ``ok`` and its log graded as truncated, i.e. unavailable, whatever the
    control did: a reward escape.
    """
    completed = (error is None and markers["test_end"] is not None and exit_code == 0
                 and not timed_out)
    if markers.get("output_over"):
        return OUTPUT_LIMIT
    if pids and not (completed and not oom):
        return PIDS
    if timed_out:
        return TIMEOUT
    if oom:
        return OOM
    if markers["apply_failed"] and exit_code in (APPLY_FAILED_EXIT, APPLY_UNEXPECTED_EXIT):
        return APPLY_FAILED
    if completed:
        return TRUNCATED_LOG if markers.get("log_cut") else OK
    return INFRA_ERROR
