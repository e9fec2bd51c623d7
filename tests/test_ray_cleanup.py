"""A killed trainer leaves nothing running on any node (``sandbox_backend=ray``).

A trainer-like driver (tests/ray_cluster_driver.py ``victim``: the runtime train.py makes, a
pool with two long trials in flight on the two sandbox nodes) is SIGKILLed; the run's
dispatcher sees its job die and removes the run's containers on every node, then itself
(sandbox.cluster.dispatch, "A killed trainer ..."). A second one is SIGKILLed holding both slots
of its cap and resumed at once (same run id): the resume is not starved. On the session's
shared test cluster (``ray_cluster``: loopback-only namespace, tests/ray_namespace.py); the
scenarios kill drivers, never nodes.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid

import pytest

from sandbox.cluster.reaper import LEASE_S, RunReaper, jobs_alive
from sandbox.images import default_image
from sandbox.runtimes.podman_runtime import gc, podman_env


def test_jobs_alive_reads_the_job_table():
    table = [{"JobID": "01000000", "IsDead": False}, {"JobID": "02000000", "IsDead": True},
             {"JobID": "03000000", "IsDead": False}]
    assert jobs_alive({"01000000", "02000000"}, table) == {"01000000"}
    assert jobs_alive({"02000000"}, table) == set()
    assert jobs_alive(set(), table) == set()
    # missing from the table (a restarted head lost it): alive without positive evidence
    nodes = [{"NodeID": "aa", "Alive": True}, {"NodeID": "bb", "Alive": False}]
    lease = {"renewed": {"09000000": 100.0}, "now": 130.0}
    assert jobs_alive({"09000000"}, table, nodes=nodes, **lease) == {"09000000"}
    assert jobs_alive({"09000000"}, [], nodes=nodes, driver_node={"09000000": "aa"},
                      **lease) == {"09000000"}
    # ... dead once its driver's node is gone from the node table, or its lease expired
    assert jobs_alive({"09000000"}, [], nodes=nodes, driver_node={"09000000": "bb"},
                      **lease) == set()
    assert jobs_alive({"09000000"}, [], nodes=nodes, driver_node={"09000000": "cc"},
                      **lease) == set()
    assert jobs_alive({"09000000"}, [], nodes=nodes, renewed={"09000000": 100.0},
                      now=100.0 + LEASE_S + 1) == set()
    assert jobs_alive({"09000000"}, [], nodes=[], driver_node={"09000000": "cc"},
                      **lease) == {"09000000"}  # an empty node table is no evidence


class _Reaper(RunReaper):
    """The dispatcher's reaper without Ray: the tables are given, the sweep is the real
    container removal of this host (:func:`sandbox.runtimes.podman_runtime.gc`)."""

    def __init__(self, run: str, tables: dict) -> None:
        self.cap, self.sem, self.holders, self.attached = 1, asyncio.Semaphore(1), {}, 1
        self.run, self.tables, self.clock = run, tables, [time.monotonic()]
        self.reaper_init("ecredit-dispatcher-", gc, alive=self._alive)

    def _alive(self, jobs, **kw):
        return jobs_alive(jobs, self.tables["jobs"], nodes=self.tables["nodes"],
                          **{**kw, "now": self.clock[0]})

    def run_id(self) -> str:
        return self.run

    async def release(self, holder: str) -> None:
        self.holders.pop(holder, None)


@pytest.mark.podman
def test_job_table_emptied_under_a_live_run_keeps_its_containers(podman_runtime):

    run = f"reaper-{uuid.uuid4().hex[:8]}"
    name = f"ecredit-{run}-trial"
    env = podman_env()
    subprocess.run(["podman", "run", "-d", "--name", name, "--label", f"ecredit.run={run}",
                    "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
                    "--network", "none", default_image(), "sleep", "300"],
                   check=True, capture_output=True, env=env)

    def running() -> bool:
        out = subprocess.run(["podman", "ps", "--filter", f"name={name}", "--format",
                              "{{.Names}}"], capture_output=True, text=True, env=env).stdout
        return name in out.split()

    try:
        tables = {"jobs": [{"JobID": "01000000", "IsDead": False}],
                  "nodes": [{"NodeID": "aa", "Alive": True}]}
        reaper = _Reaper(run, tables)

        async def scenario():
            assert await reaper.join("01000000", "aa")
            assert await reaper.renew("01000000")
            tables["jobs"] = []  # the head restarted: the job table lost the live run
            assert not await reaper.reap_if_dead()
            reaper.clock[0] += LEASE_S / 2  # renewed in time: still alive
            assert await reaper.renew("01000000")
            reaper.clock[0] = time.monotonic() + LEASE_S / 2
            assert not await reaper.reap_if_dead()
            kept = running()
            reaper.clock[0] = time.monotonic() + LEASE_S + 1  # no renewal since: expired
            reaped = await reaper.reap_if_dead()
            reaper.watcher.cancel()
            return kept, reaped

        kept, reaped = asyncio.run(scenario())
        assert kept, "a live run's container was swept"
        assert reaped and not running()  # positive evidence (an expired lease): swept
    finally:
        subprocess.run(["podman", "rm", "-f", name], capture_output=True, env=env)


@pytest.fixture(scope="module")
def cleanup_report(tmp_path_factory, ray_cluster):
    """The driver's cleanup scenarios, on the session's cluster."""
    return ray_cluster.run("cleanup", str(tmp_path_factory.mktemp("ray") / "cleanup.json"),
                           timeout=500)


@pytest.mark.podman
def test_killed_driver_leaves_no_container_and_no_dispatcher_on_any_node(cleanup_report):
    rep = cleanup_report
    nodes, r = rep["nodes"], rep["killed"]
    # two trials were running, one on each sandbox node, never on the head
    assert len(r["running"]) == 2, r["child_stderr"]
    assert r["load"] == {nodes["a"]: 1, nodes["b"]: 1}
    # the live driver's run was left alone while the reaper polled (3 polls)
    assert sorted(r["still_running_alive"]) == sorted(r["running"])
    assert r["child_rc"] == -9  # SIGKILL: no close(), no atexit hook ran
    # then, within a bounded time: no container of the run on any node, no dispatcher left
    assert r["left"] == [] and not r["dispatcher_left"]
    bound = 3 * rep["poll_s"] + 60  # polls, two sweeps REAP_GRACE_S apart, a busy machine
    assert r["gone"]["containers_s"] < bound and r["gone"]["dispatcher_s"] < bound, r["gone"]


@pytest.mark.podman
def test_a_resume_right_after_the_kill_gets_its_slots_and_ends_clean(cleanup_report):
    r = cleanup_report["resumed"]
    assert len(r["running"]) == 2  # the killed driver held both slots of the cap of 2
    # the resumed driver (same run id, same dispatcher name) was not starved by them
    assert r["rc"] == 0, r["tail"]
    assert r["resumed"]["classes"] == ["ok", "ok"] and r["resumed"]["attempts"] == [1, 1]
    assert r["left"] == []  # neither session's containers are left
