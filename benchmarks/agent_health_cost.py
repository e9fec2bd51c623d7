"""What telling agent-caused exec failures from infrastructure costs.

On real Podman agent sessions (:class:`sandbox.workspace.session.PodmanSession`, the offline sandbox
image), medians over ``--sessions`` sessions of:

* session start (create + start + the added inspect for the cgroup path and the image's
  user), and the added part alone (``container.reload`` + ``_image_user``);
* one ``bash`` call (``true``), which now includes the host-side cgroup sample after it;
* the sample alone (:func:`sandbox.workspace.health.read_cgroup`);
* :meth:`PodmanSession.diagnose` (ping + inspect + cgroup read: paid once, on a failed exec).

    PYTHONPATH=. CONTAINERS_CONF=sandbox/containers.conf \\
        python benchmarks/agent_health_cost.py [--sessions 5]
"""

from __future__ import annotations

import statistics
import tempfile
import time

from eval.integrity.agent import classify_exec_failure
from sandbox.bounds import ArgumentParser, Int
from sandbox.images import build_offline, default_image
from sandbox.runtimes.podman_runtime import PodmanRuntime
from sandbox.workspace.health import read_cgroup
from sandbox.workspace.session import PodmanSession, _image_user


def _ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:.2f} ms"


def main(argv=None) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=Int(ge=1), default=5)
    args = ap.parse_args(argv)
    build_offline(log=lambda *_: None)
    start, added, call, sample, diag = [], [], [], [], []
    with PodmanRuntime() as rt, tempfile.TemporaryDirectory() as d:
        for _ in range(args.sessions):
            t0 = time.perf_counter()
            s = PodmanSession(rt, default_image(), d)
            start.append(time.perf_counter() - t0)
            try:
                t0 = time.perf_counter()
                s.container.reload()
                _image_user(s._client, default_image())
                added.append(time.perf_counter() - t0)
                s.run("true")  # warm
                t0 = time.perf_counter()
                s.run("true")
                call.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                for _ in range(100):
                    read_cgroup(s.cgroup_path)
                sample.append((time.perf_counter() - t0) / 100)
                t0 = time.perf_counter()
                ev = s.diagnose()
                diag.append(time.perf_counter() - t0)
                assert classify_exec_failure(ev) is None and ev["service_ok"]
            finally:
                s.close()
    print(f"sessions: {args.sessions}")
    print(f"session start (median): {_ms(start)}; of it the added inspect + image user: "
          f"{_ms(added)}")
    print(f"bash call 'true' incl. the cgroup sample (median): {_ms(call)}")
    print(f"cgroup sample alone (median): {_ms(sample)}")
    print(f"diagnose on a failed exec (median): {_ms(diag)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
