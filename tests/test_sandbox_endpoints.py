"""Trials spread over several Podman endpoints (here: two local API services); agent
sessions only on local agent endpoints (issue 13 §5)."""

import pytest
from conftest import make_tar
from test_sandbox_podman import CALC, EVAL, TESTS

from sandbox import TrialSpec, VerifierPool
from sandbox.images import build_offline
from sandbox.podman_runtime import (
    PodmanRuntime,
    PodmanService,
    check_agent_endpoints,
    is_local_endpoint,
)
from sandbox.session import PodmanSession

REMOTE = "ssh://core@build.example:22/run/podman/podman.sock"


def test_remote_agent_endpoints_are_refused_naming_the_field():
    assert is_local_endpoint("unix:///run/p.sock") and is_local_endpoint("")
    assert not is_local_endpoint(REMOTE) and not is_local_endpoint("tcp://h:8080")
    assert check_agent_endpoints(["unix:///a", ""]) == ["unix:///a"]
    with pytest.raises(ValueError, match=r"^agent_endpoints: ssh://core@build.example:22/run/"
                                         r"podman/podman.sock is not local; agent sessions "
                                         r"bind-mount"):
        check_agent_endpoints(["unix:///a", REMOTE])
    with pytest.raises(ValueError, match="agent_endpoints: expected a list"):
        check_agent_endpoints("unix:///a")
    # refused before any service starts
    with pytest.raises(ValueError, match="^agent_endpoints: ssh://"):
        PodmanRuntime(endpoints=[REMOTE], agent_endpoints=[REMOTE])


def test_config_splits_endpoints_and_keeps_the_deprecated_alias(tmp_path):
    from ecredit_trl.config import ECreditConfig

    def cfg(**kw):
        return ECreditConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True,
                             bf16=False, **kw)

    c = cfg(podman_endpoints=["unix:///a", REMOTE])
    assert c.verifier_endpoints == ["unix:///a", REMOTE] and c.agent_endpoints == ["unix:///a"]
    c = cfg(podman_endpoints=[REMOTE], agent_endpoints=["unix:///b"])
    assert c.verifier_endpoints == [REMOTE] and c.agent_endpoints == ["unix:///b"]
    c = cfg(verifier_endpoints=[REMOTE])
    assert c.agent_endpoints == [] and c.podman_endpoints == []
    with pytest.raises(ValueError, match="^agent_endpoints: ssh://core@build.example"):
        cfg(agent_endpoints=[REMOTE])


@pytest.mark.podman
def test_trials_round_robin_over_endpoints_agents_stay_on_the_agent_endpoint(tmp_path):
    image = build_offline(log=lambda *_: None)
    services = [PodmanService(), PodmanService()]
    try:
        urls = [s.url for s in services]
        with PodmanRuntime(endpoints=urls, agent_endpoints=[urls[1]]) as rt:
            assert rt._service is None  # given endpoints: no private service started
            specs = [TrialSpec(trial_id=f"ep{i}", image=image, eval_script=EVAL,
                               repo_archive=make_tar({"calc.py": CALC, "test_calc.py": TESTS}),
                               timeout_s=60) for i in range(4)]
            with VerifierPool(rt, max_concurrency=2) as pool:
                results = pool.map(specs)
            sessions = [PodmanSession(rt, image, tmp_path) for _ in range(2)]
            try:
                assert [s.endpoint for s in sessions] == [urls[1], urls[1]]
            finally:
                for s in sessions:
                    s.close()
        assert [r.exit_class for r in results] == ["ok"] * 4
        assert sorted(r.endpoint for r in results) == sorted(urls * 2)
    finally:
        for s in services:
            s.stop()


@pytest.mark.podman
def test_remote_only_verifiers_start_a_local_service_for_agents():
    with PodmanRuntime(endpoints=[REMOTE]) as rt:
        assert rt.endpoints == [REMOTE]
        assert rt._service is not None and rt.agent_endpoints == [rt._service.url]
        assert rt._pick_endpoint() == rt._service.url
