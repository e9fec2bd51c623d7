"""What a checkpoint holds beyond TRL's own state, for exact resume (design page, "Run records").

* :class:`ExactResumeMixin` — the trainer's counters and caches
  (``ecredit_state[_<rank>].json``), TRL's buffered generation batch when a checkpoint
  falls inside a ``steps_per_generation × num_iterations`` cycle, the end-of-step
  snapshot an emergency checkpoint saves, the checkpoint receipt, and reading it all back.
* :class:`EpochSeededRepeatSampler` — a data order that depends only on (seed, epoch).
* :class:`TrainerHooks` — the step-end snapshot and the collective stop check.

Mixed into :class:`~ecredit_trl.trainer.grpo.ECreditGRPOTrainer` (before ``GRPOTrainer``);
the mixin reads the trainer's attributes set in its ``__init__``.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from transformers import TrainerCallback
from trl.trainer.utils import RepeatSampler

from ecredit_trl.runs.outcomes import control_facts
from ecredit_trl.runs.receipts import ECREDIT_STATE
from ecredit_trl.runs.records import write_json


class EpochSeededRepeatSampler(RepeatSampler):
    """TRL's ``RepeatSampler`` whose shuffle depends only on (seed, epoch).

    TRL's sampler draws each epoch's permutation from one generator seeded once,
    so a resumed process (a fresh sampler) would replay epoch 0's order in a
    later epoch. Here epoch ``e`` shuffles with seed ``seed + 1000003 * e``
    (epoch 0 is TRL's order); transformers/accelerate call :meth:`set_epoch`
    before every epoch, so a resume in any epoch sees the same data order.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        if self.shuffle and self.seed is not None:
            self.generator.manual_seed(int(self.seed) + 1000003 * self.epoch)
        return super().__iter__()


class TrainerHooks(TrainerCallback):
    """Step-end hook of :class:`~ecredit_trl.trainer.grpo.ECreditGRPOTrainer`: snapshot for exact emergency checkpoints,
    and the collective stop check of a signal-requested stop."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        t._take_snapshot()
        stop = t.stop is not None and t.stop.requested
        if t._any_rank(stop):
            control.should_save = True
            control.should_training_stop = True
            t._checkpoint_reason = "signal"
        return control


class ExactResumeMixin:
    """Checkpoint state of :class:`~ecredit_trl.trainer.grpo.ECreditGRPOTrainer` (see the module
    docstring); every method overrides or extends ``GRPOTrainer``'s through ``super()``."""

    def _get_train_sampler(self, dataset=None):
        """TRL's sampler, as an :class:`EpochSeededRepeatSampler` when it is TRL's plain
        ``RepeatSampler`` (so a resumed run draws the same batches; moved here from the
        trainer)."""
        sampler = super()._get_train_sampler(dataset)
        if type(sampler) is RepeatSampler:
            return EpochSeededRepeatSampler(
                data_source=sampler.data_source, mini_repeat_count=sampler.mini_repeat_count,
                batch_size=sampler.batch_size, repeat_count=sampler.repeat_count,
                shuffle=sampler.shuffle, seed=sampler.seed)
        return sampler

    def _state_file(self) -> str:
        if self.accelerator.num_processes <= 1:
            return ECREDIT_STATE
        return ECREDIT_STATE.replace(".json", f"_{self.accelerator.process_index}.json")

    def _buffer_needed(self) -> bool:
        every = self.args.steps_per_generation * self.num_iterations
        return self._step % every != 0 and self._buffered_inputs is not None

    def _ecredit_state(self) -> dict:
        """The trainer's own counters and caches, as saved in every checkpoint (JSON)."""
        return {"generation_round": self._generation_round, "trl_step": self._step,
                "global_step": self.state.global_step,
                "ledger_rows_total": self.ledger_rows_total,
                "trajectory_rows_total": self.trajectory_rows_total,
                "controls": {tid: log for tid, (_, log) in sorted(self._control.items())},
                "control_facts": {tid: asdict(f) for tid, f in
                                  sorted(self._control_facts().items()) if tid in self._control},
                # the trial an empty ablation's U(P\b) names when taken from the control
                "control_trial_ids": {tid: x for tid, x in
                                      sorted(self._control_trial_ids().items())
                                      if tid in self._control},
                "verified_trial_ids": list(self.verified_trial_ids),
                "rank": self.accelerator.process_index,
                "world_size": self.accelerator.num_processes}

    def _take_snapshot(self) -> None:
        """State at the end of a step (what a checkpoint at this step holds)."""
        rng = {"python": random.getstate(), "numpy": np.random.get_state(),
               "cpu": torch.random.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.random.get_rng_state_all()
        self._snapshot = {"rng": rng, "state": self._ecredit_state(),
                          "buffer": self._buffered_inputs if self._buffer_needed() else None,
                          "step": self.state.global_step}

    def _save_rng_state(self, output_dir: str) -> None:
        if not (self._emergency and self._snapshot):
            return super()._save_rng_state(output_dir)
        rng = dict(self._snapshot["rng"])
        if "cuda" in rng and self.args.parallel_mode.value != "distributed":
            rng["cuda"] = rng["cuda"][torch.cuda.current_device()]
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        name = ("rng_state.pth" if self.args.world_size <= 1
                else f"rng_state_{self.args.process_index}.pth")
        torch.save(rng, Path(output_dir) / name)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        ck = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self._emergency and self._snapshot:
            state, buffer = self._snapshot["state"], self._snapshot["buffer"]
        else:
            state = self._ecredit_state()
            buffer = self._buffered_inputs if self._buffer_needed() else None
        state = dict(state, buffered_inputs=buffer is not None)
        write_json(ck / self._state_file(), state)
        if buffer is not None:
            torch.save(buffer, ck / self._state_file().replace(".json", "_buffer.pt"))
        self.accelerator.wait_for_everyone()
        reason = ("infra_stop" if self._emergency else self._checkpoint_reason or "save_steps")
        self._checkpoint_reason = None
        self.checkpoints.append(str(ck))
        if self.accelerator.is_main_process and self.receipts is not None:
            self.receipts.checkpoint(ck, step=self.state.global_step, reason=reason,
                                     counters={k: v for k, v in state.items()
                                               if k not in ("controls", "verified_trial_ids")})

    def emergency_checkpoint(self) -> str | None:
        """Save the state of the last completed step after an infra stop (every rank calls it).

        Model and optimizer are untouched since that step ended (the failed round
        never reached ``optimizer.step``); RNG states, TRL's step counter and our
        counters come from the snapshot taken at its end. Returns the checkpoint
        path, or None before the first completed step.
        """
        step = self.state.global_step
        if step == 0 or self._snapshot is None or self._snapshot["step"] != step:
            return None
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        ck = Path(self.args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{step}"
        if str(ck) in self.checkpoints:  # saved at this very step already
            return str(ck)
        self._emergency = True
        try:
            self._save_checkpoint(self.model, trial=None)
        finally:
            self._emergency = False
        return str(ck)

    resume_schedule: dict | None = None  # set by train.py: runs.binding.schedule_change

    def _load_optimizer_and_scheduler(self, checkpoint):
        """transformers' load, then (a resume with a changed ``max_steps``) the
        optimizer's LR set to the rebuilt schedule's value at the resumed step: the restored
        param groups hold the old horizon's LR (0 after a completed linear schedule), which
        the first resumed step would otherwise use. ``LambdaLR`` schedulers only."""
        super()._load_optimizer_and_scheduler(checkpoint)
        change = self.resume_schedule
        sched = self.lr_scheduler
        if checkpoint is None or not change or not change.get("rebuilt") or not isinstance(
                sched, torch.optim.lr_scheduler.LambdaLR):
            return
        lrs = [b * f(sched.last_epoch) for b, f in zip(sched.base_lrs, sched.lr_lambdas,
                                                        strict=True)]
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        sched._last_lr = lrs

    def restore_state(self, checkpoint: str | Path) -> dict:
        """Read this rank's counters and caches back from ``checkpoint`` (before ``train``).

        Raises: FileNotFoundError / ValueError naming the state file.
        """
        ck = Path(checkpoint)
        path = ck / self._state_file()
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; the checkpoint cannot be resumed exactly")
        try:
            state = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from exc
        self._generation_round = int(state["generation_round"])
        self._step = int(state["trl_step"])
        self.ledger_rows_total = int(state["ledger_rows_total"])
        self.trajectory_rows_total = int(state["trajectory_rows_total"])
        self.verified_trial_ids = list(state.get("verified_trial_ids", []))
        self._control = {}
        for tid, log in state.get("controls", {}).items():
            if tid in self.tasks:
                self._control[tid] = (self._grade(self.tasks[tid], log, None), log)
                facts = state.get("control_facts", {}).get(tid)  # absent: older checkpoints
                self._control_facts()[tid] = control_facts(facts or {})
                if tid in state.get("control_trial_ids", {}):
                    self._control_trial_ids()[tid] = state["control_trial_ids"][tid]
        if state.get("buffered_inputs"):
            buf = path.with_name(path.name.replace(".json", "_buffer.pt"))
            self._buffered_inputs = torch.load(buf, weights_only=False)
        return state
