"""Choosing where trials and agent sandboxes run: :class:`SandboxOptions` (this machine,
``local``, or a Ray cluster, ``ray``), its command-line flags, and :func:`make_runtime` /
:func:`open_runtime`, which turn it into a :class:`~sandbox.runtimes.protocol.Runtime`.

One set of options, three faces: the trainer's fields (``ecredit_trl.config.ECreditConfig``:
``--runtime``, ``--sandbox_backend``, ``--ray_address`` ...), the CLIs' flags
(:meth:`SandboxOptions.add_args`: ``--runtime``, ``--sandbox-backend`` ...) and a study's
``sandbox:`` section (its keys are the field names of :class:`SandboxOptions`). Every default
is the dataclass's; every check is :meth:`SandboxOptions.validate` (design page, "Scale-out").

The top of ``sandbox/``: it may import every subpackage below it; nothing in ``sandbox/``
imports it.
"""

from __future__ import annotations

import argparse
import os
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from sandbox.bounds import Int, Text
from sandbox.cluster.dispatch import (
    DEFAULT_ADDRESS,
    DEFAULT_MAX_IN_FLIGHT,
    RayOptions,
    RayUnavailable,
)
from sandbox.cluster.trials import RayRoutedRuntime
from sandbox.runtimes.local_runtime import LocalRuntime
from sandbox.runtimes.podman_runtime import (
    PodmanRuntime,
    check_agent_endpoints,
    endpoints_retired,
)
from sandbox.runtimes.protocol import BACKENDS, FLAGS, KINDS, Runtime, runtime_flags

__all__ = ["BACKENDS", "CONFIG_FIELDS", "KINDS", "Runtime", "SandboxOptions",
           "SandboxOptionsError", "make_runtime", "open_runtime", "runtime_from_args"]

CONFIG_FIELDS = {"kind": "runtime", "backend": "sandbox_backend", "ray_address": "ray_address",
                 "max_in_flight": "sandbox_max_in_flight", "podman_url": "ray_podman_url",
                 "image_registry": "ray_image_registry", "agent_endpoints": "agent_endpoints",
                 "verifier_endpoints": "verifier_endpoints", "run_id": "sandbox_run_id",
                 "allow_unheld": "sandbox_allow_unheld",
                 "allow_unauthenticated": "sandbox_allow_unauthenticated"}
""":class:`SandboxOptions` field → the trainer's config field of the same meaning (the names
errors use by default; a CLI flag is the same name with dashes, :data:`FLAGS`)."""
STUDY_KEYS = ("backend", "ray_address", "max_in_flight", "podman_url", "image_registry")
"""The keys of a study's ``sandbox:`` section (field names of :class:`SandboxOptions`); the
runtime kind is the study's ``eval.runtime`` / ``train.runtime``."""


class SandboxOptionsError(ValueError):
    """One sandbox option is invalid. ``str()`` is ``"<name>: <problem>"``, ``name`` the
    caller's name for the field (a config field, a study key); ``field`` is the
    :class:`SandboxOptions` field, ``problem`` the text after the name."""

    def __init__(self, name: str, problem: str, field: str) -> None:
        super().__init__(f"{name}: {problem}")
        self.name, self.problem, self.field = name, problem, field


