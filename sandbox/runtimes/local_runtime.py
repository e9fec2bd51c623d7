"""Local runtime: verifier trials as host subprocesses in a temporary copy.

For machines without Podman. It is **not isolated** (the eval script runs as the
current user, with the host's network and files), so it is only ever chosen
explicitly (``runtime="local"``) and warns once when created; nothing falls
back to it silently.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import tarfile
import tempfile
import time
import warnings
from pathlib import Path

from sandbox.runtimes.protocol import runtime_flags
from sandbox.trials.trial import SWEBENCH_LOG, TrialResult, TrialSpec, control_files, finish


class LocalRuntime:
    """Runs :class:`~sandbox.trials.trial.TrialSpec` s with ``bash`` on the host.

    ``spec.image`` is ignored (recorded only); ``spec.repo_archive`` is required,
    since there is no image holding the repository. Implements
    :class:`sandbox.runtimes.protocol.Runtime` (``kind="local"``, ``backend="local"``).
    """

    endpoints = ["local"]
    kind = "local"
    backend = "local"

    def __init__(self, run_id: str = "local") -> None:
        self.run_id = run_id
        warnings.warn("LocalRuntime is not isolated: eval scripts run on the host "
                      "as the current user", RuntimeWarning, stacklevel=2)

    def check_available(self, attempts: int = 1, backoff_s: float = 0.0,
                        timeout_s: float = 0.0) -> int:
        """Always available (host subprocesses); returns 0 retries (same signature as Podman's)."""
        return 0

    def close(self) -> None:
        pass

    def argv(self) -> list[str]:
        """``--runtime local``: a child process makes its own (not isolated) runtime."""
        return runtime_flags(self.kind, self.backend)

    def image_ids(self, images) -> dict[str, str | None]:
        """All None: a local runtime runs no image (``spec.image`` is only recorded)."""
        return dict.fromkeys(sorted(set(images)))

    def open_workspace(self, task, site):
        """A rollout's workspace on this host (``site.open_here``; host sessions)."""
        return site.open_here(task)

    def __enter__(self) -> LocalRuntime:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run_trial(self, spec: TrialSpec) -> TrialResult:
        """Run one trial in a fresh temporary directory; see PodmanRuntime.run_trial."""
        res = TrialResult(trial_id=spec.trial_id, exit_class="infra_error", endpoint="local",
                          protected=list(spec.protected))
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"ecredit-trial-{spec.trial_id}-") as tmp:
            root = Path(tmp)
            work = root / "testbed"
            work.mkdir()
            try:
                if spec.repo_archive is None:
                    raise ValueError("repo_archive: LocalRuntime needs the base tree as a tar")
                _extract(spec.repo_archive, work)
                _extract(control_files(spec), root)
            except Exception as exc:
                res.error = f"{type(exc).__name__}: {exc}"
                return res
            # no cgroup of its own: the host's OOM counter would say nothing about this trial
            env = dict(os.environ, ECREDIT_DIR=str(root / "ecredit"), ECREDIT_WORKDIR=str(work),
                       ECREDIT_OOM_COUNTER="off")
            t_started = time.monotonic()
            res.setup_s = t_started - t0
            timed_out = False
            proc = subprocess.Popen(["bash", str(root / "ecredit" / "trial.sh")],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    env=env, cwd=work, start_new_session=True)
            try:
                out, _ = proc.communicate(timeout=spec.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                out, _ = proc.communicate()
            t_done = time.monotonic()
            finish(res, out.decode("utf-8", errors="replace"), run_s=t_done - t_started,
                   exit_code=proc.returncode, timed_out=timed_out, oom=False)
            swe_log = root / "ecredit" / SWEBENCH_LOG
            if spec.swebench_pass and res.protected_touched and res.exit_class == "ok" \
                    and swe_log.is_file():
                res.log_swebench = swe_log.read_text(errors="replace")
            t_clean = time.monotonic()
        res.cleanup_s = time.monotonic() - t_clean
        return res


def _extract(data: bytes, dest: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="tar")
