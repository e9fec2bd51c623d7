"""`sandbox.images pull`: names, mirrors, the space estimate, retries, and real pulls from a
saved image archive (CLI transport path) and from a local registry (podman-py path)."""

import json
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pytest
from conftest import REPO_ROOT

from sandbox.images import build_offline, image_digest, swebench_image
from sandbox.images.pull import (
    ImagePullError,
    PullOutcome,
    archive_name,
    canonical,
    images_from_file,
    missing_images,
    pull_images,
    pull_one,
    row_image,
    source_ref,
)
from sandbox.runtimes.podman_runtime import PodmanService, podman_env

SWE_ID = "django__django-11099"
SWE_IMAGE = "docker.io/swebench/sweb.eval.x86_64.django_1776_django-11099:latest"


def test_names_follow_swebench_and_a_rows_image_wins():
    assert swebench_image(SWE_ID) == SWE_IMAGE
    assert row_image({"instance_id": SWE_ID}) == SWE_IMAGE
    assert row_image({"instance_id": SWE_ID, "image": "quay.io/me/x:1"}) == "quay.io/me/x:1"
    with pytest.raises(ValueError, match="row 3: no field 'image' and no field 'instance_id'"):
        row_image({}, "row 3")


def test_registry_rewrites_the_prefix_and_transports_name_one_file_per_image():
    assert canonical("swebench/x") == "docker.io/swebench/x:latest"
    assert canonical("python") == "docker.io/library/python:latest"
    assert canonical("localhost:5000/a/b:t") == "localhost:5000/a/b:t"
    assert source_ref(SWE_IMAGE) == SWE_IMAGE
    assert source_ref(SWE_IMAGE, "https://mirror.example:5000/hub/") == \
        "mirror.example:5000/hub/swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    assert source_ref("quay.io/a/b@sha256:ab", "m.example") == "m.example/a/b@sha256:ab"
    assert source_ref(SWE_IMAGE, "oci-archive:/mirror") == (
        "oci-archive:/mirror/docker.io_swebench_sweb.eval.x86_64.django_1776_django-11099"
        "_latest.tar")
    assert source_ref("localhost/a:t", "dir:/m") == "dir:/m/localhost_a_t"
    assert archive_name("localhost/a:t") == "localhost_a_t"
    with pytest.raises(ValueError, match="registry: 'dir:' names no directory"):
        source_ref(SWE_IMAGE, "dir:")
    with pytest.raises(ValueError, match="image: not an image name"):
        source_ref("docker://x", None)


