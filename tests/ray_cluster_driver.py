"""Driver of the Ray backend tests (tests/test_ray_dispatch.py), run *inside* ``unshare -n``.

Started as ``unshare -n bash -c 'ip link set lo up; exec python tests/ray_cluster_driver.py
OUT.json'`` so every Ray address is 127.0.0.1 (a loopback-only network namespace: nothing
binds or connects to another address). It starts a local cluster with
``ray.cluster_utils.Cluster`` — a head node without the sandbox resource (the trainer's
node) and worker nodes with it plus a ``node_<x>`` label resource — runs real verifier
trials in Podman through :class:`sandbox.cluster.trials.RayTrials` and real agent rollouts whose
workspaces live on the nodes (:mod:`sandbox.cluster.workspace_host`: placement, the same records as
the local backend, the shared cap, a node killed mid-episode) and writes what it saw as
JSON; the test asserts on it. ``ECREDIT_RAY_ONLY=a,b`` runs a subset (development only). All nodes share this machine's one Podman, except node C,
whose Ray workers get their own storage (``CONTAINERS_STORAGE_CONF``) so it truly lacks the
image. ``python ray_cluster_driver.py rank ADDRESS RUN_ID CAP N`` is a second Accelerate
rank stand-in (another process and Ray job) attaching to the same run's dispatcher.
``serve READY.json`` holds the session's shared cluster (tests/ray_namespace.py); the
``cleanup``, ``tools`` and ``train`` scenarios join its namespace (``nsenter -n``) and run on
it; the default scenario set and ``auth`` start clusters of their own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import make_tar  # noqa: E402
from test_sandbox_podman import CALC, EVAL, TESTS  # noqa: E402

from eval.integrity.retry import RetryPolicy  # noqa: E402
from sandbox.cluster.auth import gcs_address_of  # noqa: E402
from sandbox.cluster.dispatch import (  # noqa: E402
    RayOptions,
    RayUnavailable,
    cluster_auth_mode,
    connect,
)
from sandbox.cluster.trials import RayTrials  # noqa: E402
from sandbox.doctor.facts import facts_key, host_facts  # noqa: E402
from sandbox.doctor.gate import NODE_UNHELD, save_report  # noqa: E402
from sandbox.images import default_image  # noqa: E402
from sandbox.runtimes.podman_runtime import RUN_LABEL, podman_env  # noqa: E402
from sandbox.trials.pool import VerifierPool  # noqa: E402
from sandbox.trials.trial import TrialSpec


def spec(trial_id: str, image: str, sleep: float = 0) -> TrialSpec:
    """The calc trial of tests/test_sandbox_podman.py (graded ``ok``), ``sleep`` s longer."""
    script = (f"sleep {sleep}\n" if sleep else "") + EVAL
    return TrialSpec(trial_id=trial_id, image=image, eval_script=script, timeout_s=120,
                     repo_archive=make_tar({"calc.py": CALC, "test_calc.py": TESTS}))


def containers(run_id: str, all_states: bool = False) -> list[str]:
    """Names of the run's containers in the shared Podman (running only, unless all)."""
    cmd = ["podman", "ps", *(["-a"] if all_states else []), "--filter",
           f"label={RUN_LABEL}={run_id}", "--format", "{{.Names}}"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=podman_env())
    return out.stdout.split()


def summary(results) -> dict:
    return {"classes": [r.exit_class for r in results], "nodes": [r.node for r in results],
            "attempts": [r.attempts for r in results],
            "errors": [r.retried_errors for r in results],
            "pulls": [r.image_pull for r in results],
            "queue_wait_s": [round(r.queue_wait_s, 4) for r in results]}


def spread(address: str, image: str) -> dict:
    """Four concurrent trials with both sandbox nodes holding the image."""
    rt = RayTrials(f"rt-spread-{os.getpid()}", RayOptions(address=address, max_in_flight=4))
    try:
        with VerifierPool(rt, max_concurrency=4, retry=RetryPolicy()) as pool:
            out = summary(pool.map([spec(f"spread{i}", image) for i in range(4)]))
        out["index_nodes"] = sorted(n for n, imgs in rt._index.items() if imgs)
    finally:
        rt.close()
    return out


def cap(address: str, image: str, driver: str) -> dict:
    """Two ranks (this process and a child process) × 3 trials of 3 s under a cap of 2,
    ``podman ps`` sampled every 0.1 s."""
    run_id = f"rt-cap-{os.getpid()}"
    rt = RayTrials(run_id, RayOptions(address=address, max_in_flight=2))
    seen: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen.append(len(containers(run_id)))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    child = subprocess.Popen([sys.executable, driver, "rank", address, run_id, "2", "3"],
                             stdout=subprocess.PIPE, text=True)
    try:
        with VerifierPool(rt, max_concurrency=3, retry=RetryPolicy()) as pool:
            mine = summary(pool.map([spec(f"cap{i}", image, sleep=3) for i in range(3)]))
        other = json.loads(child.communicate(timeout=240)[0].strip().splitlines()[-1])
        stats = rt.dispatcher_stats()
    finally:
        done.set()
        sampler.join()
        rt.close()
    return {"mine": mine, "other": other, "max_running": max(seen), "samples": len(seen),
            "dispatcher": stats}


def rank(address: str, run_id: str, cap_n: int, n: int) -> None:
    """A second rank: ``n`` trials through the same run's dispatcher; prints its summary."""
    rt = RayTrials(run_id, RayOptions(address=address, max_in_flight=cap_n))
    try:
        with VerifierPool(rt, max_concurrency=n, retry=RetryPolicy()) as pool:
            out = summary(pool.map([spec(f"rank{i}", image=default_image(), sleep=3)
                                    for i in range(n)]))
    finally:
        rt.close()
    print(json.dumps(out))


