"""A failing rollout cannot escape its negative reward by breaking its own trial.

The attribution rule (:mod:`eval.integrity.attribution`): a trial that hangs, is OOM-killed, exhausts
its pids, floods its log or does not apply is the artifact's failure (the contract's failure
value, an ``artifact_*`` class with evidence) when the task's control completed under the
same limits and the retry failed too; otherwise it stays unavailable. The artifacts below are
the attacks of the issue, run in real Podman trials (marker ``podman``); every verdict comes
from the trainer's rule (:func:`ecredit_trl.runs.outcomes.trial_verdict`) and the one
``eval.run`` uses (:func:`eval.evaluation.verification.grade_trial`).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import make_tar

from eval.integrity.attribution import HEADROOM, attribute_failure
from eval.integrity.controls import ControlFacts
from eval.integrity.failure_value import failure_utility
from eval.integrity.retry import RetryPolicy
from sandbox.images import default_image
from sandbox.trials.pool import VerifierPool
from sandbox.trials.trial import Limits, TrialSpec, classify, parse_script_log

CALC = "def add(a, b):\n    return a - b\n"
TESTS = ("from calc import add\n\n\n"
         "def test_add():\n    assert add(2, 3) == 5\n\n\n"
         "def test_zero():\n    assert add(0, 0) == 0\n")
EVAL = ("export PYTHONDONTWRITEBYTECODE=1\n"
        "echo '>>>>> Start Test Output'\n"
        "python3 -m pytest -rA -p no:cacheprovider test_calc.py\n"
        "echo '>>>>> End Test Output'\n")
LIMITS = Limits(memory="128m", pids=64, cpus=1.0)
TIMEOUT_S = 6.0
OUTPUT_BYTES = 64 * 1024


class _Task:
    instance_id = "attr-1"
    FAIL_TO_PASS = ["test_calc.py::test_add"]
    PASS_TO_PASS = ["test_calc.py::test_zero"]
    log_parser = "parse_log_pytest"


def calc_patch(head: str, new_body: str = CALC) -> str:
    """A ``git diff`` of calc.py: ``head`` (lines of Python) above ``new_body``."""
    import difflib

    new = head + new_body
    body = "".join(difflib.unified_diff(CALC.splitlines(keepends=True),
                                        new.splitlines(keepends=True), "a/calc.py", "b/calc.py"))
    return f"diff --git a/calc.py b/calc.py\n{body}"


HONEST = ("diff --git a/NOTES.md b/NOTES.md\nnew file mode 100644\n--- /dev/null\n"
          "+++ b/NOTES.md\n@@ -0,0 +1 @@\n+looked at calc\n")
HANG = calc_patch("import time\ntime.sleep(10**6)\n")
MEMORY = calc_patch("BLOB = bytearray(512 * 2**20)\n")
FORK_FLOOD = calc_patch(
    "import os, time\n"
    "def _flood():\n"
    "    while True:\n"
    "        try:\n"
    "            pid = os.fork()\n"
    "        except OSError:\n"
    "            return\n"
    "        if pid == 0:\n"
    "            time.sleep(10**6)\n"
    "            os._exit(0)\n"
    "_flood()\n")
# a huge exception message: pytest prints it whole in its report (through the script's cap)
LOG_FLOOD = calc_patch("def _boom():\n    raise ValueError('x' * (4 * 2**20))\n",
                       CALC.replace("return a - b", "return _boom()"))
# writes straight to the container's stdout, past the script's cap (the host-side guard)
LOG_BYPASS = calc_patch("with open('/proc/1/fd/1', 'w') as _f:\n"
                        "    for _ in range(64):\n"
                        "        _f.write('y' * 2**20)\n")

# kill the eval script's shells (every ancestor but PID 1) from a test's import, after the
# start marker and before the end marker: the trial script survives, the log is cut
KILL_EVAL = calc_patch("import os, signal\n"
                       "_p = os.getppid()\n"
                       "while _p > 1:\n"
                       "    _n = int(open(f'/proc/{_p}/stat').read().split(')')[1].split()[1])\n"
                       "    os.kill(_p, signal.SIGKILL)\n"
                       "    _p = _n\n")
# empty eval.sh while bash is reading it: bash stops before the end marker, exit 0
CUT_EVAL = calc_patch("import os\n"
                      "for _r, _, _fs in os.walk('/ecredit'):\n"
                      "    if 'eval.sh' in _fs:\n"
                      "        open(os.path.join(_r, 'eval.sh'), 'w').close()\n")


def spec(trial_id: str, artifact: str = "", **kw) -> TrialSpec:
    kw.setdefault("image", default_image())
    kw.setdefault("eval_script", EVAL)
    kw.setdefault("repo_archive", make_tar({"calc.py": CALC, "test_calc.py": TESTS}))
    kw.setdefault("timeout_s", TIMEOUT_S)
    kw.setdefault("limits", LIMITS)
    kw.setdefault("max_output_bytes", OUTPUT_BYTES)
    return TrialSpec(trial_id=trial_id, artifact=artifact, **kw)


def verdict(res, control):
    from ecredit_trl.runs.outcomes import trial_verdict

    return trial_verdict(_Task, res, control.log if control.exit_class == "ok" else None,
                         [ControlFacts.of(control)])


# ---------------------------------------------------------------------------
# the rule, pure
# ---------------------------------------------------------------------------
LIM = {"timeout_s": 6.0, "memory": "128m", "pids": 64, "cpus": 1.0, "output_bytes": 65536,
       "source": "a"}
OK_CONTROL = ControlFacts("ok", 0.8, {**LIM, "source": "b"})
FIRST = [{"exit_class": "timeout", "test_s": 6.0}]
RAISED = {**LIM, "timeout_s": 12.0}  # the timeout's retry ran under twice the limit


def test_the_rule_needs_a_healthy_control_under_the_same_limits_and_a_recurring_failure():
    a = attribute_failure("timeout", failed_attempts=FIRST, limits=LIM, test_s=12.0,
                          controls=[OK_CONTROL], retry_limits=RAISED)
    assert a.failure_class == "artifact_timeout" and a.unattributed is None
    ev = a.evidence
    assert ev["exit_class"] == ev["retry_exit_class"] == "timeout"
    assert ev["limit"] == {"timeout_s": 6.0} and ev["controls"][0]["test_s"] == 0.8
    # a different resource failure on the retry is still the artifact's (first class named)
    b = attribute_failure("oom", failed_attempts=FIRST, limits=LIM, test_s=1.0,
                          controls=[OK_CONTROL], retry_limits=RAISED)
    assert b.failure_class == "artifact_timeout" and b.evidence["retry_exit_class"] == "oom"

    def why(exit_class="timeout", failed=FIRST, limits=LIM, controls=(OK_CONTROL,),
            retry_limits=RAISED, test_s=1.0):
        return attribute_failure(exit_class, failed_attempts=failed, limits=limits,
                                 test_s=test_s, controls=list(controls),
                                 retry_limits=retry_limits)

    # headroom: a control that took more than half the timeout leaves the timeout unavailable
    assert why(controls=(ControlFacts("ok", 3.0, LIM),)).failure_class == "artifact_timeout"
    assert why(controls=(ControlFacts("ok", 3.1, LIM),)).unattributed == "control_no_headroom"
    assert why(controls=(ControlFacts("ok", None, LIM),)).unattributed == "control_no_headroom"
    # ... a rule of the wall clock only: a memory failure needs no headroom
    oom = [{"exit_class": "oom", "test_s": 1.0}]
    assert why("oom", oom, controls=(ControlFacts("ok", 5.9, LIM),), retry_limits=None
               ).failure_class == "artifact_oom"
    # the retry must have run under the raised limit (same other limits) and broken it
    assert why(retry_limits=None).unattributed == "retry_not_raised"
    assert why(retry_limits={**RAISED, "memory": "1g"}).unattributed == "retry_not_raised"
    assert why(retry_limits={**LIM, "timeout_s": 9.0}).unattributed == "retry_not_raised"
    # an ok retry that needed the raised limit is not graded; one within the limit is
    assert why("ok", test_s=8.0).unattributed == "retry_over_limit"
    assert why("ok", test_s=5.0).unattributed is None

    assert why(controls=()).unattributed == "no_control"
    assert why(controls=(OK_CONTROL, ControlFacts("timeout", 6.0, LIM, "gold"))
               ).unattributed == "control_failed"
    assert why(controls=(ControlFacts("ok", 1.0, {**LIM, "timeout_s": 60.0}),)
               ).unattributed == "limits_differ"
    assert why(controls=(ControlFacts("ok"),)).unattributed == "limits_differ"  # unknown limits
    assert why(failed=[]).unattributed == "not_retried"
    assert why(exit_class="infra_error").unattributed == "retry_infra_error"
    for cls in ("ok", "infra_error"):  # never the artifact's without a first failure
        assert why(exit_class=cls, failed=[]).failure_class is None
    assert why(exit_class="apply_failed", failed=[{"exit_class": "apply_failed", "test_s": 0}]
               ).failure_class == "artifact_apply_failed"


def test_the_failure_value_is_no_listed_test_passing():
    assert failure_utility(["a"], ["b"]) == -1.0
    assert failure_utility(["a"], []) == 0.0


def test_a_retry_that_passes_is_graded_and_the_first_failure_kept():
    from ecredit_trl.runs.outcomes import trial_verdict

    log = (">>>>> ecredit test-start 1\n>>>>> Start Test Output\n"
           "PASSED test_calc.py::test_add\nPASSED test_calc.py::test_zero\n"
           ">>>>> End Test Output\n>>>>> ecredit test-end 2 0\n")
    res = SimpleNamespace(exit_class="ok", log=log, failed_attempts=[FIRST[0]], limits=LIM,
                          test_s=1.0, retry_limits=RAISED)
    v = trial_verdict(_Task, res, None, [OK_CONTROL])
    assert (v.utility, v.resolved, v.outcome) == (1.0, True, "graded")
    assert v.failure_class is None and v.failure_evidence == {"not_reproduced": FIRST[0]}
    # the same passing log, but only under the raised limit: unavailable, not graded
    slow = SimpleNamespace(**{**vars(res), "test_s": 7.5})
    v = trial_verdict(_Task, slow, None, [OK_CONTROL])
    assert (v.utility, v.resolved, v.outcome) == (None, None, "timeout")
    assert v.failure_evidence["unattributed"] == "retry_over_limit"


def test_pids_and_output_markers_only_ever_claim_a_failure():
    base = (">>>>> ecredit oom-kills-start 0\n>>>>> ecredit apply-start 1\n"
            ">>>>> Applied Patch (empty artifact)\n>>>>> ecredit pids-max-start 2\n"
            ">>>>> ecredit test-start 1\n")
    m = parse_script_log(base + ">>>>> ecredit pids-max-hit 5\n>>>>> ecredit test-end 2 0\n")
    assert (m["pids_start"], m["pids_end"]) == (2, 5)
    done = dict(exit_code=0, timed_out=False, oom=False)
    assert classify(m, **done, pids=True) == "ok"  # met the limit and still finished: graded
    assert classify(m, exit_code=None, timed_out=True, oom=False, pids=True) == "pids"
    m = parse_script_log(base + ">>>>> ecredit output-over 10\n>>>>> ecredit test-end 2 0\n")
    assert m["output_over"] and classify(m, **done) == "output_limit"
    with pytest.raises(ValueError, match="max_output_bytes"):
        spec("bad", max_output_bytes=0)


def test_ledger_and_report_count_masking_attribution_and_retries():
    from ecredit_trl.runs.ledger import ledger_row, round_counts, round_metrics
    from ecredit_trl.study.report_tables import arm_integrity, integrity_counts

    def rec(reward, exclusion=None, failure_class=None, evidence=None):
        return SimpleNamespace(reward=reward, exclusion=exclusion, failure_class=failure_class,
                               failure_evidence=evidence, resolved=reward == 1.0, contrast=None,
                               format_error=False, format_errors=0, calls_not_run=0,
                               calls_after_submit=0, factual_outcome=failure_class,
                               counterfactual_outcome=None)

    records = [rec(1.0), rec(0.0, failure_class="artifact_timeout"),
               rec(None, "no_original_utility", evidence={"unattributed": "control_failed"}),
               rec(None, "sandbox_setup"), rec(0.0, failure_class="agent_disk_budget")]
    stats = [{"L": 1, "applied": False, "cap_active": False, "sel_mean": 0.0,
              "other_mean": 0.0}] * len(records)
    trial = SimpleNamespace(retries=1, exit_class="timeout", protected_touched=[],
                            queue_wait_s=0.0, setup_s=0.0, apply_s=0.0, test_s=6.0,
                            cleanup_s=0.0, failed_attempts=[FIRST[0]])
    tot = round_counts(records, stats, [("factual", trial)])
    row = ledger_row(tot, step=1, arm="O", wall_s=1.0, gpu_hours=0.0)
    assert row["masked_share"] == 0.4 and row["reward_unavailable"] == 2
    assert row["failures_attributed"] == {"artifact_timeout": 1, "agent_disk_budget": 1}
    assert row["failures_unattributed"] == {"control_failed": 1}
    assert (row["retries"], row["failure_retries"]) == (1, 1)
    assert row["rollouts_excluded"]["no_original_utility"] == 1
    assert row["trial_outcomes"]["artifact_timeout"] == 1
    met = round_metrics(tot)
    assert met["ecredit/masked_share"] == 0.4
    assert met["ecredit/failure_attributed_share"] == 0.4
    c = arm_integrity([integrity_counts([row, row])])
    assert (c["runs"], c["rollouts"], c["masked"], c["masked_share"]) == (1, 10, 4, 0.4)
    assert c["attributed"] == {"artifact_timeout": 2, "agent_disk_budget": 2}
    assert c["excluded"]["sandbox_setup"] == 2 and c["failure_retries"] == 2


# ---------------------------------------------------------------------------
# real trials
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def healthy(podman_runtime):
    """The task's empty-patch control (healthy: about a second) and the attacks' results."""
    attacks = {"hang": HANG, "memory": MEMORY, "fork_flood": FORK_FLOOD,
               "log_flood": LOG_FLOOD, "log_bypass": LOG_BYPASS, "kill_eval": KILL_EVAL,
               "cut_eval": CUT_EVAL, "honest": HONEST}
    with VerifierPool(podman_runtime, max_concurrency=2, retry=RetryPolicy(max_retries=0)) as pool:
        futs = {k: pool.submit(spec(f"attr-{k}", art)) for k, art in attacks.items()}
        control = pool.submit(spec("attr-control")).result()
        return control, {k: f.result() for k, f in futs.items()}


WANT = {"hang": ("timeout", {"timeout_s": TIMEOUT_S}),
        "memory": ("oom", {"memory": "128m"}),
        "fork_flood": ("pids", {"pids": 64}),
        "log_flood": ("output_limit", {"output_bytes": OUTPUT_BYTES}),
        "log_bypass": ("output_limit", {"output_bytes": OUTPUT_BYTES}),
        # a cut log used to be graded as truncated, i.e. unavailable whatever the control did
        "kill_eval": ("truncated_log", None),
        "cut_eval": ("truncated_log", None)}


@pytest.mark.podman
@pytest.mark.parametrize("attack", sorted(WANT))
def test_an_artifact_that_breaks_its_trial_gets_the_failure_value(healthy, attack):
    from eval.evaluation.verification import grade_trial, trial_row

    control, results = healthy
    assert control.exit_class == "ok" and control.test_s < TIMEOUT_S / 2, control.log[-2000:]
    res = results[attack]
    cls, limit = WANT[attack]
    assert res.exit_class == cls, (res.error, res.log[-3000:])
    assert [a["exit_class"] for a in res.failed_attempts] == [cls]  # the retry broke too
    v = verdict(res, control)
    assert (v.utility, v.resolved, v.outcome) == (-1.0, False, f"artifact_{cls}")
    assert v.failure_class == f"artifact_{cls}"
    ev = v.failure_evidence
    assert ev["limit"] == limit and ev["retry_exit_class"] == cls
    assert ev["controls"][0]["test_s"] == round(control.test_s, 3)
    # the honest failure of the same task: graded, U = 0 (its hang is not better than this)
    h = verdict(results["honest"], control)
    assert (h.utility, h.outcome) == (0.0, "graded")
    # eval.run's grading follows the same rule
    g = grade_trial(_Task, res, control.log, {"exit_class": "ok", "trial": trial_row(control)})
    assert (g["resolved"], g["utility"], g["failure_class"]) == (False, -1.0, f"artifact_{cls}")
    assert g["classification"]["unknown"] is False
    if cls == "pids":
        assert res.pids_max_hits and res.pids_max_hits > 0
    if cls == "output_limit":
        assert len(res.log) < 4 * OUTPUT_BYTES + 2**21  # never read whole


@pytest.mark.podman
def test_with_a_control_that_times_out_nothing_is_attributed(podman_runtime):
    from eval.evaluation.verification import grade_trial, trial_row

    slow = "sleep 30\n" + EVAL  # the task itself hangs: the infrastructure's (or task's) fault
    with VerifierPool(podman_runtime, max_concurrency=2, retry=RetryPolicy(max_retries=0)) as pool:
        hang = pool.submit(spec("attr-slow-hang", HANG, eval_script=slow, timeout_s=3.0))
        control = pool.submit(spec("attr-slow-control", eval_script=slow, timeout_s=3.0))
        control, hang = control.result(), hang.result()
    assert control.exit_class == "timeout" and hang.exit_class == "timeout"
    v = verdict(hang, control)
    assert (v.utility, v.resolved, v.outcome, v.failure_class) == (None, None, "timeout", None)
    assert v.failure_evidence["unattributed"] == "control_failed"
    g = grade_trial(_Task, hang, None, {"exit_class": control.exit_class,
                                        "trial": trial_row(control)})
    assert g["unknown_reason"] == "trial_unattributed" and g["utility"] is None


@pytest.mark.podman
def test_an_honest_artifact_under_co_load_is_never_charged(podman_runtime):
    """Load injected as wall time (a sleep in the eval script: what a starved node does to
    an honest run). A control that barely finished (over half the limit) leaves a timeout
    that recurs on the raised retry unavailable; with a healthy control, an honest trial
    that finishes only under the raised limit is unavailable too, never graded or charged."""
    from eval.evaluation.report import summarize
    from eval.evaluation.verification import grade_trial, trial_row

    def loaded(seconds: float) -> str:
        return f"sleep {seconds}\n" + EVAL

    with VerifierPool(podman_runtime, max_concurrency=3, retry=RetryPolicy(max_retries=0)) as pool:
        slow_ctrl = pool.submit(spec("attr-load-control", eval_script=loaded(6), timeout_s=10.0))
        ctrl = pool.submit(spec("attr-load-ok-control", timeout_s=10.0))
        stuck = pool.submit(spec("attr-load-honest", HONEST, eval_script=loaded(21),
                                 timeout_s=10.0))
        late = pool.submit(spec("attr-load-late", HONEST, eval_script=loaded(11),
                                timeout_s=10.0))
        slow_ctrl, ctrl, stuck, late = (f.result() for f in (slow_ctrl, ctrl, stuck, late))
    assert slow_ctrl.exit_class == "ok" and 5.0 < slow_ctrl.test_s < 10.0, slow_ctrl.log[-2000:]
    # both attempts timed out, the retry under twice the limit
    assert stuck.exit_class == "timeout" and stuck.failed_attempts[0]["exit_class"] == "timeout"
    assert stuck.retry_limits["timeout_s"] == 20.0 and stuck.limits["timeout_s"] == 10.0
    v = verdict(stuck, slow_ctrl)
    assert (v.utility, v.failure_class) == (None, None)
    assert v.failure_evidence["unattributed"] == "control_no_headroom"
    g = grade_trial(_Task, stuck, None, {"exit_class": "ok", "trial": trial_row(slow_ctrl)})
    assert g["unknown_reason"] == "trial_unattributed" and g["utility"] is None
    assert g["failure_evidence"]["unattributed"] == "control_no_headroom"
    rows = [{**g, "task_id": _Task.instance_id, "rollout_index": 0}]
    assert summarize(rows, [(_Task.instance_id, "calc")], 1, 1)["unattributed_reasons"] == \
        {"control_no_headroom": 1}  # counted by reason in the eval report
    # a healthy control; the honest trial finished only under the raised limit
    assert ctrl.exit_class == "ok" and ctrl.test_s < 5.0
    assert late.exit_class == "ok" and late.test_s > 10.0 and late.failed_attempts
    v = verdict(late, ctrl)
    assert (v.utility, v.resolved, v.outcome) == (None, None, "timeout")
    assert v.failure_evidence["unattributed"] == "retry_over_limit"
    g = grade_trial(_Task, late, ctrl.log, {"exit_class": "ok", "trial": trial_row(ctrl)})
    assert g["unknown_reason"] == "trial_unattributed" and g["failure_class"] is None


@pytest.mark.podman
def test_an_ablation_that_hangs_gives_the_failure_value_so_the_contrast_exists(healthy):
    """The trainer's counterfactual path (:class:`TrialPipelineMixin`) on real trial results:
    P resolves nothing but keeps P2P (U = 0), P\\b hangs while the control is healthy, so
    U(P\\b) = -1 and D = 1; with a failed control the same hang leaves D unavailable."""
    from ecredit_trl.runs.rollout_record import RolloutRecord
    from ecredit_trl.runs.timings import RoundClock
    from ecredit_trl.trainer.round import Round
    from ecredit_trl.trainer.trials import TrialPipelineMixin

    control, results = healthy

    class Pipe(TrialPipelineMixin):
        def __init__(self):
            self.tasks, self._control = {_Task.instance_id: _Task}, {}
            self.verified_trial_ids = []

    def rec():
        return RolloutRecord(task_id=_Task.instance_id, rollout_index=0, format_error=False,
                             num_turns=1, snapshots=[], utility=0.0)

    pipe, rnd = Pipe(), Round(index=0, clock=RoundClock(start=0.0))
    pipe._take_controls(rnd, [(_Task.instance_id, control)])
    r = rec()
    pipe._take_counterfactual(rnd, r, results["hang"])
    assert (r.utility_ablated, r.contrast, r.counterfactual_outcome) == (-1.0, 1.0,
                                                                          "artifact_timeout")
    failed = SimpleNamespace(**{**vars(control), "exit_class": "timeout"})
    pipe._take_controls(rnd, [(_Task.instance_id, failed)])  # the task's control failed
    r = rec()
    pipe._take_counterfactual(rnd, r, results["hang"])
    assert (r.utility_ablated, r.contrast, r.counterfactual_outcome) == (None, None, "timeout")
    assert [kind for kind, _ in rnd.trials] == ["control", "counterfactual"] * 2


@pytest.mark.podman
def test_an_empty_ablation_takes_the_controls_utility_only_from_a_complete_control(
        healthy, podman_runtime):
    """An empty ablated artifact is the empty-patch control's artifact: with reuse on, U(P\\b)
    is the healthy control's utility and no trial runs. A control that timed out, or whose
    log was cut (no report), is never reused: the rollout's own counterfactual trial runs
    (real Podman) and gives the same U(∅). With reuse off, the own trial runs anyway; a
    rollout excluded by then runs nothing."""
    from ecredit_trl.runs.rollout_record import RolloutRecord
    from ecredit_trl.runs.timings import RoundClock
    from ecredit_trl.trainer.round import Round
    from ecredit_trl.trainer.trials import TrialPipelineMixin

    control, _ = healthy
    assert verdict(control, control).utility == 0.0  # F2P fails, P2P passes: U(∅) = 0

    class Pipe(TrialPipelineMixin):
        def __init__(self, pool, reuse: bool):
            self.tasks, self._control = {_Task.instance_id: _Task}, {}
            self.verified_trial_ids, self.pool = [], pool
            self.ecfg = SimpleNamespace(arm="M", reuse_control_for_empty_ablation=reuse)

        def _spec(self, task, artifact, trial_id):
            return spec(f"attr-{trial_id}", artifact)

    def run(pool, reuse: bool, ctrl, exclusion=None):
        pipe, rnd = Pipe(pool, reuse), Round(index=0, clock=RoundClock(start=0.0))
        pipe._take_controls(rnd, [(_Task.instance_id, ctrl)])
        r = RolloutRecord(task_id=_Task.instance_id, rollout_index=7, format_error=False,
                          num_turns=1, snapshots=[], utility=1.0, exclusion=exclusion)
        empty = SimpleNamespace(ablated_artifact="")
        assert pipe._wants_control(r, empty) is reuse
        pipe._counterfactuals(rnd, [(r, empty, None if reuse else pipe._submit_cf(rnd, r, empty))])
        return r, [(kind, res.trial_id) for kind, res in rnd.trials]

    timed_out = SimpleNamespace(**{**vars(control), "exit_class": "timeout"})
    cut = SimpleNamespace(**{**vars(control), "log": control.log.split(">>>>> End")[0]})
    with VerifierPool(podman_runtime, max_concurrency=2, retry=RetryPolicy(max_retries=0)) as pool:
        r, trials = run(pool, True, control)
        assert trials == [("control", control.trial_id)]  # no trial of its own
        assert r.counterfactual == {"source": "control", "trial_id": control.trial_id}
        assert (r.utility_ablated, r.contrast, r.counterfactual_outcome) == (0.0, 1.0, "graded")
        for ctrl in (timed_out, cut):  # not a usable control: the rollout's own trial
            r, trials = run(pool, True, ctrl)
            assert trials == [("control", control.trial_id), ("counterfactual", "attr-cf-7")]
            assert r.counterfactual["trial_id"] == "attr-cf-7"
            assert (r.utility_ablated, r.contrast) == (0.0, 1.0)
        r, trials = run(pool, False, control)  # reuse off: its own trial
        assert trials[1:] == [("counterfactual", "attr-cf-7")] and r.contrast == 1.0
        r, trials = run(pool, True, control, exclusion="no_original_utility")
        assert trials == [("control", control.trial_id)] and r.counterfactual is None


@pytest.mark.podman
def test_eval_run_charges_a_hang_to_the_artifact(tmp_path, podman_runtime):
    """``eval.run`` on a bundled task: the hanging rollout's slot is a failure (resolved False,
    the failure value, ``artifact_timeout``), not an unknown slot; its retry is counted."""
    import json

    from test_attribution_step import _artifacts

    from eval.evaluation.options import EvalOptions
    from eval.run import evaluate
    from eval.tasks.schema import save_tasks
    from eval.tasks.splits import load_tasks

    task = load_tasks("bundled:holdout")[0]
    save_tasks([task], tmp_path / "one.jsonl")
    arts = _artifacts(task)
    rows = [{"task_id": task.instance_id, "rollout_index": i, "artifact": arts[k],
             "model_sha256": "f" * 64, "turns": 1} for i, k in enumerate(("hang", "honest"))]
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # 12 s is enough on a quiet machine (the control takes about 3 s); when a loaded host
    # stretches the control past half of it, the rule must refuse to charge the hang, and the
    # test checks that answer, then runs again with more room
    for timeout in (12, 40):
        res = evaluate(EvalOptions(model=None, split=str(tmp_path / "one.jsonl"), n=2,
                                   out=tmp_path / f"ev-{timeout}",
                                   rollouts=tmp_path / "rollouts.jsonl", timeout_s=timeout),
                       runtime=podman_runtime, log=lambda *_: None)
        slots = {r["rollout_index"]: r for r in res["slots"]}
        hang, honest = slots[0], slots[1]
        ev = hang.get("failure_evidence") or {}
        if ev.get("unattributed") != "control_no_headroom":
            break
        assert hang["failure_class"] is None and hang["unknown_reason"] == "trial_unattributed"
        assert any(c["test_s"] > HEADROOM * timeout for c in ev["controls"]), ev
    assert hang["exit_class"] == "timeout" and hang["failure_class"] == "artifact_timeout", \
        hang.get("failure_evidence")
    assert hang["resolved"] is False and hang["classification"]["unknown"] is False
    assert hang["utility"] == failure_utility(task.FAIL_TO_PASS, task.PASS_TO_PASS)
    assert hang["failure_evidence"]["controls"][0]["exit_class"] == "ok"
    assert honest["failure_class"] is None and honest["resolved"] is False
    assert honest["classification"]["unknown"] is False
    assert res["cost"]["failure_retries"] == 1
