"""The ``ray`` sandbox backend (issue 25): verifier trials as Ray tasks, Podman on every node.

The cluster tests run a real local Ray cluster (head + worker nodes, ``ray.cluster_utils``)
and real trials in Podman, inside a loopback-only network namespace (``unshare -n``), so
every Ray address is 127.0.0.1 (see tests/ray_cluster_driver.py). All nodes share this
machine's one Podman, except node C, which gets its own image storage.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox import check_backend, make_runtime
from sandbox.ray_dispatch import RayOptions, choose_node

DRIVER = Path(__file__).resolve().parent / "ray_cluster_driver.py"
IMG = "localhost/task:1"
OTHER = "docker.io/swebench/sweb.eval.x86_64.a:latest"


def test_choose_node_prefers_holders_least_loaded_and_avoids_failed_nodes():
    index = {"A": [IMG], "B": [IMG, OTHER], "C": []}
    alive = ["A", "B", "C"]
    assert choose_node(IMG, alive, index, {"A": 2, "B": 1}) == "B"
    assert choose_node(IMG, alive, index, {"A": 0, "B": 3}) == "A"
    # names compared in canonical form; only B holds it
    assert choose_node("swebench/sweb.eval.x86_64.a", alive, index, {}) == "B"
    # equal load: holders take turns
    assert {choose_node(IMG, alive, index, {}, turn=t) for t in range(4)} == {"A", "B"}
    # a node that failed this trial is avoided while another holder remains
    assert choose_node(IMG, alive, index, {"B": 5}, avoid=["A"]) == "B"
    assert choose_node(IMG, ["A"], index, {}, avoid=["A"]) == "A"
    # dead holders and images nobody holds: no preference (SPREAD, pulled on the node)
    assert choose_node(OTHER, ["A", "C"], index, {}) is None
    assert choose_node("localhost/none:1", alive, index, {}) is None


def test_backend_choice_is_checked_naming_the_field(tmp_path):
    from ecredit_trl.config import ECreditConfig

    def cfg(**kw):
        return ECreditConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True,
                             bf16=False, **kw)

    c = cfg()
    assert (c.sandbox_backend, c.ray_address, c.sandbox_max_in_flight) == ("local", "auto", 24)
    c = cfg(sandbox_backend="ray", ray_address="10.0.0.5:6379", sandbox_max_in_flight=96)
    assert c.ray_options() == RayOptions(address="10.0.0.5:6379", max_in_flight=96)
    with pytest.raises(ValueError, match=r"^sandbox_backend: expected one of \('local', 'ray'\)"):
        cfg(sandbox_backend="k8s")
    with pytest.raises(ValueError, match="^sandbox_backend: ray runs every trial in Podman"):
        cfg(sandbox_backend="ray", runtime="local")
    # the endpoint list is retired (one scheduler): refused, naming the Ray settings
    with pytest.raises(ValueError, match=r"^verifier_endpoints: retired \(issue 25\).*"
                                         r"sandbox_backend=ray and ray_address=HEAD:PORT"):
        cfg(sandbox_backend="ray", verifier_endpoints=["ssh://u@h/run/podman/podman.sock"])
    with pytest.raises(ValueError, match="^sandbox_max_in_flight: must be an integer >= 1"):
        cfg(sandbox_backend="ray", sandbox_max_in_flight=0)
    with pytest.raises(ValueError, match="^ray_podman_url: must be a node-local unix://"):
        cfg(sandbox_backend="ray", ray_podman_url="ssh://u@h/run/podman/podman.sock")
    with pytest.raises(ValueError, match="^ray_address: empty"):
        RayOptions(address=" ")
    assert check_backend("local", "local") == "local"
    with pytest.raises(ValueError, match="^sandbox_backend: ray runs every trial"):
        make_runtime("local", backend="ray")  # refused before anything connects


def test_backend_options_reach_the_cli(tmp_path):
    from transformers import HfArgumentParser

    from ecredit_trl.config import ECreditConfig

    (c,) = HfArgumentParser(ECreditConfig).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--use_cpu", "true", "--bf16", "false",
         "--report_to", "none", "--sandbox_backend", "ray", "--ray_address", "auto",
         "--sandbox_max_in_flight", "8", "--ray_image_registry", "mirror.local:5000"])
    assert (c.sandbox_backend, c.sandbox_max_in_flight, c.ray_image_registry) == (
        "ray", 8, "mirror.local:5000")


def _unshare_ok() -> str | None:
    """Why the cluster tests cannot run here, or None."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install 'ecredit-trl[ray]')"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare/ip not found: the test cluster needs a loopback-only network namespace"
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare -n is not permitted here ({probe.stderr.strip()}): needs root"
    return None


def _in_namespace(*args: str, timeout: int) -> dict:
    """Run tests/ray_cluster_driver.py ``args`` inside ``unshare -n``; its JSON report
    (written to ``args[0]``)."""
    why = _unshare_ok()
    if why:
        pytest.skip(why)
    from sandbox.images import build_offline

    build_offline(log=lambda *_: None)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0",
               PYTHONPATH=os.pathsep.join([str(DRIVER.parents[1]),
                                           os.environ.get("PYTHONPATH", "")]))
    cmd = " ".join(["ip link set lo up && exec", sys.executable, str(DRIVER), *args])
    proc = subprocess.run(["unshare", "-n", "bash", "-c", cmd], capture_output=True,
                          text=True, env=env, timeout=timeout)
    out = Path(args[1] if args[0] in ("train", "cleanup", "tools") else args[0])
    assert proc.returncode == 0 and out.exists(), proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def cluster_report(tmp_path_factory):
    """The trial scenarios of the driver, run once for this module."""
    return _in_namespace(str(tmp_path_factory.mktemp("ray") / "report.json"), timeout=400)



