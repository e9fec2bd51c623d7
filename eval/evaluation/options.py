"""The options of one evaluation (``python -m eval.run``) as a dataclass, like TRL's configs.

:class:`EvalOptions` holds every setting :func:`eval.run.evaluate` reads; each field carries its
default and a ``metadata={"help": ...}``, and the ``python -m eval.run`` flags are generated
from the fields (:func:`add_option_args`: ``--max-new-tokens`` for ``max_new_tokens``, the
field's type, default and help), so the Python API and the CLI cannot drift apart. Invalid
values are refused at construction (:meth:`EvalOptions.__post_init__`), naming the flag of
the field, before anything is loaded or written.

What an evaluation is run *with* rather than *what* it evaluates stays outside: the runtime
(a name or a runtime object), the log callback and the rollout interpreter are
:func:`eval.run.evaluate`'s keyword arguments (see the design page, "Evaluation").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from eval.evaluation.slots import EvalInputError
from eval.evaluation.templatecheck import CHAT_TEMPLATE_HELP
from sandbox.bounds import Bound, Float, InFile, Int, ModelRef, OutDir, Source, Text

__all__ = ["OVERRIDE_FIELDS", "EvalOptions", "add_option_args", "flag_of", "option_names"]

#: Generation settings passed to the rollout subprocess; None means "the run's default". The
#: given ones are the binding's ``overrides`` (:func:`eval.evaluation.binding.run_binding`).
OVERRIDE_FIELDS = ("max_turns", "max_new_tokens", "temperature", "chat_template", "scaffold",
                   "scaffold_config")

#: ``--scaffold`` names (the rollout subprocess's ``ecredit_trl.agent.scaffolds.SCAFFOLDS``;
#: ``eval`` does not import the trainer's packages).
SCAFFOLD_NAMES = ("ecredit", "mini-swe-agent")

SPLIT_HELP = ("official500 | holdout100 | bundled[:train|:holdout] | bundled-image[:train|:holdout] "
              "(the image-held stand-ins: python -m eval.build_tasks --image-tasks) | "
              "procedural[:train|:heldout] (the procedural world) | "
              "procedural-localized[:train|:heldout] (its statements quote the broken line) | "
              "swegym:PATH | swesmith:PATH | FILE (eval.tasks.splits.load_tasks)")
TIMEOUT_HELP = ("per-trial limit, seconds (default: from the task, eval.tasks.trialspec."
                "trial_limits: 1800 for SWE-bench-format image tasks, 600 for bundled)")
RUN_DEFAULT = "(default: the training run's config, else the rollout default)"
REUSE_HELP = ("opt-in verdict store shared across evaluations: a slot repeating a clean (task, "
              "artifact) trial stored there is graded from it (default: every slot runs its "
              "own trial)")


def _opt(default, help_text: str, *, bounds: Bound | None = None, **cli):
    """A field with ``default`` and its ``metadata``: ``help``, its ``bounds`` (the flag's
    argparse type, :mod:`sandbox.bounds`; a bool switch has none) and the argparse extras in
    ``cli`` (``metavar``, ``aliases``)."""
    return field(default=default, metadata={"help": help_text, "bounds": bounds, **cli})


@dataclass
class EvalOptions:
    """What to evaluate and how (the fields are the ``python -m eval.run`` flags).

    Attributes:
        model: model dir or training run dir (:func:`eval.evaluation.modelref.resolve_model`);
            may be None with ``rollouts`` (then the rows' ``model_sha256`` names the policy).
        split: task source of :func:`eval.tasks.splits.load_tasks`.
        n: rollouts per task (>= 1).
        out: output folder (created; resumable).
        concurrency: verifier trials at once (>= 1).
        seed: eval sampling seed (passed to the rollout subprocess).
        rollouts: read rollouts from this JSONL file instead of generating them.
        admission: admission manifest (:mod:`eval.controls`) to run under; refused when the
            task list or an image digest changed.
        max_turns, max_new_tokens, temperature, chat_template: rollout settings (a TRL
            template name for ``chat_template``); None means "run default"
            (:attr:`overrides`).
        timeout_s: limit of one verifier trial, seconds (None:
            :func:`eval.tasks.trialspec.trial_limits`).
        max_retries: infra retries per trial (counted).
        device: torch device of the rollout subprocess.
        batch_size, agent_concurrency, use_vllm: the rollout subprocess's flags of the same
            name (episodes in flight, tool-call threads, vLLM generation).
        reuse_verdicts: opt-in verdict store folder (:mod:`eval.evaluation.verdicts`).
        scaffold, scaffold_config: the policy's tool surface and prompt (None: a training
            run's own scaffold and config, else ``ecredit``)
            and mini-swe-agent's config file (design page, "Generation engines and scaffolds"); part of the binding.

    Raises: EvalInputError (a ValueError) from ``__post_init__``, naming the flag: a missing
        ``split`` / ``n`` / ``out``, a count < 1, neither ``model`` nor ``rollouts``.
    """

    model: str | None = _opt(None, "model dir or training run dir (runs/<name>)", bounds=ModelRef(why="or a training run dir"))
    split: str | None = _opt(None, SPLIT_HELP, bounds=Source())
    n: int | None = _opt(None, "rollouts per task", bounds=Int(ge=1))
    out: str | Path | None = _opt(None, "output folder (resumable)", bounds=OutDir())
    concurrency: int = _opt(2, "verifier trials at once", bounds=Int(ge=1))
    seed: int = _opt(0, "eval sampling seed", bounds=Int(ge=0, le=2**32 - 1, why="32-bit seeds"))
    rollouts: str | Path | None = _opt(None, "read rollouts from this JSONL instead of generating", bounds=InFile("jsonl"))
    admission: str | Path | None = _opt(None, "admission manifest (python -m eval.controls)", bounds=InFile("json"))
    max_turns: int | None = _opt(None, "most assistant turns per episode " + RUN_DEFAULT, bounds=Int(ge=1))
    max_new_tokens: int | None = _opt(None, "completion budget of a whole episode, tokens "
                                            + RUN_DEFAULT, bounds=Int(ge=1))
    temperature: float | None = _opt(None, "sampling temperature (0: greedy) " + RUN_DEFAULT, bounds=Float(ge=0, why="0 = greedy decoding"))
    timeout_s: float | None = _opt(None, TIMEOUT_HELP, bounds=Float(gt=0, why="seconds"))
    max_retries: int = _opt(1, "infra retries per trial", bounds=Int(ge=0))
    device: str | None = _opt(None, "torch device of the rollout subprocess", bounds=Text())
    batch_size: int = _opt(8, "episodes in flight, one batched generate call per round "
                              "(1: one at a time)", bounds=Int(ge=1))
    agent_concurrency: int = _opt(4, "threads running the episodes' tool calls", bounds=Int(ge=1))
    use_vllm: bool = _opt(False, "generate through vLLM (colocated; needs vllm installed)")
    chat_template: str | None = _opt(None, CHAT_TEMPLATE_HELP, metavar="NAME",
                                     aliases=("--chat_template",), bounds=Text())
    reuse_verdicts: str | Path | None = _opt(None, REUSE_HELP, metavar="DIR", bounds=OutDir())
    scaffold: str | None = _opt(None, "tool surface and prompt: ecredit or mini-swe-agent "
                                      "(docs/scaffolds.md; default: a training run's own, "
                                      "else ecredit)",
                                bounds=Text(nullable=True))  # the name is checked by the rollouts CLI
    scaffold_config: str | None = _opt(None, "mini-swe-agent: its config YAML (default: a "
                                             "training run's own, else its shipped SWE-bench "
                                             "config)", metavar="FILE",
                                       aliases=("--scaffold_config",),
                                       bounds=InFile("yaml", nullable=True))

    def __post_init__(self) -> None:
        missing = [flag_of(k) for k in ("split", "n", "out") if getattr(self, k) is None]
        if missing:
            raise EvalInputError(f"missing {', '.join(missing)} (or use --replay RESULTS)")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise EvalInputError(f"--n: must be an int >= 1, got {self.n!r}")
        for name in ("concurrency", "batch_size", "agent_concurrency"):
            if getattr(self, name) < 1:
                raise EvalInputError(f"{flag_of(name)}: must be >= 1, got {getattr(self, name)}")
        if self.scaffold is not None and self.scaffold not in SCAFFOLD_NAMES:
            raise EvalInputError(f"--scaffold: expected one of {', '.join(SCAFFOLD_NAMES)}, "
                                 f"got {self.scaffold!r}")
        if self.model is None and self.rollouts is None:
            raise EvalInputError("--model is required unless --rollouts is given")

    @property
    def overrides(self) -> dict:
        """The generation settings given (name → value, :data:`OVERRIDE_FIELDS` that are not
        None): the rollout subprocess's flags and part of the binding; ``engine: "vllm"``
        with ``use_vllm`` (vLLM samples other tokens from the same seeds, so its rows never
        resume a transformers run's folder, nor the other way round)."""
        out = {k: getattr(self, k) for k in OVERRIDE_FIELDS if getattr(self, k) is not None}
        if self.use_vllm and self.rollouts is None:
            out["engine"] = "vllm"
        return out

    @classmethod
    def from_args(cls, args) -> EvalOptions:
        """The options from an argparse namespace built by :func:`add_option_args`."""
        return cls(**{name: getattr(args, name) for name in option_names()})


def option_names() -> list[str]:
    """The field names of :class:`EvalOptions`, in flag order."""
    return [f.name for f in dataclasses.fields(EvalOptions)]


def flag_of(name: str) -> str:
    """The CLI flag of field ``name`` (``max_new_tokens`` → ``--max-new-tokens``)."""
    return "--" + name.replace("_", "-")


def add_option_args(ap, names) -> None:
    """Add the flags of the fields ``names`` (in that order) to an argparse parser: one
    ``--dashed-name`` per field (plus its ``aliases``), its default, help and ``metavar``; a
    bool field is a ``store_true`` switch, others take the field's ``bounds`` as their type
    (:mod:`sandbox.bounds`: converted, checked, refused naming the flag)."""
    fields = {f.name: f for f in dataclasses.fields(EvalOptions)}
    for name in names:
        f = fields[name]
        meta = f.metadata
        kw = {"dest": name, "default": f.default, "help": meta["help"]}
        if f.type == "bool":
            kw["action"] = "store_true"
        else:
            kw["type"] = meta["bounds"]
            if "metavar" in meta:
                kw["metavar"] = meta["metavar"]
        ap.add_argument(flag_of(name), *meta.get("aliases", ()), **kw)
