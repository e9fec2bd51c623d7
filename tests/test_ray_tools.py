"""``eval.controls`` and the signal pilot on the ``ray`` backend, end to end: each
CLI started with ``--sandbox-backend ray`` against a local cluster (a head node and two
sandbox nodes: the session's shared test cluster ``ray_cluster``, tests/ray_namespace.py; the
driver is tests/ray_cluster_driver.py ``tools``) grades its trials
on the sandbox nodes and records the node that served each one. ``eval.run`` and the main
job are covered by tests/test_ray_dispatch.py's slow test."""

from __future__ import annotations

import pytest


@pytest.mark.podman
@pytest.mark.slow
def test_controls_and_pilot_cli_grade_on_the_sandbox_nodes(tmp_path, ray_cluster):
    rep = ray_cluster.run("tools", str(tmp_path / "tools.json"), str(tmp_path), timeout=900)
    sandbox_nodes = {rep["nodes"]["a"], rep["nodes"]["b"]}
    ctl = rep["controls"]
    assert ctl["rc"] == 0, ctl["tail"]  # 0: the task was admitted (gold resolved, empty not)
    assert "admitted 1/1" in ctl["tail"]
    assert len(ctl["nodes"]) == 2 and set(ctl["nodes"]) <= sandbox_nodes, ctl["nodes"]
    pilot = rep["pilot"]
    assert pilot["rc"] == 0, pilot["tail"]  # identities and the query bound hold
    assert "usable 1, D>0 1" in pilot["tail"]  # the gold fix's ablation breaks it: D > 0
    # factual, counterfactual and control trials, every one served by a sandbox node
    assert len(pilot["nodes"]) == 3 and set(pilot["nodes"]) <= sandbox_nodes, pilot["nodes"]