def kill(cluster, address: str, image: str, a, b) -> dict:
    """A trial placed on node B; node B is killed while its container runs."""
    run_id = f"rt-kill-{os.getpid()}"
    rt = RayTrials(run_id, RayOptions(address=address, max_in_flight=4))
    rt.choose = lambda spec, load: b.node_id  # place the first attempt on B (soft)
    try:
        with VerifierPool(rt, max_concurrency=1, retry=RetryPolicy(max_retries=1)) as pool:
            fut = pool.submit(spec("killed", image, sleep=6))
            deadline = time.monotonic() + 90
            while not containers(run_id) and time.monotonic() < deadline:
                time.sleep(0.1)
            running_before = containers(run_id)
            cluster.remove_node(b, allow_graceful=False)
            res = fut.result(timeout=180)
        out = summary([res])
        out.update(running_before=running_before, stats=dict(rt.stats))
    finally:
        rt.close()
    out["left_after_close"] = containers(run_id, all_states=True)
    return out


def locality(cluster, address: str, image: str, a, store: Path, mirror: Path) -> dict:
    """Node C (own storage, no image) joins next to A (holds it): trials prefer A; with A
    gone, C pulls the image from a local docker-archive mirror, once."""
    from sandbox.images.pull import archive_name

    subprocess.run(["podman", "save", "--format", "docker-archive", "-o",
                    str(mirror / f"{archive_name(image)}.tar"), image], check=True,
                   capture_output=True, env=podman_env())
    c = cluster.add_node(num_cpus=1, resources={"ecredit_sandbox": 4, "node_c": 1},
                         env_vars={"CONTAINERS_STORAGE_CONF": str(store / "storage.conf")})
    cluster.wait_for_nodes()
    rt = RayTrials(f"rt-loc-{os.getpid()}", RayOptions(
        address=address, max_in_flight=4, registry=f"docker-archive:{mirror}"))
    try:
        index = {n: bool(imgs) for n, imgs in rt._index.items()}
        with VerifierPool(rt, max_concurrency=3, retry=RetryPolicy()) as pool:
            near = summary(pool.map([spec(f"near{i}", image) for i in range(3)]))
        cluster.remove_node(a, allow_graceful=False)
        rt._nodes = (0.0, [])  # read the live nodes now, not after the TTL
        with VerifierPool(rt, max_concurrency=1, retry=RetryPolicy()) as pool:
            far = summary([pool.submit(spec(f"far{i}", image)).result() for i in range(2)])
        stats = dict(rt.stats)
    finally:
        rt.close()
    return {"index_has_image": index, "near": near, "far": far, "stats": stats,
            "c": c.node_id}


def gc_cli(address: str, image: str) -> dict:
    """A run left behind (as by a killed trainer: a container running, the dispatcher
    alive): ``python -m sandbox gc --ray-address`` from another process cleans it."""
    import ray

    from sandbox.cluster.dispatch import NAMESPACE, dispatcher_name

    run_id = f"rt-gc-{os.getpid()}"
    rt = RayTrials(run_id, RayOptions(address=address, max_in_flight=2))
    pool = VerifierPool(rt, max_concurrency=1, retry=RetryPolicy(max_retries=0))
    fut = pool.submit(spec("orphan", image, sleep=60))
    deadline = time.monotonic() + 90
    while not containers(run_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    before = containers(run_id)
    proc = subprocess.run([sys.executable, "-m", "sandbox", "gc", "--ray-address", address,
                           "--run-id", run_id, "--no-temp"], capture_output=True, text=True,
                          timeout=120)
    res = fut.result(timeout=120)
    try:
        ray.get_actor(dispatcher_name(run_id), namespace=NAMESPACE)
        dispatcher_left = True
    except ValueError:
        dispatcher_left = False
    pool.close()
    rt.close()
    return {"before": before, "rc": proc.returncode, "stdout": proc.stdout,
            "after": containers(run_id, all_states=True), "class": res.exit_class,
            "dispatcher_left": dispatcher_left}


def calc_repo(root: Path):
    """A one-file repository whose ``add`` subtracts (tests/conftest.py's ``calc_task``)."""
    from conftest import AgentTask, git

    repo = root / "calc-origin"
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "test_calc.py").write_text(TESTS)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    return AgentTask("demo__calc-1", str(repo), git(repo, "rev-parse", "HEAD"), default_image())


def scripted_episode(runtime, task, workroot: Path, hold=None) -> dict:
    """One scripted rollout (view, fix, a bash-made file, a test edit, submit) through
    ``SWEAgentEnv`` on ``runtime``, then the trainer's own records of it: per-turn writes,
    the query plan (selection, final and ablated artifacts). ``hold(env)`` runs after turn
    2 (a check while the container is up)."""
    from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release, release_sandbox
    from ecredit_trl.credit.planning import plan_query, turn_snapshots
    from ecredit_trl.credit.trajectory import turn_writes
    from sandbox.snapshots.snapshot import artifact

    ctx = AgentContext(tasks={task.instance_id: task}, runtime=runtime,
                       workroot=str(workroot))
    env = SWEAgentEnv(ctx)
    env.reset(instance_id=task.instance_id)
    out: dict = {"setup_error": env.setup_error}
    try:
        ctx.turn = 1
        out["view"] = env.view("calc.py")
        env.str_replace("calc.py", "a - b", "a + b")
        ctx.turn = 2
        out["bash"] = env.bash("printf 'x\\n' > notes.txt && python3 -c 'print(6*7)'")
        held = hold(env) if hold else None
        ctx.turn = 3
        env.insert("test_calc.py", 0, "# checked\n")
        env.bash("rm notes.txt && printf 'y\\n' > more.txt")
        env.submit()
        release_sandbox(env)
        calls = list(env.calls)
        snaps = turn_snapshots(env.base_tree, [c.turn for c in calls],
                               [c.tree for c in calls], 3)
        plan = plan_query(env.snapshot_repo, snaps, task_id=task.instance_id, rollout_index=0,
                          run_seed=7, test_patterns=("test_*.py",), format_error=False)
        out.update(
            failure=env.failure, statuses=[c.status for c in calls], snaps=snaps,
            writes=turn_writes(env.snapshot_repo, snaps),
            artifact=artifact(env.snapshot_repo, env.base_tree, env.final_tree),
            final_artifact=plan.final_artifact, ablated_artifact=plan.ablated_artifact,
            selected_turn=plan.selection.selected_turn, held=held,
            node=getattr(env.ws, "node", None), stats=dict(getattr(env.ws, "stats", {})))
    finally:
        release(env)
        ctx.close()
    return out


