"""Shared fixtures: a Podman runtime for the suite (and its host variants), tiny git repositories."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_inherited_rendezvous():
    """Every test starts and ends without a torch.distributed rendezvous in this process's
    environment (``RANK``, ``MASTER_PORT``, ... : ``DIST_ENV``). In-process trainers write
    them (accelerate on a CPU group, TRL's vLLM colocate) and nothing takes them back; a later
    test's training child then inherits them, joins a group on port 29500 and, while another
    pytest worker's child holds that port, fails to start."""
    from ecredit_trl.policy.sft import DIST_ENV

    for name in DIST_ENV:
        os.environ.pop(name, None)
    yield
    for name in DIST_ENV:
        os.environ.pop(name, None)


def load_benchmark(name: str):
    """The module ``benchmarks/<name>.py`` (not a package: loaded from its file), registered as
    ``sys.modules[name]`` (dataclasses need it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def make_tar(files: dict[str, str | bytes]) -> bytes:
    """Tar bytes holding ``files`` (path -> content)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            raw = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(raw))
    return buf.getvalue()


def git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@e", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()


@pytest.fixture(scope="session")
def podman_runtime():
    """One PodmanRuntime (own service) for the whole session; checks no container leaks."""
    from sandbox.images import build_offline
    from sandbox.runtimes.podman_runtime import PodmanRuntime, gc

    build_offline(log=lambda *_: None)
    rt = PodmanRuntime()
    yield rt
    rt.close()
    leftovers = gc(rt.run_id)
    assert leftovers == [], f"containers left after the suite: {leftovers}"


PODMAN_VARIANTS = ("crun", "fuse-overlayfs")
"""Host variants the live integrity suites also run under (tests/test_runtime_variants.py):
the OCI runtime crun in place of runc, and fuse-overlayfs storage (Podman's
``mount_program``, the default of rootless and nested nodes) in place of native overlay."""


def _hold_v2_controllers_in_v1():
    """crun refuses a hybrid cgroup host whose v2 hierarchy has any controller ("cgroups in
    hybrid mode not supported, drop all controllers from cgroupv2"); on this kind of host
    that is only ``hugetlb``, which no v1 hierarchy binds. A controller bound to a mounted
    v1 hierarchy leaves v2, so one is mounted in a private mount namespace held by a
    sleeping process (nothing outside sees the mount): killing that process unmounts it
    and the controller returns to v2. Returns the process, or None when nothing is needed
    (a pure v1 or v2 host)."""
    unified = Path("/sys/fs/cgroup/unified/cgroup.controllers")
    ctrls = unified.read_text().split() if unified.exists() else []
    if not ctrls:
        return None
    d = tempfile.mkdtemp(prefix="ecredit-cgv1-")
    script = " && ".join(f"mkdir -p {d}/{c} && mount -t cgroup -o {c} none {d}/{c}"
                         for c in ctrls) + " && echo ready && exec sleep infinity"
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if proc.stdout.readline().strip() != b"ready":
        proc.kill()
        raise RuntimeError(f"cannot bind {ctrls} to cgroup v1 for crun: "
                           f"{proc.stderr.read().decode(errors='replace')[-500:]}")
    return proc


@contextmanager
def shared_store():
    """Podman calls inside go to the shared store (a variant's ``CONTAINERS_STORAGE_CONF``
    is lifted meanwhile): images built once there serve every variant."""
    saved = os.environ.pop("CONTAINERS_STORAGE_CONF", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["CONTAINERS_STORAGE_CONF"] = saved


def copy_from_shared_store(image: str, work: Path) -> None:
    """Copy ``image`` from the shared store into the current one (``podman save`` /
    ``load`` through a file in ``work``); nothing when they are the same store."""
    from sandbox.runtimes.podman_store import podman_env

    if not os.environ.get("CONTAINERS_STORAGE_CONF"):
        return
    archive = work / f"image-{os.getpid()}.tar"
    with shared_store():
        subprocess.run(["podman", "save", "-q", "-o", str(archive), image], check=True,
                       capture_output=True, env=podman_env())
    try:
        subprocess.run(["podman", "load", "-q", "-i", str(archive)], check=True,
                       capture_output=True, env=podman_env())
    finally:
        archive.unlink(missing_ok=True)


@contextmanager
def podman_variant(kind: str, work: Path):
    """Point Podman (CLI calls and services started inside) at ``kind``'s settings:
    ``crun``: sandbox/containers.conf with ``runtime = "crun"``, the shared store;
    ``fuse-overlayfs``: a store of its own under ``work`` (graphroot / runroot, overlay
    with ``mount_program = fuse-overlayfs``), the sandbox image copied in from the shared
    store (``podman save`` / ``load``) and everything in it removed afterwards."""
    from sandbox.images import default_image
    from sandbox.runtimes.podman_store import CONTAINERS_CONF, podman_env

    conf = Path(CONTAINERS_CONF).read_text()
    env, holder, store = {}, None, None
    if kind == "crun":
        if shutil.which("crun") is None:
            raise RuntimeError("crun is not installed (scripts/setup.sh: apt-get install crun)")
        conf = conf.replace('runtime = "runc"', 'runtime = "crun"')
        holder = _hold_v2_controllers_in_v1()
    elif kind == "fuse-overlayfs":
        if shutil.which("fuse-overlayfs") is None:
            raise RuntimeError("fuse-overlayfs is not installed (scripts/setup.sh)")
        store = work / "store"
        store.mkdir(parents=True)
        (store / "storage.conf").write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = "{store}/graph"\n'
            f'runroot = "{store}/run"\n[storage.options.overlay]\n'
            f'mount_program = "{shutil.which("fuse-overlayfs")}"\n')
        env["CONTAINERS_STORAGE_CONF"] = str(store / "storage.conf")
    else:
        raise ValueError(f"kind: expected one of {PODMAN_VARIANTS}, got {kind!r}")
    (work / "containers.conf").write_text(conf)
    env["CONTAINERS_CONF"] = str(work / "containers.conf")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        if store is not None:
            copy_from_shared_store(default_image(), work)
        yield kind
    finally:
        if store is not None:  # the variant's own store only
            for args in (["rm", "--all", "--force"], ["image", "rm", "--all", "--force"]):
                subprocess.run(["podman", *args], capture_output=True, env=podman_env())
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if store is not None:
            shutil.rmtree(store, ignore_errors=True)
        if holder is not None:
            holder.kill()
            holder.wait()


