"""How a training session ends: graceful stops on signals, infra stops, termination classes.

* :class:`GracefulStop` turns the first SIGTERM/SIGINT into a request: the
  trainer finishes the step it is in, saves a checkpoint and stops (a second
  SIGINT aborts at once with ``KeyboardInterrupt``).
* :class:`SandboxUnavailable` is raised (on every rank together) when the
  sandbox service stays unreachable after bounded retries with backoff; the
  session then saves an emergency checkpoint of the last completed step and
  stops with a termination receipt. Nothing of the failed round is recorded,
  so a resume redoes it exactly.
* :func:`termination_class` maps how ``train()`` ended onto the receipt
  classes ``completed``, ``sigterm``, ``sigint``, ``exception``, ``oom``
  (``unknown`` is only written by a later start that finds no receipt). A
  signal decides the class: a SIGTERM sent to the whole process group (batch
  schedulers, the study runner) also kills the run's git and Podman children,
  and the exception their deaths raise is a consequence of the signal, recorded
  as such, not the reason the session ended (design page, "Run records").
"""

from __future__ import annotations

import signal
import sys
import time

EXIT_CODES = {"completed": 0, "sigterm": 128 + signal.SIGTERM, "sigint": 128 + signal.SIGINT,
              "exception": 1, "oom": 1, "infra": 75}
"""Process exit status per termination class (``infra``: :class:`SandboxUnavailable`,
EX_TEMPFAIL: resumable once the sandbox service is back)."""


class SandboxUnavailable(RuntimeError):
    """The sandbox service (Podman) stayed unreachable after bounded retries.

    The message names the endpoint, the attempts and the seconds waited. The
    session stops cleanly; the state of the last completed step is resumable.
    """


class GracefulStop:
    """First SIGTERM/SIGINT: request a stop after the current step; second SIGINT: abort.

    Attributes:
        signal_name: ``"SIGTERM"``/``"SIGINT"`` of the first signal, or None.
        received_at: ``time.time()`` of the first signal (seconds), or None.
        step: the trainer's global step when it arrived (set by the caller's
            ``step_fn``), or None.
    """

    def __init__(self, step_fn=None) -> None:
        self.signal_name: str | None = None
        self.received_at: float | None = None
        self.step: int | None = None
        self._step_fn = step_fn
        self._old: dict = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def install(self) -> GracefulStop:
        """Install the handlers (main thread only); :meth:`restore` puts the old ones back."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signal_name is None:
            self.signal_name = name
            self.received_at = time.time()
            self.step = self._step_fn() if self._step_fn else None
            print(f"[ecredit] {name} received during step {(self.step or 0) + 1}: finishing this "
                  "step, then checkpoint, termination receipt and stop"
                  + (" (Ctrl-C again aborts without a checkpoint)" if name == "SIGINT" else ""),
                  file=sys.stderr, flush=True)
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        print(f"[ecredit] {name} received again: already stopping after this step",
              file=sys.stderr, flush=True)

    def __enter__(self) -> GracefulStop:
        return self.install()

    def __exit__(self, *exc) -> None:
        self.restore()


def follow_launcher_signals() -> bool:
    """Ask the kernel to send us SIGTERM when our ``accelerate launch`` parent dies.

    accelerate's single-process launcher does not forward SIGTERM to the
    training process; with ``PR_SET_PDEATHSIG`` a SIGTERM that kills the
    launcher still reaches :class:`GracefulStop`. Only done when the parent's
    command line is ``accelerate launch`` (a plain shell parent exiting, as
    with ``nohup``, must not stop training). Linux only; returns whether it was set.
    """
    import ctypes
    import os
    from pathlib import Path

    try:
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    # `accelerate launch ...` or `python -m accelerate.commands.launch ...`
    if not (b"accelerate.commands.launch" in parent[:3]
            or (any(b"accelerate" in x for x in parent[:3]) and b"launch" in parent)):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        return libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def launcher_kills_on_stop(launch_module=None) -> bool:
    """True when ``accelerate launch``'s single-process launcher ends the training process
    itself on SIGTERM or Ctrl-C, too soon for a graceful stop.

    accelerate 1.16 catches the signal in the launcher, terminates the child's whole
    process tree and SIGKILLs whatever is alive 5 s later (``_terminate_process_tree`` in
    ``accelerate/commands/launch.py``): the step in progress cannot finish, so no
    checkpoint of it and no termination receipt are written, and a later start records
    the session as ``unknown``. 1.15 and earlier leave the child alone, and
    :func:`follow_launcher_signals` delivers the stop. The project's dependencies keep
    accelerate below 1.16 for this reason; the check is on the behaviour (the function's
    presence), not the version string, so a backport is caught too.

    Args:
        launch_module: the module to inspect (tests); default ``accelerate.commands.launch``.
    Returns: False when accelerate is not installed.
    """
    if launch_module is None:
        try:
            from accelerate.commands import launch as launch_module
        except ImportError:
            return False
    return callable(getattr(launch_module, "_terminate_process_tree", None))


def is_oom(exc: BaseException) -> bool:
    """True for out-of-memory errors Python can see: ``MemoryError``,
    ``torch.OutOfMemoryError`` (CUDA) and the CPU allocator's "can't allocate memory"."""
    if isinstance(exc, MemoryError):
        return True
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):
        pass
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text
                                              or "CUDA out of memory" in text)


def termination_class(exc: BaseException | None, stop: GracefulStop | None) -> str:
    """Receipt class of a session that ended with ``exc`` (None: ``train()`` returned).

    Returns ``completed`` (returned, no signal), ``sigterm``/``sigint`` (a
    signal-requested stop, whether ``train()`` returned or raised after the signal:
    see :func:`signal_consequence`; or ``KeyboardInterrupt``), ``oom`` (see
    :func:`is_oom`; memory is not something a signal exhausts) or ``exception``.
    """
    signalled = stop is not None and stop.requested
    sig_cls = "sigterm" if signalled and stop.signal_name == "SIGTERM" else "sigint"
    if exc is None:
        return sig_cls if signalled else "completed"
    if isinstance(exc, KeyboardInterrupt):
        return "sigint"
    if is_oom(exc):
        return "oom"
    return sig_cls if signalled else "exception"


def signal_consequence(exc: BaseException | None, cls: str) -> bool:
    """True when ``exc`` ended a session whose class is a signal's: the exception is a
    consequence of the signal (a child killed by the same process-group signal), so it
    is recorded under the receipt's ``signal`` block and not re-raised."""
    return (exc is not None and cls in ("sigterm", "sigint")
            and not isinstance(exc, KeyboardInterrupt))


def exit_code(cls: str, exc: BaseException | None = None) -> int:
    """Exit status for a termination class (see :data:`EXIT_CODES`)."""
    if isinstance(exc, SandboxUnavailable) and not signal_consequence(exc, cls):
        return EXIT_CODES["infra"]
    return EXIT_CODES.get(cls, 1)


__all__ = ["EXIT_CODES", "GracefulStop", "SandboxUnavailable", "exit_code",
           "follow_launcher_signals", "is_oom", "launcher_kills_on_stop", "signal_consequence",
           "termination_class"]