def node_labels() -> dict:
    """node id → its ``node_<x>`` label resource (what placement is checked against)."""
    import ray

    return {n["NodeID"]: sorted(k for k in n["Resources"] if k.startswith("node_") and
                                not k.startswith("node:"))
            for n in ray.nodes() if n.get("Alive")}


def workspaces(address: str, root: Path) -> dict:
    """The same scripted episode with its workspace on a sandbox node (ray backend) and on
    this host (local Podman); where it ran, what came back, the bytes and seconds per call."""
    from sandbox.cluster.trials import RayRoutedRuntime
    from sandbox.runtimes.podman_runtime import PodmanRuntime

    task = calc_repo(root / "ws")
    run_id = f"rt-ws-{os.getpid()}"
    rr = RayRoutedRuntime(run_id=run_id, options=RayOptions(address=address, max_in_flight=4))
    try:
        def hold(env):  # while the container is up: it is this run's, on the node's Podman
            return {"containers": containers(run_id),
                    "host_spaces": rr.trials.ray.get(env.ws.host.count.remote())}
        remote = scripted_episode(rr, task, root / "ws-wr-ray", hold)
        remote["labels"] = node_labels()
        remote["left"] = containers(run_id, all_states=True)
        remote["ws_stats"] = dict(rr.workspaces.stats)
        remote["dispatcher"] = rr.trials.dispatcher_stats()
    finally:
        rr.close()
    local_rt = PodmanRuntime(run_id=f"ws-local-{os.getpid()}")
    try:
        local = scripted_episode(local_rt, task, root / "ws-wr-local")
    finally:
        local_rt.close()
    return {"remote": remote, "local": local}


