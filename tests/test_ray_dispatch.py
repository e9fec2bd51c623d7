"""The ``ray`` sandbox backend: verifier trials as Ray tasks and agent workspaces on
Ray actors, Podman on every node.

The cluster tests run a real local Ray cluster (head + worker nodes, ``ray.cluster_utils``)
and real trials in Podman, inside a loopback-only network namespace (``unshare -n``), so
every Ray address is 127.0.0.1 (see tests/ray_cluster_driver.py). All nodes share this
machine's one Podman, except node C, which gets its own image storage. The main job runs
on the session's shared cluster (``ray_cluster``, tests/ray_namespace.py); the node-killing
scenarios and the authentication scenario keep clusters of their own (their fixtures say
why).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ray_namespace import in_namespace

from sandbox.backend import SandboxOptions, make_runtime
from sandbox.cluster.dispatch import RayOptions, choose_node

REPO_ROOT = Path(__file__).resolve().parent.parent

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


def test_snapshot_pack_carries_the_new_objects_and_loads_over_the_donor(tmp_path):
    """What crosses back from a node: a pack of the snapshot trees' objects minus S_0's;
    loaded over the trainer's copy of the task repository it yields the same artifact."""
    from sandbox.cluster.workspace_host import load_pack, snapshot_pack
    from sandbox.snapshots.snapshot import Snapshotter, artifact

    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "big.txt").write_text("".join(f"{i:x}{i * 7919 % 104729:x}\n"
                                          for i in range(5000)))  # barely compressible
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    work = tmp_path / "work"
    subprocess.run(["git", "clone", "-q", str(repo), str(work)], check=True)
    snap = Snapshotter(work, objects_from=repo)
    try:
        (work / "calc.py").write_text("def add(a, b):\n    return a + b\n")
        (work / "new.bin").write_bytes(bytes(range(256)))
        s1 = snap.snapshot()
        thin = snapshot_pack(snap.git_dir, [snap.base_tree, s1], [snap.base_tree])
        full = snapshot_pack(snap.git_dir, [snap.base_tree, s1], [])
        want = artifact(snap.git_dir, snap.base_tree, s1)
    finally:
        snap.close()
    assert 0 < len(thin) < 1000 < len(full)  # big.txt stays home
    got = load_pack(thin, tmp_path / "local", [repo / ".git" / "objects"])
    assert artifact(got, snap.base_tree, s1) == want and "GIT binary patch" in want
    assert snapshot_pack(tmp_path / "local", [], []) == b""


def test_an_exception_that_cannot_be_pickled_crosses_as_its_type_and_text():
    import threading

    from sandbox.cluster.workspace_host import portable

    class Holding(RuntimeError):
        def __init__(self, msg):
            super().__init__(msg)
            self.lock = threading.Lock()  # like an API error holding a live response

    ok = ValueError("plain")
    assert portable(ok) is ok
    out = portable(Holding("API down"))
    assert type(out) is RuntimeError and str(out).endswith("Holding: API down")


def test_backend_choice_is_checked_naming_the_field(tmp_path):
    from ecredit_trl.config import ECreditConfig

    def cfg(**kw):
        return ECreditConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True,
                             bf16=False, **kw)

    c = cfg()
    assert (c.sandbox_backend, c.ray_address, c.sandbox_max_in_flight) == ("local", "auto", 24)
    c = cfg(sandbox_backend="ray", ray_address="10.0.0.5:6379", sandbox_max_in_flight=96)
    assert c.ray_options() == RayOptions(address="10.0.0.5:6379", max_in_flight=96)
    with pytest.raises(ValueError, match=r"^--sandbox_backend 'k8s': not allowed \(not a choice\); "
                                           r"allowed: one of local, ray$"):
        cfg(sandbox_backend="k8s")
    with pytest.raises(ValueError, match="^sandbox_backend: ray runs every trial in Podman"):
        cfg(sandbox_backend="ray", runtime="local")
    # the endpoint list is retired (one scheduler): refused, naming the Ray settings
    with pytest.raises(ValueError, match=r"^verifier_endpoints: retired.*"
                                         r"--sandbox_backend ray --ray_address HEAD:PORT"):
        cfg(sandbox_backend="ray", verifier_endpoints=["ssh://u@h/run/podman/podman.sock"])
    with pytest.raises(ValueError, match=r"^--sandbox_max_in_flight 0: not allowed \(out of range\); "
                                         r"allowed: an integer >= 1$"):
        cfg(sandbox_backend="ray", sandbox_max_in_flight=0)
    with pytest.raises(ValueError, match='^ray_podman_url: expected "" or a node-local unix://'):
        cfg(sandbox_backend="ray", ray_podman_url="ssh://u@h/run/podman/podman.sock")
    with pytest.raises(ValueError, match="^ray_address: expected 'auto' or HOST:PORT"):
        SandboxOptions(backend="ray", ray_address=" ").validate()
    assert SandboxOptions(kind="local").validate() == SandboxOptions(kind="local")
    with pytest.raises(ValueError, match="^sandbox_backend: ray runs every trial"):
        # refused before anything connects
        make_runtime(SandboxOptions(kind="local", backend="ray"))


