"""Trials spread over several Podman endpoints (here: two local API services)."""

import pytest
from conftest import make_tar
from test_sandbox_podman import CALC, EVAL, TESTS

from sandbox import TrialSpec, VerifierPool
from sandbox.images import build_offline
from sandbox.podman_runtime import PodmanRuntime, PodmanService

pytestmark = pytest.mark.podman


def test_trials_round_robin_over_endpoints():
    image = build_offline(log=lambda *_: None)
    services = [PodmanService(), PodmanService()]
    try:
        urls = [s.url for s in services]
        with PodmanRuntime(endpoints=urls) as rt:
            assert rt._service is None  # given endpoints: no private service started
            specs = [TrialSpec(trial_id=f"ep{i}", image=image, eval_script=EVAL,
                               repo_archive=make_tar({"calc.py": CALC, "test_calc.py": TESTS}),
                               timeout_s=60) for i in range(4)]
            with VerifierPool(rt, max_concurrency=2) as pool:
                results = pool.map(specs)
        assert [r.exit_class for r in results] == ["ok"] * 4
        assert sorted(r.endpoint for r in results) == sorted(urls * 2)
    finally:
        for s in services:
            s.stop()
