"""The studied policy's parameter count, measured from its weight files.

The report's caveat line states how large the policy is from the model it evaluated, never
a fixed string: the count is the sum over every tensor of the product of its shape, read
from the ``*.safetensors`` headers (the format's 8-byte little-endian header length, then a
JSON table ``name → {dtype, shape, data_offsets}``; source: the safetensors format
specification, https://github.com/huggingface/safetensors#format). Nothing is loaded into
memory beyond the headers. A tensor stored once counts once (tied weights saved once by
transformers count once, as ``sum(p.numel() for p in model.parameters())`` does).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from pathlib import Path

__all__ = ["count_parameters", "model_parameters"]

_MAX_HEADER = 100 << 20  # the format caps the header at 100 MB


def count_parameters(model_dir: str | Path) -> int | None:
    """Parameters stored in ``model_dir``'s ``*.safetensors`` files (adapter files count
    the adapter's own parameters); None when the folder holds no safetensors file.

    Raises: ValueError naming a file whose header is not a safetensors header.
    """
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with open(f, "rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                raise ValueError(f"{f}: not a safetensors file (shorter than its header length)")
            (n,) = struct.unpack("<Q", raw)
            if n > _MAX_HEADER:
                raise ValueError(f"{f}: not a safetensors file (header length {n})")
            try:
                header = json.loads(fh.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise ValueError(f"{f}: not a safetensors file (header is not JSON)") from None
        total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    return total


def model_parameters(out: Path, run_dirs: Sequence[Path],
                     baseline_results: dict[str, dict | None]) -> dict:
    """The policy's measured size for the report: the first of the runs'
    ``checkpoint-final/`` (the trained policy) and the baseline evaluation's model folder
    that holds weights.

    Returns: ``{"parameters": int | None, "source": path (relative to ``out`` when inside),
        "adapter": bool}``; ``parameters`` None (Pending) when no weights are there to count.
    """
    cands = [Path(d) / "checkpoint-final" for d in run_dirs]
    cands += [Path(m) for res in baseline_results.values() if res
              for m in [((res.get("model") or {}).get("model_dir"))] if m]
    for c in cands:
        try:
            n = count_parameters(c) if c.is_dir() else None
        except (OSError, ValueError):
            n = None
        if n is not None:
            try:
                src = c.resolve().relative_to(Path(out).resolve()).as_posix()
            except ValueError:
                src = str(c)
            return {"parameters": n, "source": src,
                    "adapter": (c / "adapter_config.json").is_file()}
    return {"parameters": None, "source": None, "adapter": False}