@dataclass
class AgentTask:
    """The fields of a task row an agent session needs (a stand-in for ``eval.tasks.schema.Task``)."""

    instance_id: str
    repo_dir: str
    base_commit: str
    image: str
    workdir: str = "/testbed"


@pytest.fixture
def calc_task(tmp_path):
    """A one-file repository whose ``add`` subtracts (the bug), as an :class:`AgentTask`."""
    from sandbox.images import default_image

    repo = tmp_path / "origin"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    return AgentTask("demo__calc-1", str(repo), git(repo, "rev-parse", "HEAD"), default_image())


def swebench_resolved(tmp_path: Path, log_text: str, f2p, p2p, parser_name: str) -> bool:
    """swebench's own end-to-end verdict (get_eval_report on a log file)."""
    from swebench.harness.grading import get_eval_report
    from swebench.types import TestSpec as SweTestSpec

    path = tmp_path / "swebench_test_output.txt"
    path.write_text(log_text)
    spec = SweTestSpec(
        instance_id="x__y-1", image="", eval_script_list=[], repo="x/y", version="0",
        FAIL_TO_PASS=list(f2p), PASS_TO_PASS=list(p2p), log_parser=parser_name,
        eval_type="pass_and_fail",
    )
    pred = {"instance_id": "x__y-1", "model_patch": "diff", "model_name_or_path": "m"}
    return get_eval_report(spec, pred, str(path), include_tests_status=False)["x__y-1"][
        "resolved"
    ]


def write_jsonl(path, rows) -> str:
    """Write ``rows`` as JSON lines to ``path``; returns the path as a string."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def ds_dir(tmp_path, monkeypatch):
    """An empty datasets folder (``ECREDIT_DATASETS_DIR``) for sealing tests."""
    d = tmp_path / "datasets"
    d.mkdir()
    monkeypatch.setenv("ECREDIT_DATASETS_DIR", str(d))
    return d


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    """A random tiny Llama + BPE with the qwen3 template: makes format errors, exercises all."""
    from ecredit_trl.policy.tiny_model import build_model, build_tokenizer

    out = tmp_path_factory.mktemp("policy")
    corpus = ["Fix the bug in the repository.", '<tool_call>\n{"name": "submit", '
              '"arguments": {}}\n</tool_call>'] * 10
    tok = build_tokenizer(corpus, vocab_size=300)
    build_model(tok, seed=0).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def warm_policy():
    """The embedded policy warm-started on ``bundled:train`` (built once, cached under
    ``$ECREDIT_CACHE``): its model directory."""
    from ecredit_trl.policy.warmstart import ensure_default_policy
    from eval.tasks.splits import load_tasks

    return ensure_default_policy(load_tasks("bundled:train", purpose="train"))


#: A random Qwen2 of the qwen2_5 family whose head size vLLM's CPU attention takes (32; the
#: family default 16 is not among its sizes).
VLLM_SHAPE = {"hidden_size": 128, "intermediate_size": 256, "head_dim": 32}


@pytest.fixture(scope="session")
def vllm_tiny_model(tmp_path_factory):
    """Directory of that model (weights, tokenizer with TRL's qwen2_5 template)."""
    from ecredit_trl.policy.families import build_family_model, build_family_tokenizer, family

    path = tmp_path_factory.mktemp("vllm-model")
    fam = family("qwen2_5")
    tok = build_family_tokenizer(fam)
    build_family_model(fam, tok, shape=VLLM_SHAPE).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """The session's one Ray test cluster (head, sandbox nodes A and B; loopback-only
    namespace, token authentication), started when a test first needs it and shut down at
    the end of the session (tests/ray_namespace.py): the scenarios that leave its nodes as
    they found them run on it."""
    from ray_namespace import SessionCluster

    work = tmp_path_factory.mktemp("ray-session")
    (work / "doctor").mkdir()
    cluster = SessionCluster(work)
    yield cluster
    cluster.close()
