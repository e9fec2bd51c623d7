"""Pull task images with podman-py: names, mirrors, a disk-space estimate, retries, a summary.

* :func:`source_ref` rewrites an image name for a mirror (``--registry``): a registry host
  (``mirror.local:5000[/prefix]``) replaces the name's registry domain; a local transport
  (``oci-archive:DIR``, ``docker-archive:DIR``, ``dir:DIR``) points at one saved image per
  name under ``DIR`` (:func:`archive_name`). The pulled image is always tagged with the
  task's own name, so the tasks and the presence check see it under that name.
* :func:`pull_images` checks what is present (one listing of local storage), estimates
  the bytes still to pull against the free space of Podman's graphroot, then pulls the
  missing ones, ``concurrency`` at a time, each retried with exponential backoff.

podman-py's ``images.pull`` speaks only the ``docker://`` transport (the libpod API
answers 400 "only docker transport is supported", podman 4.3.1); references of another
transport go through ``podman pull`` (the CLI) and are tagged with the podman-py client.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sandbox.images import swebench_image
from sandbox.runtimes.podman_runtime import PodmanService
from sandbox.runtimes.podman_store import (
    ImagePullError,
    canonical,
    local_names,
    podman_env,
    split_name,
)

LOCAL_TRANSPORTS = ("oci-archive", "docker-archive", "dir", "oci")
DEFAULT_IMAGE_BYTES = 4 * 1024 ** 3
"""Bytes assumed for an image whose size cannot be read (SWE-bench instance images hold a
conda environment and the repository; a few GB each is common)."""
EXPANSION = 2.5
"""Compressed registry layer bytes × this = the estimate of the bytes on disk (gzip'd
layers of source trees and Python environments expand roughly 2–3×)."""


def archive_name(image: str) -> str:
    """File/directory name of ``image`` in a local mirror directory: its canonical name with
    ``/``, ``:`` and ``@`` written as ``_`` (``docker.io_swebench_sweb.eval..._latest``)."""
    out = canonical(image)
    for ch in "/:@":
        out = out.replace(ch, "_")
    return out


def source_ref(image: str, registry: str | None = None) -> str:
    """Where to pull ``image`` from.

    Args:
        image: the task's image name.
        registry: None (the name's own registry), a mirror ``host[:port][/prefix]``
            (an ``http://``/``https://`` scheme is dropped), or ``TRANSPORT:DIR`` for a
            local mirror directory (``oci-archive``/``docker-archive``: ``DIR/<name>.tar``;
            ``dir``/``oci``: ``DIR/<name>``; names from :func:`archive_name`).

    Raises: ValueError naming ``registry`` when it is empty or a transport has no directory.
    """
    if registry is None:
        return canonical(image)
    reg = registry.strip()
    transport, sep, rest = reg.partition(":")
    if sep and transport in LOCAL_TRANSPORTS:
        if not rest:
            raise ValueError(f"registry: {registry!r} names no directory")
        suffix = ".tar" if transport.endswith("archive") else ""
        return f"{transport}:{Path(rest) / (archive_name(image) + suffix)}"
    reg = reg.removeprefix("https://").removeprefix("http://").rstrip("/")
    if not reg or " " in reg:
        raise ValueError(f"registry: not a registry host or TRANSPORT:DIR: {registry!r}")
    _, path, tag = split_name(image)
    return f"{reg}/{path}{tag if tag.startswith('@') else ':' + tag}"


@dataclass
class PullOutcome:
    """What happened to one image: ``status`` ``present`` (already local), ``pulled`` or
    ``failed``; ``attempts`` tries; ``seconds`` spent; ``error`` of the last failed try."""

    image: str
    source: str
    status: str
    attempts: int = 0
    seconds: float = 0.0
    error: str | None = None
    estimated_bytes: int | None = None
    size_source: str | None = None


@dataclass
class PullReport:
    """Outcomes of one :func:`pull_images` call plus the space estimate (bytes)."""

    outcomes: list[PullOutcome] = field(default_factory=list)
    estimate_bytes: int = 0
    free_bytes: int | None = None
    graphroot: str | None = None

    def counts(self) -> dict[str, int]:
        out = {"present": 0, "pulled": 0, "failed": 0}
        for o in self.outcomes:
            out[o.status] += 1
        return out

    def summary(self) -> str:
        """One line: ``N images: P present, Q pulled, F failed (first failures ...)``."""
        c = self.counts()
        line = (f"{len(self.outcomes)} images: {c['present']} present, {c['pulled']} pulled, "
                f"{c['failed']} failed")
        bad = [o for o in self.outcomes if o.status == "failed"]
        if bad:
            line += "; failed: " + "; ".join(f"{o.image} ({o.error})" for o in bad[:3])
            if len(bad) > 3:
                line += f"; ... {len(bad) - 3} more"
        return line

    def to_json(self) -> dict:
        return {"counts": self.counts(), "estimate_bytes": self.estimate_bytes,
                "free_bytes": self.free_bytes, "graphroot": self.graphroot,
                "outcomes": [asdict(o) for o in self.outcomes]}


def _env() -> dict[str, str]:
    return podman_env()


def missing_images(images: Iterable[str]) -> list[str]:
    """The names of ``images`` not in local Podman storage, sorted, each once (compared in
    canonical form, so ``swebench/x`` and ``docker.io/swebench/x:latest`` are one image)."""
    have = {canonical(n) for n in local_names()}
    return sorted({i for i in images if canonical(i) not in have})


def registry_bytes(source: str, *, tls_verify: bool = True, timeout_s: float = 30.0) -> int | None:
    """Estimated bytes on disk of the image at ``source``, None when unreadable.

    Local transports: the archive's/directory's size. Registries: the layer sizes of the
    image manifest (:func:`manifest_layers_bytes`, compressed) × :data:`EXPANSION`.
    """
    transport, sep, rest = source.partition(":")
    if sep and transport in LOCAL_TRANSPORTS:
        p = Path(rest)
        if p.is_file():
            return p.stat().st_size
        if p.is_dir():
            return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        return None
    try:
        size = manifest_layers_bytes(source, tls_verify=tls_verify, timeout_s=timeout_s)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return int(size * EXPANSION) if size else None


_MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json"])


def manifest_layers_bytes(source: str, *, tls_verify: bool = True, timeout_s: float = 30.0,
                          arch: str = "amd64") -> int:
    """Sum of the (compressed) layer sizes of ``source``'s image manifest, read with the
    registry's HTTP API v2 (``GET /v2/<path>/manifests/<tag>``; an anonymous bearer token
    when the registry asks for one, as Docker Hub does; a manifest list / OCI index gives
    its ``linux/<arch>`` entry). ``tls_verify=False`` falls back to plain HTTP.

    Raises: OSError (network, HTTP errors), ValueError/KeyError (not a manifest).
    """
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    domain, path, tag = split_name(source)
    host = "registry-1.docker.io" if domain == "docker.io" else domain
    ref = tag.lstrip("@")
    schemes = ("https", "http") if not tls_verify else ("https",)
    token: list[str] = []

    def get(url: str) -> dict:
        headers = {"Accept": _MANIFEST_TYPES}
        if token:
            headers["Authorization"] = f"Bearer {token[0]}"
        req = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            auth = exc.headers.get("WWW-Authenticate", "")
            if exc.code != 401 or token or not auth.lower().startswith("bearer "):
                raise
            fields = dict(part.split("=", 1) for part in auth[7:].split(","))
            fields = {k.strip(): v.strip().strip('"') for k, v in fields.items()}
            query = urllib.parse.urlencode({k: v for k, v in fields.items()
                                            if k in ("service", "scope")})
            with urllib.request.urlopen(f"{fields['realm']}?{query}", timeout=timeout_s) as r:
                body = json.loads(r.read())
            token.append(body.get("token") or body["access_token"])
            return get(url)

    last: Exception = OSError("no scheme tried")
    for scheme in schemes:
        base = f"{scheme}://{host}/v2/{path}/manifests/"
        try:
            man = get(base + ref)
            if "manifests" in man:  # a list / index: this platform's manifest
                entry = next(m for m in man["manifests"]
                             if (m.get("platform") or {}).get("os") == "linux"
                             and (m.get("platform") or {}).get("architecture") == arch)
                man = get(base + entry["digest"])
            return sum(int(layer["size"]) for layer in man["layers"])
        except (OSError, StopIteration) as exc:
            last = exc if isinstance(exc, OSError) else ValueError(f"no linux/{arch} image")
    raise last


def _pull_once(client, item: PullOutcome, tls_verify: bool) -> None:
    """One pull of ``item.source`` tagged as ``item.image``; raises on any failure."""
    transport, sep, _ = item.source.partition(":")
    local = bool(sep) and transport in LOCAL_TRANSPORTS
    if local:
        proc = subprocess.run(["podman", "pull", "-q", item.source], capture_output=True,
                              text=True, env=_env(), timeout=3600)
        if proc.returncode != 0:
            raise ImagePullError(proc.stderr.strip()[-500:] or f"exit {proc.returncode}")
        image_id = proc.stdout.strip().splitlines()[-1]
    else:
        image_id = None
        for line in client.images.pull(item.source, stream=True, decode=True,
                                       tls_verify=tls_verify):
            if isinstance(line, dict) and line.get("error"):
                raise ImagePullError(str(line["error"])[-500:])
            if isinstance(line, dict) and line.get("id"):
                image_id = line["id"]
        if not image_id:
            raise ImagePullError("the service reported no image id")
    if local or canonical(item.source) != canonical(item.image):
        domain, path, tag = split_name(item.image)
        if not client.images.get(image_id).tag(f"{domain}/{path}", tag):
            raise ImagePullError(f"tagging {image_id[:12]} as {item.image} failed")


def pull_one(client, item: PullOutcome, *, attempts: int = 4, backoff_s: float = 5.0,
             tls_verify: bool = True, sleep: Callable[[float], None] = time.sleep) -> PullOutcome:
    """Pull one image, retrying: try ``i`` (1-based) that fails sleeps
    ``backoff_s * 2**(i-1)`` seconds before the next; after ``attempts`` tries the outcome is
    ``failed`` with the last error. Never raises for a pull failure."""
    t0 = time.monotonic()
    for attempt in range(1, max(1, attempts) + 1):
        item.attempts = attempt
        try:
            _pull_once(client, item, tls_verify)
            item.status, item.error = "pulled", None
            break
        except Exception as exc:  # API errors, timeouts, CLI failures: all retried
            item.status, item.error = "failed", f"{type(exc).__name__}: {exc}"[:500]
            if attempt < max(1, attempts):
                sleep(backoff_s * 2 ** (attempt - 1))
    item.seconds = round(time.monotonic() - t0, 3)
    return item


def pull_images(images: Iterable[str], *, registry: str | None = None, url: str | None = None,
                concurrency: int = 4, attempts: int = 4, backoff_s: float = 5.0,
                tls_verify: bool = True, check_space: bool = True,
                default_bytes: int = DEFAULT_IMAGE_BYTES,
                log: Callable[[str], None] = print) -> PullReport:
    """Pull every image of ``images`` that local storage lacks (see the module docstring).

    Args:
        images: task image names (duplicates are pulled once).
        registry: mirror (:func:`source_ref`).
        url: Podman API URL; None starts a private local service for the call.
        concurrency: pulls at once (>= 1). attempts, backoff_s: see :func:`pull_one`.
        tls_verify: verify registry TLS (False for a plain-HTTP local registry).
        check_space: refuse when the estimate exceeds the graphroot's free bytes.
        default_bytes: estimate for an image whose size cannot be read.

    Returns: a :class:`PullReport` (one outcome per distinct image, input order).

    Raises:
        ValueError: ``concurrency`` < 1, ``attempts`` < 1, a bad image name or ``registry``.
        ImagePullError: the estimate exceeds the free space (both in GiB), or podman
            cannot list its images.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency: must be >= 1, got {concurrency}")
    if attempts < 1:
        raise ValueError(f"attempts: must be >= 1, got {attempts}")
    names = list(dict.fromkeys(images))
    have = {canonical(n) for n in local_names()}
    report = PullReport(outcomes=[
        PullOutcome(image=n, source=source_ref(n, registry),
                    status="present" if canonical(n) in have else "todo") for n in names])
    todo = [o for o in report.outcomes if o.status == "todo"]
    service = None
    if todo and url is None:
        service = PodmanService()
        url = service.url
    try:
        if todo:
            _check_space(report, todo, url, check_space, default_bytes, tls_verify, log)
            from podman import PodmanClient

            lock = threading.Lock()

            def work(item: PullOutcome) -> PullOutcome:
                with PodmanClient(base_url=url, timeout=3600) as client:
                    out = pull_one(client, item, attempts=attempts, backoff_s=backoff_s,
                                   tls_verify=tls_verify)
                with lock:
                    log(f"{out.status}: {out.image} ({out.attempts} attempt(s), "
                        f"{out.seconds:.1f} s){' ' + out.error if out.error else ''}")
                return out

            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                list(pool.map(work, todo))
    finally:
        if service is not None:
            service.stop()
    return report


def _check_space(report: PullReport, todo: list[PullOutcome], url: str, check_space: bool,
                 default_bytes: int, tls_verify: bool, log) -> None:
    """Fill the per-image and total estimates and the graphroot's free bytes; refuse
    (ImagePullError) when the estimate does not fit and ``check_space`` is set."""
    from podman import PodmanClient

    for o in todo:
        size = registry_bytes(o.source, tls_verify=tls_verify)
        o.estimated_bytes, o.size_source = ((size, "manifest") if size is not None
                                            else (default_bytes, "default"))
    report.estimate_bytes = sum(o.estimated_bytes or 0 for o in todo)
    with PodmanClient(base_url=url, timeout=60) as client:
        root = (client.info().get("store") or {}).get("graphRoot")
    report.graphroot = root
    if root and Path(root).exists():
        report.free_bytes = shutil.disk_usage(root).free
    gib = 1024 ** 3
    n_default = sum(o.size_source == "default" for o in todo)
    free_txt = (f"{report.free_bytes / gib:.1f} GiB" if report.free_bytes is not None
                else "unknown")
    log(f"{len(todo)} image(s) to pull, about {report.estimate_bytes / gib:.1f} GiB "
        f"({n_default} estimated at the {default_bytes / gib:.1f} GiB default); free in "
        f"{root}: {free_txt}")
    if check_space and report.free_bytes is not None and report.estimate_bytes > report.free_bytes:
        raise ImagePullError(
            f"not enough disk space: about {report.estimate_bytes / gib:.1f} GiB to pull, "
            f"{report.free_bytes / gib:.1f} GiB free in {root} (free space, pull fewer images, "
            "or pass --no-space-check)")


def row_image(row: dict, where: str = "row") -> str:
    """The image of one task row: its own ``image`` field wins, else the swebench 5 name of
    its ``instance_id`` (:func:`sandbox.images.swebench_image`).

    Raises: ValueError naming ``where`` when the row has neither.
    """
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object, got {type(row).__name__}")
    if row.get("image"):
        if not isinstance(row["image"], str):
            raise ValueError(f"{where}: field 'image' must be a string")
        return row["image"]
    if not row.get("instance_id"):
        raise ValueError(f"{where}: no field 'image' and no field 'instance_id'")
    return swebench_image(str(row["instance_id"]))


def images_from_file(path: str | Path) -> list[str]:
    """Image names listed by a file: ``.txt`` (one name a line, ``#`` comments), ``.jsonl``
    (task rows, :func:`row_image`) or ``.json`` (a list of rows or names).

    Raises: FileNotFoundError; ValueError naming the file and row for a bad row or suffix.
    """
    import json

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--split: no such file {p}")
    text = p.read_text(encoding="utf-8")
    if p.suffix == ".txt":
        return [ln.strip() for ln in text.splitlines() if ln.strip() and not
                ln.lstrip().startswith("#")]
    if p.suffix == ".jsonl":
        items = []
        for n, ln in enumerate(text.splitlines(), 1):
            if ln.strip():
                try:
                    items.append((n, json.loads(ln)))
                except ValueError as exc:
                    raise ValueError(f"{p} row {n}: not JSON ({exc})") from None
    elif p.suffix == ".json":
        data = json.loads(text)
        if not isinstance(data, list):
            raise ValueError(f"{p}: expected a JSON list of rows or image names")
        items = list(enumerate(data, 1))
    else:
        raise ValueError(f"--split: {p}: expected a .txt, .jsonl or .json file here (other "
                         "task files: python -m eval.images pull --split FILE)")
    return [item if isinstance(item, str) else row_image(item, f"{p} row {n}")
            for n, item in items]