def test_backend_options_reach_the_cli(tmp_path):
    from transformers import HfArgumentParser

    from ecredit_trl.config import ECreditConfig

    (c,) = HfArgumentParser(ECreditConfig).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--use_cpu", "true", "--bf16", "false",
         "--report_to", "none", "--sandbox_backend", "ray", "--ray_address", "auto",
         "--sandbox_max_in_flight", "8", "--ray_image_registry", "mirror.local:5000"])
    assert (c.sandbox_backend, c.sandbox_max_in_flight, c.ray_image_registry) == (
        "ray", 8, "mirror.local:5000")
    assert c.ray_options().allow_unauthenticated is False  # refused unless asked for


def test_allowing_an_unauthenticated_cluster_is_one_explicit_flag_on_every_face(tmp_path):
    """``sandbox_allow_unauthenticated`` (trainer) / ``--sandbox-allow-unauthenticated``
    (CLIs) reaches the Ray options, and a child process's flags carry it (eval.run's rollout
    subprocess joins with the parent's setting); off by default everywhere."""
    import argparse

    from transformers import HfArgumentParser

    from ecredit_trl.config import ECreditConfig

    (c,) = HfArgumentParser(ECreditConfig).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--use_cpu", "true", "--bf16", "false",
         "--report_to", "none", "--sandbox_backend", "ray", "--ray_address", "127.0.0.1:6379",
         "--sandbox_allow_unauthenticated", "true"])
    assert c.ray_options() == RayOptions(address="127.0.0.1:6379", allow_unauthenticated=True)
    ap = argparse.ArgumentParser()
    SandboxOptions.add_args(ap)
    opts = SandboxOptions.from_args(ap.parse_args(c.sandbox_options().argv()))
    assert opts.allow_unauthenticated is True and opts.ray_options() == c.ray_options()
    plain = SandboxOptions.from_args(ap.parse_args(["--sandbox-backend", "ray"]))
    assert plain.allow_unauthenticated is False
    assert "--sandbox-allow-unauthenticated" not in plain.argv()


@pytest.fixture(scope="module")
def cluster_report(tmp_path_factory):
    """The trial scenarios of the driver, run once for this module, on a cluster of their
    own (not the session's): they kill nodes B, D and A mid-work, add node C with its own
    image storage and node E with a failing doctor report, and end with E alone."""
    return in_namespace(str(tmp_path_factory.mktemp("ray") / "report.json"), timeout=600)



@pytest.mark.podman
def test_ray_address_without_a_cluster_is_refused_not_started(cluster_report):
    if "no_cluster" not in cluster_report:
        pytest.skip("/tmp/ray/ray_current_cluster exists: 'auto' would find that cluster")
    seen = cluster_report["gcs_seen"]
    if seen is None:  # nothing to find: Ray's own refusal, with how to start a cluster
        assert cluster_report["no_cluster"].startswith("ray_address='auto': no Ray cluster")
    else:  # a GCS in the process table that this namespace cannot reach: named, not joined
        assert cluster_report["no_cluster"].startswith(
            f"ray_address='auto': the GCS at {seen} did not answer")


