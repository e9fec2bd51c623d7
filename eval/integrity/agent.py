"""The agent rule: who broke an agent container, and the score of an episode the policy broke.

The sandbox collects the evidence of a failed exec
(:meth:`sandbox.workspace.session.PodmanSession.diagnose`, cgroup reads and the kernel's OOM
record in :mod:`sandbox.workspace.health`); this module decides (design page, "Who caused a failure decides the reward"). Training applies it in
:mod:`ecredit_trl.agent.failures`, ``eval.run`` in :mod:`eval.evaluation.verification`.

**Who broke it.** A policy can break its own container (5,000 background ``sleep`` s fill
its pids limit; a process that holds the memory limit gets the next exec killed), so
masking every such failure would pay a failing policy for breaking its own sandbox.
An exec failure is the **agent's** (``agent_pids`` / ``agent_oom``) only when all hold:

1. **the service is healthy**: the Podman endpoint answers a ping (a dead service or a
   lost node is infrastructure);
2. **the container is the one we started and was not stopped from outside**: it still
   exists (a container removed from outside is infrastructure) and, for ``agent_pids``,
   it is still running. The agent cannot stop it itself: its init and main process run
   as a uid of their own (:data:`sandbox.workspace.health.KEEPER_USER`), and the agent, root
   without ``CAP_KILL``, gets ``EPERM`` signalling them. So a container that exited without
   memory evidence was stopped by someone else;
3. **the container hit its own limit**, read on the host from its own cgroup (the agent
   cannot write cgroup files: they are read-only inside, and the host reads the
   service-reported ``CgroupPath``). Every hit is read from a counter that only grows, over the container's cgroup subtree,
   against the sample before the last call that returned (:func:`classify_exec_failure`),
   so processes exiting or reaped before the reading hide nothing:

   * pids: the ``pids.events`` "max" counter grew (a fork was refused at the limit), or
     ``pids.current`` is within :data:`PIDS_SLACK` of ``pids.max`` now after a refusal;
   * memory: the OOM killer acted in the container's cgroup (``oom_kill`` grew, or v2
     ``memory.events`` ``oom``: the cgroup went OOM at its own limit) **and** its
     usage reached its own limit (:func:`memory_limit_reached`: the peak or the usage
     within :data:`MEMORY_SLACK_BYTES` of it, or the cgroup's own counters of hitting it
     grew: v2 ``memory.events`` ``max`` / ``oom``, v1 ``memory.failcnt``; the counters hold
     where ``memory.peak`` does not exist, cgroup v2 before kernel 5.19). That rules out a
     host-wide OOM kill (which also counts in ``oom_kill``) of a container below its
     limit. The counters die with the cgroup, so a container that the OOM killer stopped
     is judged on the counters read the moment the exec failed and the last sample taken
     after a call (:meth:`sandbox.workspace.session.PodmanSession.sample`), or,
     when the kill came during the failing call itself (the sample after it found no
     cgroup left: a race lost under load), on the kernel's own record of it: an
     ``oom-kill:constraint=CONSTRAINT_MEMCG,...,oom_memcg=<the container's cgroup>`` line in
     the kernel log (:func:`sandbox.workspace.health.memcg_oom_logged`; ``CONSTRAINT_MEMCG`` =
     the cgroup's own limit, not host-wide pressure; the agent cannot write the kernel log).

Anything else stays an infra failure (``None``).

**What it scores.**

* **agent-caused** (``failure_class`` in :data:`AGENT_FAILURE_CLASSES`): the tree grew past
  the rollout's disk budget or a file past the per-file limit (``agent_disk_budget``), or an
  exec failed because the agent's own processes filled its container's pids or memory limit
  while the service was healthy (``agent_pids``, ``agent_oom``: :func:`classify_exec_failure`).
  The episode is a *failure*: resolved False and U = the failure value
  (:func:`eval.integrity.failure_value.failure_utility`), scored like any failing rollout,
  never masked. No factual trial runs: the policy ended its own episode by breaking its
  tool, so what it left behind is not a submission (a trial of the last good tree would
  make breaking the sandbox free: a fix followed by a fork bomb would keep the fix's
  reward), and after ``agent_disk_budget`` the files are gone. No counterfactual either, so
  the credit C is 0.
* **infrastructure** (no ``failure_class``: the container could not start, the service or
  node died, the container was removed or stopped from outside, a snapshot failed): the
  utility is unavailable, the rollout excluded and counted by reason, the reward None.
"""

from __future__ import annotations

from dataclasses import dataclass

from eval.integrity.failure_value import failure_utility

