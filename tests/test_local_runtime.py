"""LocalRuntime: the same trial script on the host (explicit choice only)."""

import pytest
from conftest import make_tar
from test_sandbox_podman import BUG, CALC, TESTS

from sandbox.backend import SandboxOptions, make_runtime
from sandbox.trials.trial import TrialSpec

EVAL = ("echo '>>>>> Start Test Output'\n"
        "python -m pytest -rA -p no:cacheprovider test_calc.py\n"
        "echo '>>>>> End Test Output'\n")


def _spec(tid, **kw):
    return TrialSpec(trial_id=tid, image="local", eval_script=kw.pop("eval_script", EVAL),
                     repo_archive=make_tar({"calc.py": CALC, "test_calc.py": TESTS}), **kw)


def test_local_runtime_warns_and_runs():
    with pytest.warns(RuntimeWarning, match="not isolated"):
        rt = make_runtime(SandboxOptions(kind="local"))
    r = rt.run_trial(_spec("l1", artifact=BUG))
    assert r.exit_class == "ok"
    assert "FAILED test_calc.py::test_add" in r.log
    assert r.applied_with == "git apply --verbose"
    t = rt.run_trial(_spec("l2", eval_script="sleep 30\n", timeout_s=1))
    assert t.exit_class == "timeout"


def test_unknown_runtime_is_refused():
    with pytest.raises(ValueError, match="runtime"):
        make_runtime(SandboxOptions(kind="docker"))


@pytest.mark.parametrize("field,kw", [("trial_id", {"trial_id": "bad id/x"}),
                                      ("image", {"image": ""}),
                                      ("timeout_s", {"timeout_s": 0})])
def test_trial_spec_errors_name_the_field(field, kw):
    args = {"trial_id": "ok", "image": "img", "eval_script": "true", **kw}
    with pytest.raises(ValueError, match=field):
        TrialSpec(**args)