@pytest.mark.podman
def test_trials_land_on_both_sandbox_nodes_and_never_on_the_head(cluster_report):
    # the cluster every scenario ran on enforces token authentication (its GCS refuses a
    # call without the token), and the backend connected with the token
    assert cluster_report["auth_mode"] == "token"
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


@pytest.mark.podman
def test_a_rollout_workspace_lands_on_a_sandbox_node_and_its_tool_calls_run_there(
        cluster_report):
    nodes, r = cluster_report["nodes"], cluster_report["workspaces"]["remote"]
    assert r["setup_error"] is None and r["failure"] is None
    assert r["statuses"] == ["ok"] * 6
    # the host actor that ran every call is on a node offering a sandbox label, not the head
    assert r["node"] in (nodes["a"], nodes["b"]) and r["node"] != nodes["head"]
    assert r["labels"][r["node"]] in (["node_a"], ["node_b"])
    assert r["ws_stats"]["by_node"] == {r["node"]: 1}
    # the command ran in the run's container (made by that node's Podman service)
    assert r["bash"] == "42\n" and "     2\t    return a - b\n" in r["view"]
    assert len(r["held"]["containers"]) == 1 and "-agent-" in r["held"]["containers"][0]
    assert r["held"]["host_spaces"] == 1
    # 6 tool calls + 6 snapshots = 12 actor calls; the slot was held and given back
    assert r["stats"]["calls"] == 12 and r["dispatcher"]["peak"] == 1
    assert r["dispatcher"]["in_flight"] == 0 and r["left"] == []


@pytest.mark.podman
def test_a_remote_rollout_brings_back_what_the_local_backend_records(cluster_report):
    """Same scripted episode, workspace on a node vs on this host: the same trees, per-turn
    writes, selection, final and ablated artifacts (through one pack of the new objects)."""
    r = cluster_report["workspaces"]
    remote, local = r["remote"], r["local"]
    for key in ("statuses", "snaps", "writes", "artifact", "final_artifact",
                "ablated_artifact", "selected_turn"):
        assert remote[key] == local[key], key
    assert len(set(remote["snaps"])) == 4  # S_0..S_3 all differ
    assert "+    return a + b" in remote["artifact"] and "more.txt" in remote["artifact"]
    assert remote["selected_turn"] is not None and remote["ablated_artifact"] is not None
    assert 0 < remote["stats"]["pack_bytes"] < 4096  # the new objects only, not the repo


@pytest.mark.podman
def test_an_image_held_task_on_a_node_brings_back_what_the_local_backend_records(
        cluster_report):
    """No repo_dir: the node builds S_0 from the task image itself and the pack carries every
    object (the trainer holds none of the image's); the records equal the local backend's."""
    nodes, r = cluster_report["nodes"], cluster_report["ws_image"]
    remote, local = r["remote"], r["local"]
    assert remote["failure"] is None and remote["node"] in (nodes["a"], nodes["b"])
    for key in ("statuses", "snaps", "writes", "artifact", "final_artifact",
                "ablated_artifact", "selected_turn"):
        assert remote[key] == local[key], key
    assert remote["statuses"] == ["ok"] * 6 and "+    return a + b" in remote["artifact"]
    assert remote["stats"]["pack_bytes"] > 0


@pytest.mark.podman
def test_cap_counts_agent_sandboxes_and_trials_together(cluster_report):
    r = cluster_report["ws_cap"]
    assert r["classes"] == ["ok"] * 3 and r["samples"] > 40
    assert r["sandbox_seen"] == 1  # the agent container was up for the whole first part
    assert r["max_while_sandbox"] == 2  # it + one trial: the cap of 2 held both kinds
    assert r["max_running"] == 2 and r["agents_after"] == 0
    assert r["dispatcher"]["peak"] == 2 and r["dispatcher"]["in_flight"] == 0
    # a third sandbox of the same rank under a cap of 2: refused at once (a wait could only
    # deadlock: its slots free when this rank's episodes end), infrastructure, by reason
    first, third = r["refused"]["failures"]
    assert first is None and third[0] == "sandbox_setup"
    assert third[1].startswith("ray: sandbox_max_in_flight=2 is held by this rank's 2 open")
    assert r["refused"]["seconds"] < 30