@dataclass(frozen=True)
class SandboxOptions:
    """Where and how verifier trials and agent sandboxes run.

    Attributes:
        kind: ``"podman"`` (fresh containers) or ``"local"`` (host subprocesses, not isolated;
            only ever chosen explicitly). Flag ``--runtime``.
        backend: ``"local"`` (this machine) or ``"ray"`` (Ray tasks and actors on an existing
            cluster's sandbox nodes, each with its own Podman; needs ``kind="podman"``).
        ray_address: ray: ``ray.init`` address of the running cluster (``auto``,
            ``HOST:PORT``, ``ray://HOST:10001``); the cluster is never started here.
        max_in_flight: ray: cluster-wide cap on the run's trials and agent sandboxes in
            flight, shared by every rank (one dispatcher per run).
        podman_url: ray: each node's Podman socket (``unix://...``); "" = a private service
            per Ray worker.
        image_registry: ray: where a node pulls an image it lacks (a mirror host or
            ``docker-archive:DIR``); None = the image name's own registry.
        agent_endpoints: local ``unix://`` Podman sockets for agent sessions (the first also
            serves the local backend's trials); empty = a private local service. The
            trainer's field only: these sockets are not passed to a child process.
        verifier_endpoints: retired: any entry is refused with the migration message
            (:func:`sandbox.runtimes.podman_runtime.endpoints_retired`).
        run_id: ray: the run whose dispatcher to join (a child process of that run, flag
            ``--sandbox-run-id``); None = a run of one's own.
        allow_unheld: ray: let a sandbox node whose doctor report has a rule not held serve
            anyway, its trials marked with the rules it lacks (default: such a node is
            refused; :mod:`sandbox.doctor.gate`).
        allow_unauthenticated: ray: use a cluster that does not enforce Ray token
            authentication (only a loopback-only test cluster should); default: refused
            before any work, naming the fix (:mod:`sandbox.cluster.auth`).

    Frozen (usable as a default argument); :meth:`validate` checks it.
    """

    kind: str = "podman"
    backend: str = "local"
    ray_address: str = DEFAULT_ADDRESS
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    podman_url: str = ""
    image_registry: str | None = None
    agent_endpoints: tuple[str, ...] = ()
    verifier_endpoints: tuple[str, ...] = ()
    run_id: str | None = None
    allow_unheld: bool = False
    allow_unauthenticated: bool = False

    # -- checks ---------------------------------------------------------------
    def validate(self, names: Mapping[str, str] | None = None) -> SandboxOptions:
        """``self`` when every field is valid, else the first problem.

        Args:
            names: field → the caller's name for it in the message (default
                :data:`CONFIG_FIELDS`: the trainer's field names).

        Raises: :class:`SandboxOptionsError` (a ValueError, one line) naming the field: an
        unknown kind or backend; an empty address; a cap that is not an int >= 1; a
        non-``unix://`` node socket; an empty registry; ``ray`` with the ``local`` kind;
        a remote agent endpoint; any verifier endpoint (the retired list).
        """
        name = {**CONFIG_FIELDS, **(names or {})}

        def bad(f: str, problem: str) -> SandboxOptionsError:
            return SandboxOptionsError(name[f], problem, f)

        if self.kind not in KINDS:
            raise bad("kind", f"expected 'podman' or 'local', got {self.kind!r}")
        if self.backend not in BACKENDS:
            raise bad("backend", f"expected one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if not isinstance(self.ray_address, str) or not self.ray_address.strip():
            raise bad("ray_address", f"expected 'auto' or HOST:PORT of a running cluster, got "
                                     f"{self.ray_address!r}")
        m = self.max_in_flight
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise bad("max_in_flight", f"expected an int >= 1, got {m!r}")
        url = self.podman_url
        if not isinstance(url, str) or (url and not url.startswith("unix://")):
            raise bad("podman_url", f"expected \"\" or a node-local unix:// socket (each node "
                                    f"runs its own trials), got {url!r}")
        reg = self.image_registry
        if reg is not None and (not isinstance(reg, str) or not reg):
            raise bad("image_registry", f"expected a registry/mirror or null, got {reg!r}")
        if self.backend == "ray" and self.kind != "podman":
            raise bad("backend", f"ray runs every trial in Podman on a cluster node; "
                                 f"{name['kind']} must be podman, got {self.kind!r}")
        try:
            check_agent_endpoints(self.agent_endpoints, name["agent_endpoints"])
        except ValueError as exc:
            raise bad("agent_endpoints", str(exc).split(": ", 1)[1]) from None
        if [e for e in self.verifier_endpoints if e]:
            msg = endpoints_retired(name["verifier_endpoints"])
            raise bad("verifier_endpoints", msg.split(": ", 1)[1])
        return self

    def ray_options(self) -> RayOptions:
        """The Ray part (:class:`sandbox.cluster.dispatch.RayOptions`)."""
        return RayOptions(address=self.ray_address, max_in_flight=self.max_in_flight,
                          podman_url=self.podman_url, registry=self.image_registry,
                          allow_unheld=self.allow_unheld,
                          allow_unauthenticated=self.allow_unauthenticated)

    # -- the three faces ------------------------------------------------------
    def study_section(self) -> dict:
        """The study ``sandbox:`` section of these options (:data:`STUDY_KEYS`)."""
        return {k: getattr(self, k) for k in STUDY_KEYS}

    def argv(self) -> list[str]:
        """The :meth:`add_args` flags of these options (a child process rebuilds them with
        :meth:`from_args`): ``--runtime`` alone on the local backend, every Ray field on
        ``ray`` (:func:`sandbox.runtimes.protocol.runtime_flags`). Agent endpoints are this
        process's sockets and stay out."""
        return runtime_flags(self.kind, self.backend, ray_address=self.ray_address,
                             max_in_flight=self.max_in_flight, podman_url=self.podman_url,
                             image_registry=self.image_registry, run_id=self.run_id,
                             allow_unheld=self.allow_unheld,
                             allow_unauthenticated=self.allow_unauthenticated)

    @staticmethod
    def add_args(ap: argparse.ArgumentParser) -> None:
        """Add ``--runtime`` and the backend flags (:data:`FLAGS`, the trainer's field names
        with dashes) to an argparse parser, defaults from the dataclass."""
        d = SandboxOptions()
        ap.add_argument(FLAGS["kind"], choices=KINDS, default=d.kind)
        ap.add_argument(FLAGS["backend"], choices=BACKENDS, default=d.backend,
                        help="where verifier trials and agent sandboxes run: local (this "
                             "machine) or ray (an existing Ray cluster's sandbox nodes; "
                             "docs/scale-out.md)")
        ap.add_argument(FLAGS["ray_address"], type=Text(), default=d.ray_address,
                        help="ray: address of the running cluster (auto, HOST:PORT)")
        ap.add_argument(FLAGS["max_in_flight"], type=Int(ge=1), default=d.max_in_flight,
                        help="ray: cluster-wide cap on trials and agent sandboxes in flight")
        ap.add_argument(FLAGS["podman_url"], type=Text(empty=True), default=d.podman_url,
                        help="ray: each node's Podman socket (default: a private service per "
                             "worker)")
        ap.add_argument(FLAGS["image_registry"], type=Text(), default=d.image_registry,
                        help="ray: where a node pulls an image it lacks (mirror or "
                             "docker-archive:DIR)")
        ap.add_argument(FLAGS["allow_unheld"], action="store_true",
                        help="ray: let a sandbox node where a reward-integrity rule did not "
                             "hold (python -m sandbox doctor) serve anyway, its trials marked; "
                             "default: such a node is refused")
        ap.add_argument(FLAGS["allow_unauthenticated"], action="store_true",
                        help="ray: use a cluster that does not enforce Ray token "
                             "authentication (a loopback-only test cluster); default: refused "
                             "(docs/scale-out.md)")
        # internal: eval.run's rollout subprocess joins the evaluation's dispatcher (its cap
        # and its cleanup) instead of making a new one
        ap.add_argument(FLAGS["run_id"], type=Text(), default=d.run_id, help=argparse.SUPPRESS)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SandboxOptions:
        """The options of :meth:`add_args` flags (not validated: :meth:`validate`)."""
        return cls(kind=args.runtime, backend=args.sandbox_backend,
                   ray_address=args.ray_address, max_in_flight=args.sandbox_max_in_flight,
                   podman_url=args.ray_podman_url, image_registry=args.ray_image_registry,
                   run_id=getattr(args, "sandbox_run_id", None),
                   allow_unheld=bool(getattr(args, "sandbox_allow_unheld", False)),
                   allow_unauthenticated=bool(getattr(args, "sandbox_allow_unauthenticated",
                                                      False)))

    @classmethod
    def from_config(cls, cfg) -> SandboxOptions:
        """The options of an object with the trainer's fields (:data:`CONFIG_FIELDS`; a
        missing one keeps its default), not validated."""
        d = cls()
        kw = {f: getattr(cfg, c, getattr(d, f)) for f, c in CONFIG_FIELDS.items()}
        kw["agent_endpoints"] = tuple(kw["agent_endpoints"] or ())
        kw["verifier_endpoints"] = tuple(kw["verifier_endpoints"] or ())
        return cls(**kw)


DEFAULTS = SandboxOptions()
"""The options of a run that names none: Podman on this machine."""


def make_runtime(options: SandboxOptions = DEFAULTS, *, run_id: str | None = None) -> Runtime:
    """The runtime ``options`` name (validated first; never chosen implicitly).

    ``podman``/``local``: :class:`~sandbox.runtimes.podman_runtime.PodmanRuntime` (its agent
    sessions on ``options.agent_endpoints``); ``local``/``local``:
    :class:`~sandbox.runtimes.local_runtime.LocalRuntime`; ``podman``/``ray``:
    :class:`~sandbox.cluster.trials.RayRoutedRuntime` on the running cluster, joining
    ``options.run_id``'s dispatcher when set. ``run_id`` labels what the runtime starts
    (default: random; ``options.run_id`` wins).

    Raises: SandboxOptionsError (a ValueError naming the field) before anything starts;
    PodmanUnavailable when Podman cannot start; RayUnavailable when the cluster cannot be
    reached.
    """
    options.validate()
    run_id = options.run_id or run_id
    agents = list(options.agent_endpoints) or None
    if options.backend == "ray":
        return RayRoutedRuntime(run_id=run_id or f"ray-{uuid.uuid4().hex[:8]}",
                                options=options.ray_options(), agent_endpoints=agents)
    if options.kind == "local":
        return LocalRuntime(run_id=run_id or "local")
    return PodmanRuntime(run_id=run_id, agent_endpoints=agents)


@contextmanager
def open_runtime(runtime: Runtime | SandboxOptions, *, run_id: str) -> Iterator[Runtime]:
    """The runtime to use for one call: ``runtime`` itself when it is one (the caller's: not
    closed here), else :func:`make_runtime` of the options, closed on exit. ``run_id`` labels
    a runtime made here."""
    if not isinstance(runtime, SandboxOptions):
        yield runtime
        return
    rt = make_runtime(runtime, run_id=run_id)
    try:
        yield rt
    finally:
        rt.close()


def runtime_from_args(args: argparse.Namespace, run_prefix: str) -> Runtime | SandboxOptions:
    """What a CLI (``eval.run``, ``eval.controls``, the pilot, the rollout subprocess) passes
    on from its :meth:`SandboxOptions.add_args` flags: the options on the local backend (the
    callee makes and closes the runtime); on ``ray`` the opened
    :class:`~sandbox.cluster.trials.RayRoutedRuntime` (run id ``<run_prefix>-<pid>`` unless
    ``--sandbox-run-id`` names the run to join), closed when the process exits (its
    ``atexit`` hook), so every stage of the command shares one dispatcher.

    Raises: ValueError naming the flag's field, or with the one-line
    :class:`sandbox.cluster.dispatch.RayUnavailable` message when no cluster answers (the CLIs
    print a ValueError as one ``error:`` line and exit 2).
    """
    options = SandboxOptions.from_args(args).validate()
    if options.backend == "local":
        return options
    try:
        return make_runtime(options, run_id=f"{run_prefix}-{os.getpid()}")
    except RayUnavailable as exc:
        raise ValueError(str(exc)) from exc
