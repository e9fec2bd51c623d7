"""``python -m sandbox doctor`` (design page, "Threat model"): run for real on this host it
holds every probe, through the product's own workspace, trial and classification code; with
the kernel log replaced at the file layer the kernel's OOM record cannot be found and the
doctor says so and exits 1. The node gate's decision and its cache by the host's facts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from sandbox.doctor.facts import KEY_FIELDS, cgroup_version, facts_key, host_facts
from sandbox.doctor.gate import NODE_UNHELD, decide, load_report, node_verdict, save_report

AGENT_LINES = ("pids: held", "fork_bomb: held", "exhaustion_evidence: held",
               "memory_running: held", "oom_record: held", "memory_stopped: held",
               "disk: held", "history: held", "overlay_opacity: held")
TRIAL_LINES = ("trial_timeout: held", "trial_oom: held", "trial_output_limit: held",
               "trial_truncated_log: held")


def _env(tmp_path) -> dict:
    return {**os.environ, "ECREDIT_CACHE": str(tmp_path / "cache"),
            "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.mark.podman
def test_doctor_holds_every_rule_here_and_caches_its_report(tmp_path):
    """Every probe line reads ``held``, exit 0; the facts head the report; the report is
    cached by the host's facts key, where a node's gate reuses it."""
    proc = subprocess.run([sys.executable, "-m", "sandbox", "doctor"], capture_output=True,
                          text=True, env=_env(tmp_path), cwd=REPO_ROOT, timeout=600)
    lines = proc.stdout.splitlines()
    probes = [ln for ln in lines if not ln.startswith("fact ")][:-1]
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert probes == [*AGENT_LINES, *TRIAL_LINES], proc.stdout
    facts = dict(ln[5:].split(": ", 1) for ln in lines if ln.startswith("fact "))
    assert facts["kernel"] == os.uname().release
    assert facts["oci_runtime"] == "runc" and facts["storage_driver"] == "overlay"
    assert facts["kmsg_readable"] == "True" and facts["pids_counted_in"] == "."
    assert facts["exhaustion_counters"].startswith("pids.events max, oom_kill")
    assert lines[-1].startswith("all held (")
    key = lines[-1].rsplit(" ", 1)[-1].rstrip(")")
    cached = json.loads((tmp_path / "cache" / "doctor" / f"{key}.json").read_text())
    assert cached["held"] is True and cached["facts_key"] == key
    assert [p["name"] for p in cached["probes"] if p["held"]] == \
        [ln.split(":")[0] for ln in probes]
    pids = next(p for p in cached["probes"] if p["name"] == "pids")
    assert pids["detail"]["class"] == "agent_pids"
    assert pids["detail"]["evidence"]["cgroup"]["pids_max"] == 64


@pytest.mark.podman
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_a_kernel_log_without_the_oom_record_fails_the_probe_and_exits_1(tmp_path):
    """/dev/kmsg replaced by an empty file (a private mount namespace, as on a node whose
    kernel log is a stand-in): the kernel's OOM record of the container is not found, so
    ``oom_record`` is FAILED with that reason; ``memory_stopped`` (a container the OOM killer
    stopped between two calls: no sample after a call saw the kill) holds only on the
    counters read the moment the next exec failed, while the stopped container's cgroup is
    still there (as on this host), else it is FAILED as infrastructure (only the record could
    charge it); the doctor exits 1, the other probes of the group still hold. ``--json`` is
    the machine-readable report."""
    fake = tmp_path / "kmsg"
    fake.write_text("")
    cmd = (f"mount --bind {fake} /dev/kmsg && exec {sys.executable} -m sandbox doctor "
           "--json --only agent")
    proc = subprocess.run(["unshare", "-m", "bash", "-c", cmd], capture_output=True,
                          text=True, env=_env(tmp_path), cwd=REPO_ROOT, timeout=600)
    if "mount" in proc.stderr and proc.returncode != 1 and not proc.stdout:
        pytest.skip(f"cannot bind-mount over /dev/kmsg here: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    verdicts = {p["name"]: (p["held"], p["reason"]) for p in report["probes"]}
    assert report["held"] is False
    assert verdicts["oom_record"][0] is False
    assert verdicts["oom_record"][1].startswith("the kernel log (/dev/kmsg) holds no "
                                                "CONSTRAINT_MEMCG record naming the container")
    stopped = next(p for p in report["probes"] if p["name"] == "memory_stopped")
    at = (stopped["detail"].get("evidence") or {}).get("cgroup_at_failure")
    if at is not None:  # read before the cgroup went: the kill is in its counters
        assert stopped["held"] is True and at["oom_kill"] > 0, stopped
        assert at["memory_peak_bytes"] >= at["memory_limit_bytes"] - 4 * 2**20, stopped
    else:
        assert stopped["held"] is False, stopped
        assert stopped["reason"].startswith("classified infrastructure"), stopped
    assert {n for n, (held, _) in verdicts.items() if held} - {"memory_stopped"} == \
        {ln.split(":")[0] for ln in AGENT_LINES} - {"oom_record", "memory_stopped"}
    assert not (tmp_path / "cache" / "doctor").exists()  # a partial run is never cached


def test_cgroup_layouts_are_told_apart(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpu memory pids\n")
    v1 = tmp_path / "v1"
    for sub in ("memory", "pids", "unified"):
        (v1 / sub).mkdir(parents=True)
    assert cgroup_version(v2) == "v2"
    assert cgroup_version(v1) == "v1+unified"
    (v1 / "unified").rmdir()
    assert cgroup_version(v1) == "v1"
    assert cgroup_version(tmp_path / "none") == "none"


def _report(**held) -> dict:
    probes = [{"name": n, "held": h, "reason": "" if h else f"{n} broke", "detail": {}}
              for n, h in held.items()]
    return {"facts_key": "k" * 16, "probes": probes, "held": all(held.values())}


def test_the_gate_serves_refuses_or_serves_with_unheld_rules_named():
    assert decide(_report(pids=True, oom_record=True)).serve is True
    v = decide(_report(pids=True, oom_record=False))
    assert (v.serve, v.unheld) == (False, ["oom_record"])
    assert v.reason == "refused: rules not held here: oom_record: oom_record broke"
    v = decide(_report(pids=True, oom_record=False), allow_unheld=True)
    assert (v.serve, v.unheld) == (True, ["oom_record"]) and NODE_UNHELD in v.reason
    v = decide({"probes": [], "error": "the doctor did not report: boom"}, allow_unheld=True)
    assert (v.serve, v.reason) == (False, "the doctor did not report: boom")


def test_a_report_is_reused_by_the_hosts_facts_key(tmp_path, monkeypatch):
    """The gate reads the report cached for this host's facts key (no doctor run); a
    report of another key is not this host's."""
    monkeypatch.setenv("ECREDIT_CACHE", str(tmp_path))
    facts = host_facts()
    key = facts_key(facts)
    assert len(key) == 16 and key == facts_key({k: facts.get(k) for k in KEY_FIELDS})
    assert facts_key({**facts, "kernel": "5.15.0"}) != key
    save_report({**_report(pids=True, oom_record=False), "facts_key": key})
    assert load_report(key)["facts_key"] == key and load_report("0" * 16) is None
    v = node_verdict()
    assert (v.serve, v.unheld, v.cached, v.facts_key) == (False, ["oom_record"], True, key)
    assert node_verdict(allow_unheld=True).serve is True