@pytest.mark.podman
def test_node_killed_mid_episode_excludes_its_rollout_as_infra_and_the_rest_goes_on(
        cluster_report):
    nodes, r = cluster_report["nodes"], cluster_report["ws_kill"]
    assert r["nodes"] == [r["d"], nodes["a"]]
    lost = f"WorkspaceLost: ray: node {r['d'][:12]} lost mid-episode ("
    assert r["out"].startswith(f"ERROR: the sandbox failed ({lost}")
    assert r["statuses"] == ["ok", "infra", "ended"]  # later calls refused, still recorded
    assert r["failure"][0] == "sandbox_error" and r["failure"][1].startswith(lost)
    # infrastructure, never the policy's: excluded by reason (a ledger guard exclusion)
    assert r["failure_class"] is None and r["evidence"]["node_lost"] == r["d"]
    assert r["exclusion"] == "sandbox_error" and r["guard"] and r["lost_count"] == 1
    assert r["lost_after_s"] < 60  # noticed when the node went, not at the call's deadline
    # the rollout on node A finished and its artifact came back
    assert r["survivor_failure"] is None
    assert r["survivor_artifact"].endswith("+x = 1\n+z\n")


@pytest.mark.podman
def test_a_node_where_a_rule_did_not_hold_is_refused_or_serves_marked(cluster_report):
    """The gate (design page, "Threat model"): node E's doctor report has ``oom_record``
    not held. By default E is refused: not among the serving nodes, and a trial whose image
    only E is listed as holding lands on a serving node instead. With ``allow_unheld`` E
    serves, and its trial carries the rule it lacks, counted under ``node_rule_unheld``.
    With E the only sandbox node left the backend does not start, naming E's reason, and
    ``python -m sandbox doctor --ray-address`` reports E's probes (run on E)."""
    r = cluster_report["gate"]
    e, refused, allowed = r["e"], r["allow_False"], r["allow_True"]
    why = ("refused: rules not held here: oom_record: the kernel log (/dev/kmsg) holds no "
           "CONSTRAINT_MEMCG record naming the container's cgroup")
    assert e not in refused["alive"] and refused["alive"]
    assert refused["refused"] == {e: why} and refused["unheld"] == {}
    assert refused["class"] == "ok" and refused["node"] in refused["alive"]
    assert refused["node_unheld"] == [] and refused["counted"] == 0
    assert e in allowed["alive"] and allowed["refused"] == {}
    assert allowed["unheld"] == {e: ["oom_record"]}
    assert (allowed["class"], allowed["node"]) == ("ok", e)
    assert allowed["node_unheld"] == ["oom_record"] and allowed["counted"] == 1
    assert r["none_serve"].startswith("every sandbox node was refused by its gate (node "
                                      f"{e[:12]}: {why})")
    # `python -m sandbox doctor --ray-address`: E's agent probes run on E, all held
    # and the cluster's Ray authentication mode, token (the test clusters' setting): held
    cli = r["cli"]
    assert cli["rc"] == 0, cli["tail"]
    assert (cli["reports"]["auth_mode"], cli["reports"]["auth_held"]) == ("token", True)
    nodes = cli["reports"]["nodes"]
    assert list(nodes) == [e] and nodes[e]["held"] is True
    assert [p["name"] for p in nodes[e]["probes"]] == [
        "pids", "fork_bomb", "exhaustion_evidence", "memory_running", "oom_record",
        "memory_stopped", "disk", "history", "overlay_opacity"]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.podman
