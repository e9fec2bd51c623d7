"""The vLLM worker side of the file weight route (design page, "Generation engines and
scaffolds"): a worker extension a vLLM server loads with ``--worker-extension-cls
ecredit_trl.agent.vllm_worker.WeightFileSync`` (``python -m ecredit_trl.agent.vllm_server``
passes it).

The trainer writes its weights to a directory and asks every worker, through vLLM's
development endpoint ``POST /collective_rpc``, to reload them from there
(:meth:`WeightFileSync.ecredit_load_weights`); the worker keeps the version string the trainer
gave with them and reports it (:meth:`WeightFileSync.ecredit_weights_version`), so the trainer
can refuse a server whose weights are not the ones of its current step. This module imports
nothing heavy: the server's worker processes import it at start.
"""

from __future__ import annotations

__all__ = ["WeightFileSync"]


class WeightFileSync:
    """Methods mixed into vLLM's worker class (``worker_extension_cls``).

    ``self`` is a vLLM worker (``reload_weights`` is vLLM's: checkpoint-format weights are
    loaded through the model's own ``load_weights``, then processed as at start, so the CPU
    backend's repacked linear layers are rebuilt too).
    """

    def ecredit_load_weights(self, path: str, version: str) -> str:
        """Reload the weights from the safetensors files in directory ``path`` and record
        ``version``; returns it. Raises what vLLM's ``reload_weights`` raises (a missing path,
        a tensor of the wrong shape); the reported version is then ``"reload-failed"``."""
        self._ecredit_weights_version = "reload-failed"
        self.reload_weights(weights_path=str(path), is_checkpoint_format=True)
        self._ecredit_weights_version = str(version)
        return self._ecredit_weights_version

    def ecredit_weights_version(self) -> str:
        """The version of the last weights loaded by :meth:`ecredit_load_weights`;
        ``"initial"`` for the weights the server started with."""
        return getattr(self, "_ecredit_weights_version", "initial")
