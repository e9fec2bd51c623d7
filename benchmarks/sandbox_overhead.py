"""Verifier-trial overhead in Podman for a small repository whose tests take ~1 s.

Overhead = setup (create container, copy repo + scripts, start) + apply +
cleanup, per trial; reported in seconds and as a fraction of the test time.
Throughput (trials/minute) at concurrency 1 and 2 through the VerifierPool.

Target: overhead ≤ 0.30 s per trial (median, concurrency 1). The load average is printed
with the table: other jobs on this 2-core machine stretch every figure.

The cost of the attribution retry: an artifact that OOMs at import and one
that hangs at import (``--hang-timeout`` seconds) are each run through the pool, which runs
them a second time; printed: the first attempt's and the retry's service seconds and the
total (the wall-clock limit is paid twice by a hang).

    python benchmarks/sandbox_overhead.py [--trials 6] [--hang-timeout 5]
"""

from __future__ import annotations

import io
import statistics
import tarfile
import time
from pathlib import Path

from eval.integrity.retry import RetryPolicy
from sandbox.bounds import ArgumentParser, Float, Int
from sandbox.images import build_offline
from sandbox.runtimes.podman_runtime import PodmanRuntime
from sandbox.trials.pool import VerifierPool
from sandbox.trials.trial import OOM, TIMEOUT, Limits, TrialSpec

TARGET_S = 0.30
SRC = "def add(a, b):\n    return a + b\n"
# ~1 s of test time: 10 tests of 0.1 s each
TESTS = "import time\nfrom calc import add\n\n" + "".join(
    f"def test_{i}():\n    time.sleep(0.1)\n    assert add({i}, 1) == {i + 1}\n\n" for i in range(10))
PATCH = ("diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,3 @@\n"
         " def add(a, b):\n+    # patched\n     return a + b\n")
EVAL = ("echo '>>>>> Start Test Output'\npython3 -m pytest -rA -q -p no:cacheprovider "
        "test_calc.py\necho '>>>>> End Test Output'\n")


def repo_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, text in {"calc.py": SRC, "test_calc.py": TESTS}.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _import_patch(head: str) -> str:
    """A patch that puts ``head`` (one line) above calc.py's code."""
    return ("diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,3 @@\n"
            f"+{head}\n def add(a, b):\n     return a + b\n")


def retry_cost(rt, image: str, tar: bytes, hang_timeout_s: float) -> None:
    """Print what the attribution retry costs for a fast (OOM) and a slow (hang) failure."""
    cases = {OOM: (_import_patch("BLOB = bytearray(512 * 2**20)"), 120.0),
             TIMEOUT: (_import_patch("import time; time.sleep(10**6)"), hang_timeout_s)}
    print(f"\n{'failure':>8} {'limit s':>7} {'1st service s':>13} {'retry service s':>15} "
          f"{'total s':>8} {'classes':>18}")
    with VerifierPool(rt, max_concurrency=1, retry=RetryPolicy(max_retries=0)) as pool:
        for name, (patch, timeout_s) in cases.items():
            spec = TrialSpec(trial_id=f"retry-{name}", image=image, eval_script=EVAL,
                             artifact=patch, repo_archive=tar, timeout_s=timeout_s,
                             limits=Limits(memory="128m"))
            t0 = time.monotonic()
            r = pool.submit(spec).result()
            total = time.monotonic() - t0
            first = r.failed_attempts[0] if r.failed_attempts else {"service_s": 0.0,
                                                                    "exit_class": "-"}
            print(f"{name:>8} {timeout_s:>7.0f} {first['service_s']:>13.3f} "
                  f"{r.service_s:>15.3f} {total:>8.3f} "
                  f"{first['exit_class'] + ' / ' + r.exit_class:>18}")


def main() -> None:
    ap = ArgumentParser()
    ap.add_argument("--trials", type=Int(ge=1), default=6)
    ap.add_argument("--hang-timeout", type=Float(gt=0, why="seconds"), default=5.0)
    args = ap.parse_args()
    image = build_offline(log=lambda *_: None)
    tar = repo_tar()

    def specs(tag):
        return [TrialSpec(trial_id=f"{tag}{i}", image=image, eval_script=EVAL, artifact=PATCH,
                          repo_archive=tar, timeout_s=120) for i in range(args.trials)]

    with PodmanRuntime() as rt:
        rt.run_trial(specs("warm")[0])  # first start pays image/storage warm-up
        print(f"{'concurrency':>11} {'trials':>6} {'setup s':>8} {'apply s':>8} {'test s':>7} "
              f"{'cleanup s':>9} {'overhead s':>10} {'overhead/test':>13} {'trials/min':>10} "
              f"{'ok':>3}")
        for conc in (1, 2):
            with VerifierPool(rt, max_concurrency=conc, retry=RetryPolicy()) as pool:
                t0 = time.monotonic()
                res = pool.map(specs(f"c{conc}-"))
                wall = time.monotonic() - t0
            bad = [r.exit_class for r in res if r.exit_class != "ok"]
            if bad:
                raise SystemExit(f"trials failed: {bad}")
            med = {k: statistics.median(getattr(r, k) for r in res)
                   for k in ("setup_s", "apply_s", "test_s", "cleanup_s")}
            overhead = statistics.median(r.setup_s + r.apply_s + r.cleanup_s for r in res)
            print(f"{conc:>11} {len(res):>6} {med['setup_s']:>8.3f} {med['apply_s']:>8.3f} "
                  f"{med['test_s']:>7.3f} {med['cleanup_s']:>9.3f} {overhead:>10.3f} "
                  f"{overhead / med['test_s']:>13.1%} {len(res) / wall * 60:>10.1f} "
                  f"{'yes' if overhead <= TARGET_S else 'NO':>3}")
        print(f"target: overhead <= {TARGET_S} s per trial (median); load average "
              f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
        retry_cost(rt, image, tar, args.hang_timeout)


if __name__ == "__main__":
    main()
