"""ECreditConfig: the one configuration object of a run (a ``GRPOConfig`` subclass), and the
main job's two other argument groups: ``ModelArguments`` (the policy and LoRA) and
``RunArguments`` (session control, never part of the run's config).

Every field is settable from the command line (``--credit_lambda 0.5`` or
``--credit-lambda 0.5``) and from a YAML file (``--config file.yaml``), through
transformers' ``HfArgumentParser``, as TRL's own scripts do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from trl import GRPOConfig

from ecredit_trl.agent.scaffolds import SCAFFOLDS
from ecredit_trl.agent.vllm_server import require_listening
from ecredit_trl.credit.arms import ARMS
from ecredit_trl.policy.vllm_checks import check_vllm_config
from eval.evaluation.templatecheck import CHAT_TEMPLATE_HELP, TOOL_TEMPLATES
from sandbox.backend import BACKENDS, KINDS, SandboxOptions
from sandbox.backend import DEFAULTS as SANDBOX
from sandbox.bounds import (
    BoundError,
    Choice,
    Float,
    InFile,
    Int,
    ModelRef,
    OutDir,
    Source,
    Text,
    check_fields,
    declared,
    register,
)
from sandbox.cluster.dispatch import RayOptions
from sandbox.runtimes.podman_runtime import endpoints_retired, is_local_endpoint
from sandbox.snapshots.snapshot import DEFAULT_SNAPSHOT_IGNORE

DEFAULT_TEST_PATTERNS = ["tests/", "test_*.py", "*_test.py", "testing/", "conftest.py"]


@declared
@dataclass
class ECreditConfig(GRPOConfig):
    """GRPO configuration plus the counterfactual-credit fields (design page, "Credit arms").

    Each field's bounds are declared beside it (``metadata["bounds"]``, moved into
    :data:`sandbox.bounds.FIELD_BOUNDS` by :func:`sandbox.bounds.declared`); those of the
    fields inherited from TRL / transformers are :data:`INHERITED`. All are
    checked first (:func:`sandbox.bounds.check_fields`: BoundError, a ValueError naming the
    flag, the value and what is allowed), then the field combinations
    (:func:`check_combinations`), both before TRL's ``__post_init__``.

    Raises ValueError (naming the field) for a value outside its bounds (an unknown arm,
    runtime, terminal reward or pipeline, a negative ``credit_lambda``, a ``chat_template`` TRL
    has no tool-call parser for: :data:`eval.evaluation.templatecheck.TOOL_TEMPLATES`, ...),
    ``use_vllm`` settings vLLM or the host cannot give
    (:mod:`ecredit_trl.policy.vllm_checks`), a remote (non-``unix://``) ``agent_endpoints`` entry, any
    ``verifier_endpoints`` or remote ``podman_endpoints`` entry (retired: the message
    names the Ray settings, :func:`sandbox.runtimes.podman_runtime.endpoints_retired`), an unknown
    ``sandbox_backend``, an invalid Ray field or a refused ray combination
    (:meth:`sandbox.backend.SandboxOptions.validate`, the one check of the sandbox fields;
    :meth:`sandbox_options` builds the options, defaults from :class:`SandboxOptions`).
    """

    disable_dropout: bool = field(default=True, metadata={
        "help": "Dropout off in the training forward (TRL's field; here on by default, and it "
                "also zeroes the float rates attention layers read, such as Llama's "
                "attention_dropout): dropout makes the log-probabilities the loss trains on "
                "differ from the ones the tokens were sampled with."})
    arm: str = field(default="B", metadata={
        "bounds": Choice(*ARMS),
        "help": "O (plain GRPO), B (broadcast D), M (D on the selected turn), E (A on the "
                "selected turn)"})
    credit_lambda: float = field(default=0.5, metadata={"bounds": Float(ge=0),
                                                        "help": "λ: weight of the contrast D"})
    credit_cap: float = field(default=1.0, metadata={"bounds": Float(gt=0),
                                                     "help": "c: cap on |C(t)| per token"})
    negative_advantage_weight: float = field(default=1.0, metadata={
        "bounds": Float(ge=0, le=1),
        "help": "weight of the negative terminal advantages A < 0 of every arm (1: GRPO's "
                "own; below 1 a failed rollout pushes its tokens down less than a resolved "
                "one pushes its tokens up)"})
    test_path_patterns: list[str] = field(
        default_factory=lambda: list(DEFAULT_TEST_PATTERNS),
        metadata={"bounds": Text(),
                  "help": "edit blocks touching only these paths are not eligible"})
    snapshot_ignore: list[str] = field(
        default_factory=lambda: list(DEFAULT_SNAPSHOT_IGNORE),
        metadata={"bounds": Text(),
                  "help": "generated files never recorded in snapshots (dir/ = a directory "
                          "at any depth, name = a file name, a/b = a path; fnmatch globs)"})
    selection_seed: int | None = field(default=None, metadata={
        "bounds": Int(ge=0, le=2**32 - 1, nullable=True),
        "help": "run seed of block selection (default: the run's --seed, so the seeds of a "
                "study do not share one selection stream; an explicit value wins)"})
    runtime: str = field(default=SANDBOX.kind, metadata={"bounds": Choice(*KINDS),
                                                         "help": "podman or local (not isolated)"})
    podman_endpoints: list[str] = field(
        default_factory=list,
        metadata={"bounds": Text(empty=True, why="an empty entry is no endpoint"),
                  "help": "deprecated: its unix:// entries set agent_endpoints when that is "
                          "not given; a remote entry is refused (retired: sandbox_backend=ray)"})
    agent_endpoints: list[str] = field(
        default_factory=list,
        metadata={"bounds": Text(empty=True, why="an empty entry is no endpoint"),
                  "help": "local Podman API URLs (unix://) for agent sessions; the first one "
                          "also serves the local backend's verifier trials; empty: a private "
                          "local service"})
    verifier_endpoints: list[str] = field(
        default_factory=list,
        metadata={"bounds": Text(empty=True, why="an empty entry is no endpoint"),
                  "help": "retired: any value is refused with a migration "
                          "message; trials on other hosts run with sandbox_backend=ray"})
    sandbox_backend: str = field(default=SANDBOX.backend, metadata={"bounds": Choice(*BACKENDS),
        "help": "where verifier trials and agent sandboxes run: local (this machine's "
                "Podman) or ray (Ray tasks and actors on an existing cluster's sandbox nodes, "
                "each with its own Podman; docs/scale-out.md)"})
    ray_address: str = field(default=SANDBOX.ray_address, metadata={"bounds": Text(),
        "help": "sandbox_backend=ray: address of the running Ray cluster (auto, HOST:PORT, "
                "ray://HOST:10001); the trainer never starts a cluster"})
    sandbox_max_in_flight: int = field(default=SANDBOX.max_in_flight, metadata={"bounds": Int(ge=1),
        "help": "sandbox_backend=ray: cluster-wide cap on verifier trials and agent sandboxes "
                "in flight together, shared by every rank of the run (a named Ray actor); "
                "set it above one generation round's rollouts across ranks plus trial slots"})
    ray_podman_url: str = field(default=SANDBOX.podman_url, metadata={"bounds": Text(empty=True),
        "help": "sandbox_backend=ray: each node's Podman socket (e.g. unix:///run/podman/"
                "podman.sock); empty: a private service per Ray worker"})
    ray_image_registry: str | None = field(default=SANDBOX.image_registry, metadata={
        "bounds": Text(nullable=True),
        "help": "sandbox_backend=ray: where a node pulls an image it lacks (a mirror host or "
                "docker-archive:DIR, as `python -m sandbox.images pull --registry`); "
                "default: the image's own registry"})
    sandbox_allow_unheld: bool = field(default=SANDBOX.allow_unheld, metadata={
        "help": "sandbox_backend=ray: let a sandbox node where a reward-integrity rule did not "
                "hold (python -m sandbox doctor) serve anyway, its trials marked with the "
                "rules it lacks (node_rule_unheld); default: such a node is refused"})
    sandbox_allow_unauthenticated: bool = field(default=SANDBOX.allow_unauthenticated, metadata={
        "help": "sandbox_backend=ray: use a Ray cluster that does not enforce token "
                "authentication (RAY_AUTH_MODE=token), e.g. a loopback-only test cluster; "
                "recorded in the run's config; default: such a cluster is refused before any "
                "work (docs/scale-out.md)"})
    verifier_concurrency: int = field(default=2, metadata={"bounds": Int(ge=1),
                                                           "help": "concurrent verifier trials"})
    verifier_retries: int = field(default=1, metadata={"bounds": Int(ge=0),
                                                       "help": "retries after an infra error"})
    reuse_control_for_empty_ablation: bool = field(default=True, metadata={
        "help": "arms B/M: a rollout whose ablated artifact is empty (restoring its selected "
                "block gives the base tree) takes U(P\\b) from the task's empty-patch control, a "
                "completed trial of that same empty artifact under the same limits, instead "
                "of a trial of its own (docs/design.md, \"Query bound\"); false: every "
                "admitted rollout of B/M runs its own counterfactual trial"})
    trial_timeout_s: float | None = field(default=None, metadata={
        "bounds": Float(gt=0, nullable=True),
        "help": "seconds per verifier trial; default from the task (eval.tasks.trialspec."
                "trial_limits): 1800 for SWE-bench-format image tasks, 120 for bundled"})
    trial_memory: str | None = field(default=None, metadata={"bounds": Text(nullable=True),
        "help": "memory limit of a verifier trial (podman size, e.g. 8g); default from the "
                "task: 8g for SWE-bench-format image tasks, 2g for bundled"})
    trial_cpus: float | None = field(default=None, metadata={"bounds": Float(gt=0, nullable=True),
        "help": "CPUs of a verifier trial; default from the task: 2 for SWE-bench-format "
                "image tasks, 1 for bundled"})
    sandbox_retries: int = field(default=4, metadata={"bounds": Int(ge=1),
        "help": "health checks of the sandbox service before a clean stop (before each round, "
                "and after a round with infra errors)"})
    sandbox_retry_backoff_s: float = field(default=2.0, metadata={"bounds": Float(ge=0),
        "help": "seconds before the 2nd health check; doubles each time"})
    bash_timeout_s: float = field(default=30.0, metadata={"bounds": Float(gt=0),
                                                          "help": "seconds per agent bash call"})
    agent_max_file_mib: int = field(default=100, metadata={"bounds": Int(ge=1, why="MiB"),
        "help": "largest file (MiB) an agent may write: fsize ulimit in its container and "
                "the snapshot limit (GitHub refuses files over 100 MiB)"})
    agent_tree_budget_mib: int = field(default=2048, metadata={"bounds": Int(ge=1, why="MiB"),
        "help": "growth (MiB) of one rollout's working tree + snapshot store; past it the "
                "episode ends as the policy's failure (agent_disk_budget: the failure value, "
                "not excluded)"})
    tasks: str = field(default="bundled:train", metadata={
        "bounds": Source(),
        "help": "task source (bundled:train, official500, a .jsonl path, ...)"})
    max_tasks: int | None = field(default=None, metadata={"bounds": Int(ge=1, nullable=True),
                                                          "help": "use only the first N tasks"})
    max_turns: int = field(default=4, metadata={"bounds": Int(ge=1),
                                                "help": "assistant turns per rollout"})
    terminal_reward: str = field(default="resolved", metadata={
        "bounds": Choice("resolved", "utility"), "help": "resolved or utility"})
    pipeline: str = field(default="overlapped", metadata={
        "bounds": Choice("sequential", "overlapped"),
        "help": "overlapped: tool calls of the rollouts in parallel (agent_concurrency), each "
                "rollout's trials submitted when its episode ends; sequential: one rollout's "
                "tool calls after another, all trials after the last episode"})
    agent_concurrency: int = field(default=8, metadata={"bounds": Int(ge=1),
        "help": "rollouts whose tool calls run at once (overlapped pipeline)"})
    chat_template: str | None = field(default=None, metadata={
        "bounds": Choice(*TOOL_TEMPLATES, nullable=True), "help": CHAT_TEMPLATE_HELP})
    scaffold: str = field(default="ecredit", metadata={
        "bounds": Choice(*SCAFFOLDS),
        "help": "tool surface and prompt of the policy: ecredit (bash, editor, submit) or "
                "mini-swe-agent (one bash tool, its SWE-bench templates and stop signal; "
                "docs/scaffolds.md)"})
    scaffold_config: str | None = field(default=None, metadata={
        "bounds": InFile("yaml", nullable=True),
        "help": "mini-swe-agent: a config YAML of its shape (default: its shipped "
                "SWE-bench config; with the embedded policy, no --model, the compact one "
                "shipped in ecredit_trl/agent/scaffolds/configs)"})
    run_name_prefix: str = field(default="ecredit", metadata={"bounds": Text(),
                                                              "help": "runs/<prefix>-<arm>-..."})
    runs_dir: str = field(default="runs", metadata={"bounds": OutDir(),
                                                    "help": "where run directories go"})

    max_steps: int = field(default=2, metadata={
        "help": "optimizer steps of the run (a run counts steps: receipts, checkpoints and "
                "resume are in steps, so TRL's -1 'train epochs instead' is refused; default "
                "2, the embedded run's)"})

    def __post_init__(self) -> None:
        if self.selection_seed is None:  # one selection stream per run seed
            self.selection_seed = self.seed
        check_fields(self)  # every declared bound, ours and INHERITED (BoundError, one line)
        if isinstance(self.snapshot_ignore, str):
            raise ValueError(f"snapshot_ignore: expected a list of non-empty glob strings, "
                             f"got {self.snapshot_ignore!r}")
        self._resolve_endpoints()
        self.sandbox_options().validate()  # ValueError naming the field
        if self.use_vllm:
            self._require_vllm()
        if self.scaffold_config is not None and self.scaffold == "ecredit":
            raise ValueError("scaffold_config: the ecredit scaffold takes no config file")
        if self.use_vllm and self.vllm_mode == "server":  # every rank: a connect, no request
            require_listening(self.vllm_server_base_url, self.vllm_server_host,
                              self.vllm_server_port)
        # one assistant turn per tool-calling iteration, plus the first generation
        if self.max_tool_calling_iterations is None:
            self.max_tool_calling_iterations = self.max_turns - 1
        check_combinations(self)  # before TRL's own checks divide by num_generations
        super().__post_init__()

    def _require_vllm(self) -> None:
        """``use_vllm`` refused at parse time, in one line, where this host or install cannot
        give it (:func:`ecredit_trl.policy.vllm_checks.check_vllm_config`)."""
        check_vllm_config(self)

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


# -- bounds of the inherited fields, and of field combinations (design page, "Bad input") ----
# Our own fields declare their bounds beside themselves (``metadata={"bounds": ...}``); the
# inherited ones a user can set are declared in INHERITED, one line per field. Values that are
# legal upstream but meaningless here are refused with the reason, never reinterpreted:
# ``max_steps <= 0`` ("train epochs instead") because a run counts steps (receipts,
# checkpoints, resume and schedule are in steps), ``top_p > 1``, ``temperature <= 0`` (GRPO
# samples; greedy decoding is an evaluation setting, ``eval.run --temperature 0``). vLLM fields
# are not listed (their checks sit with the vLLM generation settings).
_SEED = "numpy and torch seeds are 32-bit"
_RATIO = "a value < 1 is a fraction of the run's steps (transformers)"

INHERITED = {
    # sampling (TRL's generation settings)
    "temperature": Float(gt=0, why="GRPO samples; logits are divided by it"),
    "top_p": Float(gt=0, le=1, why="a probability mass"),
    "top_k": Int(ge=0, why="0 disables top-k"),
    "min_p": Float(ge=0, le=1, nullable=True, why="a probability"),
    "repetition_penalty": Float(gt=0, why="logits are divided or multiplied by it"),
    # optimisation
    "learning_rate": Float(ge=0, why="a negative rate ascends the loss"),
    "weight_decay": Float(ge=0),
    "warmup_steps": Float(ge=0, why=_RATIO),
    "max_grad_norm": Float(ge=0, why="0 turns clipping off"),
    "adam_beta1": Float(ge=0, lt=1),
    "adam_beta2": Float(ge=0, lt=1),
    "adam_epsilon": Float(gt=0),
    "beta": Float(ge=0, why="KL coefficient"),
    "epsilon": Float(ge=0, why="clip range"),
    "epsilon_high": Float(ge=0, nullable=True, why="upper clip range"),
    "num_iterations": Int(ge=1),
    "seed": Int(ge=0, le=2**32 - 1, why=_SEED),
    # lengths, steps and batch sizes
    "max_completion_length": Int(ge=1, why="tokens of the whole episode, tool results included"),
    "max_steps": Int(ge=1, why="a run counts steps (receipts, checkpoints, resume); "
                               "transformers' <= 0 'train epochs instead' is refused"),
    "num_train_epochs": Float(gt=0, why="unused: max_steps ends a run"),
    "per_device_train_batch_size": Int(ge=1),
    "per_device_eval_batch_size": Int(ge=1),
    "gradient_accumulation_steps": Int(ge=1),
    "num_generations": Int(ge=2, why="a GRPO group needs two completions to compare"),
    "num_generations_eval": Int(ge=1, nullable=True),
    "steps_per_generation": Int(ge=1, nullable=True),
    "generation_batch_size": Int(ge=1, nullable=True),
    "max_tool_calling_iterations": Int(ge=0, nullable=True, why="default max_turns - 1"),
    "dataloader_num_workers": Int(ge=0),
    # save / eval / logging cadence
    "save_steps": Float(gt=0, why=_RATIO),
    "eval_steps": Float(gt=0, nullable=True, why=_RATIO),
    "logging_steps": Float(gt=0, why=_RATIO),
    "save_total_limit": Int(ge=1, nullable=True, why="checkpoints kept; None keeps all"),
    "save_strategy": Choice("no", "steps", "epoch", "best"),
    "logging_strategy": Choice("no", "steps", "epoch"),
    "eval_strategy": Choice("no", "steps", "epoch"),
    # paths and names
    "output_dir": OutDir(nullable=True, why="default: runs_dir/<run name>"),
    "run_name": Text(nullable=True),
}
"""GRPOConfig / TrainingArguments field -> its bound (one line each; a field left out passes
through to TRL unchecked, as upstream)."""

#: Tokens below which ``max_completion_length`` cannot hold one assistant turn: the shortest
#: complete turn is a ``submit`` call in TRL's tool-call format
#: (``<tool_call>{"name": "submit", "arguments": {}}</tool_call>``, 57 characters), which
#: takes more than 16 tokens at the 3-4 characters per token of BPE tokenizers on such text.
MIN_TURN_TOKENS = 16

#: Fields that fix the data order and the groups of a run: a resume must keep them.
SIZE_FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
               "steps_per_generation", "generation_batch_size")


register(ECreditConfig, INHERITED)  # the bounds of the fields TRL / transformers declare


def _world_size() -> int:
    """Processes of this launch, read as TRL's ``__post_init__`` will see them
    (``WORLD_SIZE``, set by accelerate and torchrun; 1 without a launcher)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def check_combinations(cfg) -> None:
    """Checks across fields, before TRL's ``__post_init__`` divides by any of them.

    * the generation batch (``per_device_train_batch_size`` x processes x
      ``steps_per_generation``, which defaults to ``gradient_accumulation_steps``; or
      ``generation_batch_size``) must be a multiple of ``num_generations`` (TRL's rule: a
      batch holds whole groups);
    * ``max_completion_length`` >= :data:`MIN_TURN_TOKENS`.

    Raises: BoundError, one line naming the fields, their values and the rule.
    """
    world = _world_size()
    g = cfg.num_generations
    if cfg.generation_batch_size is not None:
        total, how = cfg.generation_batch_size, f"generation_batch_size {cfg.generation_batch_size}"
    else:
        spg = cfg.steps_per_generation or cfg.gradient_accumulation_steps
        src = "steps_per_generation" if cfg.steps_per_generation else "gradient_accumulation_steps"
        total = cfg.per_device_train_batch_size * world * spg
        how = (f"per_device_train_batch_size {cfg.per_device_train_batch_size} x processes "
               f"{world} x {src} {spg} = {total}")
    if g and total % g:
        raise BoundError(f"--num_generations: {g} does not divide the generation batch ({how}): "
                         "each batch must hold whole groups of num_generations completions "
                         "(TRL's rule); choose sizes whose product is a multiple of it")
    if cfg.max_completion_length is not None and cfg.max_completion_length < MIN_TURN_TOKENS:
        raise BoundError(f"--max_completion_length: {cfg.max_completion_length} is shorter than "
                         f"one turn's minimum ({MIN_TURN_TOKENS} tokens: the shortest complete "
                         "turn, a submit tool call); it budgets the whole episode")


def check_resume_sizes(recorded: dict, cfg, allowed: list[str]) -> None:
    """A resume must keep the sizes that fix the data order and the groups
    (:data:`SIZE_FIELDS`, and the world size) unless each change is accepted with
    ``--allow-changed FIELD`` (``allowed``, earlier resumes' acceptances included).

    Args:
        recorded: the run's manifest (``config.ecredit`` and ``world_size``).

    Raises: BoundError, one line listing each changed size (recorded -> now).
    """
    old = (recorded.get("config") or {}).get("ecredit") or {}
    now = {name: getattr(cfg, name) for name in SIZE_FIELDS} | {"world_size": cfg.world_size}
    old = {name: old.get(name) for name in SIZE_FIELDS} | {
        "world_size": recorded.get("world_size")}
    changed = [f"{k} {old[k]} -> {now[k]}" for k in now
               if old[k] is not None and old[k] != now[k] and k not in allowed]
    if changed:
        raise BoundError("resume refused: changed sizes (" + ", ".join(changed) + ") would change "
                         "the run's data order and groups; pass the original values, or accept "
                         "each with --allow-changed FIELD --reason TEXT")


@declared
@dataclass
class ModelArguments:
    """Which policy to train and how (LoRA through peft). Bounds beside each field, checked
    at construction (BoundError naming the flag)."""

    model: str | None = field(default=None, metadata={
        "bounds": ModelRef(nullable=True),
        "help": "causal LM path or hub id; default: the embedded tiny policy (built locally)"})
    lora_r: int = field(default=0, metadata={"bounds": Int(ge=0, why="0 trains all weights"),
                                             "help": "LoRA rank; 0 trains all weights"})
    lora_alpha: int | None = field(default=None, metadata={
        "bounds": Int(gt=0, nullable=True), "help": "LoRA alpha (default 2 x r)"})
    lora_dropout: float = field(default=0.0, metadata={
        "bounds": Float(ge=0, lt=1, why="a probability"), "help": "LoRA dropout"})
    lora_target_modules: list[str] = field(default_factory=lambda: ["auto"], metadata={
        "bounds": Text(),
        "help": "modules LoRA adapts: auto (the architecture's default, "
                "ecredit_trl.policy.lora_defaults), all-linear, or peft module names"})
    warmstart_steps: int | None = field(default=None, metadata={
        "bounds": Int(ge=0, nullable=True),
        "help": "SFT steps of the embedded policy's warm start (default: its recipe)"})
    config: str | None = field(default=None, metadata={
        "bounds": InFile("yaml", nullable=True), "help": "YAML file of config fields"})

    def __post_init__(self) -> None:
        check_fields(self)


@declared
@dataclass
class RunArguments:
    """Session control (never part of the run's config or its hashes)."""

    resume_from: str | None = field(default=None, metadata={
        "bounds": Text(nullable=True, why="a checkpoint inside a run directory: checked first "
                                          "by the resume, naming the missing manifest"),
        "help": "checkpoint directory (runs/<name>/checkpoint-<step>) to resume exactly"})
    allow_changed: list[str] = field(default_factory=list, metadata={
        "bounds": Text(),
        "help": "bound field allowed to differ from the manifest on resume (repeatable, or "
                "comma-separated: a config field, model.<field>, tasks, code, world_size)"})
    reason: str | None = field(default=None, metadata={
        "bounds": Text(nullable=True),
        "help": "why the --allow-changed fields changed (recorded in the resume receipt)"})

    def __post_init__(self) -> None:
        check_fields(self)
