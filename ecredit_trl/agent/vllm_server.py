"""Training against a vLLM server (``--use_vllm true --vllm_mode server``): the weight route
by device, the stale-weights guard, and the listening check (design page, "Generation engines
and scaffolds").

TRL pushes the trainer's weights into the server over vLLM's NCCL weight-transfer engine,
which needs a CUDA device (``VLLMClient.init_communicator`` raises ``NotImplementedError``
elsewhere). The route is therefore chosen by the trainer's device:

* **CUDA**: TRL's own route, unchanged (NCCL broadcast, then a prefix-cache reset).
* **CPU** (the file route, :class:`FileWeightRoute`): every sync writes the weights TRL would
  broadcast (``VLLMGeneration._iter_named_params``: LoRA adapters merged, names as vLLM loads
  them; ``lm_head.weight`` added for tied embeddings) to
  ``<run_dir>/vllm_weights/step-<N>/model.safetensors``, then asks every server worker through
  vLLM's development endpoint ``POST /collective_rpc`` to reload from that directory
  (:meth:`ecredit_trl.agent.vllm_worker.WeightFileSync.ecredit_load_weights`) under the
  version ``step-<N>-<sha256[:16] of the file>``, and resets the prefix cache. The server must
  see the same path (same host, or a shared file system) and run the worker extension: start
  it with ``python -m ecredit_trl.agent.vllm_serve``.

Stale weights are refused, never used silently: after each push the workers must report the
version just written, and before every generation call the server's version must still be it
and must have been pushed at the trainer's current step (:class:`StaleServerWeights`). A
server started on other weights and never reloaded reports ``"initial"``; one without the
extension cannot report a version at all; both are refused.

:func:`server_generation` is the trainer's hook: while ``GRPOTrainer.__init__`` runs it makes
TRL build :class:`ServerGeneration` (TRL's ``VLLMGeneration`` with the routes above) instead.
"""

from __future__ import annotations

import hashlib
import shutil
import socket
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import requests
import trl.trainer.grpo_trainer as grpo_trainer
from trl.generation.vllm_client import VLLMClient
from trl.generation.vllm_generation import VLLMGeneration

__all__ = ["FileWeightRoute", "ServerGeneration", "StaleServerWeights", "require_listening",
           "server_generation"]

#: seconds a push (write + reload on the server) may take before the trainer gives up.
RELOAD_TIMEOUT_S = 600.0


class StaleServerWeights(RuntimeError):
    """The vLLM server does not hold the weights of the trainer's current step."""


def server_url(base_url: str | None, host: str, port: int) -> str:
    """``base_url`` when given, else ``http://host:port`` (as TRL builds it)."""
    return base_url.rstrip("/") if base_url else f"http://{host}:{port}"


def require_listening(base_url: str | None, host: str, port: int, timeout_s: float = 3.0) -> None:
    """Refuse, in one line, a server address nothing listens on (before any rollout: TRL
    would wait ``vllm_server_timeout`` seconds, 240 by default, and then fail mid-setup).

    Raises: ValueError naming ``vllm_server_base_url`` or ``vllm_server_host`` /
    ``vllm_server_port`` and the command that starts a server.
    """
    url = urlparse(server_url(base_url, host, port))
    h, p = url.hostname or host, url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((h, p), timeout=timeout_s).close()
    except OSError as exc:
        field = "vllm_server_base_url" if base_url else "vllm_server_host/vllm_server_port"
        raise ValueError(f"{field}: nothing listens on {h}:{p} ({exc.strerror or exc}); start "
                         f"the server first (python -m ecredit_trl.agent.vllm_serve --model M "
                         f"--host {h} --port {p}) or use --vllm_mode colocate") from None


def _with_tied_head(named: dict, tie: bool) -> dict:
    """``named`` plus ``lm_head.weight`` = the input embedding when the model ties them
    (the checkpoint the server loads must carry the head it computes with)."""
    if tie and "lm_head.weight" not in named:
        emb = [k for k in named if k.endswith("embed_tokens.weight")]
        if emb:
            named["lm_head.weight"] = named[emb[0]].clone()
    return named