def image_task(root: Path):
    """An image-held task (no ``repo_dir``): the offline image plus /testbed = a git repo
    with history, the calc module and its tests, and an untracked file."""
    from types import SimpleNamespace

    from conftest import git

    ctx = root / "imgctx"
    repo = ctx / "testbed"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "pristine")  # history holding the fix: never shown
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "test_calc.py").write_text(TESTS)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    (repo / "NOTES.txt").write_text("untracked, not ignored\n")
    (ctx / "Containerfile").write_text(f"FROM {default_image()}\nCOPY testbed /testbed\n"
                                       "WORKDIR /testbed\n")
    name = f"localhost/ecredit-raytest-imagetask:{os.getpid()}"
    subprocess.run(["podman", "build", "-q", "--pull=never", "--network=none", "--ulimit",
                    "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "-t", name, str(ctx)],
                   check=True, capture_output=True, env=podman_env())
    return SimpleNamespace(instance_id="demo__calc-img-1", repo_dir=None, image=name,
                           base_commit=git(repo, "rev-parse", "HEAD"), workdir="/testbed",
                           checkout_base=False)


def ws_image(address: str, root: Path) -> dict:
    """The scripted episode on an image-held task, workspace on a node vs on this host."""
    from sandbox.cluster.trials import RayRoutedRuntime
    from sandbox.runtimes.podman_runtime import PodmanRuntime

    task = image_task(root / "img")
    try:
        rr = RayRoutedRuntime(run_id=f"rt-wsimg-{os.getpid()}",
                              options=RayOptions(address=address, max_in_flight=4))
        try:
            remote = scripted_episode(rr, task, root / "img-wr-ray")
        finally:
            rr.close()
        local_rt = PodmanRuntime(run_id=f"ws-imglocal-{os.getpid()}")
        try:
            local = scripted_episode(local_rt, task, root / "img-wr-local")
        finally:
            local_rt.close()
    finally:
        subprocess.run(["podman", "rmi", "-f", task.image], capture_output=True,
                       env=podman_env())
    return {"remote": remote, "local": local}


def ws_cap(address: str, image: str, root: Path) -> dict:
    """Cap 2 shared by one agent sandbox and three trials of 3 s (same run): while the
    sandbox's container is up only one trial runs; ``podman ps`` sampled every 0.1 s."""
    from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release
    from sandbox.cluster.trials import RayRoutedRuntime

    task = calc_repo(root / "cap")
    run_id = f"rt-wscap-{os.getpid()}"
    rr = RayRoutedRuntime(run_id=run_id, options=RayOptions(address=address, max_in_flight=2))
    seen: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            names = containers(run_id)
            seen.append((time.monotonic(), len(names), sum("-agent-" in n for n in names)))
            time.sleep(0.1)

    ctx = AgentContext(tasks={task.instance_id: task}, runtime=rr, workroot=str(root / "cw"))
    env = SWEAgentEnv(ctx)
    sampler = threading.Thread(target=sample, daemon=True)
    try:
        env.reset(instance_id=task.instance_id)
        ctx.turn = 1
        env.bash("true")
        # this rank alone filling the cap: the next reset is refused at once, never a wait
        extra = [SWEAgentEnv(ctx), SWEAgentEnv(ctx)]
        t0 = time.monotonic()
        for e in extra:
            e.reset(instance_id=task.instance_id)
        refused = {"failures": [e.failure for e in extra],
                   "seconds": round(time.monotonic() - t0, 2)}
        for e in extra:
            release(e)
        sampler.start()
        with VerifierPool(rr, max_concurrency=3, retry=RetryPolicy()) as pool:
            futs = [pool.submit(spec(f"wscap{i}", image, sleep=3)) for i in range(3)]
            time.sleep(8)  # the sandbox holds one slot meanwhile
            released_at = time.monotonic()
            env.submit()  # the episode ends: its container and slot go
            classes = [f.result(timeout=240).exit_class for f in futs]
        time.sleep(1)  # releases are fire-and-forget actor calls
        stats = rr.trials.dispatcher_stats()
    finally:
        done.set()
        release(env)
        rr.close()
        ctx.close()
    held = [(n, agents) for t, n, agents in seen if t < released_at]
    return {"classes": classes, "samples": len(seen), "max_running": max(n for _, n, _ in seen),
            "max_while_sandbox": max(n for n, _ in held),
            "sandbox_seen": min(agents for _, agents in held),
            "agents_after": max(agents for t, _, agents in seen if t > released_at + 1),
            "refused": refused,
            "dispatcher": stats}


def ws_kill(cluster, address: str, root: Path, a) -> dict:
    """Two rollouts: one placed on a new node D, one on A. D is killed while the first
    runs a command: that rollout ends as an infrastructure failure naming D and is excluded
    by the trainer's rule; the other finishes and is planned as usual."""
    from types import SimpleNamespace

    from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release
    from ecredit_trl.agent.failures import apply_episode_failure
    from ecredit_trl.runs.ledger import GUARD_EXCLUSIONS
    from sandbox.cluster.trials import RayRoutedRuntime
    from sandbox.snapshots.snapshot import artifact

    d = cluster.add_node(num_cpus=1, resources={"ecredit_sandbox": 4, "node_d": 1})
    cluster.wait_for_nodes()
    task = calc_repo(root / "kill")
    run_id = f"rt-wskill-{os.getpid()}"
    rr = RayRoutedRuntime(run_id=run_id, options=RayOptions(address=address, max_in_flight=4))
    rr.trials._nodes = (0.0, [])
    ctx = AgentContext(tasks={task.instance_id: task}, runtime=rr, workroot=str(root / "kw"))
    envs = [SWEAgentEnv(ctx), SWEAgentEnv(ctx)]
    out: dict = {}
    try:
        from sandbox.cluster.workspace_proxy import RayWorkspaces

        rr.workspaces = RayWorkspaces(rr.trials)
        places = iter([d.node_id, a.node_id])
        rr.workspaces._place = lambda image, load: next(places)
        for env in envs:
            env.reset(instance_id=task.instance_id)
        ctx.turn = 1
        for env in envs:
            env.create("new.py", "x = 1\n")
        result: dict = {}
        t = threading.Thread(target=lambda: result.update(
            out=envs[0].bash("sleep 20; echo never")))
        t.start()
        time.sleep(3)
        t_kill = time.monotonic()
        cluster.remove_node(d, allow_graceful=False)
        t.join(timeout=200)
        lost_after_s = time.monotonic() - t_kill
        after = envs[0].view("new.py")
        envs[1].bash("printf 'z\\n' >> new.py")
        envs[1].submit()
        survivor = artifact(envs[1].snapshot_repo, envs[1].base_tree, envs[1].final_tree)
        rec = apply_episode_failure(SimpleNamespace(failure=None, exclusion=None), envs[0],
                                    task, SimpleNamespace(terminal_reward="binary",
                                                          mask_truncated_completions=False),
                                    truncated=False)
        out.update({"d": d.node_id, "nodes": [e.ws.node for e in envs], "out": result.get("out"),
               "lost_after_s": round(lost_after_s, 2), "after": after,
               "failure": envs[0].failure, "failure_class": envs[0].failure_class,
               "evidence": envs[0].failure_evidence,
               "statuses": [c.status for c in envs[0].calls],
               "exclusion": rec.exclusion, "guard": rec.exclusion in GUARD_EXCLUSIONS,
               "survivor_failure": envs[1].failure, "survivor_artifact": survivor})
    finally:
        for env in envs:
            release(env)
        out["lost_count"] = rr.workspaces.stats["lost"] if rr.workspaces else None
        rr.close()
        ctx.close()
    return out


def gate_report(held: bool) -> dict:
    """A doctor report of this host as the doctor writes it (``oom_record`` not held when
    ``held`` is False); what a node's gate reads from its cache (the doctor's own run is
    tests/test_doctor.py)."""
    probes = [{"name": "pids", "held": True, "reason": "", "detail": {}},
              {"name": "oom_record", "held": held, "detail": {},
               "reason": "" if held else "the kernel log (/dev/kmsg) holds no CONSTRAINT_MEMCG "
                                         "record naming the container's cgroup"}]
    return {"facts_key": facts_key(host_facts()), "probes": probes, "held": held}


def gate(cluster, address: str, image: str, root: Path) -> dict:
    """Node E joins with its own doctor cache, whose report of this host has ``oom_record``
    not held: it is refused (no trial lands there, even one whose image only E is listed
    as holding), while the other nodes serve; with ``allow_unheld`` E serves and its trial
    carries the rules it lacks, counted under ``node_rule_unheld``; with every node
    refused the backend does not start; ``python -m sandbox doctor
    --ray-address`` then reports E's probes afresh."""
    cache = root / "doctor-e"
    cache.mkdir()
    failing = gate_report(held=False)
    (cache / f"{failing['facts_key']}.json").write_text(json.dumps(failing))
    e = cluster.add_node(num_cpus=1, resources={"ecredit_sandbox": 4, "node_e": 1},
                         env_vars={"ECREDIT_DOCTOR_CACHE": str(cache)})
    cluster.wait_for_nodes()
    out: dict = {"e": e.node_id}
    for allow in (False, True):
        rt = RayTrials(f"rt-gate-{int(allow)}-{os.getpid()}", RayOptions(
            address=address, max_in_flight=4, allow_unheld=allow))
        try:
            alive = rt.alive_nodes()
            rt._index = {e.node_id: [image]}  # only E listed as holding the image
            res = rt.run_trial(spec(f"gate{int(allow)}", image))
            out[f"allow_{allow}"] = {
                "alive": alive, "refused": dict(rt.stats["refused"]),
                "unheld": dict(rt.stats["unheld"]), "counted": rt.stats[NODE_UNHELD],
                "class": res.exit_class, "node": res.node, "node_unheld": res.node_unheld}
        finally:
            rt.close()
    for n in cluster.list_all_nodes():  # E alone is left
        if n is not cluster.head_node and n is not e:
            cluster.remove_node(n, allow_graceful=False)
    cluster.wait_for_nodes()
    try:
        RayTrials(f"rt-gate-none-{os.getpid()}", RayOptions(address=address, max_in_flight=4))
        out["none_serve"] = "started"
    except RayUnavailable as exc:
        out["none_serve"] = str(exc)
    # `python -m sandbox doctor --ray-address`: a fresh report of every node (E alone now)
    proc = subprocess.run([sys.executable, "-m", "sandbox", "doctor", "--ray-address", address,
                           "--only", "agent", "--json"], capture_output=True, text=True,
                          timeout=600)
    out["cli"] = {"rc": proc.returncode, "tail": proc.stderr[-2000:],
                  "reports": json.loads(proc.stdout.strip().splitlines()[-1])
                  if proc.stdout.strip() else None}
    return out


def storage_for_c(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "storage.conf").write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{root}/graph"\nrunroot = "{root}/run"\n')
    return root


def sandbox_cluster():
    """A :class:`ray.cluster_utils.Cluster` of a head node without the sandbox resource (the
    trainer's node) and sandbox nodes A and B (4 slots and a ``node_<x>`` label each):
    (cluster, a, b)."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        a = cluster.add_node(num_cpus=1, resources={"ecredit_sandbox": 4, "node_a": 1})
        b = cluster.add_node(num_cpus=1, resources={"ecredit_sandbox": 4, "node_b": 1})
        cluster.wait_for_nodes()
    except BaseException:
        cluster.shutdown()
        raise
    return cluster, a, b


def serve(ready_path: str) -> None:
    """The session's shared cluster (tests/ray_namespace.py): :func:`sandbox_cluster`, its
    address and node ids written to ``ready_path`` (atomically), then held until stdin
    closes; then shut down and every process left in this namespace killed."""
    cluster, a, b = sandbox_cluster()
    try:
        info = {"address": cluster.address,
                "nodes": {"head": cluster.head_node.node_id, "a": a.node_id, "b": b.node_id}}
        tmp = Path(ready_path + ".tmp")
        tmp.write_text(json.dumps(info))
        os.replace(tmp, ready_path)
        sys.stdin.read()
    finally:
        cluster.shutdown()
        kill_namespace_processes()


def session_cluster() -> tuple[str, dict]:
    """(address, node ids) of the session's cluster this driver joined
    (``ECREDIT_TEST_CLUSTER`` names the file :func:`serve` wrote)."""
    info = json.loads(Path(os.environ["ECREDIT_TEST_CLUSTER"]).read_text())
    return info["address"], info["nodes"]


def main(out_path: str) -> None:
    report: dict = {}
    if not Path("/tmp/ray/ray_current_cluster").exists():
        # Ray's "auto" also finds a GCS by scanning the process table: a cluster another test
        # holds in its own network namespace is seen here and does not answer
        report["gcs_seen"] = gcs_address_of("auto")
        try:
            connect("auto")
            report["no_cluster"] = "connected"
        except RayUnavailable as exc:
            report["no_cluster"] = str(exc)
    image = default_image()
    tmp = Path(tempfile.mkdtemp(prefix="ecredit-raytest-"))
    store = storage_for_c(tmp / "store")
    (tmp / "mirror").mkdir()
    t0 = time.monotonic()
    cluster, a, b = sandbox_cluster()
    try:
        report["nodes"] = {"head": cluster.head_node.node_id, "a": a.node_id, "b": b.node_id}
        report["cluster_start_s"] = round(time.monotonic() - t0, 2)
        report["auth_mode"] = cluster_auth_mode(cluster.address)  # GCS, asked without token
        only = [x for x in os.environ.get("ECREDIT_RAY_ONLY", "").split(",") if x]
        for name, fn in (("spread", lambda: spread(cluster.address, image)),
                         ("cap", lambda: cap(cluster.address, image, __file__)),
                         ("gc", lambda: gc_cli(cluster.address, image)),
                         ("workspaces", lambda: workspaces(cluster.address, tmp)),
                         ("ws_image", lambda: ws_image(cluster.address, tmp)),
                         ("ws_cap", lambda: ws_cap(cluster.address, image, tmp)),
                         ("kill", lambda: kill(cluster, cluster.address, image, a, b)),
                         ("ws_kill", lambda: ws_kill(cluster, cluster.address, tmp, a)),
                         ("locality", lambda: locality(cluster, cluster.address, image, a,
                                                       store, tmp / "mirror")),
                         ("gate", lambda: gate(cluster, cluster.address, image, tmp))):
            if only and name not in only:  # a developer's subset; the test runs them all
                continue
            t = time.monotonic()
            report[name] = fn()
            report[name]["seconds"] = round(time.monotonic() - t, 2)
    finally:
        cluster.shutdown()
        # node C's private store: unmount what is still mounted under it, then delete it
        # (never `podman rmi`: a mistaken storage setting would reach the shared store)
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                  if line.split()[1].startswith(str(tmp))]
        for mnt in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mnt], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    Path(out_path).write_text(json.dumps(report, indent=1))


def evaluate_on_ray(address: str, runs: str, root: Path, env: dict) -> dict:
    """``python -m eval.run`` (2 bundled holdout tasks × 1 rollout) with ``--sandbox-backend
    ray`` on the trained run's final checkpoint; its rc, output tail and slot rows."""
    from eval.tasks.schema import save_tasks
    from eval.tasks.splits import load_tasks

    (run,) = list(Path(runs).iterdir())
    split = Path(runs).parent / "two.jsonl"
    save_tasks(load_tasks("bundled:holdout")[:2], split)
    out = Path(runs).parent / "eval"
    cmd = [sys.executable, "-m", "eval.run", "--model", str(run / "checkpoint-final"),
           "--split", str(split), "--n", "1", "--out", str(out), "--max-new-tokens", "48",
           "--sandbox-backend", "ray", "--ray-address", address, "--sandbox-max-in-flight",
           "4"]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env, timeout=600)
    slots = out / "slots.jsonl"
    rows = [json.loads(x) for x in slots.read_text().splitlines() if x.strip()] \
        if slots.exists() else []
    return {"rc": proc.returncode, "tail": proc.stdout[-1500:] + proc.stderr[-3000:],
            "slots": rows}


