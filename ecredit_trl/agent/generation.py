"""The policy as the rollout loop sees it (:mod:`ecredit_trl.agent.rollouts`): episode and
sampling settings, the per-rollout sampling seed, and a loaded model + tokenizer that renders
prompts, samples one assistant turn and parses its tool calls the way ``GRPOTrainer`` does
(TRL's ``add_response_schema`` / ``parse_response`` / tool-suffix construction).
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ecredit_trl.agent.prompts import policy_tools
from eval.evaluation.modelref import resolve_model
from eval.evaluation.templatecheck import resolve_template_option

__all__ = ["GenerationSettings", "Policy", "RowSampler", "TRL_SAMPLING_DEFAULTS", "cpu_threads",
           "load_rollout_policy", "rollout_seed", "torch_threads"]

#: GRPOConfig's sampling defaults (TRL 1.16), used when a bare model dir is given.
TRL_SAMPLING_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": None,
                         "repetition_penalty": 1.0}


@dataclass
class GenerationSettings:
    """Episode and sampling settings of a rollout.

    Attributes:
        max_turns: assistant turns per episode (>= 1); TRL's ``max_tool_calling_iterations``
            is ``max_turns - 1``.
        max_new_tokens: completion budget of the whole episode in tokens (TRL's
            ``max_completion_length``), generated and tool-result tokens together.
        temperature, top_p, top_k, min_p, repetition_penalty: sampling (GRPOConfig meaning;
            ``top_k=0`` disables top-k). ``temperature=0`` means greedy decoding (argmax;
            top-p/top-k/min-p unused, the repetition penalty still applies) - evaluation only,
            GRPO training samples.
        bash_timeout_s: wall-clock limit of one ``bash`` tool call, seconds.
    """

    max_turns: int = 4
    max_new_tokens: int = 640
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    bash_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_turns, int) or self.max_turns < 1:
            raise ValueError(f"max_turns: must be an int >= 1, got {self.max_turns!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: must be an int >= 1, got {self.max_new_tokens!r}")
        if isinstance(self.temperature, bool) or not self.temperature >= 0:
            raise ValueError(f"temperature: must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p!r}")
        if self.bash_timeout_s <= 0:
            raise ValueError(f"bash_timeout_s: must be > 0, got {self.bash_timeout_s!r}")

    @property
    def greedy(self) -> bool:
        """True for ``temperature == 0`` (argmax decoding)."""
        return self.temperature == 0

    def to_json(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def rollout_seed(seed: int, task_id: str, rollout_index: int) -> int:
    """The sampling seed of one rollout: first 8 bytes of ``sha256(f"{seed}:{task_id}:{i}")``
    as an int below 2**63 (independent of the order rollouts run in)."""
    d = hashlib.sha256(f"{seed}:{task_id}:{rollout_index}".encode()).digest()
    return int.from_bytes(d[:8], "big") & ((1 << 63) - 1)


class Policy:
    """A causal LM + tokenizer ready for TRL-style multi-turn tool calling.

    Attributes:
        model: the LM in eval mode (peft adapters merged).
        tokenizer: with a response template/schema (TRL's ``add_response_schema``).
        chat_template: ``None`` (the tokenizer's own) or TRL's training template, chosen as
            ``GRPOTrainer`` does (``is_chat_template_prefix_preserving``).
        tools: tool schemas in TRL's order (:func:`ecredit_trl.agent.prompts.policy_tools`).
        eos_token_ids: token ids that end an assistant turn.
        max_model_len: the model's context (``max_position_embeddings``), tokens.
        ref: the :class:`eval.evaluation.modelref.ModelRef` it came from.
        cache_implementation: ``None`` (transformers' dynamic KV cache, the default) or
            ``"static"``: a preallocated cache, which ``generate`` compiles on CUDA
            (``benchmarks/generation_speed.py`` measures both).
    """

    def __init__(self, model, tokenizer, ref) -> None:
        from trl.chat_template_utils import (
            add_response_schema,
            get_training_chat_template,
            is_chat_template_prefix_preserving,
        )

        self.model = model
        self.tokenizer = tokenizer
        self.ref = ref
        self.tools = policy_tools()
        self.scaffold = None  # the ecredit scaffold; use_scaffold() sets another
        if getattr(tokenizer, "response_template", None) is None and getattr(
                tokenizer, "response_schema", None) is None:
            try:
                add_response_schema(tokenizer)
            except ValueError as exc:
                raise ValueError(f"model {ref.model_dir}: tokenizer chat template: {exc}") from None
        self.chat_template = (None if is_chat_template_prefix_preserving(tokenizer)
                              else get_training_chat_template(tokenizer))
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_token_ids = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in self.eos_token_ids:
            self.eos_token_ids.append(tokenizer.eos_token_id)
        self.max_model_len = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.device = next(model.parameters()).device
        self.cache_implementation: str | None = None

    def use_scaffold(self, scaffold) -> None:
        """Roll out with ``scaffold`` (:mod:`ecredit_trl.agent.scaffolds`): its tool schemas
        (rendered and parsed) and, in :func:`ecredit_trl.agent.episode.start_episode`, its
        prompt and tool surface."""
        self.scaffold = scaffold
        self.tools = scaffold.tools()

    def render_prompt(self, messages: list[dict]) -> list[int]:
        """Token ids of ``messages`` with the tool schemas and the generation prompt (as
        ``GRPOTrainer._tokenize_prompts`` renders an ``environment_factory`` prompt)."""
        out = self.tokenizer.apply_chat_template(
            conversation=[messages], tools=self.tools or None, chat_template=self.chat_template,
            add_generation_prompt=True, tokenize=True, return_dict=True)
        return list(out["input_ids"][0])

    def tool_suffix_ids(self, tool_messages: list[dict]) -> list[int]:
        """Token ids appended after an assistant turn for ``tool_messages`` (tool results +
        the next generation prompt): ``GRPOTrainer._get_tool_suffix_ids``'s construction.

        Raises: ValueError when the template does not render the dummy prefix as a prefix.
        """
        dummy_calls = [{"type": "function",
                        "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
        dummy = [{"role": "user", "content": "dummy"},
                 {"role": "assistant", "content": "", "tool_calls": dummy_calls}]
        kw = dict(tokenize=True, chat_template=self.chat_template, return_dict=False)
        prefix = list(self.tokenizer.apply_chat_template(dummy, add_generation_prompt=False, **kw))
        full = list(self.tokenizer.apply_chat_template(dummy + tool_messages,
                                                       add_generation_prompt=True, **kw))
        eos_pos = [i for i, t in enumerate(prefix) if t == self.tokenizer.eos_token_id]
        if eos_pos:
            prefix = prefix[: eos_pos[-1] + 1]
        if full[: len(prefix)] != prefix:
            raise ValueError("chat template: the EOS-trimmed prefix ids are not a prefix of the "
                             "full ids (template not prefix-preserving)")
        return full[len(prefix):]

    def parse(self, ids: list[int], prefix: list[int]) -> dict:
        """TRL's ``parse_response`` of one assistant turn (falls back to plain text)."""
        from trl.chat_template_utils import parse_response

        return parse_response(self.tokenizer, ids, prefix=prefix, tools=self.tools)

    def generate(self, input_ids: list[int], max_new_tokens: int, settings: GenerationSettings,
                 seed: int | None) -> list[int]:
        """Sample one assistant turn (argmax when ``settings.greedy``); returns the new ids up
        to and including the first EOS (GRPOTrainer keeps exactly those). ``seed`` reseeds torch
        first (None: continue)."""
        import torch
        from transformers import GenerationConfig

        if seed is not None:
            torch.manual_seed(seed)
        sampling = {} if settings.greedy else dict(
            temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
            min_p=settings.min_p)
        gc = GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=not settings.greedy,
            pad_token_id=self.pad_token_id, bos_token_id=self.tokenizer.bos_token_id,
            eos_token_id=self.eos_token_ids, repetition_penalty=settings.repetition_penalty,
            **self._cache_options(), **sampling)
        ids = torch.tensor([input_ids], dtype=torch.long, device=self.device)
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      generation_config=gc)
        return self._until_eos(out[0, len(input_ids):].tolist())

    def _cache_options(self) -> dict:
        """``GenerationConfig`` cache keys: compiled only with a static cache on CUDA (eager
        otherwise: compiling a dynamic cache recompiles as it grows, and on CPU costs more
        than it saves)."""
        static = self.cache_implementation == "static"
        return {"cache_implementation": self.cache_implementation,
                "disable_compile": not (static and self.device.type == "cuda")}

    @property
    def pad_token_id(self) -> int:
        """The tokenizer's pad id, else the first EOS id (padding is masked out)."""
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.eos_token_ids[0]

    def _until_eos(self, new: list[int]) -> list[int]:
        for i, t in enumerate(new):
            if t in self.eos_token_ids:
                return new[: i + 1]
        return new

    def row_sampler(self, seed: int) -> RowSampler:
        """The sampling state of one episode in a batch (see :class:`RowSampler`)."""
        return RowSampler(seed, self.device)

    def generate_batch(self, contexts: list[list[int]], limits: list[int],
                       settings: GenerationSettings, samplers: list[RowSampler]) -> list[list[int]]:
        """One ``model.generate`` call over several episodes' next assistant turns.

        Args:
            contexts: B token-id lists (prompt + completion so far), any lengths; left-padded
                with :attr:`pad_token_id` into a (B, max_len) batch with an attention mask.
            limits: B per-row token limits (>= 1): row i stops after ``limits[i]`` new tokens
                or its first EOS, whichever comes first (the others go on).
            samplers: B :class:`RowSampler` (ignored when ``settings.greedy``): row i's draws
                come from its own ``torch.Generator``, so its tokens do not depend on the
                other rows, and equal :meth:`generate`'s with ``seed = samplers[i].seed`` at
                the episode's first turn (the same draws from the same probabilities; a
                padded batch can round the logits differently in the last bits).

        Returns: B lists of new ids, each up to and including its first EOS (as
            :meth:`generate`).

        Raises: ValueError when the three lists differ in length or a limit is < 1.
        """
        import torch
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        if not (len(contexts) == len(limits) == len(samplers)) or not contexts:
            raise ValueError(f"generate_batch: contexts/limits/samplers lengths "
                             f"{len(contexts)}/{len(limits)}/{len(samplers)} must be equal, > 0")
        if min(limits) < 1:
            raise ValueError(f"limits: every limit must be >= 1, got {min(limits)}")
        width = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), width), dtype=torch.long)
        for i, c in enumerate(contexts):
            ids[i, width - len(c):] = torch.tensor(c, dtype=torch.long)
            mask[i, width - len(c):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        limit_t = torch.tensor(limits, device=self.device)
        processors = LogitsProcessorList()
        if not settings.greedy:  # min_p None: the model's default, as generate() fills it
            min_p = (settings.min_p if settings.min_p is not None
                     else getattr(self.model.generation_config, "min_p", None))
            processors.append(_RowSampling(settings, samplers, width, limit_t, self.eos_token_ids,
                                           min_p=min_p))
        gc = GenerationConfig(
            max_new_tokens=max(limits), do_sample=False, pad_token_id=self.pad_token_id,
            bos_token_id=self.tokenizer.bos_token_id, eos_token_id=self.eos_token_ids,
            repetition_penalty=settings.repetition_penalty, **self._cache_options())
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, generation_config=gc,
                logits_processor=processors,
                stopping_criteria=StoppingCriteriaList([_RowLimits(width, limit_t)]))
        return [self._until_eos(out[i, width:width + limits[i]].tolist())
                for i in range(len(contexts))]


