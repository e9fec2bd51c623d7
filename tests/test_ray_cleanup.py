"""A killed trainer leaves nothing running on any node (``sandbox_backend=ray``).

A trainer-like driver (tests/ray_cluster_driver.py ``victim``: the runtime train.py makes, a
pool with two long trials in flight on the two sandbox nodes) is SIGKILLed; the run's
dispatcher sees its job die and removes the run's containers on every node, then itself
(sandbox.cluster.dispatch, "A killed trainer ..."). A second one is SIGKILLed holding both slots
of its cap and resumed at once (same run id): the resume is not starved. One cluster start,
in a loopback-only network namespace like tests/test_ray_dispatch.py.
"""

from __future__ import annotations

import pytest
from test_ray_dispatch import _in_namespace

from sandbox.cluster.reaper import jobs_alive


def test_jobs_alive_reads_the_job_table():
    table = [{"JobID": "01000000", "IsDead": False}, {"JobID": "02000000", "IsDead": True},
             {"JobID": "03000000", "IsDead": False}]
    assert jobs_alive({"01000000", "02000000"}, table) == {"01000000"}
    assert jobs_alive({"02000000"}, table) == set()
    assert jobs_alive({"09000000"}, table) == set()  # not in the table: not alive
    assert jobs_alive(set(), table) == set()


@pytest.fixture(scope="module")
def cleanup_report(tmp_path_factory):
    """The driver's cleanup scenarios (one cluster start for this module)."""
    return _in_namespace("cleanup", str(tmp_path_factory.mktemp("ray") / "cleanup.json"),
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