def workspace_hosts(address: str) -> list[str]:
    """Node ids of every workspace host actor the cluster has seen (dead ones included: the
    run that made them has ended), from the GCS actor table."""
    import ray

    ray.init(address=address, log_to_driver=False, logging_level="warning")
    try:
        return sorted(a.get("Address", {}).get("NodeID", "")
                      for a in ray._private.state.actors().values()
                      if a.get("ActorClassName") == "WorkspaceHost")
    finally:
        ray.shutdown()


def train(out_path: str, runs: str) -> None:
    """The main job (arm M, 2 steps, ``accelerate launch``) with ``--sandbox_backend ray``
    on the session's cluster (a head node, the trainer's, without the sandbox resource, and
    two sandbox nodes), then ``eval.run`` of its final checkpoint on the same cluster
    (:func:`evaluate_on_ray`). Workspace hosts already in the actor table (earlier
    scenarios on that cluster) are not counted."""
    address, nodes = session_cluster()
    earlier = workspace_hosts(address)
    root = Path(__file__).resolve().parents[1]
    cmd = [str(Path(sys.executable).with_name("accelerate")), "launch", "--num_processes",
           "1", "ecredit_trl/train.py", "--arm", "M", "--max_steps", "2", "--runs_dir",
           runs, "--sandbox_backend", "ray", "--ray_address", address,
           "--sandbox_max_in_flight", "6",
           # every ablation its own trial: counterfactual trials dispatched through Ray
           "--reuse_control_for_empty_ablation", "false"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env,
                          timeout=900)
    report = {"rc": proc.returncode, "tail": proc.stdout[-2000:] + proc.stderr[-4000:],
              "nodes": nodes, "hosts_earlier": earlier}
    report["hosts_train"] = without(workspace_hosts(address), earlier)
    if proc.returncode == 0:  # then eval.run of the trained policy, same backend
        report["eval"] = evaluate_on_ray(address, runs, root, env)
        report["hosts_all"] = without(workspace_hosts(address), earlier)
    Path(out_path).write_text(json.dumps(report, indent=1))


