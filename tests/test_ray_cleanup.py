"""A killed trainer leaves nothing running on any node (issue 25, ``sandbox_backend=ray``).

A trainer-like driver (tests/ray_cluster_driver.py ``victim``: the runtime train.py makes, a
pool with two long trials in flight on the two sandbox nodes) is SIGKILLed; the run's
dispatcher sees its job die and removes the run's containers on every node, then itself
(sandbox.ray_dispatch, "A killed trainer ..."). One cluster start, in a loopback-only
network namespace like tests/test_ray_dispatch.py.
"""

from __future__ import annotations

import pytest
from test_ray_dispatch import _in_namespace

from sandbox.ray_dispatch import jobs_alive


def test_jobs_alive_reads_the_job_table():
    table = [{"JobID": "01000000", "IsDead": False}, {"JobID": "02000000", "IsDead": True},
             {"JobID": "03000000", "IsDead": False}]
    assert jobs_alive({"01000000", "02000000"}, table) == {"01000000"}
    assert jobs_alive({"02000000"}, table) == set()
    assert jobs_alive({"09000000"}, table) == set()  # not in the table: not alive
    assert jobs_alive(set(), table) == set()


@pytest.mark.podman
def test_killed_driver_leaves_no_container_and_no_dispatcher_on_any_node(tmp_path):
    rep = _in_namespace("cleanup", str(tmp_path / "cleanup.json"), timeout=400)
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