class FileWeightRoute:
    """The CPU weight route of one trainer to one server (see the module docstring).

    Args:
        base_url: the server, ``http://host:port``.
        directory: where the weights are written (the server reads them from there).
    """

    def __init__(self, base_url: str, directory: str | Path) -> None:
        self.base_url, self.directory = base_url.rstrip("/"), Path(directory)
        self.session = requests.Session()
        self.pushed: tuple[int, str] | None = None  # (trainer step, version) of the last push

    def _rpc(self, method: str, args: list[str], timeout_s: float = 30.0) -> list:
        r = self.session.post(f"{self.base_url}/collective_rpc", timeout=timeout_s,
                              json={"method": method, "args": args})
        if r.status_code != 200:
            raise StaleServerWeights(
                f"vLLM server {self.base_url}: {method} failed ({r.status_code}: "
                f"{r.text[:300]}); start it with python -m ecredit_trl.agent.vllm_serve "
                "(VLLM_SERVER_DEV_MODE=1 and the ecredit worker extension)")
        return list(r.json().get("results") or [])

    def version(self) -> str:
        """The weights version every server worker reports (``"initial"``: never reloaded).
        Raises: StaleServerWeights when the server cannot report one, or its workers
        disagree."""
        got = set(self._rpc("ecredit_weights_version", []))
        if len(got) != 1:
            raise StaleServerWeights(f"vLLM server {self.base_url}: workers report weights "
                                     f"versions {sorted(map(str, got))}")
        return str(got.pop())

    def push(self, named_params, step: int, *, tie_word_embeddings: bool = False) -> str:
        """Write ``named_params`` (iterable of (vLLM name, tensor)) as the weights of trainer
        step ``step``, have the server reload them, check it reports their version, reset its
        prefix cache; older step directories are removed. Returns the version.

        Raises: StaleServerWeights when the server does not report the version written.
        """
        from safetensors.torch import save_file  # heavy: only when a sync happens

        named = {n: t.detach().to("cpu").contiguous().clone() for n, t in named_params}
        named = _with_tied_head(named, tie_word_embeddings)
        out = self.directory / f"step-{step}"
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        save_file(named, str(out / "model.safetensors"))
        sha = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
        version = f"step-{step}-{sha[:16]}"
        self._rpc("ecredit_load_weights", [str(out.resolve()), version], RELOAD_TIMEOUT_S)
        self.pushed = (step, version)
        self.require(step)
        r = self.session.post(f"{self.base_url}/reset_prefix_cache", timeout=30)
        if r.status_code != 200:
            raise StaleServerWeights(f"vLLM server {self.base_url}: reset_prefix_cache failed "
                                     f"({r.status_code})")
        for old in self.directory.glob("step-*"):
            if old != out:
                shutil.rmtree(old, ignore_errors=True)
        return version

    def require(self, step: int) -> None:
        """Refuse to generate unless the server holds the weights pushed at trainer step
        ``step``. Raises: StaleServerWeights naming the server's and the expected version."""
        if self.pushed is None or self.pushed[0] != step:
            raise StaleServerWeights(f"vLLM server {self.base_url}: no weights pushed at "
                                     f"trainer step {step} (last push: {self.pushed})")
        have = self.version()
        if have != self.pushed[1]:
            raise StaleServerWeights(
                f"vLLM server {self.base_url} holds weights {have!r}, the trainer's step "
                f"{step} are {self.pushed[1]!r}: refusing to train on stale weights (was the "
                "server restarted, or is another trainer using it?)")


class ServerGeneration(VLLMGeneration):
    """TRL's ``VLLMGeneration`` with the file route in server mode on a non-CUDA device
    (colocate mode and CUDA keep TRL's behaviour). ``weights_dir`` and ``step_of`` (the
    trainer's global step) are set by :func:`server_generation`."""

    weights_dir: Path | None = None
    step_of = None

    def _file_route(self) -> bool:
        return self.mode == "server" and self.accelerator.device.type != "cuda"

    def _init_vllm(self) -> None:
        if not self._file_route():
            return super()._init_vllm()
        self.route = None
        if self.accelerator.is_main_process:
            base_url = server_url(self.server_base_url, self.server_host, self.server_port)
            self.vllm_client = VLLMClient(base_url=base_url, group_port=self.group_port,
                                          connection_timeout=self.server_timeout)
            self.route = FileWeightRoute(base_url, self.weights_dir)
            self.route.version()  # a server without the extension is refused here

    def _step(self) -> int:
        return int(self.step_of()) if self.step_of is not None else 0

    def sync_weights(self) -> None:
        if not self._file_route():
            return super().sync_weights()
        named = self._iter_named_params()
        if self.route is None:  # other ranks take part in the gathers only
            for _ in named:
                pass
            return
        tie = bool(getattr(self.model.config, "tie_word_embeddings", False))
        self.route.push(named, self._step(), tie_word_embeddings=tie)

    def generate(self, *args, **kwargs):
        if self._file_route() and self.route is not None:
            self.route.require(self._step())
        return super().generate(*args, **kwargs)


@contextmanager
def server_generation(args, run_dir: str | Path, step_of):
    """While the ``with`` body runs (``GRPOTrainer.__init__``), TRL builds
    :class:`ServerGeneration` for ``use_vllm`` in server mode; a no-op otherwise.

    Args:
        args: the trainer's config (``use_vllm``, ``vllm_mode``).
        run_dir: the run directory; the file route writes under ``run_dir/vllm_weights``.
        step_of: a callable returning the trainer's global step.
    """
    if not (args.use_vllm and args.vllm_mode == "server"):
        yield
        return
    cls = type("ServerGeneration", (ServerGeneration,),
               {"weights_dir": Path(run_dir) / "vllm_weights", "step_of": staticmethod(step_of)})
    saved = grpo_trainer.VLLMGeneration
    grpo_trainer.VLLMGeneration = cls
    try:
        yield
    finally:
        grpo_trainer.VLLMGeneration = saved
