"""Study configuration: load and validate ``studies/<name>.yaml``.

A study config is a YAML mapping with exactly these keys (anything else is an error that
names the key)::

    name: embedded                 # default: the YAML file's stem
    model: null                    # null = the embedded warm-started default policy
    warmstart: {harmful_fraction: 0.5}  # model: null only: warm-start recipe overrides
                                   #     (ecredit_trl.policy.warmstart.recipe_for fields; a
                                   #     positive control's harmful blocks)
    arms: [O, B, M]                # from O, B, M, E
    seeds: [0, 1]                  # every arm's seeds ...
    seeds_by_arm: {E: [0]}         # ... unless an arm has its own list (arms listed here
                                   #     but not in `arms` are added after them)
    train: {max_steps: 2, ...}     # ECreditConfig fields (and train.py's model fields:
                                   #     lora_r, lora_alpha, lora_dropout,
                                   #     lora_target_modules, warmstart_steps)
    eval: {splits: [bundled:train], n: 4, n_by_split: {holdout100: 16},
           temperature: 1.0, batch_size: 8,
           concurrency: 2, seed: 0, max_turns: null, max_new_tokens: null, runtime: podman,
           reuse_verdicts: false,  # true: evals share <out>/verdicts/ (eval.run
                                   #     --reuse-verdicts; opt-in, see eval.evaluation.verdicts)
           in_distribution: []}    # eval splits that may share ids with the training
                                   #     pool (the embedded `bundled:train`)
    bootstrap: {n_boot: 10000, seed: 0, alpha: 0.05, power: 0.8}  # power: of the MDD
    pooled_seeds: shared           # seeds-pooled differences use the seeds both arms
                                   #     share (M−E on E's seeds); `all`: every seed
    accelerate_config: null        # path of an `accelerate launch --config_file`
    sandbox: {backend: local, ray_address: auto, max_in_flight: 24, podman_url: "",
              image_registry: null}  # where verifier trials run, for every training run
                                   #     and every eval.run (docs/scale-out.md)

``arm``, ``seed``, ``output_dir`` and ``runs_dir`` are set by the study per run and may not
appear under ``train``. The resolved config (defaults filled in) is hashed with sha256 over
its canonical JSON (sorted keys); a changed hash is what ``study run`` refuses. One
exception: ``eval.reuse_verdicts: false`` (the default) is left out of the resolved config,
so studies bound before the key existed keep their hash; the same holds for the later keys
at their defaults (:data:`OMIT_AT_DEFAULT`: ``eval.in_distribution: []``,
``bootstrap.power: 0.8``, ``pooled_seeds: shared``, ``warmstart: {}``).

``sandbox`` chooses where verifier trials run (design page, "Scale-out"): ``local`` (the
default) or ``ray`` (an existing cluster at ``ray_address``; ``max_in_flight`` is the
cluster-wide cap of each unit); its keys, defaults and checks are those of
``sandbox.backend.SandboxOptions``. Every unit gets it: training runs as ``--sandbox_backend ...`` fields (a resume too:
the study's current section wins over the run's recorded one) and ``eval.run`` as
``--sandbox-backend ...`` flags. It is recorded in ``study.json`` when not at its default but
left out of the hash (:data:`UNHASHED_KEYS`): results do not depend on where a trial ran, as
a run's manifest does not bind these fields (``ecredit_trl.runs.manifest``), so a study may
move to a cluster half-way. The same fields under ``train`` are refused (one place for both
kinds of unit).

The training pool never overlaps an evaluation split unless that split is listed in
``eval.in_distribution``; ``official500`` / ``holdout100`` are evaluation-only.
That check needs the task ids, so ``study run`` makes it (:mod:`ecredit_trl.study.pool`)
before anything runs; reading a study folder never does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ecredit_trl.config import ECreditConfig, ModelArguments
from ecredit_trl.credit.arms import ARMS
from ecredit_trl.policy.warmstart import DEFAULT_RECIPE, OPTIONAL_RECIPE, recipe_for
from ecredit_trl.train import embedded_defaults
from eval.files import read_json_object
from sandbox.backend import (
    CONFIG_FIELDS,
    DEFAULTS,
    FLAGS,
    STUDY_KEYS,
    SandboxOptions,
    SandboxOptionsError,
)
from sandbox.bounds import BoundError, bound_of, check_value
from sandbox.runtimes.podman_runtime import endpoints_retired

TOP_KEYS = ("name", "model", "arms", "seeds", "seeds_by_arm", "train", "eval", "bootstrap",
            "accelerate_config", "pooled_seeds", "sandbox", "warmstart")
EVAL_DEFAULTS = {"splits": None, "n": None, "n_by_split": None, "temperature": None, "batch_size": 8,
                 "concurrency": 2, "seed": 0, "max_turns": None, "max_new_tokens": None,
                 "runtime": "podman", "reuse_verdicts": False, "in_distribution": []}
BOOTSTRAP_DEFAULTS = {"n_boot": 10000, "seed": 0, "alpha": 0.05, "power": 0.8}
POOLED_SEEDS = ("shared", "all")
#: the ``sandbox`` section: key → default (``sandbox.backend.SandboxOptions``'s), and the
#: ECreditConfig field each one sets
SANDBOX_DEFAULTS = DEFAULTS.study_section()
SANDBOX_FIELDS = {k: CONFIG_FIELDS[k] for k in STUDY_KEYS}
#: (section or None, key) → the default left out of the resolved config (hash stability)
OMIT_AT_DEFAULT = {("eval", "reuse_verdicts"): False, ("eval", "in_distribution"): [],
                   ("bootstrap", "power"): 0.8, (None, "pooled_seeds"): "shared",
                   (None, "sandbox"): SANDBOX_DEFAULTS, (None, "warmstart"): {}}
#: recorded in study.json but not hashed: where trials run does not change a result
UNHASHED_KEYS = ("sandbox",)
#: train.py's ModelArguments that a study may set under ``train`` (``model`` is top level)
MODEL_FIELDS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
                "warmstart_steps")
#: set by the study for every run, never by the config
RESERVED_TRAIN = ("arm", "seed", "output_dir", "runs_dir", "resume_from", "config", "model")


class StudyConfigError(ValueError):
    """A study config that cannot be used; the message names the file and the key."""


@dataclass
class StudyConfig:
    """A validated, resolved study config (see the module docstring for the keys).

    Attributes:
        path: the YAML file read (None when built from a dict).
        seeds_by_arm: every arm's seed list (resolved: ``seeds`` unless overridden).
    """

    name: str
    model: str | None
    arms: list[str]
    seeds: list[int]
    seeds_by_arm: dict[str, list[int]]
    train: dict
    eval: dict
    bootstrap: dict
    accelerate_config: str | None
    pooled_seeds: str = "shared"
    sandbox: dict = field(default_factory=lambda: dict(SANDBOX_DEFAULTS))
    warmstart: dict = field(default_factory=dict)
    path: str | None = field(default=None, compare=False)

    def resolved(self) -> dict:
        """The config as written into ``study.json`` (every key, defaults filled in, but the
        keys of :data:`OMIT_AT_DEFAULT` only when not at their default: see the module
        docstring)."""
        out = {k: getattr(self, k) for k in TOP_KEYS}
        for (section, key), default in OMIT_AT_DEFAULT.items():
            if section is None:
                if out.get(key) == default:
                    out.pop(key)
            elif out[section].get(key, default) == default:
                out[section] = {k: v for k, v in out[section].items() if k != key}
        return out

    def sha256(self) -> str:
        """sha256 (hex) of the canonical JSON of :meth:`resolved` without
        :data:`UNHASHED_KEYS`."""
        hashed = {k: v for k, v in self.resolved().items() if k not in UNHASHED_KEYS}
        blob = json.dumps(hashed, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def sandbox_flags(self, style: str) -> list[str]:
        """The ``sandbox`` section as command-line flags: ``style="train"`` gives
        ECreditConfig fields (``--sandbox_backend ray --ray_address A ...``), ``"eval"``
        gives ``eval.run`` flags (``--sandbox-backend ray ...``). The local backend gives only
        the backend flag (nothing else applies to it); unset optional keys are left out."""
        sb = self.sandbox
        keys = ["backend"] if sb["backend"] == "local" else [
            k for k in SANDBOX_FIELDS if sb[k] not in (None, "")]
        out: list[str] = []
        for k in keys:
            flag = f"--{SANDBOX_FIELDS[k]}" if style == "train" else FLAGS[k]
            out += [flag, str(sb[k])]
        return out

    def eval_n(self, split: str) -> int:
        """Rollouts per task on ``split`` (``eval.n_by_split`` overrides ``eval.n``)."""
        return int(self.eval["n_by_split"].get(split, self.eval["n"]))

    def design(self) -> list[tuple[str, int]]:
        """Every training run as (arm, seed), arms in config order, seeds ascending as given."""
        return [(a, s) for a in self.arms for s in self.seeds_by_arm[a]]


def _err(where: str, key: str, msg: str) -> StudyConfigError:
    return StudyConfigError(f"{where}: {key}: {msg}")


def _int_list(where: str, key: str, v) -> list[int]:
    if not isinstance(v, list) or not v or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise _err(where, key, f"expected a non-empty list of ints, got {v!r}")
    if len(set(v)) != len(v):
        raise _err(where, key, f"seeds repeated: {v!r}")
    return list(v)


def _train_field_types() -> dict[str, object]:
    """Field name → annotation of ECreditConfig plus the allowed model fields."""
    from ecredit_trl.config import ECreditConfig  # start-up: trl; study --help stays light

    types = {f.name: f.type for f in dataclasses.fields(ECreditConfig)}
    types.update({"lora_r": "int", "lora_alpha": "int | None", "lora_dropout": "float",
                  "lora_target_modules": "list[str]", "warmstart_steps": "int | None"})
    return types


def _check_value(where: str, key: str, annotation, value) -> None:
    """Reject a value whose plain type cannot match a simple annotation (int/float/bool/str)."""
    ann = (annotation.__name__ if isinstance(annotation, type)
           else str(annotation)).replace("typing.", "")
    if value is None:
        if "None" not in ann and "Optional" not in ann:
            raise _err(where, f"train.{key}", "null is not allowed")
        return
    checks = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,)}
    base = ann.split("|")[0].strip()
    ok = checks.get(base)
    if ok is None or "Union" in ann:
        return  # complex types are left to train.py's own parser
    if isinstance(value, bool) and base != "bool" or not isinstance(value, ok):
        raise _err(where, f"train.{key}", f"expected {base}, got {value!r}")


def validate_train(train, where: str = "config") -> dict:
    """Check ``train`` against ECreditConfig's fields (and the allowed model fields).

    Raises: StudyConfigError naming an unknown or reserved field, or a value of the wrong
    plain type.
    """
    if train is None:
        return {}
    if not isinstance(train, dict):
        raise _err(where, "train", f"expected a mapping of ECreditConfig fields, got {train!r}")
    types = _train_field_types()
    moved = {f: key for key, f in SANDBOX_FIELDS.items()}
    for k, v in train.items():
        if k in RESERVED_TRAIN:
            raise _err(where, f"train.{k}", "set by the study for every run (use arms/seeds/"
                       "model at the top level)")
        if k not in types:
            raise _err(where, f"train.{k}", "unknown field (not an ECreditConfig field)")
        if k in moved:
            raise _err(where, f"train.{k}", f"set it as sandbox.{moved[k]} (the sandbox "
                       "section applies to training runs and eval.run alike)")
        if k == "verifier_endpoints" and v:
            raise _err(where, f"train.{k}", endpoints_retired(k).split(": ", 1)[1])
        _check_value(where, k, types[k], v)
        _check_bounds(where, k, v)
    return dict(train)


def _check_bounds(where: str, key: str, value) -> None:
    """Refuse a value outside the field's declared bounds (``sandbox.bounds``; the numeric,
    choice and text ones: a path is checked by train.py, relative to where the run starts)."""
    b = bound_of(ECreditConfig, key) or bound_of(ModelArguments, key)
    if b is None or b.kind not in ("int", "float", "choice", "text", "any-text"):
        return
    try:
        check_value(key, b, value)
    except BoundError as exc:
        raise _err(where, f"train.{key}", str(exc).removeprefix(f"--{key} ")) from None


def _section(where: str, key: str, given, defaults: dict) -> dict:
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise _err(where, key, f"expected a mapping, got {given!r}")
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise _err(where, f"{key}.{unknown[0]}", f"unknown key (allowed: {', '.join(defaults)})")
    return {**defaults, **given}


def _validate_eval(where: str, ev: dict) -> dict:
    splits = ev["splits"]
    if not isinstance(splits, list) or not splits or not all(
            isinstance(s, str) and s for s in splits):
        raise _err(where, "eval.tasks.splits", f"expected a non-empty list of split names, got {splits!r}")
    if len({split_dirname(s) for s in splits}) != len(splits):
        raise _err(where, "eval.tasks.splits", f"two splits share one folder name: {splits!r}")
    for k in ("n", "batch_size", "concurrency"):
        v = ev[k]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise _err(where, f"eval.{k}", f"expected an int >= 1, got {v!r}")
    nbs = ev["n_by_split"] or {}
    if not isinstance(nbs, dict):
        raise _err(where, "eval.n_by_split", f"expected a mapping split: n, got {nbs!r}")
    for k, v in nbs.items():
        if k not in splits:
            raise _err(where, f"eval.n_by_split.{k}", f"not one of eval.tasks.splits {splits!r}")
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise _err(where, f"eval.n_by_split.{k}", f"expected an int >= 1, got {v!r}")
    ev["n_by_split"] = dict(nbs)
    if not isinstance(ev["seed"], int) or isinstance(ev["seed"], bool):
        raise _err(where, "eval.seed", f"expected an int, got {ev['seed']!r}")
    t = ev["temperature"]
    if t is not None and (not isinstance(t, (int, float)) or isinstance(t, bool) or t < 0):
        raise _err(where, "eval.temperature", f"expected a number >= 0 or null, got {t!r}")
    for k in ("max_turns", "max_new_tokens"):
        v = ev[k]
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise _err(where, f"eval.{k}", f"expected an int >= 1 or null, got {v!r}")
    if not isinstance(ev["reuse_verdicts"], bool):
        raise _err(where, "eval.reuse_verdicts", f"expected true or false, got "
                   f"{ev['reuse_verdicts']!r}")
    if ev["runtime"] not in ("podman", "local"):
        raise _err(where, "eval.runtime", f"expected podman or local, got {ev['runtime']!r}")
    ind = ev["in_distribution"]
    if not isinstance(ind, list) or not all(isinstance(s, str) for s in ind):
        raise _err(where, "eval.in_distribution", f"expected a list of eval split names, got "
                   f"{ind!r}")
    for s in ind:
        if s not in splits:
            raise _err(where, "eval.in_distribution", f"{s!r} is not one of eval.tasks.splits "
                       f"{splits!r}")
    ev["in_distribution"] = list(ind)
    return ev


def _validate_sandbox(where: str, sb: dict, runtimes: dict[str, str]) -> dict:
    """Check the ``sandbox`` section (filled with :data:`SANDBOX_DEFAULTS`) with
    :meth:`sandbox.backend.SandboxOptions.validate`, once per runtime kind in ``runtimes``
    (``eval.runtime`` / ``train.runtime`` → value: ray needs podman for both).

    Raises: StudyConfigError naming ``sandbox.<key>`` (or the runtime's key).
    """
    names = {k: f"sandbox.{k}" for k in STUDY_KEYS}
    for key, runtime in runtimes.items():
        try:
            SandboxOptions(kind=runtime, **sb).validate({**names, "kind": key})
        except SandboxOptionsError as exc:
            raise _err(where, exc.name, exc.problem) from None
    return sb


def _validate_bootstrap(where: str, bs: dict) -> dict:
    if not isinstance(bs["n_boot"], int) or isinstance(bs["n_boot"], bool) or bs["n_boot"] < 1:
        raise _err(where, "bootstrap.n_boot", f"expected an int >= 1, got {bs['n_boot']!r}")
    if not isinstance(bs["seed"], int) or isinstance(bs["seed"], bool):
        raise _err(where, "bootstrap.seed", f"expected an int, got {bs['seed']!r}")
    a = bs["alpha"]
    if not isinstance(a, (int, float)) or isinstance(a, bool) or not 0 < a < 1:
        raise _err(where, "bootstrap.alpha", f"expected a number in (0, 1), got {a!r}")
    pw = bs["power"]
    if not isinstance(pw, (int, float)) or isinstance(pw, bool) or not 0 < pw < 1:
        raise _err(where, "bootstrap.power", f"expected a number in (0, 1), got {pw!r}")
    return bs


def config_from_dict(raw, *, where: str = "config", default_name: str = "study",
                     path: str | None = None) -> StudyConfig:
    """Validate a parsed study config and fill in defaults (pure apart from importing
    ECreditConfig for its field list).

    Raises: StudyConfigError naming ``where`` and the offending key.
    """
    if not isinstance(raw, dict):
        raise StudyConfigError(f"{where}: expected a mapping of study keys, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        raise _err(where, unknown[0], f"unknown key (allowed: {', '.join(TOP_KEYS)})")
    name = raw.get("name", default_name)
    if not isinstance(name, str) or not name or "/" in name:
        raise _err(where, "name", f"expected a non-empty name without '/', got {name!r}")
    model = raw.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise _err(where, "model", f"expected a model path/id or null, got {model!r}")
    arms = raw.get("arms")
    if not isinstance(arms, list) or not arms or any(a not in ARMS for a in arms) \
            or len(set(arms)) != len(arms):
        raise _err(where, "arms", f"expected a non-empty list of distinct arms from {ARMS}, "
                   f"got {arms!r}")
    seeds = _int_list(where, "seeds", raw.get("seeds"))
    sba_raw = raw.get("seeds_by_arm") or {}
    if not isinstance(sba_raw, dict):
        raise _err(where, "seeds_by_arm", f"expected a mapping arm: [seeds], got {sba_raw!r}")
    for a in sba_raw:
        if a not in ARMS:
            raise _err(where, f"seeds_by_arm.{a}", f"not an arm (expected one of {ARMS})")
    arms = list(arms) + [a for a in ARMS if a in sba_raw and a not in arms]
    seeds_by_arm = {a: _int_list(where, f"seeds_by_arm.{a}", sba_raw[a]) if a in sba_raw
                    else list(seeds) for a in arms}
    train = validate_train(raw.get("train"), where)
    ev = _validate_eval(where, _section(where, "eval", raw.get("eval"), EVAL_DEFAULTS))
    # Same protocol for every policy: an eval of a trained run inherits the run's max_turns /
    # max_completion_length, the bare starting policy would get eval.run's own defaults (a
    # confound measured on the baseline), so unset values come from the training fields.
    # train.py's embedded defaults apply under the field defaults, as they do in a run.
    from ecredit_trl.config import ECreditConfig  # start-up: trl; study --help stays light
    defaults = {f.name: f.default for f in dataclasses.fields(ECreditConfig)}
    defaults.update(embedded_defaults(on_gpu=False))
    for k, tk in (("max_turns", "max_turns"), ("max_new_tokens", "max_completion_length"),
                  ("temperature", "temperature")):
        if ev[k] is None:
            ev[k] = train.get(tk, defaults[tk])
    bs = _validate_bootstrap(where, _section(where, "bootstrap", raw.get("bootstrap"),
                                             BOOTSTRAP_DEFAULTS))
    acc = raw.get("accelerate_config")
    if acc is not None and (not isinstance(acc, str) or not acc):
        raise _err(where, "accelerate_config", f"expected a path or null, got {acc!r}")
    pooled = raw.get("pooled_seeds") or "shared"
    if pooled not in POOLED_SEEDS:
        raise _err(where, "pooled_seeds", f"expected one of {POOLED_SEEDS}, got {pooled!r}")
    sb = _validate_sandbox(where, _section(where, "sandbox", raw.get("sandbox"),
                                           SANDBOX_DEFAULTS),
                           {"eval.runtime": ev["runtime"],
                            "train.runtime": train.get("runtime", "podman")})
    return StudyConfig(name=name, model=model, arms=arms, seeds=seeds, seeds_by_arm=seeds_by_arm,
                       train=train, eval=ev, bootstrap=bs, accelerate_config=acc,
                       pooled_seeds=pooled, sandbox=sb,
                       warmstart=_validate_warmstart(where, raw, model), path=path)


def _validate_warmstart(where: str, raw: dict, model) -> dict:
    """``warmstart``: a mapping of warm-start recipe overrides
    (:func:`ecredit_trl.policy.warmstart.recipe_for`), only with ``model: null``.

    Raises: StudyConfigError naming ``warmstart`` or ``warmstart.<field>``."""
    ws = raw.get("warmstart") or {}
    if not isinstance(ws, dict):
        raise _err(where, "warmstart", f"expected a mapping of warm-start recipe fields, got {ws!r}")
    if ws and model is not None:
        raise _err(where, "warmstart", "only with model: null (it shapes the embedded policy)")

    for k in sorted(ws):
        if k not in DEFAULT_RECIPE and k not in OPTIONAL_RECIPE:
            raise _err(where, f"warmstart.{k}", "unknown warm-start recipe field (allowed: "
                       f"{', '.join(sorted({*DEFAULT_RECIPE, *OPTIONAL_RECIPE} - {'steps'}))}; "
                       "steps: train.warmstart_steps)")
        if k == "steps":
            raise _err(where, "warmstart.steps", "set it as train.warmstart_steps")
        # site_max_shift means something only beside site_demos: its value is checked so
        probe = {k: ws[k], **({"site_demos": 1} if k == "site_max_shift" else {})}
        try:
            recipe_for(**probe)
        except (ValueError, TypeError) as exc:
            raise _err(where, f"warmstart.{k}", str(exc)) from None
    try:
        recipe_for(**ws)
    except (ValueError, TypeError) as exc:
        raise _err(where, "warmstart", str(exc)) from None
    return dict(ws)


def config_from_study_json(path: str | Path) -> StudyConfig:
    """The study config recorded in a study folder's ``study.json`` (its keys of
    :data:`TOP_KEYS`; keys it predates get their defaults).

    Raises: FileNotFoundError naming the missing file; StudyConfigError naming the file and
        key of a bad record.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--out: {p} missing (not a study folder?)")
    rec = read_json_object(p, StudyConfigError)
    raw = {k: rec[k] for k in TOP_KEYS if k in rec}
    return config_from_dict(raw, where=str(p), default_name=rec.get("name") or "study")