@pytest.mark.slow
def test_main_job_arm_m_two_steps_and_eval_run_on_the_ray_backend(tmp_path, ray_cluster):
    """On the session's cluster (the job adds no node and kills none): the workspace hosts
    it counts are the ones this job and its eval.run made (those of earlier scenarios on the
    same cluster are subtracted in the driver)."""
    from ecredit_trl.policy.warmstart import ensure_default_policy
    from eval.tasks.splits import load_tasks

    ensure_default_policy(load_tasks("bundled:train", purpose="train"))  # cached, not timed
    runs = tmp_path / "runs"
    rep = ray_cluster.run("train", str(tmp_path / "train.json"), str(runs), timeout=1000)
    assert rep["rc"] == 0, rep["tail"]
    (run,) = list(runs.iterdir())
    cfg = json.loads((run / "config.json").read_text())["ecredit"]
    # 6: the 4 agent sandboxes of a round hold slots too (the cap counts both kinds)
    assert (cfg["sandbox_backend"], cfg["sandbox_max_in_flight"]) == ("ray", 6)
    # the run used a token cluster: the recorded config says no exception was allowed
    assert cfg["sandbox_allow_unauthenticated"] is False
    ledger = _jsonl(run / "ledger.jsonl")
    assert [r["step"] for r in ledger] == [1, 2] and sum(r["infra_errors"] for r in ledger) == 0
    # the recorded image digests are read from the sandbox nodes' storage (no local check)
    images = json.loads((run / "manifest.json").read_text())["images"]
    assert images and all(str(v).startswith("sha256:") for v in images.values()), images
    trajs = _jsonl(run / "trajectories.jsonl")
    trials = [t[k] for t in trajs for k in ("factual", "counterfactual") if t.get(k)]
    assert len(trials) >= len(trajs) == 8
    sandbox_nodes = {rep["nodes"]["a"], rep["nodes"]["b"]}
    # every trial names the sandbox node that served it; none ran on the trainer's head node
    assert {t["node"] for t in trials} <= sandbox_nodes
    # the rollouts' workspaces were hosted on sandbox nodes too (one host per node used)
    assert rep["hosts_train"] and set(rep["hosts_train"]) <= sandbox_nodes
    assert all(t["image_pull"] == "present" for t in trials)
    assert sum(r["trials_counterfactual"] for r in ledger) >= 1
    # eval.run of the trained policy on the same cluster: every slot graded or explained,
    # each graded slot's trial served by a sandbox node
    ev = rep["eval"]
    assert ev["rc"] == 0, ev["tail"]
    assert len(ev["slots"]) == 2
    trial_nodes = [r["trial"]["node"] for r in ev["slots"] if r.get("trial")]
    assert trial_nodes and set(trial_nodes) <= sandbox_nodes
    # eval.run's rollout subprocess hosted its agent sandboxes on sandbox nodes as well (it
    # joined the evaluation's dispatcher): host actors beyond the trainer's, none on the head
    eval_hosts = list(rep["hosts_all"])
    for h in rep["hosts_train"]:
        eval_hosts.remove(h)
    assert eval_hosts and set(eval_hosts) <= sandbox_nodes


def test_an_address_nothing_listens_on_is_one_line_at_once_and_starts_nothing(tmp_path):
    """``--ray_address HOST:PORT`` with no cluster there: ``ray.init`` alone retried it for
    minutes (a new user saw Ray's GCS retry loop and no error after 5 min). Now train.py and
    eval.run refuse in one ``error:`` line, exit 2, before any warm start or run directory,
    and no Ray process is left."""
    import time

    env = dict(os.environ, HF_HUB_OFFLINE="1")
    cmds = {"train": [sys.executable, "ecredit_trl/train.py", "--arm", "M", "--sandbox_backend",
                      "ray", "--ray_address", "127.0.0.1:1", "--output_dir", str(tmp_path / "runs"),
                      "--report_to", "none"],
            "eval": [sys.executable, "-m", "eval.run", "--split", "bundled:holdout", "--n", "1",
                     "--out", str(tmp_path / "ev"), "--sandbox-backend", "ray",
                     "--ray-address", "127.0.0.1:1"]}
    for name, cmd in cmds.items():
        t0 = time.monotonic()
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, env=env,
                              timeout=300)
        assert time.monotonic() - t0 < 120, name
        assert proc.returncode == 2, (name, proc.stderr[-2000:])
        lines = [x for x in proc.stderr.splitlines() if "error:" in x]
        assert len(lines) == 1 and "Traceback" not in proc.stderr, (name, proc.stderr[-2000:])
        assert "ray_address='127.0.0.1:1': nothing answers at 127.0.0.1:1" in lines[0], name
    assert not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def auth_report(tmp_path_factory):
    """The token-authentication scenario of the driver (the scale-out page's commands), on
    clusters of its own: the page's `ray start` commands, and a head without token
    authentication (a mode the session's cluster must never have)."""
    work = tmp_path_factory.mktemp("rayauth")
    return in_namespace("auth", str(work / "auth.json"), str(work), timeout=900)