LIM = {"timeout_s": 3.0, "memory": "64m", "pids": 256, "cpus": 1.0, "output_bytes": 65536}


def _timeout_trial(node_unheld):
    from sandbox.trials.trial import TrialResult

    return TrialResult(trial_id="t", exit_class="timeout", limits=LIM, test_s=3.0,
                       failed_attempts=[{"exit_class": "timeout", "test_s": 3.0}],
                       # the retry ran under the raised limit (the headroom rule's retry)
                       retry_limits={**LIM, "timeout_s": 2 * LIM["timeout_s"]},
                       node_unheld=list(node_unheld))


def test_a_failure_on_a_node_serving_with_rules_not_held_is_never_charged():
    """The node rule, through training's and evaluation's adapters: a hang that recurs
    beside a healthy control is ``artifact_timeout`` on a node where every rule held, and
    unavailable (``node_rule_unheld``, counted in the ledger's reasons) on one that serves
    with ``oom_record`` not held; an agent's OOM there is infrastructure."""
    from types import SimpleNamespace

    from ecredit_trl.runs.outcomes import UNATTRIBUTED_REASONS, exec_failure_class, trial_verdict
    from eval.evaluation.verification import grade_trial
    from eval.integrity.controls import ControlFacts

    task = SimpleNamespace(FAIL_TO_PASS=["t.py::a"], PASS_TO_PASS=["t.py::b"],
                           log_parser="parse_log_pytest")
    controls = [ControlFacts("ok", 0.1, LIM)]
    assert trial_verdict(task, _timeout_trial([]), None, controls).failure_class == \
        "artifact_timeout"
    v = trial_verdict(task, _timeout_trial(["oom_record"]), None, controls)
    assert (v.utility, v.outcome, v.failure_class) == (None, "timeout", None)
    assert v.failure_evidence["unattributed"] == NODE_UNHELD
    assert v.failure_evidence["node_unheld"] == ["oom_record"]
    assert NODE_UNHELD in UNATTRIBUTED_REASONS
    control = {"exit_class": "ok", "trial": {"limits": LIM, "test_s": 0.1}}
    assert grade_trial(task, _timeout_trial([]), None, control)["failure_class"] == \
        "artifact_timeout"
    row = grade_trial(task, _timeout_trial(["oom_record"]), None, control)
    assert row["failure_class"] is None and row["unknown_reason"] == "trial_unattributed"
    assert row["failure_evidence"]["unattributed"] == NODE_UNHELD
    oom = {"service_ok": True, "container": "exited", "cgroup_last": None, "cgroup_prev": None,
           "memcg_oom": "oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/x"}
    assert exec_failure_class(oom) == "agent_oom"
    assert exec_failure_class({**oom, "node_unheld": ["oom_record"]}) is None