def load_study_config(path: str | Path) -> StudyConfig:
    """Read and validate a study YAML (see the module docstring).

    Raises: FileNotFoundError (no such file); StudyConfigError (bad YAML or a bad key,
    named); the accelerate config must exist as a file when given.
    """
    import yaml

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--config: no such file {p}")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise StudyConfigError(f"{p}: not valid YAML ({exc})") from None
    except UnicodeDecodeError as exc:
        raise StudyConfigError(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    cfg = config_from_dict(raw if raw is not None else {}, where=str(p), default_name=p.stem,
                           path=str(p))
    if cfg.accelerate_config and not Path(cfg.accelerate_config).is_file():
        raise _err(str(p), "accelerate_config", f"no such file {cfg.accelerate_config}")
    return cfg


def changed_keys(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two resolved configs (pure), sorted."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += changed_keys(a, b, f"{prefix}{k}.")
        elif a != b or (k in old) != (k in new):
            out.append(f"{prefix}{k}")
    return out


def split_dirname(split: str) -> str:
    """Folder name of an eval split: ``bundled:train`` → ``bundled-train``; a file path →
    its stem (``/x/two.jsonl`` → ``two``)."""
    if "/" in split or split.endswith((".jsonl", ".json", ".parquet")):
        return Path(split).stem
    return split.replace(":", "-")


__all__ = ["OMIT_AT_DEFAULT", "POOLED_SEEDS", "SANDBOX_DEFAULTS", "StudyConfig", "StudyConfigError",
           "changed_keys", "config_from_dict", "config_from_study_json", "load_study_config",
           "split_dirname", "validate_train"]