FIX = ("make a token with `ray get-auth-token --generate` (it writes ~/.ray/auth_token), copy "
       "that file to every node, and start every node (`ray start`) and the trainer with "
       "RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=<the token file>; docs/scale-out.md")


@pytest.mark.podman
def test_the_docs_token_cluster_refuses_a_client_without_its_token(auth_report):
    """The scale-out page's commands (run as written, HEAD = 127.0.0.1) start a head and a
    sandbox node with token authentication, the dashboard on loopback and the token a
    mode-600 file named by RAY_AUTH_TOKEN_PATH. A GCS call without the token is refused
    (UNAUTHENTICATED); the backend refuses at once, in one line naming the fix, without a
    token and with a wrong one; with the token it connects and sees the sandbox node."""
    r = auth_report
    assert r["start_rc"] == 0, r["start_tail"]
    block = r["block"]
    assert "ray get-auth-token --generate" in block
    assert "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=/etc/ray/auth_token" in block
    assert block.count("--dashboard-host 127.0.0.1") == 1 and "RAY_AUTH_TOKEN=" not in block
    assert r["token_mode"] == "0o600"
    assert r["probe_no_token"] == "token"
    nt, wt = r["no_token"], r["wrong_token"]
    assert nt["rc"] == 0 and wt["rc"] == 0, (nt["tail"], wt["tail"])
    assert nt["out"] == ("ray_address='127.0.0.1:6379': the Ray cluster requires its token and "
                         "this process has none (RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH "
                         "unset or the file missing); " + FIX)
    assert wt["out"] == ("ray_address='127.0.0.1:6379': the Ray cluster refuses this "
                         "process's token (not the one the cluster was started with); " + FIX)
    assert nt["seconds"] < 10 and wt["seconds"] < 10  # not ray.init's minute of retries
    assert r["with_token"] == {"rc": 0, "out": "1", "tail": r["with_token"]["tail"]}


@pytest.mark.podman
def test_a_cluster_without_token_auth_is_refused_in_one_line_and_nothing_is_written(
        auth_report):
    """A head started with RAY_AUTH_MODE=disabled: train.py and eval.run (which hold the
    token) stop with exit 2 and one ``error:`` line naming the variable and the command that
    makes a token, before any warm start, run directory or eval output;
    ``--sandbox-allow-unauthenticated`` connects; the doctor reports the mode, a failed
    check (its nodes not probed) unless allowed."""
    r = auth_report
    assert r["probe_open"] == "disabled"
    want = ("ray_address='127.0.0.1:6380': the Ray cluster does not enforce token "
            "authentication, so anyone who reaches its ports can run code on its nodes; "
            "refused (to allow it on a loopback-only test cluster: "
            "--sandbox-allow-unauthenticated); " + FIX)
    for name, ref in r["refusals"].items():
        lines = [x for x in ref["stderr"].splitlines() if "error:" in x]
        assert ref["rc"] == 2 and len(lines) == 1, (name, ref["stderr"])
        assert lines[0].endswith(want) and "Traceback" not in ref["stderr"], (name, lines)
        assert ref["written"] is False, name
    assert r["allowed"]["out"] == "connected", r["allowed"]
    # the doctor: a failed check, and no node probed; allowed, the check passes (this head
    # offers no sandbox node, so the doctor still exits 1 for want of a node report)
    refused, allowed = r["doctor_open"]["False"], r["doctor_open"]["True"]
    assert refused["rc"] == 1 and refused["stdout"].splitlines() == [
        "cluster: ray_auth_mode=disabled: FAILED anyone who reaches the cluster's ports can "
        "run code on its nodes (its nodes were not probed); " + FIX], refused
    assert allowed["rc"] == 1 and allowed["stdout"].splitlines() == [
        "cluster: ray_auth_mode=disabled: allowed (--sandbox-allow-unauthenticated)"], allowed
