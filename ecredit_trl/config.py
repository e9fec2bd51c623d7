"""ECreditConfig: the one configuration object of a run (a ``GRPOConfig`` subclass).

Every field is settable from the command line (``--credit_lambda 0.5`` or
``--credit-lambda 0.5``) and from a YAML file (``--config file.yaml``), through
transformers' ``HfArgumentParser``, as TRL's own scripts do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from ecredit_trl.agent.vllm_server import require_listening
from ecredit_trl.credit.arms import ARMS
from eval.evaluation.templatecheck import CHAT_TEMPLATE_HELP, TOOL_TEMPLATES
from sandbox.backend import DEFAULTS as SANDBOX
from sandbox.backend import SandboxOptions
from sandbox.cluster.dispatch import RayOptions
from sandbox.runtimes.podman_runtime import endpoints_retired, is_local_endpoint
from sandbox.snapshots.snapshot import DEFAULT_SNAPSHOT_IGNORE

DEFAULT_TEST_PATTERNS = ["tests/", "test_*.py", "*_test.py", "testing/", "conftest.py"]


@dataclass
class ECreditConfig(GRPOConfig):
    """GRPO configuration plus the counterfactual-credit fields (design page, "Credit arms").

    Raises ValueError (naming the field) for an unknown arm, runtime or terminal
    reward, a negative ``credit_lambda``, a non-positive ``credit_cap``,
    ``max_turns`` < 1, a ``chat_template`` TRL has no tool-call parser for (names:
    :data:`eval.evaluation.templatecheck.TOOL_TEMPLATES`), ``use_vllm`` without vLLM installed,
    ``verifier_concurrency`` < 1, ``sandbox_retries`` < 1, an unknown
    ``pipeline``, ``agent_concurrency`` < 1, a negative ``sandbox_retry_backoff_s``, an agent
    disk limit below 1 MiB, a remote (non-``unix://``) ``agent_endpoints`` entry, any
    ``verifier_endpoints`` or remote ``podman_endpoints`` entry (retired: the message
    names the Ray settings, :func:`sandbox.runtimes.podman_runtime.endpoints_retired`), an unknown
    ``sandbox_backend``, an invalid Ray field or a refused ray combination
    (:meth:`sandbox.backend.SandboxOptions.validate`, the one check of the sandbox fields;
    :meth:`sandbox_options` builds the options, defaults from :class:`SandboxOptions`).
    """

    arm: str = field(default="B", metadata={"help": "O (plain GRPO), B (broadcast D), M (D on "
                                                    "the selected turn), E (A on the selected turn)"})
    credit_lambda: float = field(default=0.5, metadata={"help": "λ: weight of the contrast D"})
    credit_cap: float = field(default=1.0, metadata={"help": "c: cap on |C(t)| per token"})
    test_path_patterns: list[str] = field(
        default_factory=lambda: list(DEFAULT_TEST_PATTERNS),
        metadata={"help": "edit blocks touching only these paths are not eligible"})
    snapshot_ignore: list[str] = field(
        default_factory=lambda: list(DEFAULT_SNAPSHOT_IGNORE),
        metadata={"help": "generated files never recorded in snapshots (dir/ = a directory "
                          "at any depth, name = a file name, a/b = a path; fnmatch globs)"})
    selection_seed: int | None = field(default=None, metadata={
        "help": "run seed of block selection (default: the run's --seed, so the seeds of a "
                "study do not share one selection stream; an explicit value wins)"})
    runtime: str = field(default=SANDBOX.kind, metadata={"help": "podman or local (not isolated)"})
    podman_endpoints: list[str] = field(
        default_factory=list,
        metadata={"help": "deprecated: its unix:// entries set agent_endpoints when that is "
                          "not given; a remote entry is refused (retired: sandbox_backend=ray)"})
    agent_endpoints: list[str] = field(
        default_factory=list,
        metadata={"help": "local Podman API URLs (unix://) for agent sessions; the first one "
                          "also serves the local backend's verifier trials; empty: a private "
                          "local service"})
    verifier_endpoints: list[str] = field(
        default_factory=list,
        metadata={"help": "retired: any value is refused with a migration "
                          "message; trials on other hosts run with sandbox_backend=ray"})
    sandbox_backend: str = field(default=SANDBOX.backend, metadata={
        "help": "where verifier trials and agent sandboxes run: local (this machine's "
                "Podman) or ray (Ray tasks and actors on an existing cluster's sandbox nodes, "
                "each with its own Podman; docs/scale-out.md)"})
    ray_address: str = field(default=SANDBOX.ray_address, metadata={
        "help": "sandbox_backend=ray: address of the running Ray cluster (auto, HOST:PORT, "
                "ray://HOST:10001); the trainer never starts a cluster"})
    sandbox_max_in_flight: int = field(default=SANDBOX.max_in_flight, metadata={
        "help": "sandbox_backend=ray: cluster-wide cap on verifier trials and agent sandboxes "
                "in flight together, shared by every rank of the run (a named Ray actor); "
                "set it above one generation round's rollouts across ranks plus trial slots"})
    ray_podman_url: str = field(default=SANDBOX.podman_url, metadata={
        "help": "sandbox_backend=ray: each node's Podman socket (e.g. unix:///run/podman/"
                "podman.sock); empty: a private service per Ray worker"})
    ray_image_registry: str | None = field(default=SANDBOX.image_registry, metadata={
        "help": "sandbox_backend=ray: where a node pulls an image it lacks (a mirror host or "
                "docker-archive:DIR, as `python -m sandbox.images pull --registry`); "
                "default: the image's own registry"})
    verifier_concurrency: int = field(default=2, metadata={"help": "concurrent verifier trials"})
    verifier_retries: int = field(default=1, metadata={"help": "retries after an infra error"})
    trial_timeout_s: float | None = field(default=None, metadata={
        "help": "seconds per verifier trial; default from the task (eval.tasks.trialspec."
                "trial_limits): 1800 for SWE-bench-format image tasks, 120 for bundled"})
    trial_memory: str | None = field(default=None, metadata={
        "help": "memory limit of a verifier trial (podman size, e.g. 8g); default from the "
                "task: 8g for SWE-bench-format image tasks, 2g for bundled"})
    trial_cpus: float | None = field(default=None, metadata={
        "help": "CPUs of a verifier trial; default from the task: 2 for SWE-bench-format "
                "image tasks, 1 for bundled"})
    sandbox_retries: int = field(default=4, metadata={
        "help": "health checks of the sandbox service before a clean stop (before each round, "
                "and after a round with infra errors)"})
    sandbox_retry_backoff_s: float = field(default=2.0, metadata={
        "help": "seconds before the 2nd health check; doubles each time"})
    bash_timeout_s: float = field(default=30.0, metadata={"help": "seconds per agent bash call"})
    agent_max_file_mib: int = field(default=100, metadata={
        "help": "largest file (MiB) an agent may write: fsize ulimit in its container and "
                "the snapshot limit (GitHub refuses files over 100 MiB)"})
    agent_tree_budget_mib: int = field(default=2048, metadata={
        "help": "growth (MiB) of one rollout's working tree + snapshot store; past it the "
                "episode ends as the policy's failure (agent_disk_budget: the failure value, "
                "not excluded)"})
    tasks: str = field(default="bundled:train", metadata={"help": "task source (bundled:train, official500, "
                                                            "a .jsonl path, ...)"})
    max_tasks: int | None = field(default=None, metadata={"help": "use only the first N tasks"})
    max_turns: int = field(default=4, metadata={"help": "assistant turns per rollout"})
    terminal_reward: str = field(default="resolved", metadata={"help": "resolved or utility"})
    pipeline: str = field(default="overlapped", metadata={
        "help": "overlapped: tool calls of the rollouts in parallel (agent_concurrency), each "
                "rollout's trials submitted when its episode ends; sequential: one rollout's "
                "tool calls after another, all trials after the last episode"})
    agent_concurrency: int = field(default=8, metadata={
        "help": "rollouts whose tool calls run at once (overlapped pipeline)"})
    chat_template: str | None = field(default=None, metadata={"help": CHAT_TEMPLATE_HELP})
    run_name_prefix: str = field(default="ecredit", metadata={"help": "runs/<prefix>-<arm>-..."})
    runs_dir: str = field(default="runs", metadata={"help": "where run directories go"})

    def __post_init__(self) -> None:
        if self.selection_seed is None:  # one selection stream per run seed
            self.selection_seed = self.seed
        if self.arm not in ARMS:
            raise ValueError(f"arm: expected one of {ARMS}, got {self.arm!r}")
        if self.terminal_reward not in ("resolved", "utility"):
            raise ValueError(f"terminal_reward: expected 'resolved' or 'utility', "
                             f"got {self.terminal_reward!r}")
        if not self.credit_lambda >= 0:
            raise ValueError(f"credit_lambda: must be >= 0, got {self.credit_lambda}")
        if not self.credit_cap > 0:
            raise ValueError(f"credit_cap: must be > 0, got {self.credit_cap}")
        if self.max_turns < 1:
            raise ValueError(f"max_turns: must be >= 1, got {self.max_turns}")
        if self.sandbox_retries < 1:
            raise ValueError(f"sandbox_retries: must be >= 1, got {self.sandbox_retries}")
        if not self.sandbox_retry_backoff_s >= 0:
            raise ValueError(f"sandbox_retry_backoff_s: must be >= 0, got {self.sandbox_retry_backoff_s}")
        for name in ("agent_max_file_mib", "agent_tree_budget_mib"):
            if not getattr(self, name) >= 1:
                raise ValueError(f"{name}: must be >= 1 (MiB), got {getattr(self, name)}")
        if isinstance(self.snapshot_ignore, str) or not all(
                isinstance(p, str) and p.strip() for p in self.snapshot_ignore):
            raise ValueError(f"snapshot_ignore: expected a list of non-empty glob strings, "
                             f"got {self.snapshot_ignore!r}")
        self._resolve_endpoints()
        self.sandbox_options().validate()  # ValueError naming the field
        if self.chat_template is not None and self.chat_template not in TOOL_TEMPLATES:
            raise ValueError(f"chat_template: expected one of {', '.join(TOOL_TEMPLATES)}, "
                             f"got {self.chat_template!r}")
        if self.use_vllm:
            self._require_vllm()
        if self.use_vllm and self.vllm_mode == "server":  # every rank: a connect, no request
            require_listening(self.vllm_server_base_url, self.vllm_server_host,
                              self.vllm_server_port)
        if self.pipeline not in ("sequential", "overlapped"):
            raise ValueError(f"pipeline: expected 'sequential' or 'overlapped', got {self.pipeline!r}")
        if self.agent_concurrency < 1:
            raise ValueError(f"agent_concurrency: must be >= 1, got {self.agent_concurrency}")
        if self.verifier_concurrency < 1:
            raise ValueError(f"verifier_concurrency: must be >= 1, got {self.verifier_concurrency}")
        # one assistant turn per tool-calling iteration, plus the first generation
        if self.max_tool_calling_iterations is None:
            self.max_tool_calling_iterations = self.max_turns - 1
        super().__post_init__()

    def _require_vllm(self) -> None:
        """``use_vllm`` (TRL's own generation path, colocate or server mode, kept
        as is) refused at parse time, in one line, where vLLM is not installed - not after the
        tasks, the sandbox service and the start receipt."""
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise ValueError(f"use_vllm: vllm is not installed in this environment (vllm_mode="
                             f"{self.vllm_mode}); install a vLLM release TRL supports (0.22-0.31)"
                             " on a CUDA host, or drop --use_vllm")

    def sandbox_options(self) -> SandboxOptions:
        """These fields as :class:`sandbox.backend.SandboxOptions` (what ``make_runtime`` takes)."""
        return SandboxOptions.from_config(self)

    def ray_options(self) -> RayOptions:
        """The :class:`sandbox.cluster.dispatch.RayOptions` of these fields."""
        return self.sandbox_options().ray_options()

    def _resolve_endpoints(self) -> None:
        """The deprecated ``podman_endpoints`` fills ``agent_endpoints`` when that is empty
        (its entries must be local now: a remote one is refused with the migration message);
        empty entries are dropped. The endpoint checks themselves (a remote agent endpoint,
        any ``verifier_endpoints`` entry) are :meth:`SandboxOptions.validate`'s."""
        for name in ("podman_endpoints", "agent_endpoints", "verifier_endpoints"):
            if isinstance(getattr(self, name), str):
                raise ValueError(f"{name}: expected a list of Podman API URLs, got a string")
        if [e for e in self.podman_endpoints if e and not is_local_endpoint(e)]:
            raise ValueError(endpoints_retired("podman_endpoints"))
        if self.podman_endpoints and not self.agent_endpoints:
            self.agent_endpoints = list(self.podman_endpoints)
        self.agent_endpoints = [e for e in self.agent_endpoints if e]