def _bomb(failed, cls=None, refused=0):
    counters = {"pids_max_events": refused}
    return {"failed": failed, "class": cls, "counters": counters,
            "evidence": {"cgroup": counters} if failed else {}}


KEPT = {"pids_max_events": True, "oom_kill": True, "memory_oom_events": False}


@pytest.mark.parametrize("runs, have, bomb, evidence", [
    ([_bomb(True, "agent_pids", 9), _bomb(False, refused=3)], KEPT, True, True),
    # one bomb charged to the infrastructure: the rule does not hold here
    ([_bomb(True, "agent_pids", 9), _bomb(True, None, 9)], KEPT, False, True),
    # no bomb ever hit the limit: nothing was proven
    ([_bomb(False), _bomb(False)], KEPT, False, True),
    # a host whose cgroups keep no pids.events: the doctor says so
    ([_bomb(False), _bomb(False)], {**KEPT, "pids_max_events": False}, False, False),
    ([_bomb(True, "agent_pids", 9)], None, True, False),
])
def test_fork_bomb_probe_verdicts(runs, have, bomb, evidence):
    from eval.doctor.probes import fork_bomb_verdicts

    got = fork_bomb_verdicts(runs, have)
    assert [r.name for r in got] == ["fork_bomb", "exhaustion_evidence"]
    assert (got[0].held, got[1].held) == (bomb, evidence), [r.line() for r in got]
    if not evidence:
        assert got[1].reason.startswith("this host keeps no pids.events max"), got[1].reason