class RowSampler:
    """Sampling state of one episode in a batched generation: its own ``torch.Generator``
    seeded once with the rollout's sampling seed and continued across its turns - the
    per-row counterpart of :meth:`Policy.generate`'s ``torch.manual_seed(seed)`` at the first
    turn followed by the global generator. The generator is made on first use (on ``device``).
    """

    def __init__(self, seed: int, device) -> None:
        self.seed = seed
        self.device = device
        self._gen = None

    @property
    def generator(self):
        import torch

        if self._gen is None:
            self._gen = torch.Generator(device=self.device)
            self._gen.manual_seed(self.seed)
        return self._gen


class _RowLimits:
    """Stopping criterion: row i is done once it holds ``limits[i]`` new tokens."""

    def __init__(self, start: int, limits) -> None:
        self.start, self.limits = start, limits

    def __call__(self, input_ids, scores, **kwargs):
        return (input_ids.shape[1] - self.start) >= self.limits


def _warpers(settings: GenerationSettings, min_p: float | None):
    """The warpers ``generate(do_sample=True)`` applies, in its order (temperature, top-k,
    top-p, min-p; transformers ``_get_logits_processor``)."""
    from transformers import (
        LogitsProcessorList,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    w = LogitsProcessorList()
    if settings.temperature != 1.0:
        w.append(TemperatureLogitsWarper(settings.temperature))
    if settings.top_k:
        w.append(TopKLogitsWarper(top_k=settings.top_k, min_tokens_to_keep=1))
    if settings.top_p < 1.0:
        w.append(TopPLogitsWarper(top_p=settings.top_p, min_tokens_to_keep=1))
    if min_p is not None:
        w.append(MinPLogitsWarper(min_p=min_p, min_tokens_to_keep=1))
    return w


class _RowSampling:
    """Logits processor that samples each unfinished row with its own generator.

    The warpers of ``generate(do_sample=True)`` in its order (temperature, top-k, top-p,
    min-p; transformers ``_get_logits_processor``), softmax, then for each unfinished row the
    draw ``torch.multinomial(probs[i:i+1], 1, generator=row's)`` makes - written out:
    ``argmax(probs[i] / q)`` with ``q`` one ``exponential_(1)`` fill of the row's generator
    over the vocabulary (``multinomial``'s one-sample path, aten ``Distributions.cpp``), so the
    tokens and every generator's state equal the per-row ``multinomial`` calls, while the
    division and the argmax run once for the batch and no per-row host check runs (one host
    read per step: which rows are finished, together with the validity check ``multinomial``
    makes). Returns scores that are 0 at the drawn token and -inf elsewhere, so greedy
    selection (``do_sample=False``) takes it. Rows already finished (EOS or their limit) draw
    nothing, as a one-row ``generate`` would have stopped; their token is replaced by padding.

    Raises: RuntimeError (as ``multinomial``) when an unfinished row's probabilities are not
    finite (e.g. every logit ``-inf``).
    """

    def __init__(self, settings: GenerationSettings, samplers: list[RowSampler], start: int,
                 limits, eos_ids: list[int], min_p: float | None = None) -> None:
        import torch

        w = _warpers(settings, min_p)
        self.warpers, self.start, self.limits = w, start, limits
        self.generators = [s.generator for s in samplers]
        self.eos = torch.tensor(eos_ids, device=limits.device)
        self.done = torch.zeros(len(samplers), dtype=torch.bool, device=limits.device)

    def __call__(self, input_ids, scores):
        import torch

        n = input_ids.shape[1] - self.start  # tokens generated so far, every row alike
        if n:  # a row is done once its last token is an EOS (padding after that keeps it so)
            self.done |= torch.isin(input_ids[:, -1], self.eos)
        done = self.done | (n >= self.limits)
        probs = torch.softmax(self.warpers(input_ids, scores), dim=-1)
        bad = ~(probs.sum(dim=-1) > 0) & ~done  # NaN rows (softmax of all -inf or of a NaN)
        flags = torch.stack([done, bad]).tolist()  # the step's one host read
        if any(flags[1]):
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        q = torch.empty_like(probs)
        for i, g in enumerate(self.generators):
            if flags[0][i]:
                q[i].fill_(1.0)  # a finished row draws nothing; its token becomes padding
            else:
                q[i].exponential_(1, generator=g)
        tok = torch.div(probs, q, out=q).argmax(dim=-1, keepdim=True)
        return torch.full_like(scores, float("-inf")).scatter_(1, tok, 0.0)


def busy_cpus(window_s: float = 0.25) -> float | None:
    """CPUs busy during the next ``window_s`` seconds: the non-idle share of the machine's
    CPU time in ``/proc/stat`` (idle and iowait are idle) times ``os.cpu_count()``; None
    where ``/proc/stat`` cannot be read (not Linux) or no time passed.

    Unlike the load average (a one-minute moving average), it says what runs *now*: right
    after a task build the load average still reads about 2 on an idle 2-core machine.
    """
    def sample() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
        return sum(fields), fields[3] + fields[4]

    try:
        total0, idle0 = sample()
        time.sleep(window_s)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (1.0 - (idle1 - idle0) / (total1 - total0)) * (os.cpu_count() or 1)


def torch_threads(env_var: str = "ECREDIT_WARMSTART_THREADS", *, now: bool = False) -> int:
    """Intra-op threads for training: all CPUs on an idle machine, fewer when busy.

    ``$<env_var>`` (default ``ECREDIT_WARMSTART_THREADS``) overrides. Otherwise ``cpu_count -
    round(busy)`` (at least 1), with ``busy`` the CPUs in use: with ``now``, what runs at this
    moment (:func:`busy_cpus`, for a job that starts alone, like a warm start: on an idle
    2-core machine two threads train the embedded policy's SFT step in 0.49 s where one takes
    0.86 s, to the same bits), else (or where it cannot be read) the 1-minute load
    average: on the 2-core reference machine two torch threads competing with other work
    ran a step 5x slower than one thread (0.42 s vs 2-3 s for batch 4 x 500 tokens).
    """
    env = os.environ.get(env_var)
    if env:
        return max(1, int(env))
    cpus = os.cpu_count() or 1
    busy = busy_cpus() if now else None
    if busy is None:
        try:
            busy = os.getloadavg()[0]
        except OSError:
            busy = 0.0
    return max(1, min(cpus, cpus - math.ceil(busy - 0.5)))


def cpu_threads() -> int:
    """Intra-op torch threads for CPU generation: ``$ECREDIT_ROLLOUT_THREADS``, else
    ``cpu_count - round(1-minute load)`` (at least 1). On the 2-core reference machine, two
    threads competing with other work generated ~3 tokens/s, one thread ~350 tokens/s."""
    return torch_threads("ECREDIT_ROLLOUT_THREADS")


def load_rollout_policy(model: str | Path, *, device: str | None = None,
                        dtype: str = "auto", chat_template: str | None = None) -> Policy:
    """Load a model dir or run dir (see :func:`eval.evaluation.modelref.resolve_model`) for rollouts.

    A peft adapter (``adapter_config.json``) is loaded on its base model with
    ``peft.PeftModel.from_pretrained`` and merged. The tokenizer comes from the model dir
    (``train.py`` saves it in ``checkpoint-final``), else from the adapter's base.

    Args:
        device: ``"cpu"``, ``"cuda"``, ... (default: cuda when available).
        dtype: ``"auto"`` (float32 on CPU, bfloat16 on CUDA), ``"float32"``, ``"bfloat16"``,
            ``"float16"``.
        chat_template: TRL's template of that name replaces the tokenizer's
            (:data:`eval.evaluation.templatecheck.TOOL_TEMPLATES`); None keeps the tokenizer's own.

    Raises: FileNotFoundError / ValueError naming the path (see ``resolve_model``), ValueError
        for an unknown ``dtype`` or ``chat_template``, TemplateRefused (one line) for a
        template TRL has no tool-call parser for (before the weights are loaded).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ref = resolve_model(model)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(cpu_threads())
    if dtype == "auto":
        torch_dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    elif dtype in ("float32", "bfloat16", "float16"):
        torch_dtype = getattr(torch, dtype)
    else:
        raise ValueError(f"dtype: expected auto, float32, bfloat16 or float16, got {dtype!r}")
    tok_dir = ref.model_dir
    if ref.adapter and not (Path(ref.model_dir) / "tokenizer_config.json").is_file():
        tok_dir = ref.base_model
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    _, tokenizer.chat_template = resolve_template_option(chat_template, tokenizer.chat_template,
                                                         ref.given)
    if ref.adapter:
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(ref.base_model, dtype=torch_dtype)
        lm = PeftModel.from_pretrained(base, ref.model_dir).merge_and_unload()
    else:
        lm = AutoModelForCausalLM.from_pretrained(ref.model_dir, dtype=torch_dtype)
    # A MoE config saved with the router's auxiliary loss on (TRL's SFTTrainer turns it on and
    # saves it so) makes padded batched generation crash in the load-balancing loss, which
    # assumes unpadded rows; rollouts never use that loss.
    if getattr(lm.config, "output_router_logits", False):
        lm.config.output_router_logits = False
    lm.to(device)
    lm.eval()
    return Policy(lm, tokenizer, ref)
