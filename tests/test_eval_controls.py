"""eval.controls in Podman: gold + empty controls on the bundled holdout, admission manifest."""

from __future__ import annotations

import json

import pytest

from eval.controls import AdmissionError, check_admission, control_counts, run_controls


def _c(exit_class="ok", resolved=False, complete=True, f2p_passed=0, p2p=True, cl=True):
    return {"exit_class": exit_class, "resolved": resolved, "complete": complete,
            "f2p_passed": f2p_passed, "p2p_all_passing": p2p,
            "classification": {"raw": cl, "strict": cl, "report_binary": cl, "unknown": False}}


def test_counts_and_reasons_pure():
    per = {"ok": {"gold": _c(resolved=True), "empty": _c()},
           "bad_gold": {"gold": _c(resolved=False, cl=False), "empty": _c()},
           "leaky": {"gold": _c(resolved=True), "empty": _c(f2p_passed=1, cl=False)},
           "partial": {"gold": _c(resolved=True), "empty": _c(complete=False)},
           "infra": {"gold": _c(exit_class="infra_error"), "empty": _c()}}
    c = control_counts(per)
    assert c["controls"]["count"] == 10
    assert c["admitted"]["ids"] == ["ok"]
    assert c["unresolved"]["ids"] == ["bad_gold"]
    assert c["expectation_mismatches"]["ids"] == ["bad_gold", "leaky"]
    assert c["partially_observed"]["ids"] == ["partial:empty"]
    assert c["infra_errors"]["ids"] == ["infra:gold"]
    assert "ok:gold" in c["report_binary_as_expected"]["ids"]
    assert "bad_gold:gold" not in c["report_binary_as_expected"]["ids"]
    assert c["not_admitted"]["leaky"] == ["empty passes FAIL_TO_PASS"]


@pytest.mark.podman
def test_every_bundled_holdout_task_admitted(tmp_path, podman_runtime):
    from eval.splits import load_tasks

    tasks = load_tasks("bundled:holdout")
    res = run_controls("bundled:holdout", tmp_path, runtime=podman_runtime, concurrency=2,
                       log=lambda *_: None)
    c = res["counts"]
    n = len(tasks)
    assert c["controls"]["count"] == 2 * n
    assert c["admitted"]["count"] == n, c["not_admitted"]
    for k in ("raw_as_expected", "strict_as_expected", "report_binary_as_expected"):
        assert c[k]["count"] == 2 * n, k
    for k in ("unresolved", "partially_observed", "expectation_mismatches", "infra_errors"):
        assert c[k]["count"] == 0 and c[k]["ids"] == [], k
    man = json.loads((tmp_path / "admission.json").read_text())
    assert sorted(man["admitted"]) == sorted(t.instance_id for t in tasks)
    assert set(man["images"]) == {t.image for t in tasks}
    assert all(d and d.startswith("sha256:") for d in man["images"].values())
    assert set(man["parsers"].values()) == {"parse_log_pytest"}
    assert man["unknown_rule"] and man["tasks"]["count"] == n
    assert (tmp_path / "controls.md").is_file()

    # the manifest binds the task list and the image digests
    rec = check_admission(tmp_path, tasks, runtime="podman")
    assert rec["admitted"] == n and rec["digests_checked"]
    with pytest.raises(AdmissionError, match="task list changed"):
        check_admission(tmp_path, tasks[:-1], runtime="podman")
    image = next(iter(man["images"]))
    man["images"][image] = "sha256:" + "0" * 64
    (tmp_path / "admission.json").write_text(json.dumps(man))
    with pytest.raises(AdmissionError, match="image digest changed"):
        check_admission(tmp_path, tasks, runtime="podman")

    # a rerun reuses every cached task result
    again = run_controls("bundled:holdout", tmp_path, runtime=podman_runtime,
                         log=lambda *_: None)
    assert again["counts"]["admitted"]["count"] == n and again["wall_s"] < res["wall_s"]
