"""A garbled exec output (podman-py: an empty body, or the raw stream frames) on a live
agent container (design page, "Who caused a failure decides the reward").

The garbling is injected at the podman-py boundary only: the container's real
``exec_run`` runs the command, and its result is handed back garbled. A read-only call is
re-run once and counted; a call that changed the tree is never re-run; a second garbling
ends the episode as infrastructure with its own reason (``exec_garbled``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release
from ecredit_trl.agent.failures import apply_episode_failure
from ecredit_trl.runs.ledger import GUARD_EXCLUSIONS
from ecredit_trl.runs.rollout_record import RolloutRecord
from sandbox.workspace.session import output_garbled

pytestmark = pytest.mark.podman


def _empty(code, out, err):
    return 0, (None, None)


def _frames(code, out, err):
    raw = b"".join(bytes([s, 0, 0, 0]) + len(b).to_bytes(4, "big") + b
                   for s, b in ((1, out or b""), (2, err or b"")) if b)
    return code, (raw, None)


def _garble(env, monkeypatch, how, times: int) -> list[str]:
    """The container's real exec_run, its first ``times`` results garbled by ``how``."""
    container = env.ws.session.container
    real = container.exec_run
    ran: list[str] = []

    def exec_run(cmd, **kw):
        code, (out, err) = real(cmd, **kw)
        ran.append(cmd[-1])
        if len(ran) <= times:
            return how(code, out, err)
        return code, (out, err)

    monkeypatch.setattr(container, "exec_run", exec_run)
    return ran


@pytest.fixture
def env(calc_task, tmp_path, podman_runtime):
    ctx = AgentContext(tasks={calc_task.instance_id: calc_task}, runtime=podman_runtime,
                       workroot=str(tmp_path / "work"), bash_timeout_s=30)
    e = SWEAgentEnv(ctx)
    e.reset(instance_id=calc_task.instance_id)
    ctx.turn = 1
    yield e
    release(e)


def test_output_garbled_rule():
    assert output_garbled(0, b"", b"")
    assert output_garbled(0, b"\x01\x00\x00\x00\x00\x00\x00\x05hello", b"")
    assert not output_garbled(0, b"@@ecredit-start-x@@\nhello", b"")
    assert not output_garbled(126, b"", b"OCI runtime error")  # did not start: not garbled
    assert not output_garbled(137, b"", b"")


@pytest.mark.parametrize("how", [_empty, _frames], ids=["empty", "frames"])
def test_read_only_call_is_rerun_once_and_counted(env, monkeypatch, how):
    ran = _garble(env, monkeypatch, how, times=1)
    out = env.bash("cat calc.py | wc -l; ls")
    assert "calc.py" in out and env.failure is None, out
    assert len(ran) == 2 and env.exec_retries == 1
    assert env.calls[-1].status == "ok"


def test_call_that_changed_the_tree_is_never_rerun(env, monkeypatch, calc_task):
    ran = _garble(env, monkeypatch, _empty, times=1)
    out = env.bash("echo more >> notes.txt")
    assert out.startswith("ERROR: the sandbox failed (ExecOutputGarbled"), out
    assert len(ran) == 1 and env.exec_retries == 0
    assert (env.ws.workdir / "notes.txt").read_text() == "more\n"  # ran once, not twice
    assert env.failure[0] == "exec_garbled" and env.failure_class is None
    assert "exec_garbled" in GUARD_EXCLUSIONS
    rec = RolloutRecord(task_id=calc_task.instance_id, rollout_index=0, format_error=False,
                        num_turns=1, snapshots=[])
    cfg = SimpleNamespace(terminal_reward="utility", mask_truncated_completions=False)
    rec = apply_episode_failure(rec, env, calc_task, cfg, False)
    assert rec.exclusion == "exec_garbled" and rec.reward is None and rec.failure_class is None


def test_garbled_twice_is_infrastructure(env, monkeypatch):
    ran = _garble(env, monkeypatch, _frames, times=2)
    out = env.bash("ls")
    assert out.startswith("ERROR: the sandbox failed (ExecOutputGarbled"), out
    assert len(ran) == 2 and env.failure[0] == "exec_garbled" and env.failure_class is None
    assert env.exec_retries == 1  # the one re-run is counted even when it broke too
