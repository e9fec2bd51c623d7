"""Checkpoint audit: what is in a checkpoint, what changed against the base, anything non-finite.

``python -m ecredit_trl.runs.audit CHECKPOINT [--base MODEL] [--json-only]``

Full weights (``model.safetensors``, sharded ``model-*.safetensors``): tensors,
elements, non-finite values; with a base (``--base``, or the run's policy from
``manifest.json`` two levels up) also tensors/elements that differ from the
base (exact comparison, ``!=``; shape mismatches and tensors missing on either
side are listed).

LoRA adapters (``adapter_model.safetensors``): the adapter's tensors and
non-finite values, and per adapted module the weight change
``ΔW = (alpha / r) · B @ A`` it applies to the base (scaling from
``adapter_config.json``): ``changed_tensors`` counts modules with ΔW ≠ 0,
``changed_elements`` the non-zero elements of ΔW. With ``--base`` an adapter
directory, the adapter tensors are compared one to one instead.

Prints one JSON object, then one readable line; exit status 0, or 1 when a
non-finite value was found, 2 when the checkpoint cannot be read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sandbox.bounds import ArgumentParser, InDir, InPath


class AuditError(ValueError):
    """The checkpoint or base cannot be audited; the message names the file."""


def _weight_files(path: Path) -> tuple[str, list[Path]]:
    if path.is_file():
        kind = "lora" if "adapter" in path.name else "full"
        return kind, [path]
    if not path.is_dir():
        raise AuditError(f"{path}: no such checkpoint file or directory")
    adapter = path / "adapter_model.safetensors"
    if adapter.is_file():
        return "lora", [adapter]
    single = path / "model.safetensors"
    if single.is_file():
        return "full", [single]
    shards = sorted(path.glob("model-*-of-*.safetensors"))
    if shards:
        return "full", shards
    if (path / "pytorch_model.bin").is_file() or (path / "adapter_model.bin").is_file():
        raise AuditError(f"{path}: only .bin weights; the audit reads safetensors")
    raise AuditError(f"{path}: no model.safetensors / adapter_model.safetensors")


def load_tensors(path: str | Path) -> tuple[str, dict]:
    """(kind ``full``/``lora``, name → tensor) of a checkpoint directory or weight file.

    Raises: AuditError naming the file (missing, unreadable, truncated).
    """
    from safetensors.torch import load_file

    kind, files = _weight_files(Path(path))
    tensors = {}
    for f in files:
        try:
            tensors.update(load_file(str(f)))
        except Exception as exc:  # safetensors raises its own error types
            raise AuditError(f"{f}: unreadable safetensors ({exc})") from exc
    return kind, tensors


def _nonfinite(tensors: dict) -> tuple[int, int, list[str]]:
    import torch

    nt = ne = 0
    names = []
    for name, t in tensors.items():
        if t.is_floating_point() or t.is_complex():
            bad = int((~torch.isfinite(t)).sum())
            if bad:
                nt += 1
                ne += bad
                names.append(name)
    return nt, ne, names


def _lora_scaling(path: Path) -> tuple[float, dict]:
    cfg_path = (path if path.is_dir() else path.parent) / "adapter_config.json"
    if not cfg_path.is_file():
        return 1.0, {}
    cfg = json.loads(cfg_path.read_text())
    r = cfg.get("r") or 1
    alpha = cfg.get("lora_alpha") or r
    scale = alpha / (r ** 0.5) if cfg.get("use_rslora") else alpha / r
    return float(scale), cfg


def audit(checkpoint: str | Path, base: str | Path | None = None) -> dict:
    """Audit ``checkpoint`` (see the module docstring).

    Returns a JSON-ready dict: ``checkpoint``, ``kind``, ``tensors``, ``elements``,
    ``nonfinite_tensors``, ``nonfinite_elements``, ``nonfinite_names`` (first 20),
    ``base``, ``changed_tensors``, ``changed_elements`` (None without a reference),
    ``missing_in_base``, ``missing_in_checkpoint``, ``shape_mismatch``,
    ``max_abs_change``, ``reference`` (what "changed" is measured against).

    Raises: AuditError naming an unreadable checkpoint or base.
    """
    import torch

    ck = Path(checkpoint)
    kind, tensors = load_tensors(ck)
    nt, ne, names = _nonfinite(tensors)
    out = {"checkpoint": str(ck), "kind": kind, "tensors": len(tensors),
           "elements": int(sum(t.numel() for t in tensors.values())),
           "nonfinite_tensors": nt, "nonfinite_elements": ne, "nonfinite_names": names[:20],
           "base": None, "reference": None, "changed_tensors": None, "changed_elements": None,
           "max_abs_change": None, "missing_in_base": [], "missing_in_checkpoint": [],
           "shape_mismatch": []}
    if base is None and kind == "full":
        base = _base_from_manifest(ck)
    if kind == "lora" and (base is None or _weight_files(Path(base))[0] == "full"):
        scale, cfg = _lora_scaling(ck)
        out["base"] = str(base) if base is not None else cfg.get("base_model_name_or_path")
        out["reference"] = f"base model (adapter delta = {scale:g} * B @ A per module)"
        pairs = {}
        for name in tensors:
            if ".lora_A." in name or name.endswith(".lora_A.weight"):
                stem = name.replace(".lora_A.", ".lora_B.")
                if stem in tensors:
                    pairs[name.split(".lora_A.")[0]] = (tensors[name], tensors[stem])
        changed_t = changed_e = 0
        worst = 0.0
        for _, (a, b) in sorted(pairs.items()):
            delta = scale * (b.float() @ a.float())
            nz = int((delta != 0).sum())
            if nz:
                changed_t += 1
                changed_e += nz
                worst = max(worst, float(delta.abs().max()))
        out.update(changed_tensors=changed_t, changed_elements=changed_e, max_abs_change=worst,
                   adapted_modules=len(pairs))
        return out
    if base is None:
        return out
    bkind, btensors = load_tensors(base)
    out["base"] = str(base)
    out["reference"] = f"{bkind} weights at {base}"
    changed_t = changed_e = 0
    worst = 0.0
    for name, t in tensors.items():
        if name not in btensors:
            out["missing_in_base"].append(name)
            continue
        b = btensors[name]
        if tuple(b.shape) != tuple(t.shape):
            out["shape_mismatch"].append({"name": name, "checkpoint": list(t.shape),
                                          "base": list(b.shape)})
            continue
        diff = t.to(torch.float64) != b.to(torch.float64)
        n = int(diff.sum())
        if n:
            changed_t += 1
            changed_e += n
            worst = max(worst, float((t.double() - b.double()).abs().max()))
    out["missing_in_checkpoint"] = sorted(set(btensors) - set(tensors))
    out.update(changed_tensors=changed_t, changed_elements=changed_e, max_abs_change=worst)
    return out


def _base_from_manifest(ck: Path) -> str | None:
    """The run's policy path from ``manifest.json`` beside the checkpoint, if it still exists."""
    man = (ck if ck.is_dir() else ck.parent).parent / "manifest.json"
    try:
        path = json.loads(man.read_text())["model"]["path"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return path if Path(path).exists() else None


def summary_line(r: dict) -> str:
    """One readable line of an :func:`audit` result."""
    what = "LoRA adapter" if r["kind"] == "lora" else "full weights"
    line = f"{r['checkpoint']}: {what}, {r['tensors']} tensors ({r['elements']:,} elements)"
    if r["changed_tensors"] is None:
        line += "; no base to compare with"
    else:
        unit = "modules" if r["kind"] == "lora" and "delta" in (r["reference"] or "") else "tensors"
        line += (f"; {r['changed_tensors']} {unit} changed vs base ({r['changed_elements']:,} "
                 f"elements, max |change| {r['max_abs_change']:.3g})")
        extra = len(r["missing_in_base"]) + len(r["missing_in_checkpoint"]) + len(r["shape_mismatch"])
        if extra:
            line += f", {extra} not comparable"
    line += f"; {r['nonfinite_elements']:,} non-finite values"
    if r["nonfinite_tensors"]:
        line += f" in {r['nonfinite_tensors']} tensors (e.g. {r['nonfinite_names'][0]})"
    return line


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m ecredit_trl.runs.audit",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", type=InPath(), help="checkpoint directory or .safetensors file")
    ap.add_argument("--base", type=InDir(), default=None,
                    help="base model directory (default: the run's policy from manifest.json)")
    ap.add_argument("--json-only", action="store_true", help="print only the JSON object")
    args = ap.parse_args(argv)
    try:
        result = audit(args.checkpoint, args.base)
    except AuditError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, sort_keys=True))
    if not args.json_only:
        print(summary_line(result))
    return 1 if result["nonfinite_elements"] else 0


if __name__ == "__main__":
    sys.exit(main())
