"""vLLM is imported when a run generates with it, not whenever it is installed.

TRL 1.16 imports vLLM at the import of its trainer as soon as the package is installed
(``trl/generation/vllm_generation.py`` and ``vllm_client.py``: ``if is_vllm_available(): from
vllm import ...``), which costs about 6 s of start-up in every process that imports
``GRPOTrainer`` - every ``train.py``, every rollout CLI, every test that starts one - although
only runs with ``use_vllm`` touch those names (design page, "Generation engines and
scaffolds"). :func:`defer_trl_vllm_import` (called by the package's ``__init__``, before
anything imports TRL's trainer) lets those two modules import as if vLLM were absent;
:func:`load_trl_vllm_names` (called by the trainer when ``use_vllm`` is set, before TRL builds
its engine or client) imports vLLM and gives the two modules the names they would have had.
Everything else of TRL sees the real ``is_vllm_available``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys

#: TRL's modules whose top level imports vLLM, and the vLLM names each binds there
#: (trl 1.16: the ``if is_vllm_available():`` blocks of those files).
DEFERRED = {
    "trl.generation.vllm_generation": {
        "LLM": ("vllm", "LLM"), "RequestOutput": ("vllm", "RequestOutput"),
        "SamplingParams": ("vllm", "SamplingParams"),
        "StructuredOutputsParams": ("vllm.sampling_params", "StructuredOutputsParams")},
    "trl.generation.vllm_client": {"get_ip": ("vllm.utils.network_utils", "get_ip")},
}


def _absent(*_args, **_kwargs) -> bool:
    return False


class _WithoutVLLM(importlib.abc.Loader):
    """Runs a module of :data:`DEFERRED` with ``is_vllm_available`` answering False."""

    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        import trl.import_utils as iu  # here, not at the top: importing this hook costs nothing

        real = iu.is_vllm_available
        iu.is_vllm_available = _absent
        try:
            self.inner.exec_module(module)
        finally:
            iu.is_vllm_available = real
            # modules imported meanwhile may have bound the stand-in: give them the real one
            for name, mod in list(sys.modules.items()):
                if name.startswith("trl") and getattr(mod, "is_vllm_available", None) is _absent:
                    mod.is_vllm_available = real


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in DEFERRED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _WithoutVLLM(spec.loader)
                return spec
        return None


def defer_trl_vllm_import() -> None:
    """Install the import hook (idempotent). No effect on modules already imported."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def load_trl_vllm_names() -> None:
    """Import vLLM and bind, in each imported module of :data:`DEFERRED`, the names its
    ``if is_vllm_available():`` block binds. Raises ImportError without vLLM."""
    for mod_name, names in DEFERRED.items():
        mod = sys.modules.get(mod_name)
        if mod is None:
            continue
        for attr, (src, src_attr) in names.items():
            if not hasattr(mod, attr):
                setattr(mod, attr, getattr(importlib.import_module(src), src_attr))


__all__ = ["DEFERRED", "defer_trl_vllm_import", "load_trl_vllm_names"]
