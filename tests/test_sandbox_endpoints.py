"""Podman endpoints: agent sessions only on local agent endpoints; the
remote verifier endpoint list is retired in favour of the Ray backend (one scheduler), so it
is refused in one line naming the Ray settings; one local socket serves trials and sessions."""

import re

import pytest
from conftest import make_tar
from test_sandbox_podman import CALC, EVAL, TESTS

from eval.integrity.retry import RetryPolicy
from sandbox.backend import SandboxOptions, make_runtime
from sandbox.images import build_offline
from sandbox.runtimes.podman_runtime import (
    PodmanRuntime,
    PodmanService,
    check_agent_endpoints,
    check_trial_endpoints,
    endpoints_retired,
    is_local_endpoint,
)
from sandbox.trials.pool import VerifierPool
from sandbox.trials.trial import TrialSpec
from sandbox.workspace.session import PodmanSession

REMOTE = "ssh://core@build.example:22/run/podman/podman.sock"
MIGRATION = re.escape("retired: verifier trials on other hosts run on a Ray "
                      "cluster with Podman on every node")


def _cfg(tmp_path, **kw):
    from ecredit_trl.config import ECreditConfig

    return ECreditConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False,
                         **kw)


def test_remote_agent_endpoints_are_refused_naming_the_field():
    assert is_local_endpoint("unix:///run/p.sock") and is_local_endpoint("")
    assert not is_local_endpoint(REMOTE) and not is_local_endpoint("tcp://h:8080")
    assert check_agent_endpoints(["unix:///a", ""]) == ["unix:///a"]
    with pytest.raises(ValueError, match=r"^agent_endpoints: ssh://core@build.example:22/run/"
                                         r"podman/podman.sock is not local; agent sessions "
                                         r"bind-mount.*sandbox_backend=ray$"):
        check_agent_endpoints(["unix:///a", REMOTE])
    with pytest.raises(ValueError, match="agent_endpoints: expected a list"):
        check_agent_endpoints("unix:///a")
    # refused before any service starts
    with pytest.raises(ValueError, match="^agent_endpoints: ssh://"):
        PodmanRuntime(agent_endpoints=[REMOTE])


def test_the_migration_message_is_one_line_naming_the_ray_settings():
    msg = endpoints_retired("verifier_endpoints")
    assert re.match("verifier_endpoints: " + MIGRATION, msg) and "\n" not in msg
    for setting in ("--sandbox_backend ray", "--ray_address HEAD:PORT", "--sandbox_max_in_flight",
                    "--ray_podman_url", "--ray_image_registry", "--num-gpus 0",
                    "'{\"ecredit_sandbox\": 24}'", "docs/scale-out.md#migrate-endpoints"):
        assert setting in msg, setting


def test_verifier_endpoints_are_refused_everywhere_before_anything_starts(tmp_path):
    for urls in ([REMOTE], ["unix:///run/podman/podman.sock"], ["unix:///a", REMOTE]):
        with pytest.raises(ValueError, match="^verifier_endpoints: " + MIGRATION):
            _cfg(tmp_path, verifier_endpoints=urls)
        with pytest.raises(ValueError, match="^verifier_endpoints: " + MIGRATION):
            make_runtime(SandboxOptions(verifier_endpoints=tuple(urls)))
    with pytest.raises(ValueError, match="^verifier_endpoints: " + MIGRATION):
        _cfg(tmp_path, verifier_endpoints=[REMOTE], sandbox_backend="ray")
    # the runtime takes at most one local trial socket (a Ray node's own), never a rotation
    assert check_trial_endpoints(["", "unix:///a"]) == ["unix:///a"]
    with pytest.raises(ValueError, match="^verifier_endpoints: " + MIGRATION):
        check_trial_endpoints(["unix:///a", "unix:///b"])
    with pytest.raises(ValueError, match="^verifier_endpoints: " + MIGRATION):
        PodmanRuntime(endpoints=[REMOTE])


def test_podman_endpoints_alias_keeps_local_sockets_and_refuses_remote_ones(tmp_path):
    c = _cfg(tmp_path, podman_endpoints=["unix:///a"])
    assert c.agent_endpoints == ["unix:///a"] and c.verifier_endpoints == []
    c = _cfg(tmp_path, podman_endpoints=["unix:///a"], agent_endpoints=["unix:///b"])
    assert c.agent_endpoints == ["unix:///b"]
    with pytest.raises(ValueError, match="^podman_endpoints: " + MIGRATION):
        _cfg(tmp_path, podman_endpoints=["unix:///a", REMOTE])
    with pytest.raises(ValueError, match="^agent_endpoints: ssh://core@build.example"):
        _cfg(tmp_path, agent_endpoints=[REMOTE])


def test_a_resumed_endpoint_run_can_clear_the_recorded_list(tmp_path):
    """A run recorded with ``--verifier_endpoints URL`` resumes with ``--verifier_endpoints ""``
    added (later arguments win): an empty entry is no endpoint."""
    from transformers import HfArgumentParser

    from ecredit_trl.config import ECreditConfig

    argv = ["--output_dir", str(tmp_path), "--use_cpu", "true", "--bf16", "false",
            "--report_to", "none", "--verifier_endpoints", REMOTE]
    with pytest.raises(ValueError, match="^verifier_endpoints: " + MIGRATION):
        HfArgumentParser(ECreditConfig).parse_args_into_dataclasses(argv)
    (c,) = HfArgumentParser(ECreditConfig).parse_args_into_dataclasses(
        [*argv, "--verifier_endpoints", "", "--sandbox_backend", "ray"])
    assert c.verifier_endpoints == [""] and c.sandbox_backend == "ray"


@pytest.mark.podman
def test_one_local_socket_serves_trials_and_agent_sessions(tmp_path):
    image = build_offline(log=lambda *_: None)
    service = PodmanService()
    try:
        with PodmanRuntime(agent_endpoints=[service.url]) as rt:
            assert rt._service is None  # given a socket: no private service started
            assert rt.endpoints == rt.agent_endpoints == [service.url]
            specs = [TrialSpec(trial_id=f"ep{i}", image=image, eval_script=EVAL,
                               repo_archive=make_tar({"calc.py": CALC, "test_calc.py": TESTS}),
                               timeout_s=60) for i in range(2)]
            with VerifierPool(rt, max_concurrency=2, retry=RetryPolicy()) as pool:
                results = pool.map(specs)
            session = PodmanSession(rt, image, tmp_path)
            try:
                assert session.endpoint == service.url
            finally:
                session.close()
        assert [r.exit_class for r in results] == ["ok"] * 2
        assert [r.endpoint for r in results] == [service.url] * 2
    finally:
        service.stop()
