"""Test Ray clusters in a loopback-only network namespace, and the session's shared one.

Every Ray test drives tests/ray_cluster_driver.py inside a network namespace whose only
interface is loopback (``unshare -n``), so every Ray address is 127.0.0.1. Two ways:

- :func:`in_namespace` with no cluster: a fresh namespace and a cluster of the scenario's
  own (the scenarios that kill nodes, add nodes with their own settings, or start Ray in
  another authentication mode);
- :class:`SessionCluster`: ONE cluster (a head without the sandbox resource and sandbox
  nodes A and B, the topology every scenario starts from) started once per pytest session
  in its own namespace by a serving driver (``ray_cluster_driver.py serve``); scenarios that
  leave the nodes as they found them join that namespace (``nsenter -n``) and connect to
  it. Its session files live under a private ``RAY_TMPDIR``, so ``/tmp/ray`` (where
  ``ray_address='auto'`` looks) never names it. Closing its stdin shuts it down.

Every test cluster enforces Ray token authentication (one token per session, made by
``ray get-auth-token --generate`` into a private HOME).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

DRIVER = Path(__file__).resolve().parent / "ray_cluster_driver.py"
_TOKEN: list[Path] = []


def unshare_problem() -> str | None:
    """Why the cluster tests cannot run here, or None."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install 'ecredit-trl[ray]')"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare/ip not found: the test cluster needs a loopback-only network namespace"
    if shutil.which("nsenter") is None:
        return "nsenter not found: scenarios join the session cluster's network namespace"
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare -n is not permitted here ({probe.stderr.strip()}): needs root"
    return None


def token_file() -> Path:
    """This session's test-cluster token file (``ray get-auth-token --generate`` with a
    private HOME, then mode 600), made once."""
    if not _TOKEN:
        home = Path(tempfile.mkdtemp(prefix="ecredit-raytoken-"))
        ray_cli = Path(sys.executable).with_name("ray")
        subprocess.run([str(ray_cli), "get-auth-token", "--generate"], check=True,
                       capture_output=True, env=dict(os.environ, HOME=str(home)), timeout=120)
        path = home / ".ray" / "auth_token"
        path.chmod(0o600)
        _TOKEN.append(path)
    return _TOKEN[0]


def driver_env(**extra: str) -> dict:
    """The environment of a driver: token authentication (the token reaches the nodes, the
    driver and its children as a file, RAY_AUTH_TOKEN_PATH, as the scale-out page says),
    this checkout first on PYTHONPATH, no usage stats; plus ``extra``."""
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token",
               RAY_AUTH_TOKEN_PATH=str(token_file()),
               PYTHONPATH=os.pathsep.join([str(DRIVER.parents[1]),
                                           os.environ.get("PYTHONPATH", "")]), **extra)
    env.pop("RAY_AUTH_TOKEN", None)
    return env


def _ready() -> None:
    why = unshare_problem()
    if why:
        pytest.skip(why)
    from sandbox.images import build_offline

    build_offline(log=lambda *_: None)


class SessionCluster:
    """The session's shared test cluster (head, sandbox nodes A and B) in its own
    loopback-only namespace; :meth:`run` runs a driver scenario inside that namespace."""

    def __init__(self, work: Path, timeout: float = 300) -> None:
        _ready()
        self.work = work
        self.ready = work / "cluster.json"
        # short: Ray's unix sockets live under it (a path limit of 107 bytes)
        self.env = {"RAY_TMPDIR": tempfile.mkdtemp(prefix="ecr-", dir="/tmp"),
                    "ECREDIT_DOCTOR_CACHE": str(work / "doctor"),
                    "ECREDIT_TEST_CLUSTER": str(self.ready)}
        self.log = open(work / "serve.log", "w")  # noqa: SIM115 (closed in close())
        cmd = " ".join(["ip link set lo up && exec", sys.executable, str(DRIVER), "serve",
                        str(self.ready)])
        self.proc = subprocess.Popen(["unshare", "-n", "bash", "-c", cmd],
                                     stdin=subprocess.PIPE, stdout=self.log,
                                     stderr=subprocess.STDOUT, env=driver_env(**self.env))
        deadline = time.monotonic() + timeout
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the session's Ray test cluster did not start: "
                                   + (work / "serve.log").read_text()[-3000:])
            time.sleep(0.2)
        info = json.loads(self.ready.read_text())
        self.address, self.nodes = info["address"], info["nodes"]

    def run(self, *args: str, timeout: int) -> dict:
        """Run ray_cluster_driver.py ``args`` in this cluster's namespace; its JSON report."""
        return _run(["nsenter", "-t", str(self.proc.pid), "-n", sys.executable, str(DRIVER),
                     *args], args, driver_env(**self.env), timeout)

    def close(self) -> None:
        """Shut the cluster down (stdin closed: the serving driver stops its nodes and
        kills what is left in its namespace); the serving process is killed, by its pid,
        only if it has not ended within two minutes."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.env["RAY_TMPDIR"], ignore_errors=True)


def _run(cmd: list[str], args: tuple, env: dict, timeout: int) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    out = Path(args[1] if args[0] in ("train", "cleanup", "tools", "auth") else args[0])
    assert proc.returncode == 0 and out.exists(), proc.stderr[-4000:]
    return json.loads(out.read_text())


def in_namespace(*args: str, timeout: int) -> dict:
    """Run tests/ray_cluster_driver.py ``args`` inside a fresh ``unshare -n`` (the scenario
    starts the cluster it needs); its JSON report (written to the path the args name)."""
    _ready()
    cmd = " ".join(["ip link set lo up && exec", sys.executable, str(DRIVER), *args])
    return _run(["unshare", "-n", "bash", "-c", cmd], args, driver_env(), timeout)