@pytest.mark.podman
def test_ray_address_without_a_cluster_is_refused_not_started(cluster_report):
    if "no_cluster" not in cluster_report:
        pytest.skip("/tmp/ray/ray_current_cluster exists: 'auto' would find that cluster")
    assert cluster_report["no_cluster"].startswith("ray_address='auto': no Ray cluster")


@pytest.mark.podman
def test_trials_land_on_both_sandbox_nodes_and_never_on_the_head(cluster_report):
    nodes, r = cluster_report["nodes"], cluster_report["spread"]
    assert r["classes"] == ["ok"] * 4
    assert sorted(r["nodes"]) == sorted([nodes["a"]] * 2 + [nodes["b"]] * 2)
    assert nodes["head"] not in r["nodes"]
    assert r["index_nodes"] == sorted([nodes["a"], nodes["b"]])
    assert r["attempts"] == [1] * 4 and r["pulls"] == ["present"] * 4


@pytest.mark.podman
def test_cap_holds_across_two_ranks(cluster_report):
    r = cluster_report["cap"]
    assert r["mine"]["classes"] == ["ok"] * 3 and r["other"]["classes"] == ["ok"] * 3
    assert r["samples"] > 20
    assert r["max_running"] == 2  # never more than the cap of 2, and the cap was reached
    # both ranks used the run's one dispatcher (the other had detached when it was read)
    assert r["dispatcher"]["peak"] == 2 and r["dispatcher"]["attaches"] == 2
    # six trials of >= 3 s each through 2 slots: somebody waited, and it is on the record
    assert max(r["mine"]["queue_wait_s"] + r["other"]["queue_wait_s"]) > 2.0


@pytest.mark.podman
def test_gc_with_ray_address_cleans_a_left_run_on_the_nodes(cluster_report):
    r = cluster_report["gc"]
    assert len(r["before"]) == 1 and r["rc"] == 0
    assert "removed 1 container(s): " + r["before"][0] in r["stdout"]
    assert r["after"] == [] and not r["dispatcher_left"]
    assert r["class"] == "infra_error"  # the trial lost its container: never graded


@pytest.mark.podman
def test_killed_node_mid_trial_retries_on_the_other_node_and_is_graded(cluster_report):
    nodes, r = cluster_report["nodes"], cluster_report["kill"]
    assert len(r["running_before"]) == 1  # the container ran when node B was killed
    assert r["classes"] == ["ok"] and r["nodes"] == [nodes["a"]]
    assert r["attempts"] == [2]
    (err,) = r["errors"][0]
    assert err.startswith(f"ray: attempt on node {nodes['b'][:12]} lost: NodeDiedError")
    assert r["stats"]["node_failures"] == 1
    assert r["left_after_close"] == []  # the lost attempt's container is gone too


@pytest.mark.podman
def test_trials_prefer_the_node_holding_the_image_and_a_missing_one_is_pulled_once(
        cluster_report):
    nodes, r = cluster_report["nodes"], cluster_report["locality"]
    assert r["index_has_image"] == {nodes["a"]: True, r["c"]: False}
    # three concurrent trials, node C idle with 4 free slots: all on A, which holds the image
    assert r["near"]["classes"] == ["ok"] * 3 and r["near"]["nodes"] == [nodes["a"]] * 3
    # A gone: C pulls the image from the mirror for the first trial, holds it for the next
    assert r["far"]["classes"] == ["ok", "ok"] and r["far"]["nodes"] == [r["c"]] * 2
    assert r["far"]["pulls"] == ["pulled", "present"] and r["stats"]["pulls"] == 1


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.podman
@pytest.mark.slow
def test_main_job_arm_m_two_steps_and_eval_run_on_the_ray_backend(tmp_path):
    from ecredit_trl.policy.warmstart import ensure_default_policy
    from eval.splits import load_tasks

    ensure_default_policy(load_tasks("bundled:train", purpose="train"))  # cached, not timed
    runs = tmp_path / "runs"
    rep = _in_namespace("train", str(tmp_path / "train.json"), str(runs), timeout=1000)
    assert rep["rc"] == 0, rep["tail"]
    (run,) = list(runs.iterdir())
    cfg = json.loads((run / "config.json").read_text())["ecredit"]
    assert (cfg["sandbox_backend"], cfg["sandbox_max_in_flight"]) == ("ray", 3)
    ledger = _jsonl(run / "ledger.jsonl")
    assert [r["step"] for r in ledger] == [1, 2] and sum(r["infra_errors"] for r in ledger) == 0
    trajs = _jsonl(run / "trajectories.jsonl")
    trials = [t[k] for t in trajs for k in ("factual", "counterfactual") if t.get(k)]
    assert len(trials) >= len(trajs) == 8
    sandbox_nodes = {rep["nodes"]["a"], rep["nodes"]["b"]}
    # every trial names the sandbox node that served it; none ran on the trainer's head node
    assert {t["node"] for t in trials} <= sandbox_nodes
    assert all(t["image_pull"] == "present" for t in trials)
    assert sum(r["trials_counterfactual"] for r in ledger) >= 1
    # eval.run of the trained policy on the same cluster: every slot graded or explained,
    # each graded slot's trial served by a sandbox node
    ev = rep["eval"]
    assert ev["rc"] == 0, ev["tail"]
    assert len(ev["slots"]) == 2
    trial_nodes = [r["trial"]["node"] for r in ev["slots"] if r.get("trial")]
    assert trial_nodes and set(trial_nodes) <= sandbox_nodes