AGENT_EXEC_CLASSES = ("agent_pids", "agent_oom")
"""Failure classes of an exec failure charged to the agent (:func:`classify_exec_failure`)."""
AGENT_DISK_BUDGET = "agent_disk_budget"
"""``failure_class`` of an episode whose tree grew past its disk budget (always the policy's)."""
AGENT_FAILURE_CLASSES = (AGENT_DISK_BUDGET, *AGENT_EXEC_CLASSES)
"""``failure_class`` of an episode ended by the policy in its own container."""
PIDS_SLACK = 4
"""An exec needs a few pids of its own (runc init, bash, timeout): a cgroup within this many
of its limit cannot start one."""
MEMORY_SLACK_BYTES = 4 * 2**20
"""Peak usage within this many bytes of the limit counts as having reached it (the kernel
reclaims and kills a little below the exact limit)."""


def _grew(c: dict, before: dict | None, key: str) -> bool:
    """``c[key]`` (a counter that only grows) is above ``before[key]`` (0 when unknown)."""
    now = c.get(key)
    return now is not None and now > ((before or {}).get(key) or 0)


def pids_exhausted(c: dict | None, before: dict | None = None) -> bool:
    """The container's own processes hit its pids limit (rule 3, pids): a fork was refused at
    the limit since ``before`` (the ``pids.events`` ``max`` counter, summed over the subtree,
    grew; None: since the start, when the fresh cgroup's counter was 0), or the cgroup is at
    its limit now (``pids_current`` within :data:`PIDS_SLACK` of ``pids_max``) and refused a
    fork at some time. The counter only grows, so a limit hit during the window is seen
    however fast the processes that hit it exit and are reaped afterwards (a bounded fork
    bomb frees its pids within a second of ``timeout`` killing it). Source:
    Documentation/admin-guide/cgroup-v2.rst ("PID": ``pids.events``); the fields are
    :func:`sandbox.workspace.health.read_cgroup`'s."""
    if not c:
        return False
    if _grew(c, before, "pids_max_events"):
        return True
    if c.get("pids_current") is None or c.get("pids_max") is None:
        return False
    return (c["pids_current"] >= c["pids_max"] - PIDS_SLACK
            and (c.get("pids_max_events") or 0) > 0)


def memory_limit_reached(c: dict | None, before: dict | None = None) -> bool:
    """The container's memory usage reached its own limit (rule 3, memory): the peak (v2
    ``memory.peak``, kernel >= 5.19; v1 ``memory.max_usage_in_bytes``) or the usage now
    within :data:`MEMORY_SLACK_BYTES` of the limit, or, since ``before`` (None: since the
    start), the cgroup's count of hitting the limit grew (v2 ``memory.events`` ``max``, v1
    ``memory.failcnt``: ``memory_max_events``) or it went OOM at a limit of its own (v2
    ``oom``: ``memory_oom_events``). Sources: Documentation/admin-guide/cgroup-v2.rst
    ("memory.events"), Documentation/admin-guide/cgroup-v1/memory.rst; the fields are
    :func:`sandbox.workspace.health.read_cgroup`'s."""
    if not c or c.get("memory_limit_bytes") is None:
        return False
    near = c["memory_limit_bytes"] - MEMORY_SLACK_BYTES
    return ((c.get("memory_peak_bytes") or 0) >= near
            or (c.get("memory_current_bytes") or 0) >= near
            or _grew(c, before, "memory_max_events") or _grew(c, before, "memory_oom_events"))


def memory_exhausted(c: dict | None, before: dict | None = None) -> bool:
    """The container's memory was exhausted at its own limit (rule 3, memory): since
    ``before`` (an earlier sample; None: since the start, when the fresh cgroup's counters
    were 0) the OOM killer acted in the container's cgroup (``oom_kill`` grew) or the cgroup
    went OOM at a limit of its own (v2 ``memory.events`` ``oom`` grew: an allocation was
    about to fail, also when no process could be killed and the exec got ``ENOMEM``), and
    :func:`memory_limit_reached`."""
    if not c or c.get("memory_limit_bytes") is None:
        return False
    if not (_grew(c, before, "oom_kill") or _grew(c, before, "memory_oom_events")):
        return False  # an old OOM the agent recovered from says nothing of this failure
    return memory_limit_reached(c, before)


