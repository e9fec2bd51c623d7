"""Cost of the credit computation and injection per training step: arm M vs arm O.

On one frozen batch (B rollouts × T completion tokens, several turns each, tool
tokens masked) with the embedded tiny policy, time:

* the policy step the trainer pays anyway: forward + backward of the token-level
  GRPO loss with per-token advantages (what TRL's ``_compute_loss`` does);
* the credit path of ``ECreditGRPOTrainer._generate_and_score_completions``:
  turn map from the masks, ``credit_coefficients_batch`` and ``(A + C) * mask``.

Arm O runs the same injection with C ≡ 0. Verification is excluded.
Target: credit path ≤ 1% of the step.

    python benchmarks/credit_overhead.py [--batch 8] [--tokens 640] [--turns 3] [--repeats 20]
"""

from __future__ import annotations

import statistics
import time

import torch

from ecredit_trl.credit.planning import per_token_advantages
from ecredit_trl.policy.tiny_model import build_model, build_tokenizer
from sandbox.bounds import ArgumentParser, Int


def frozen_batch(B: int, T: int, turns: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    cmask = torch.ones(B, T, dtype=torch.long)
    tmask = torch.ones(B, T, dtype=torch.long)
    seg = T // (2 * turns)
    for k in range(turns):  # generated segment, then a tool-result segment
        tmask[:, (2 * k + 1) * seg:(2 * k + 2) * seg] = 0
    for b in range(B):  # ragged lengths: right padding
        cmask[b, T - (b * 7 % (T // 4)):] = 0
    A = torch.randn(B, generator=g)
    D = [float(x) for x in torch.randn(B, generator=g)]
    selected = [1 + (b % turns) for b in range(B)]
    return ids, cmask, tmask, A, D, selected


def credit_path(arm, cmask, tmask, A, D, selected):
    adv, _, _ = per_token_advantages(arm, advantages=A, completion_mask=cmask, tool_mask=tmask,
                                     contrasts=D, selected_turns=selected, credit_lambda=0.5,
                                     credit_cap=1.0)
    return adv


def policy_step(model, ids, adv, mask):
    logits = model(input_ids=ids).logits[:, :-1]
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    loss = -(ratio * adv[:, 1:] * mask[:, 1:]).sum() / mask[:, 1:].sum()
    loss.backward()
    model.zero_grad(set_to_none=True)


def timed(fn, repeats):
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    ap = ArgumentParser()
    ap.add_argument("--batch", type=Int(ge=1), default=8)
    ap.add_argument("--tokens", type=Int(ge=1), default=640)
    ap.add_argument("--turns", type=Int(ge=1), default=3)
    ap.add_argument("--repeats", type=Int(ge=1), default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    tok = build_tokenizer(["def add(a, b):\n    return a + b\n"] * 4, vocab_size=400)
    model = build_model(tok)
    ids, cmask, tmask, A, D, sel = frozen_batch(args.batch, args.tokens, args.turns, len(tok))
    mask = (cmask * tmask).to(torch.float32)
    rows = []
    for arm in ("O", "M"):
        adv = credit_path(arm, cmask, tmask, A, D, sel)
        step = timed(lambda adv=adv: policy_step(model, ids, adv, mask), max(3, args.repeats // 4))
        credit = timed(lambda arm=arm: credit_path(arm, cmask, tmask, A, D, sel), args.repeats)
        rows.append((arm, step, credit))
    print(f"batch {args.batch} x {args.tokens} tokens, {args.turns} turns, tiny policy, CPU, "
          f"{torch.get_num_threads()} threads")
    print(f"{'arm':>3} {'policy step ms':>15} {'credit path ms':>15} {'credit/step':>12}")
    for arm, step, credit in rows:
        print(f"{arm:>3} {step * 1e3:>15.1f} {credit * 1e3:>15.3f} {credit / step:>12.3%}")
    (_, so, co), (_, sm, cm) = rows
    print(f"M vs O: step+credit {(sm + cm) * 1e3:.1f} ms vs {(so + co) * 1e3:.1f} ms "
          f"(ratio {(sm + cm) / (so + co):.4f}); target: credit path <= 1% of the step "
          f"-> {'yes' if cm / sm <= 0.01 else 'NO'}")


if __name__ == "__main__":
    main()
