"""vLLM is imported by the runs that use it, whatever imported TRL first
(:mod:`ecredit_trl.policy.vllm_deferred`).

Each case runs in a fresh interpreter, because the import order is the thing under test: the
package imported before TRL's trainer (as ``train.py`` and every CLI do, and as a test session
does once any earlier test imported it), and TRL's own ``GRPOTrainer`` built inside
:func:`~ecredit_trl.policy.vllm_sync.colocate_engine` (as the colocate tests build it) must
still find ``vllm.LLM`` - the case that once failed only in the full suite.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (scripts/setup.sh installs it)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(body: str) -> str:
    code = textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_package_first_then_trl_trainer_imports_no_vllm():
    out = _run("""
        import sys
        import ecredit_trl  # installs the hook
        from trl import GRPOTrainer  # noqa: F401
        import trl.generation.vllm_generation as vg
        import trl.generation.vllm_client as vc
        import trl.import_utils as iu
        print(("vllm" in sys.modules, hasattr(vg, "LLM"), hasattr(vc, "get_ip"),
               iu.is_vllm_available()))
    """)
    # vLLM not imported, TRL's two modules without its names, the real availability kept
    assert out == "(False, False, False, True)"


def test_colocate_engine_binds_the_names_for_trls_own_trainer():
    out = _run("""
        import types
        import ecredit_trl
        from trl import GRPOTrainer  # noqa: F401
        import trl.generation.vllm_generation as vg
        import trl.generation.vllm_client as vc
        from ecredit_trl.policy.vllm_sync import colocate_engine
        import vllm
        from vllm.utils.network_utils import get_ip

        args = types.SimpleNamespace(use_vllm=True, vllm_mode="colocate", use_cpu=True,
                                     bf16=False)
        model = types.SimpleNamespace(dtype=__import__("torch").float32)
        with colocate_engine(args, model):
            inside = vg.LLM is not vllm.LLM and callable(vg.LLM)  # the CPU options wrapper
            names = (vg.SamplingParams is vllm.SamplingParams, vc.get_ip is get_ip)
        print((inside, names, vg.LLM is vllm.LLM))
    """)
    assert out == "(True, (True, True), True)"


def test_a_run_without_vllm_leaves_it_unimported():
    out = _run("""
        import sys, types
        import ecredit_trl
        from trl import GRPOTrainer  # noqa: F401
        from ecredit_trl.policy.vllm_sync import colocate_engine
        args = types.SimpleNamespace(use_vllm=False, vllm_mode="colocate", use_cpu=True,
                                     bf16=False)
        with colocate_engine(args, object()):
            pass
        print("vllm" in sys.modules)
    """)
    assert out == "False"
