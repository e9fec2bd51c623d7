"""Live probes of the trial-side rules: an artifact that hangs, OOMs, floods its output or
cuts its test log, run as the trainer runs a verifier trial and judged by the artifact rule
(design page, "Threat model").

The trials go through a :class:`sandbox.trials.pool.VerifierPool` with the trainer's retry
policy (:class:`eval.integrity.retry.RetryPolicy`: one failure retry), beside the task's
empty-patch control under the same limits; each failure is then judged by
:func:`eval.integrity.attribution.attribute_failure` with the control's facts
(:func:`eval.integrity.controls.control_facts`), through :mod:`eval.doctor.verdicts`. A probe *holds* when the trial ended in the
limit's own exit class (:mod:`sandbox.trials.trial`), that class is one the artifact rule may
charge (:func:`eval.integrity.exits.exit_rule`), and the rule charged it to the artifact
(``artifact_<class>``): a policy cannot escape its reward by breaking its own trial.
"""

from __future__ import annotations

import io
import tarfile

from eval.doctor.probes import ProbeResult
from eval.doctor.verdicts import ATTRIBUTABLE, trial_class, trial_retry
from sandbox.images import default_image
from sandbox.trials.pool import VerifierPool
from sandbox.trials.trial import OOM, OUTPUT_LIMIT, TIMEOUT, TRUNCATED_LOG, Limits, TrialSpec

TRIAL_LIMITS = Limits(memory="64m", pids=256, cpus=1.0)
"""Limits of the probe trials (and their control)."""
TRIAL_TIMEOUT_S = 3.0
"""Wall clock of a probe trial (seconds): the control takes well under one."""
TRIAL_OUTPUT_BYTES = 64 * 2**10
"""Output limit of a probe trial (bytes); the flood prints 32 times as much."""
EVAL = ("echo '>>>>> Start Test Output'\nbash probe.sh\necho 'probe ran'\n"
        "echo '>>>>> End Test Output'\n")
"""The task's eval script: it runs the repository's ``probe.sh`` (``true`` at base)."""
ARTIFACTS = {
    TIMEOUT: "sleep 600",
    OOM: "python3 -c 'x = bytearray(400 << 20)'",
    OUTPUT_LIMIT: f"yes xxxxxxxxxxxxxxx | head -c {32 * TRIAL_OUTPUT_BYTES}",
    TRUNCATED_LOG: "kill -9 $PPID",
}
"""Exit class → the ``probe.sh`` line the artifact writes to cause it."""
PROBE_NAMES = {TIMEOUT: "trial_timeout", OOM: "trial_oom", OUTPUT_LIMIT: "trial_output_limit",
               TRUNCATED_LOG: "trial_truncated_log"}


def _archive() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"true\n"
        info = tarfile.TarInfo("probe.sh")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def artifact(line: str) -> str:
    """The patch that replaces ``probe.sh``'s ``true`` by ``line`` (``git diff`` form)."""
    return ("diff --git a/probe.sh b/probe.sh\n--- a/probe.sh\n+++ b/probe.sh\n"
            f"@@ -1 +1 @@\n-true\n+{line}\n")


def _spec(trial_id: str, patch: str, archive: bytes) -> TrialSpec:
    return TrialSpec(trial_id=trial_id, image=default_image(), eval_script=EVAL,
                     artifact=patch, repo_archive=archive, timeout_s=TRIAL_TIMEOUT_S,
                     limits=TRIAL_LIMITS, max_output_bytes=TRIAL_OUTPUT_BYTES,
                     limits_source="doctor")


def trial_probes(runtime, concurrency: int = 3) -> list[ProbeResult]:
    """The control and the four failing artifacts (module docstring) on ``runtime``."""
    archive = _archive()
    specs = [_spec("doctor-control", "", archive)]
    specs += [_spec(f"doctor-{cls.replace('_', '-')}", artifact(line), archive)
              for cls, line in ARTIFACTS.items()]
    with VerifierPool(runtime, max_concurrency=concurrency, retry=trial_retry()) as pool:
        control, *results = pool.map(specs)
    out = []
    for (cls, _), res in zip(ARTIFACTS.items(), results, strict=True):
        name = PROBE_NAMES[cls]
        cls_charged, unattributed, decision = trial_class(res, control)
        detail = {"exit_class": res.exit_class, "error": res.error,
                  "failed_attempts": res.failed_attempts, "class": cls_charged,
                  "unattributed": unattributed, "control": control.exit_class}
        if control.exit_class != "ok":
            out.append(ProbeResult(name, False, f"the control ended {control.exit_class}: "
                                   f"{(control.error or '')[:200]}", detail))
        elif res.exit_class != cls:
            out.append(ProbeResult(name, False, f"the trial ended {res.exit_class}, not {cls}"
                                   f"{': ' + res.error[:200] if res.error else ''}", detail))
        elif decision != ATTRIBUTABLE or cls_charged != f"artifact_{cls}":
            out.append(ProbeResult(name, False, f"not charged to the artifact "
                                   f"({unattributed or decision})", detail))
        else:
            out.append(ProbeResult(name, True, detail=detail))
    return out


__all__ = ["ARTIFACTS", "EVAL", "PROBE_NAMES", "TRIAL_LIMITS", "TRIAL_OUTPUT_BYTES",
           "TRIAL_TIMEOUT_S", "artifact", "trial_probes"]