def without(items: list[str], earlier: list[str]) -> list[str]:
    """``items`` less one occurrence of each of ``earlier`` (a multiset difference)."""
    left = list(items)
    for x in earlier:
        left.remove(x)
    return left


def victim(address: str, run_id: str, n: int) -> None:
    """A trainer-like driver (tests/test_ray_cleanup.py): the runtime ``train.py`` makes for
    ``sandbox_backend=ray`` and a pool with ``n`` long trials in flight; it never finishes on
    its own (the test SIGKILLs it)."""
    from sandbox.backend import SandboxOptions, make_runtime
    rt = make_runtime(SandboxOptions(backend="ray", ray_address=address, max_in_flight=n),
                      run_id=run_id)
    pool = VerifierPool(rt, max_concurrency=n, retry=RetryPolicy(max_retries=0))
    futures = [pool.submit(spec(f"long{i}", default_image(), sleep=300)) for i in range(n)]
    print("submitted", flush=True)
    for fut in futures:
        fut.result()


def resumed_at_once(address: str, driver: str) -> dict:
    """SIGKILL a driver with two trials in flight under a cap of 2, then at once (as soon as
    its process is gone) start another driver of the same run (a resume) with two short
    trials: they must get slots and be graded, and the run end with nothing left."""
    import signal

    run_id = f"rt-resume-{os.getpid()}"
    child = subprocess.Popen([sys.executable, driver, "victim", address, run_id, "2"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(containers(run_id)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    running = containers(run_id)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, driver, "rank", address, run_id, "2", "2"],
                          capture_output=True, text=True, timeout=240)
    out = {"running": running, "rc": proc.returncode, "resume_s": round(time.monotonic() - t0, 2),
           "tail": proc.stderr[-2000:]}
    if proc.returncode == 0:
        out["resumed"] = json.loads(proc.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 60
    while containers(run_id, all_states=True) and time.monotonic() < deadline:
        time.sleep(0.25)
    out["left"] = containers(run_id, all_states=True)
    return out


def killed_driver(address: str, driver: str, poll_s: float) -> dict:
    """SIGKILL a driver whose two trials run on the sandbox nodes; then watch, every 0.25 s
    for at most 90 s, for its containers (``podman ps -a``: every node's, all share this
    machine's Podman) and its dispatcher actor to go. Before the kill, the live run is
    watched for ``3 * poll_s`` seconds: the reaper must not touch it."""
    import signal

    import ray

    from sandbox.cluster.dispatch import NAMESPACE, dispatcher_name

    def dispatcher_alive() -> bool:
        try:
            ray.get_actor(dispatcher_name(run_id), namespace=NAMESPACE)
            return True
        except ValueError:
            return False

    run_id = f"rt-victim-{os.getpid()}"
    connect(address)
    child = subprocess.Popen([sys.executable, driver, "victim", address, run_id, "2"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(containers(run_id)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        running = containers(run_id)
        load = ray.get(ray.get_actor(dispatcher_name(run_id), namespace=NAMESPACE)
                       .load.remote())
        time.sleep(3 * poll_s)  # the reaper polls meanwhile; the driver is alive
        still = containers(run_id)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    t0 = time.monotonic()
    gone: dict[str, float] = {}
    left = containers(run_id, all_states=True)
    while time.monotonic() - t0 < 90 and len(gone) < 2:
        left = containers(run_id, all_states=True)
        if not left:
            gone.setdefault("containers_s", round(time.monotonic() - t0, 2))
        if not dispatcher_alive():
            gone.setdefault("dispatcher_s", round(time.monotonic() - t0, 2))
        time.sleep(0.25)
    return {"running": running, "load": load, "still_running_alive": still,
            "child_rc": child.returncode, "gone": gone, "left": left,
            "dispatcher_left": dispatcher_alive(),
            "child_stderr": child.stderr.read()[-2000:] if child.stderr else ""}


def cleanup(out_path: str) -> None:
    """The cleanup scenario (tests/test_ray_cleanup.py) on the session's cluster: a head
    node without the sandbox resource and two sandbox nodes, as in :func:`main`."""
    import ray

    from sandbox.cluster.reaper import REAP_POLL_S

    address, nodes = session_cluster()
    report = {"nodes": nodes, "poll_s": REAP_POLL_S}
    try:
        t = time.monotonic()
        report["killed"] = killed_driver(address, __file__, REAP_POLL_S)
        report["killed"]["seconds"] = round(time.monotonic() - t, 2)
        t = time.monotonic()
        report["resumed"] = resumed_at_once(address, __file__)
        report["resumed"]["seconds"] = round(time.monotonic() - t, 2)
    finally:
        if ray.is_initialized():  # killed_driver connected this process as a driver
            ray.shutdown()
    Path(out_path).write_text(json.dumps(report, indent=1))


def tools(out_path: str, work: str) -> None:
    """``python -m eval.controls`` (one bundled holdout task: its gold and empty controls) and
    ``python -m ecredit_trl.credit.pilot`` (one scripted gold_only rollout of that task:
    factual, counterfactual and control trials) with ``--sandbox-backend ray`` on the
    session's cluster (a head node and two sandbox nodes); rc, output tail and the node of
    every trial they recorded."""
    from ecredit_trl.credit.scripted import scripted_trajectories
    from ecredit_trl.credit.trajectory import dump_trajectories
    from eval.tasks.splits import load_tasks

    root, work = Path(__file__).resolve().parents[1], Path(work)
    task = load_tasks("bundled:holdout")[0]
    trajs = work / "trajs.jsonl"
    dump_trajectories(scripted_trajectories([task], kinds=("gold_only",)), trajs)
    address, nodes = session_cluster()
    ray_flags = ["--sandbox-backend", "ray", "--ray-address", address,
                 "--sandbox-max-in-flight", "2"]
    report = {"nodes": nodes}
    for name, cmd, records in (
            ("controls", ["-m", "eval.controls", "--split", "bundled:holdout", "--task-id",
                          task.instance_id, "--out", str(work / "controls")],
             lambda: [c.get("node", "") for r in json.loads(
                 (work / "controls" / "controls.json").read_text())["per_task"].values()
                 for c in (r["gold"], r["empty"])]),
            ("pilot", ["-m", "ecredit_trl.credit.pilot", "--tasks", "bundled:holdout",
                       "--trajectories", str(trajs), "--out", str(work / "pilot")],
             lambda: [json.loads(x)["node"] for x in (work / "pilot" / "trials.jsonl")
                      .read_text().splitlines() if x.strip()])):
        proc = subprocess.run([sys.executable, *cmd, *ray_flags], cwd=root,
                              capture_output=True, text=True, timeout=600)
        report[name] = {"rc": proc.returncode, "tail": proc.stderr[-3000:]}
        try:
            report[name]["nodes"] = records()
        except (OSError, KeyError, ValueError) as exc:
            report[name]["nodes"] = f"{type(exc).__name__}: {exc}"
    Path(out_path).write_text(json.dumps(report, indent=1))


DOCS = Path(__file__).resolve().parents[1] / "docs" / "scale-out.md"
TOKEN_BLOCK = "<!-- ray-token-cluster:"


def docs_token_block() -> str:
    """The scale-out page's token-cluster command block (the bash block after its
    ``ray-token-cluster`` marker), as written."""
    text = DOCS.read_text()
    after = text[text.index(TOKEN_BLOCK):]
    return after.split("```bash\n", 1)[1].split("```", 1)[0]


def connect_in_child(address: str, env: dict, allow: bool = False) -> str:
    """``connect(address)`` in a fresh process with ``env`` (Ray caches its token per
    process): "connected" or the RayUnavailable line, and its seconds."""
    code = ("import sys, time; from sandbox.cluster.dispatch import connect, RayUnavailable\n"
            "t = time.monotonic()\n"
            "try:\n    connect(sys.argv[1], sys.argv[2] == '1'); out = 'connected'\n"
            "except RayUnavailable as exc:\n    out = str(exc)\n"
            "print(round(time.monotonic() - t, 2)); print(out)")
    proc = subprocess.run([sys.executable, "-c", code, address, "1" if allow else "0"],
                          capture_output=True, text=True, env=env, timeout=120)
    lines = proc.stdout.strip().splitlines()
    return {"rc": proc.returncode, "seconds": float(lines[0]) if lines else None,
            "out": "\n".join(lines[1:]), "tail": proc.stderr[-1500:]}


def kill_namespace_processes() -> list[int]:
    """SIGKILL every process of this network namespace but this one and its parents (the
    ``ray start`` daemons of :func:`auth`; ``ray stop`` would end every Ray process on the
    machine, other namespaces' included). Returns the pids."""
    import signal

    own = os.readlink("/proc/self/ns/net")
    keep, pid = set(), os.getpid()
    while pid > 1:
        keep.add(pid)
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    killed = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) not in keep:
            try:
                if os.readlink(d / "ns" / "net") == own:
                    os.kill(int(d.name), signal.SIGKILL)
                    killed.append(int(d.name))
            except OSError:
                pass
    return killed


def auth(out_path: str, work: str) -> None:
    """Token authentication: the scale-out page's token-cluster block run as written
    (``HEAD`` = 127.0.0.1, the token file under ``work``, ``HOME`` = ``work/home``), then a
    GCS call and the backend's ``connect`` without the token and with a wrong one (refused),
    with the token (connected, the sandbox node seen); then a head started without token
    authentication: ``train.py`` and ``eval.run`` refuse it in one line, nothing written,
    ``--sandbox-allow-unauthenticated`` connects, and ``python -m sandbox doctor`` reports the
    mode. This process has no token in its own environment."""
    from sandbox.cluster.auth import gcs_auth_mode

    work = Path(work)
    home, token = work / "home", work / "etc-ray" / "auth_token"
    base = {k: v for k, v in os.environ.items()
            if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    # RAY_TMPDIR: the session files of these `ray start`s stay out of /tmp/ray (where `auto`
    # of every other Ray user on this machine looks)
    base.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0",
                RAY_TMPDIR=tempfile.mkdtemp(prefix="ecr-", dir="/tmp"))
    block = docs_token_block()
    script = block.replace("HEAD:", "127.0.0.1:").replace("/etc/ray/auth_token", str(token))
    venv = str(Path(sys.executable).parent)
    t = time.monotonic()
    started = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True,
                             text=True, env=dict(base, PATH=f"{venv}:{base['PATH']}"),
                             timeout=300)
    report: dict = {"block": block, "start_rc": started.returncode,
                    "start_tail": started.stderr[-2000:], "start_s": round(time.monotonic() - t, 2),
                    "token_mode": oct(token.stat().st_mode & 0o777) if token.exists() else None}
    root = Path(__file__).resolve().parents[1]
    try:
        gcs = "127.0.0.1:6379"
        report["probe_no_token"] = gcs_auth_mode(gcs)
        report["no_token"] = connect_in_child(gcs, base)
        report["wrong_token"] = connect_in_child(gcs, dict(
            base, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 32))
        good = dict(base, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
        code = ("import sys; from sandbox.cluster.dispatch import connect, sandbox_nodes\n"
                "connect(sys.argv[1]); print(len(sandbox_nodes()))")
        proc = subprocess.run([sys.executable, "-c", code, gcs], capture_output=True, text=True,
                              env=good, timeout=120)
        report["with_token"] = {"rc": proc.returncode, "out": proc.stdout.strip(),
                                "tail": proc.stderr[-1500:]}
        # a head without token authentication (port 6380; no sandbox slots: every check
        # below stops before work, and the doctor probes no node)
        subprocess.run(["ray", "start", "--head", "--port", "6380", "--num-cpus", "1",
                        "--dashboard-host", "127.0.0.1"], capture_output=True, text=True,
                       env=dict(base, RAY_AUTH_MODE="disabled", PATH=f"{venv}:{base['PATH']}"),
                       timeout=120, check=True)
        opened = "127.0.0.1:6380"
        report["probe_open"] = gcs_auth_mode(opened)
        refusals = {}
        for name, cmd, out in (
                ("train", [sys.executable, "ecredit_trl/train.py", "--arm", "M",
                           "--sandbox_backend", "ray", "--ray_address", opened,
                           "--output_dir", str(work / "runs"), "--report_to", "none"],
                 work / "runs"),
                ("eval", [sys.executable, "-m", "eval.run", "--split", "bundled:holdout",
                          "--n", "1", "--out", str(work / "ev"), "--sandbox-backend", "ray",
                          "--ray-address", opened], work / "ev")):
            t = time.monotonic()
            proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True,
                                  env=dict(good, HF_HUB_OFFLINE="1"), timeout=300)
            refusals[name] = {"rc": proc.returncode, "stderr": proc.stderr[-3000:],
                              "seconds": round(time.monotonic() - t, 2),
                              "written": out.exists()}
        report["refusals"] = refusals
        report["allowed"] = connect_in_child(opened, good, allow=True)
        doctor = {}
        for allow in (False, True):
            cmd = [sys.executable, "-m", "sandbox", "doctor", "--ray-address", opened,
                   "--only", "agent", *(["--sandbox-allow-unauthenticated"] if allow else [])]
            proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=good,
                                  timeout=600)
            doctor[str(allow)] = {"rc": proc.returncode, "stdout": proc.stdout,
                                  "tail": proc.stderr[-2000:]}
        report["doctor_open"] = doctor
    finally:
        report["killed"] = len(kill_namespace_processes())
        shutil.rmtree(base["RAY_TMPDIR"], ignore_errors=True)
    Path(out_path).write_text(json.dumps(report, indent=1))


def seed_gate() -> None:
    """Every sandbox node's gate reads a held report of this host from one doctor cache
    (``ECREDIT_DOCTOR_CACHE``, inherited by the cluster's nodes and the driver's children)
    unless a scenario gives a node its own."""
    if not os.environ.get("ECREDIT_DOCTOR_CACHE"):
        os.environ["ECREDIT_DOCTOR_CACHE"] = tempfile.mkdtemp(prefix="ecredit-raytest-doctor-")
    save_report(gate_report(held=True))


if __name__ == "__main__":
    seed_gate()
    if sys.argv[1] == "rank":
        rank(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif sys.argv[1] == "train":
        train(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "victim":
        victim(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "cleanup":
        cleanup(sys.argv[2])
    elif sys.argv[1] == "tools":
        tools(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "auth":
        auth(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        main(sys.argv[1])
