"""The sandbox ``Runtime`` protocol and ``SandboxOptions``: every runtime class satisfies the
protocol and names its kind and backend; the flags a runtime or a set of options writes are
parsed back into the same options; each check names its field; each default is written once."""

from __future__ import annotations

import argparse
import dataclasses
import warnings
from types import SimpleNamespace

import pytest

from sandbox.backend import (
    CONFIG_FIELDS,
    DEFAULTS,
    STUDY_KEYS,
    Runtime,
    SandboxOptions,
    SandboxOptionsError,
    open_runtime,
)
from sandbox.cluster.dispatch import DEFAULT_MAX_IN_FLIGHT, RayOptions
from sandbox.cluster.trials import RayRoutedRuntime
from sandbox.runtimes.local_runtime import LocalRuntime
from sandbox.runtimes.podman_runtime import PodmanRuntime
from sandbox.runtimes.protocol import FLAGS


def _parse(argv: list[str]) -> SandboxOptions:
    ap = argparse.ArgumentParser()
    SandboxOptions.add_args(ap)
    return SandboxOptions.from_args(ap.parse_args(argv))


def _bare(cls, **attrs):
    """An instance of ``cls`` without its constructor (no Podman service, no cluster)."""
    obj = object.__new__(cls)
    obj.__dict__.update(attrs)
    return obj


def _local() -> LocalRuntime:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return LocalRuntime(run_id="t")


RAY = RayOptions(address="10.0.0.5:6379", max_in_flight=48,
                 podman_url="unix:///run/podman/podman.sock", registry="mirror.local:5000")


def _runtimes():
    return {"local": _local(),
            "podman": _bare(PodmanRuntime, run_id="p"),
            "ray": _bare(RayRoutedRuntime, run_id="r",
                         trials=SimpleNamespace(options=RAY, run_id="r"))}


def test_every_runtime_class_satisfies_the_protocol_and_names_its_kind_and_backend():
    rts = _runtimes()
    for rt in rts.values():
        assert isinstance(rt, Runtime), type(rt)
    assert {n: (rt.kind, rt.backend) for n, rt in rts.items()} == {
        "local": ("local", "local"), "podman": ("podman", "local"), "ray": ("podman", "ray")}
    assert rts["local"].image_ids(["b", "a", "b"]) == {"a": None, "b": None}
    # options are not a runtime: a caller tells them apart to decide who closes what
    assert not isinstance(DEFAULTS, Runtime)


def test_a_runtimes_argv_rebuilds_its_options_in_a_child():
    rts = _runtimes()
    assert rts["local"].argv() == ["--runtime", "local"]
    assert rts["podman"].argv() == ["--runtime", "podman"]
    assert _parse(rts["local"].argv()) == SandboxOptions(kind="local")
    assert _parse(rts["podman"].argv()) == DEFAULTS
    child = _parse(rts["ray"].argv())
    assert child == SandboxOptions(backend="ray", ray_address=RAY.address,
                                   max_in_flight=RAY.max_in_flight, podman_url=RAY.podman_url,
                                   image_registry=RAY.registry, run_id="r")
    assert child.ray_options() == RAY  # the child joins run r's dispatcher with the same cap


@pytest.mark.parametrize("options", [
    DEFAULTS, SandboxOptions(kind="local"),
    SandboxOptions(backend="ray"),
    SandboxOptions(backend="ray", ray_address="ray://h:10001", max_in_flight=3,
                   podman_url="unix:///s.sock", image_registry="docker-archive:/d", run_id="x"),
])
def test_options_round_trip_through_their_flags(options):
    assert _parse(options.argv()) == options
    assert options.validate() is options


def test_flags_keep_their_names_and_the_trainers_field_names():
    # the CLI flag is the trainer's field with dashes (docs and tests use both spellings)
    for f, flag in FLAGS.items():
        assert flag == "--" + CONFIG_FIELDS[f].replace("_", "-"), f
    assert {f.name for f in dataclasses.fields(SandboxOptions)} == set(CONFIG_FIELDS)
    assert set(STUDY_KEYS) <= set(CONFIG_FIELDS)


@pytest.mark.parametrize("kw, field, text", [
    ({"kind": "docker"}, "runtime", "expected 'podman' or 'local', got 'docker'"),
    ({"backend": "k8s"}, "sandbox_backend", "expected one of local, ray, got 'k8s'"),
    ({"ray_address": " "}, "ray_address", "expected 'auto' or HOST:PORT"),
    ({"max_in_flight": 0}, "sandbox_max_in_flight", "expected an int >= 1, got 0"),
    ({"max_in_flight": True}, "sandbox_max_in_flight", "expected an int >= 1, got True"),
    ({"podman_url": "ssh://u@h/s.sock"}, "ray_podman_url", "expected \"\" or a node-local"),
    ({"image_registry": ""}, "ray_image_registry", "expected a registry/mirror or null"),
    ({"kind": "local", "backend": "ray"}, "sandbox_backend",
     "ray runs every trial in Podman on a cluster node; runtime must be podman, got 'local'"),
    ({"agent_endpoints": ("ssh://u@h/s.sock",)}, "agent_endpoints", "ssh://u@h/s.sock is not "
                                                                   "local"),
    ({"verifier_endpoints": ("unix:///a",)}, "verifier_endpoints", "retired: "),
])
def test_validate_names_the_field(kw, field, text):
    with pytest.raises(SandboxOptionsError) as ei:
        SandboxOptions(**kw).validate()
    assert str(ei.value).startswith(f"{field}: {text}"), str(ei.value)
    assert isinstance(ei.value, ValueError) and "\n" not in str(ei.value)
    # a caller with its own names (a study's section) gets them in the message
    key = ei.value.field
    with pytest.raises(SandboxOptionsError, match=f"^sandbox.{key}: "):
        SandboxOptions(**kw).validate({key: f"sandbox.{key}"})


def test_each_default_is_the_dataclass_one():
    from ecredit_trl.config import ECreditConfig
    from ecredit_trl.study.config import SANDBOX_DEFAULTS

    assert DEFAULTS.max_in_flight == DEFAULT_MAX_IN_FLIGHT == RayOptions().max_in_flight
    assert _parse([]) == DEFAULTS  # the CLI defaults
    assert SANDBOX_DEFAULTS == DEFAULTS.study_section()
    defaults = {f.name: f.default for f in dataclasses.fields(ECreditConfig)}
    for f, c in CONFIG_FIELDS.items():
        if c in defaults and not isinstance(getattr(DEFAULTS, f), tuple):
            assert defaults[c] == getattr(DEFAULTS, f), c


def test_open_runtime_closes_only_what_it_opened(monkeypatch):
    import sandbox.backend as backend

    closed = []

    class Given:
        def close(self):
            closed.append("given")

    given = Given()
    with open_runtime(given, run_id="x") as rt:
        assert rt is given
    assert closed == []

    made = SimpleNamespace(close=lambda: closed.append("made"))
    monkeypatch.setattr(backend, "make_runtime", lambda options, run_id: (
        closed.append(("make", options.kind, run_id)) or made))
    with pytest.raises(RuntimeError), open_runtime(SandboxOptions(kind="local"),
                                                   run_id="y") as rt:
        assert rt is made
        raise RuntimeError("the caller's work failed")
    assert closed == [("make", "local", "y"), "made"]
