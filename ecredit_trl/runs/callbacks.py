"""Readable per-step lines for people watching a run (beside TRL's progress bar)."""

from __future__ import annotations

from pathlib import Path

from transformers import TrainerCallback


class ProgressLines(TrainerCallback):
    """Prints one line per logged step: reward, resolved rate, contrasts, trials, the masked
    share (rollouts whose reward was None), seconds, and the sampling–training log-probability
    difference (mean / max over generated tokens)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "loss" not in logs:
            return

        def g(key, fmt="{:.3f}"):
            v = logs.get(key)
            return "-" if v is None else fmt.format(v)

        print(f"[ecredit] step {state.global_step}/{state.max_steps}  loss {g('loss')}  "
              f"reward {g('reward')}  resolved {g('ecredit/resolved_rate')}  "
              f"contrasts {g('ecredit/usable_contrasts', '{:.0f}')} usable / "
              f"{g('ecredit/nonzero_contrasts', '{:.0f}')} nonzero  "
              f"trials/rollout {g('ecredit/trials_per_rollout', '{:.2f}')}  "
              f"format-errors {g('ecredit/format_error_rate')}  "
              f"masked {g('ecredit/masked_share')}  "
              f"service {g('ecredit/service_s', '{:.1f}')} s  "
              f"logp-diff {g('sampling/sampling_logp_difference/mean', '{:.1e}')} mean / "
              f"{g('sampling/sampling_logp_difference/max', '{:.1e}')} max", flush=True)
