"""The study config's ``sandbox`` section: validated naming the key, passed to every
unit (training runs, their resumes and ``eval.run``) as flags their own parsers accept,
recorded in ``study.json`` and left out of the hash."""

from __future__ import annotations

import argparse
import json

import pytest
from conftest import REPO_ROOT

from ecredit_trl.study.config import StudyConfigError, config_from_dict, config_from_study_json

BASE = {"arms": ["M"], "seeds": [0], "train": {"max_steps": 2},
        "eval": {"splits": ["bundled:train"], "n": 1}}
RAY = {"backend": "ray", "ray_address": "10.0.0.5:6379", "max_in_flight": 48}


def _cfg(**over):
    raw = json.loads(json.dumps(BASE))
    raw.update(over)
    return config_from_dict(raw, where="t.yaml")


@pytest.mark.parametrize("over, named", [
    ({"sandbox": {"backend": "k8s"}}, "t.yaml: sandbox.backend: expected one of local, ray, "
                                      "got 'k8s'"),
    ({"sandbox": {"backend": "ray", "max_in_flight": 0}},
     "t.yaml: sandbox.max_in_flight: expected an int >= 1, got 0"),
    ({"sandbox": {"max_in_flight": True}}, "t.yaml: sandbox.max_in_flight: expected an int"),
    ({"sandbox": {"ray_address": " "}}, "t.yaml: sandbox.ray_address: expected 'auto'"),
    ({"sandbox": {"podman_url": "ssh://u@h/run/podman/podman.sock"}},
     "t.yaml: sandbox.podman_url: expected \"\" or a node-local unix:// socket"),
    ({"sandbox": {"image_registry": ""}}, "t.yaml: sandbox.image_registry: expected"),
    ({"sandbox": {"nodes": 3}}, "t.yaml: sandbox.nodes: unknown key (allowed: backend, "),
    ({"sandbox": ["ray"]}, "t.yaml: sandbox: expected a mapping"),
    ({"sandbox": {"backend": "ray"}, "eval": {**BASE["eval"], "runtime": "local"}},
     "t.yaml: sandbox.backend: ray runs every trial in Podman on a cluster node; eval.runtime "
     "must be podman, got 'local'"),
    ({"sandbox": {"backend": "ray"}, "train": {"runtime": "local"}},
     "t.yaml: sandbox.backend: ray runs every trial in Podman on a cluster node; "
     "train.runtime must be podman"),
    ({"train": {"sandbox_backend": "ray"}}, "t.yaml: train.sandbox_backend: set it as "
                                            "sandbox.backend (the sandbox section applies"),
    ({"train": {"sandbox_max_in_flight": 8}}, "t.yaml: train.sandbox_max_in_flight: set it as "
                                              "sandbox.max_in_flight"),
    ({"train": {"verifier_endpoints": ["ssh://u@h/s.sock"]}},
     "t.yaml: train.verifier_endpoints: retired"),
])
def test_sandbox_errors_name_the_key_in_one_line(over, named):
    with pytest.raises(StudyConfigError) as ei:
        _cfg(**over)
    assert str(ei.value).startswith(named), str(ei.value)
    assert "\n" not in str(ei.value)


def test_sandbox_is_recorded_when_set_but_never_changes_the_hash():
    local, ray = _cfg(), _cfg(sandbox=RAY)
    assert local.sandbox == {"backend": "local", "ray_address": "auto", "max_in_flight": 24,
                             "podman_url": "", "image_registry": None}
    # at its default it is left out (hashes and study.json of older studies hold)
    assert "sandbox" not in local.resolved()
    assert ray.resolved()["sandbox"] == {**local.sandbox, **RAY}
    assert local.sha256() == ray.sha256() == _cfg(sandbox={"backend": "local"}).sha256()
    assert local.sha256() != _cfg(train={"max_steps": 3}).sha256()


def test_every_unit_gets_the_backend_as_flags_its_parser_accepts(tmp_path):
    from transformers import HfArgumentParser

    from ecredit_trl.config import ECreditConfig
    from ecredit_trl.study.runner import eval_command, train_command
    from sandbox.backend import SandboxOptions
    c = _cfg(sandbox={**RAY, "image_registry": "mirror.local:5000"})
    train_py = str(REPO_ROOT / "ecredit_trl" / "train.py")
    flags = ["--sandbox_backend", "ray", "--ray_address", "10.0.0.5:6379",
             "--sandbox_max_in_flight", "48", "--ray_image_registry", "mirror.local:5000"]
    cmd = train_command(c, "M", 0, tmp_path / "M-s0")
    assert cmd[cmd.index(train_py) + 1:] == [
        "--arm", "M", "--seed", "0", "--output_dir", str(tmp_path / "M-s0"), "--max_steps", "2",
        *flags]
    # a resume passes the study's section too (later arguments win over the recorded ones)
    ck = tmp_path / "M-s0" / "checkpoint-1"
    assert train_command(c, "M", 0, ck.parent, ck)[-len(flags) - 2:] == [
        *flags, "--resume-from", str(ck)]
    (parsed,) = HfArgumentParser(ECreditConfig).parse_args_into_dataclasses(
        [*cmd[cmd.index(train_py) + 1:][6:], "--output_dir", str(tmp_path), "--use_cpu", "true",
         "--bf16", "false", "--report_to", "none"])
    assert (parsed.sandbox_backend, parsed.ray_address, parsed.sandbox_max_in_flight,
            parsed.ray_image_registry) == ("ray", "10.0.0.5:6379", 48, "mirror.local:5000")
    ev = eval_command(c, "/m", "bundled:train", tmp_path / "e")
    ap = argparse.ArgumentParser()
    SandboxOptions.add_args(ap)
    args, _ = ap.parse_known_args(ev[3:])
    assert (args.runtime, args.sandbox_backend, args.ray_address, args.sandbox_max_in_flight,
            args.ray_podman_url, args.ray_image_registry) == (
        "podman", "ray", "10.0.0.5:6379", 48, "", "mirror.local:5000")
    # local: fresh commands are what they always were; a resume says local explicitly
    local = _cfg()
    assert not [x for x in train_command(local, "M", 0, tmp_path / "M-s0")
                + eval_command(local, "/m", "bundled:train", tmp_path / "e")
                if x.startswith(("--sandbox", "--ray"))]
    assert train_command(local, "M", 0, ck.parent, ck)[-4:] == [
        "--sandbox_backend", "local", "--resume-from", str(ck)]


def test_a_changed_backend_is_recorded_not_refused(tmp_path):
    from ecredit_trl.study.supervisor import StudyRefused, bind_study

    out = tmp_path / "study"
    out.mkdir()
    first = bind_study(_cfg(), out, allow_changed=False, command=["a"])
    assert "sandbox" not in first
    # moving the study onto a cluster half-way: same hash, section and history recorded
    rec = bind_study(_cfg(sandbox=RAY), out, allow_changed=False, command=["b"])
    assert rec["config_sha256"] == first["config_sha256"]
    assert rec["sandbox"]["backend"] == "ray" and rec["started_at"] == first["started_at"]
    assert rec["history"][-1]["command"] == ["b"]
    assert rec["history"][-1]["changed_keys"] == ["sandbox"]
    on_disk = json.loads((out / "study.json").read_text())
    assert on_disk["sandbox"] == rec["sandbox"]
    assert config_from_study_json(out / "study.json").sandbox["max_in_flight"] == 48
    # a real change is still refused, naming only the keys that bind
    with pytest.raises(StudyRefused, match=r"changed \(train\.max_steps\);"):
        bind_study(_cfg(train={"max_steps": 3}), out, allow_changed=False, command=["c"])