def classify_exec_failure(evidence: dict) -> str | None:
    """Apply the module's rule to the evidence of one failed exec (pure).

    Args:
        evidence: :meth:`sandbox.workspace.session.PodmanSession.diagnose`'s facts:
            ``service_ok`` (bool: the endpoint answered a ping), ``container``
            (``"running"``, ``"exited"``, ... or ``"missing"``), ``cgroup`` (counters now,
            :func:`sandbox.workspace.health.read_cgroup`, None when gone),
            ``cgroup_at_failure`` (the counters read the moment the exec failed, before
            anything else: None when unreadable), ``cgroup_last`` (the sample taken right
            after the last call that returned, None if unreadable) and ``cgroup_prev`` (the
            sample before that one: after the call before, or at start; None when no call
            returned), and optionally ``memcg_oom``
            (:func:`sandbox.workspace.health.memcg_oom_logged` for the container's cgroup).

    Returns: ``"agent_pids"``, ``"agent_oom"``, or None (infrastructure: unavailable).

    Every limit hit is read from counters that only grow (``pids.events`` ``max``;
    ``oom_kill`` and ``memory.events`` ``oom``), compared with a sample taken before the
    window, so no timing (processes exiting, zombies reaped, memory freed between the
    failure and the reading) can hide one. The window is the last call that returned and
    the failing one (``cgroup_prev`` to now): a fork bomb or a memory blow-up in one call
    leaves the container full of dying processes, or of memory, when the next exec starts
    (seen live: OOM kills during the call that filled ``/tmp``, then the next exec's
    ``setns`` failed with no further kill). A limit hit the agent recovered from (a call
    returned after it) says nothing of this failure.
    A running container is judged on its counters now and at the failure; a stopped one
    (only the OOM killer of its own limit can stop it from inside) on the counters at the
    failure and the last call's sample, else the kernel's record, since its counters died
    with the cgroup.
    """
    if not evidence.get("service_ok"):
        return None
    state = evidence.get("container")
    at, last = evidence.get("cgroup_at_failure"), evidence.get("cgroup_last")
    base = evidence.get("cgroup_prev") or last
    if state == "running":
        now = evidence.get("cgroup")
        if pids_exhausted(now, base) or pids_exhausted(at, base):
            return "agent_pids"
        if memory_exhausted(now, base) or memory_exhausted(at, base):
            return "agent_oom"
        return None
    if state in (None, "missing"):
        return None
    if (memory_exhausted(at, base) or memory_exhausted(last, evidence.get("cgroup_prev"))
            or evidence.get("memcg_oom")):
        return "agent_oom"
    return None


@dataclass(frozen=True)
class AgentFailureVerdict:
    """The verdict of an agent-caused failure: ``resolved`` False, ``utility`` the failure
    value, ``failure_class`` one of :data:`AGENT_FAILURE_CLASSES`."""

    failure_class: str
    utility: float
    resolved: bool = False

    def reward(self, terminal_reward: str) -> float:
        """The terminal reward as for a graded trial: the utility with
        ``terminal_reward="utility"``, else 0.0 (not resolved)."""
        return float(self.utility) if terminal_reward == "utility" else 0.0


def agent_failure_verdict(task, failure_class: str) -> AgentFailureVerdict:
    """The verdict of ``task`` (``FAIL_TO_PASS``, ``PASS_TO_PASS``) for an agent-caused failure.

    Raises: ValueError naming ``failure_class`` when it is not in :data:`AGENT_FAILURE_CLASSES`.
    """
    if failure_class not in AGENT_FAILURE_CLASSES:
        raise ValueError(f"failure_class: expected one of {AGENT_FAILURE_CLASSES}, "
                         f"got {failure_class!r}")
    return AgentFailureVerdict(failure_class,
                               failure_utility(task.FAIL_TO_PASS, task.PASS_TO_PASS))


def agent_failure_slot(task, failure_class: str, evidence: dict | None) -> dict:
    """Slot fields of an evaluation rollout the agent broke (``eval.run``): graded, not
    unknown; resolved False, the failure value, every classification False, no trial."""
    v = agent_failure_verdict(task, failure_class)
    return {"resolved": False, "utility": v.utility, "complete": False, "attributed": False,
            "classification": {"raw": False, "report_binary": False, "strict": False,
                               "unknown": False},
            "unknown_reason": None, "failure_class": failure_class,
            "failure_evidence": evidence, "trial_source": None}


__all__ = ["AGENT_DISK_BUDGET", "AGENT_EXEC_CLASSES", "AGENT_FAILURE_CLASSES",
           "MEMORY_SLACK_BYTES", "PIDS_SLACK",
           "AgentFailureVerdict", "agent_failure_slot", "agent_failure_verdict",
           "classify_exec_failure", "memory_exhausted", "memory_limit_reached",
           "pids_exhausted"]