def test_images_from_file_reads_names_and_rows(tmp_path):
    (tmp_path / "n.txt").write_text("# names\nlocalhost/a:1\n\nquay.io/b\n")
    assert images_from_file(tmp_path / "n.txt") == ["localhost/a:1", "quay.io/b"]
    (tmp_path / "r.jsonl").write_text(json.dumps({"instance_id": SWE_ID}) + "\n"
                                      + json.dumps({"instance_id": "a__b-1", "image": "x/y:2"}))
    assert images_from_file(tmp_path / "r.jsonl") == [SWE_IMAGE, "x/y:2"]
    (tmp_path / "bad.jsonl").write_text('{"repo": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl row 1: no field 'image'"):
        images_from_file(tmp_path / "bad.jsonl")
    (tmp_path / "t.csv").write_text("x")
    with pytest.raises(ValueError, match="expected a .txt, .jsonl or .json file"):
        images_from_file(tmp_path / "t.csv")


# ---------------------------------------------------------------------------
# real pulls (Podman)
# ---------------------------------------------------------------------------

def _podman(*args, check=True):
    return subprocess.run(["podman", *args], capture_output=True, text=True, env=podman_env(),
                          check=check)


def _untag(name: str) -> None:
    """Remove the one name ``name`` (``podman untag IMAGE`` alone would remove every name of
    the image, the shared offline image's included)."""
    _podman("untag", name, name, check=False)


@pytest.fixture
def saved_image(tmp_path):
    """A fresh name for the offline image, saved to ``oci-archive:`` and untagged again."""
    base = build_offline(log=lambda *_: None)
    name = f"localhost/ecredit-pulltest:{uuid.uuid4().hex[:8]}"
    _podman("tag", base, name)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    _podman("save", "--format", "oci-archive", "-o",
            str(mirror / (archive_name(name) + ".tar")), name)
    digest = image_digest(base)
    _untag(name)
    yield name, mirror, digest
    _untag(name)


@pytest.mark.podman
def test_pull_from_an_oci_archive_mirror_then_present(saved_image):
    name, mirror, digest = saved_image
    assert missing_images([name]) == [name]
    lines = []
    report = pull_images([name, name], registry=f"oci-archive:{mirror}", concurrency=2,
                         log=lines.append)
    (o,) = report.outcomes
    assert (o.status, o.attempts, o.error) == ("pulled", 1, None)
    assert o.size_source == "manifest" and o.estimated_bytes == \
        (mirror / (archive_name(name) + ".tar")).stat().st_size
    assert report.free_bytes > 0 and report.graphroot
    assert missing_images([name]) == []
    assert image_digest(name) == digest  # the same image, under the task's name
    again = pull_images([name], registry=f"oci-archive:{mirror}")
    assert again.counts() == {"present": 1, "pulled": 0, "failed": 0}
    assert again.summary() == "1 images: 1 present, 0 pulled, 0 failed"


@pytest.mark.podman
def test_cli_pulls_a_name_file_and_prints_the_summary(saved_image, tmp_path):
    name, mirror, _ = saved_image
    (tmp_path / "names.txt").write_text(name + "\n")
    proc = subprocess.run([sys.executable, "-m", "sandbox.images", "pull", "--split",
                           str(tmp_path / "names.txt"), "--registry", f"oci-archive:{mirror}",
                           "--json", str(tmp_path / "r.json")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "1 images: 0 present, 1 pulled, 0 failed"
    assert json.loads((tmp_path / "r.json").read_text())["counts"]["pulled"] == 1
    assert missing_images([name]) == []


@pytest.mark.podman
def test_space_estimate_refuses_before_pulling(saved_image):
    name, _, _ = saved_image
    with pytest.raises(ImagePullError, match=r"not enough disk space: about .* GiB to pull"):
        pull_images([name], registry="localhost:1", default_bytes=10 ** 18)
    assert missing_images([name]) == [name]


@pytest.mark.podman
def test_a_failing_reference_is_retried_with_backoff_then_reported():
    """podman-py path: the service is asked for an image on a registry nobody serves."""
    from podman import PodmanClient

    service = PodmanService()
    sleeps = []
    try:
        with PodmanClient(base_url=service.url, timeout=120) as client:
            item = PullOutcome(image="docker.io/ecredit/none:x",
                               source="localhost:1/ecredit/none:x", status="todo")
            out = pull_one(client, item, attempts=3, backoff_s=0.25, tls_verify=False,
                           sleep=sleeps.append)
    finally:
        service.stop()
    assert (out.status, out.attempts) == ("failed", 3)
    assert sleeps == [0.25, 0.5]
    assert "localhost:1" in out.error


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.podman
@pytest.mark.skipif(shutil.which("docker-registry") is None,
                    reason="no local registry binary (apt-get install docker-registry)")
def test_pull_through_podman_py_from_a_local_registry_mirror(tmp_path):
    base = build_offline(log=lambda *_: None)
    port = _free_port()
    (tmp_path / "reg.yml").write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: error\n")
    reg = subprocess.Popen(["docker-registry", "serve", str(tmp_path / "reg.yml")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    task_image = f"docker.io/ecredit/pulltest:{uuid.uuid4().hex[:8]}"
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        mirror = f"localhost:{port}"
        _podman("push", "--tls-verify=false", base, source_ref(task_image, mirror))
        report = pull_images([task_image], registry=f"http://{mirror}", tls_verify=False,
                             attempts=2, backoff_s=0.1, log=lambda *_: None)
        (o,) = report.outcomes
        assert (o.status, o.error) == ("pulled", None)
        assert o.size_source == "manifest" and o.estimated_bytes > 10 ** 6
        assert missing_images([task_image]) == []
        assert image_digest(task_image) == image_digest(source_ref(task_image, mirror))
    finally:
        reg.terminate()
        reg.wait(timeout=10)
        _untag(task_image)
        _untag(source_ref(task_image, f"localhost:{port}"))


@pytest.mark.podman
def test_a_split_name_is_handed_to_eval_images():
    """`sandbox` cannot import the task loaders: a split name runs `python -m eval.images`."""
    from eval.images import split_images

    proc = subprocess.run([sys.executable, "-m", "sandbox.images", "pull", "--split",
                           "bundled:holdout"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    n = len(split_images("bundled:holdout"))
    assert proc.stdout.splitlines()[-1] == f"{n} images: {n} present, 0 pulled, 0 failed"


def test_pull_of_an_unreachable_hub_split_is_one_error_line(capsys):
    """official500 from the hub, offline (HF_HUB_OFFLINE=1 in tests): exit 2 with one line
    naming the split and the local-copy way out, no traceback."""
    from eval.images import main

    assert main(["pull", "--split", "official500"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --split official500: ") and "official500:PATH" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
