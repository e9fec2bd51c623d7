"""The live integrity suites under the host variants users run (design page, "Threat model"):
the OCI runtime crun in place of runc, and fuse-overlayfs storage in place of native overlay.

A representative subset, not every live test (CI time): an agent's fork flood and memory
blow-up in its own container (tests/test_agent_failures.py), the trial facts of an artifact
that hangs, OOMs or fork-floods (tests/test_attribution.py's artifacts; the rule applied
to those facts is pure and the same on every host), and an image whose history holds the
fix, hidden from the agent (tests/test_history_leaks.py: the tree container's overlay,
with the opaque ``.git`` checked on the merged view after the remount). The agent tests
are the same functions as there, collected here again with this module's
``podman_runtime``: one runtime (its own Podman service) per variant, started inside
:func:`tests.conftest.podman_variant`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import (
    PODMAN_VARIANTS,
    copy_from_shared_store,
    podman_variant,
    shared_store,
)
from tests.test_agent_failures import (  # noqa: F401 - fixtures and tests collected here again
    task,
    test_fork_flood_in_its_own_container_is_the_agents_failure,
    test_memory_filled_to_its_own_limit_is_the_agents_failure,
)
from tests.test_attribution import FORK_FLOOD, HANG, MEMORY, TIMEOUT_S, spec
from tests.test_history_leaks import FUTURE_SH, _build
from tests.test_history_leaks import test_no_agent_command_prints_the_fix as _history_hunt


@pytest.fixture(scope="module", params=PODMAN_VARIANTS)
def variant(request) -> str:
    """The host variant of this module's runtime."""
    return request.param


@pytest.fixture(scope="module")
def podman_runtime(variant, tmp_path_factory):
    """A PodmanRuntime whose service and CLI calls run under ``variant``; checks that no
    container of it is left."""
    from sandbox.images import build_offline
    from sandbox.runtimes.podman_runtime import PodmanRuntime, gc

    with podman_variant(variant, tmp_path_factory.mktemp(variant)):
        build_offline(log=lambda *_: None)  # present: copied in or shared
        rt = PodmanRuntime()
        try:
            yield rt
        finally:
            rt.close()
            leftovers = gc(rt.run_id)
        assert leftovers == [], f"containers left under {variant}: {leftovers}"


@pytest.mark.podman
def test_variant_is_in_effect(variant, podman_runtime):
    """The service runs what the variant says: crun as the OCI runtime (native overlay), or
    runc with fuse-overlayfs mounting the container layers."""
    with podman_runtime.client() as client:
        info = client.info()
    runtime = info["host"]["ociRuntime"]["name"]
    mount_program = info["store"]["graphOptions"].get("overlay.mount_program", {})
    assert info["store"]["graphDriverName"] == "overlay"
    if variant == "crun":
        assert (runtime, mount_program) == ("crun", {}), info["store"]["graphOptions"]
    else:
        assert runtime == "runc" and "fuse-overlayfs" in str(mount_program), info["store"]


@pytest.mark.podman
def test_trial_limits_hold(podman_runtime):
    """A hang past the trial's timeout, a blob past its memory limit and a fork flood to
    its pids limit each end with their own exit class (what the attribution rule reads);
    the untouched task passes. One trial each (``run_trial``: no retry). The timeouts other
    than the hang's are generous (the OOM ends its trial at once; the flood's children keep
    theirs up to its timeout): fuse-overlayfs on a loaded 2-core machine was seen to make a
    trial 3-10x slower, and what is checked is the limit that stops each artifact."""
    want = {"fork_flood": (FORK_FLOOD, "pids", 20.0), "hang": (HANG, "timeout", TIMEOUT_S),
            "memory": (MEMORY, "oom", 120.0), "control": ("", "ok", 120.0)}
    with ThreadPoolExecutor(max_workers=2) as ex:
        futs = {k: ex.submit(podman_runtime.run_trial, spec(f"variant-{k}", art, timeout_s=t))
                for k, (art, _, t) in want.items()}
        got = {k: f.result() for k, f in futs.items()}
    assert {k: r.exit_class for k, r in got.items()} == {k: w[1] for k, w in want.items()}, \
        {k: (r.error, r.log[-1500:]) for k, r in got.items()}


@pytest.mark.podman
def test_history_stays_hidden(tmp_path_factory, tmp_path, podman_runtime):
    """An image whose future commits, tags, remote refs and packed refs hold the fix (the
    ``future`` case of tests/test_history_leaks.py): no agent command prints it."""
    with shared_store():  # built once, in the shared store (a fuse-overlayfs build is slow)
        image = _build(tmp_path_factory, "future", FUTURE_SH)
    copy_from_shared_store(image, tmp_path)
    _history_hunt("future", {"future": image}, tmp_path, podman_runtime)
