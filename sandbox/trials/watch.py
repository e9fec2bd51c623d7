"""The host side of a verifier trial's limits: its deadline and its log size.

The trial script caps the eval script's output itself (``head -c``, :mod:`sandbox.trials.script`),
but code in the sandbox runs as the same user as the script and can write to the container's
own stdout (``/proc/1/fd/1``) past that cap. The container log is a file on the host
(``k8s-file`` driver, :file:`sandbox/containers.conf`), so a flood would fill the host's
disk; conmon's own size limit would truncate the log from its start, dropping the script's
markers (and letting whatever the flood printed stand in for them). So the watcher here
stats the log file every :data:`POLL_S` seconds and kills the container once it passes
:func:`log_cap`; the trial is then ``output_limit`` and only the first bytes of its log up to
the cap are read. Where the log file is not on this host (a remote endpoint) only the
script's cap holds.
"""

from __future__ import annotations

import io
import os
import signal
import tarfile
import threading
import time

POLL_S = 0.25
"""Seconds between two looks at the deadline and the log size."""


def log_cap(max_output_bytes: int) -> int:
    """Bytes the container's log file may reach: the eval script's limit, times 4 for the
    ``k8s-file`` line prefixes (timestamp, stream, tag: ~40 bytes per line), plus 1 MiB for the
    script's own lines."""
    return 4 * max_output_bytes + 2**20


def log_file(container) -> str | None:
    """Host path of ``container``'s log file (``HostConfig.LogConfig.Path``; conmon creates
    it when the container starts), None when the runtime does not say. Only for a container
    of a local endpoint (the path is on this host)."""
    path = ((container.attrs.get("HostConfig") or {}).get("LogConfig") or {}).get("Path")
    return path or None


def file_size(path: str | None) -> int:
    """Size of ``path`` in bytes, 0 when there is none (or it is gone)."""
    try:
        return os.stat(path).st_size if path else 0
    except OSError:
        return 0


class TrialWatch:
    """Kills ``container`` (SIGKILL) at ``timeout_s`` seconds or once ``log_path`` passes
    ``cap`` bytes, whichever comes first; :attr:`timed_out` / :attr:`flooded` say which.

    The deadline is enforced here, not by the HTTP timeout of the wait call, so a slow API
    answer is never mistaken for a timeout. Call :meth:`stop` when the container ended.
    """

    def __init__(self, container, timeout_s: float, log_path: str | None, cap: int) -> None:
        self.timed_out = threading.Event()
        self.flooded = threading.Event()
        self._done = threading.Event()
        self._container, self._path, self._cap = container, log_path, cap
        self._deadline = time.monotonic() + timeout_s
        self._thread = threading.Thread(target=self._run, daemon=True, name="trial-watch")
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(max(0.0, min(POLL_S, self._deadline - time.monotonic()))):
            if time.monotonic() >= self._deadline:
                self.timed_out.set()
            elif file_size(self._path) > self._cap:
                self.flooded.set()
            else:
                continue
            try:
                self._container.kill(signal.SIGKILL)
            except Exception:  # already gone: its end is read by the caller
                pass
            return

    def stop(self) -> None:
        """Stop watching (the container ended); waits for the watcher thread."""
        self._done.set()
        self._thread.join()


def read_logs(container, cap: int | None = None) -> str:
    """The container's combined stdout/stderr as text; with ``cap``, only its first ``cap``
    bytes (streamed, so a flooded log is never read whole)."""
    if cap is None:
        data = container.logs(stdout=True, stderr=True, stream=False)
        if not isinstance(data, (bytes, bytearray)):
            data = b"".join(data)
        return bytes(data).decode("utf-8", errors="replace")
    buf = bytearray()
    for chunk in container.logs(stdout=True, stderr=True, stream=True):
        buf += chunk if isinstance(chunk, (bytes, bytearray)) else str(chunk).encode()
        if len(buf) >= cap:
            break
    return bytes(buf[:cap]).decode("utf-8", errors="replace")


def read_file(container, path: str) -> str | None:
    """Text of one file in a (stopped) container, None when it is not there."""
    try:
        stream, _ = container.get_archive(path)
        data = b"".join(stream)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.next()
            fh = tar.extractfile(member) if member is not None else None
            return fh.read().decode("utf-8", errors="replace") if fh else None
    except Exception:
        return None


__all__ = ["POLL_S", "TrialWatch", "file_size", "log_cap", "log_file", "read_file", "read_logs"]
