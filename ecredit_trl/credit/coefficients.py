"""Per-token credit coefficients C_arm(t) for the four arms O/B/M/E.

Pure functions, no I/O. The trainer adds the returned coefficients to the
terminal group advantage A (never replacing it): per-token advantage
``A + C_arm(t)``.

Notation (source: the design page, "Credit arms"):

* ``L``  number of generated tokens of the rollout (``token_turn >= 0``);
  environment/tool-result tokens are ``-1`` and are never counted.
* ``m``  generated tokens whose turn is the selected block's turn.
* ``λ``  ``credit_lambda`` (>= 0), ``c`` ``credit_cap`` (> 0).
* ``D``  contrast ``U(P) - U(P\\b)`` (utility units, ``None`` when unavailable).
* ``A``  terminal group advantage (standard GRPO).
* shared shrinkage ``s = min(1, c / (λ·|D|·L/m))`` (``s = 1`` when ``λ·D == 0``).

=====  ============================================================
arm    C(t)
=====  ============================================================
O      0
B      ``s·λ·D`` on every generated token
M      ``s·λ·D·L/m`` on the selected turn's generated tokens, 0 elsewhere
E      ``clip(λ·A·L/m, −c, c)`` on the selected turn's tokens, 0 elsewhere
       (never reads D)
=====  ============================================================

``D is None`` (B/M), ``m == 0`` or no selection ⇒ ``C ≡ 0`` for that rollout.
B and M carry the same signed and L1 mass ``s·λ·D·L``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ecredit_trl.credit.arms import ARMS

__all__ = [
    "CreditStats",
    "credit_coefficients",
    "credit_coefficients_batch",
    "credit_stats",
]

# Sentinel for "no selected turn" in the batched kernel. Valid token_turn values
# are >= -1, so -2 never matches any token.
_NO_TURN = -2


# ----------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------


def _check_arm(arm: object) -> str:
    if not isinstance(arm, str) or arm not in ARMS:
        raise ValueError(f"arm must be one of {list(ARMS)}, got {arm!r}")
    return arm


def _as_float(name: str, value: object, *, allow_inf: bool = False) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a real number, got bool {value!r}")
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None
    if math.isnan(out) or (math.isinf(out) and not allow_inf):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return out


def _check_hyper(credit_lambda: object, credit_cap: object) -> tuple[float, float]:
    lam = _as_float("credit_lambda", credit_lambda)
    if lam < 0:
        raise ValueError(f"credit_lambda must be >= 0, got {credit_lambda!r}")
    cap = _as_float("credit_cap", credit_cap, allow_inf=True)
    if not cap > 0:
        raise ValueError(f"credit_cap must be > 0, got {credit_cap!r}")
    return lam, cap


def _check_contrast(name: str, value: object) -> float | None:
    if value is None:
        return None
    return _as_float(name, value)


def _check_turn(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int >= 0 or None, got bool {value!r}")
    try:
        turn = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name} must be an int >= 0 or None, got {value!r}") from None
    if turn < 0:
        raise ValueError(f"{name} must be an int >= 0 or None, got {value!r}")
    return turn


def _check_token_turn(token_turn: object, ndim: int) -> torch.Tensor:
    shape = "(T,)" if ndim == 1 else "(B, T)"
    if not isinstance(token_turn, torch.Tensor):
        raise ValueError(
            f"token_turn must be a {shape} integer torch.Tensor, got {type(token_turn).__name__}"
        )
    dt = token_turn.dtype
    if dt.is_floating_point or dt.is_complex or dt == torch.bool:
        raise ValueError(f"token_turn must have an integer dtype, got {dt}")
    if token_turn.dim() != ndim:
        raise ValueError(
            f"token_turn must be {ndim}-D {shape}, got shape {tuple(token_turn.shape)}"
        )
    if token_turn.numel() and bool((token_turn < -1).any()):
        raise ValueError("token_turn values must be >= -1 (-1 = not policy-generated)")
    return token_turn


# ----------------------------------------------------------------------------
# kernel
# ----------------------------------------------------------------------------


def _kernel(
    arm: str,
    advantages: torch.Tensor,  # (B,) float64
    contrasts: torch.Tensor,  # (B,) float64, NaN = None
    token_turn: torch.Tensor,  # (B, T) integer
    selected: torch.Tensor,  # (B,) int64, _NO_TURN = None
    lam: float,
    cap: float,
) -> torch.Tensor:
    """Vectorised C(t) for a batch; inputs already validated. Returns (B, T) float32."""
    if arm == "O":
        return torch.zeros(token_turn.shape, dtype=torch.float32, device=token_turn.device)

    tt = token_turn.long()
    gen = tt >= 0  # (B, T)
    sel = tt == selected[:, None]  # (B, T); selected >= 0 or never matches
    L = gen.sum(dim=-1).to(torch.float64)  # (B,)
    m = sel.sum(dim=-1).to(torch.float64)  # (B,)
    ratio = L / m.clamp_min(1.0)  # L/m, (B,)
    has_turn = m > 0
    zero = torch.zeros((), dtype=torch.float64, device=tt.device)

    if arm == "E":
        coef = (lam * advantages * ratio).clamp(-cap, cap)
        coef = torch.where(has_turn, coef, zero).to(torch.float32)
        return torch.where(sel, coef[:, None], coef.new_zeros(()))

    has_d = ~torch.isnan(contrasts)
    d = torch.where(has_d, contrasts, zero)
    s = _shrinkage_t(lam, d, ratio, cap)
    base = torch.where(has_d & has_turn, s * lam * d, zero)  # s·λ·D, (B,)
    if arm == "B":
        coef = base.to(torch.float32)
        return torch.where(gen, coef[:, None], coef.new_zeros(()))
    # arm M
    coef = (base * ratio).to(torch.float32)
    return torch.where(sel, coef[:, None], coef.new_zeros(()))


def _shrinkage_t(lam: float, d: torch.Tensor, ratio: torch.Tensor, cap: float) -> torch.Tensor:
    """s = min(1, c / (λ·|D|·L/m)), 1 where the denominator is 0. (B,) float64."""
    mag = lam * d.abs() * ratio
    one = torch.ones((), dtype=mag.dtype, device=mag.device)
    return torch.where(mag > 0, (cap / mag.clamp_min(1e-300)).clamp_max(1.0), one)


def _shrinkage(lam: float, x: float, ratio: float, cap: float) -> float:
    """Scalar shrinkage min(1, c / (λ·|x|·ratio)); 1 when λ·x·ratio == 0."""
    mag = lam * abs(x) * ratio
    return 1.0 if mag == 0 else min(1.0, cap / mag)


# ----------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------


def credit_coefficients(
    arm: str,
    *,
    advantage: float,
    contrast: float | None,
    token_turn: torch.Tensor,
    selected_turn: int | None,
    credit_lambda: float,
    credit_cap: float,
) -> torch.Tensor:
    """Auxiliary per-token credit C(t) of one rollout (added to A, never replacing it).

    Args:
        arm: one of ``"O"``, ``"B"``, ``"M"``, ``"E"``.
        advantage: terminal group advantage A of the rollout (advantage units,
            finite float). Read only by arm E.
        contrast: D = U(P) − U(P\\b) (utility units, finite float) or ``None``
            when either verifier report gave no utility. Never read by arm E.
        token_turn: ``(T,)`` integer tensor (int64 usually): turn index (>= 0)
            of every policy-generated token, ``-1`` for every other token
            (prompt, padding, environment/tool results).
        selected_turn: turn index of the selected edit block, or ``None`` when
            nothing was selected.
        credit_lambda: λ >= 0 (dimensionless).
        credit_cap: c > 0, bound on |C(t)| of arms M and E (``math.inf`` allowed).

    Returns:
        ``(T,)`` float32 tensor on ``token_turn.device``; exactly 0 on every
        ``-1`` position. With L generated tokens, m of them in the selected turn
        and ``s = min(1, c / (λ·|D|·L/m))`` (``s = 1`` when ``λ·D == 0``):
        O → 0; B → ``s·λ·D`` on every generated token; M → ``s·λ·D·L/m`` on the
        selected turn's tokens; E → ``clip(λ·A·L/m, −c, c)`` on the selected
        turn's tokens. ``contrast is None`` (B/M), ``m == 0`` or
        ``selected_turn is None`` ⇒ all zeros.

    Raises:
        ValueError: naming the argument, for an unknown ``arm``; a non-finite
            ``advantage``/``contrast``; ``credit_lambda < 0``; ``credit_cap <= 0``;
            ``token_turn`` not a 1-D integer tensor or holding values < -1;
            ``selected_turn`` not an int >= 0 or None.

    source: the design page, "Credit arms"
    """
    arm = _check_arm(arm)
    lam, cap = _check_hyper(credit_lambda, credit_cap)
    adv = _as_float("advantage", advantage)
    d = _check_contrast("contrast", contrast)
    tt = _check_token_turn(token_turn, 1)
    turn = _check_turn("selected_turn", selected_turn)
    dev = tt.device
    adv_t = torch.tensor([adv], dtype=torch.float64, device=dev)
    d_t = torch.tensor([math.nan if d is None else d], dtype=torch.float64, device=dev)
    sel_t = torch.tensor([_NO_TURN if turn is None else turn], dtype=torch.long, device=dev)
    return _kernel(arm, adv_t, d_t, tt[None, :], sel_t, lam, cap)[0]


def credit_coefficients_batch(
    arm: str,
    *,
    advantages: torch.Tensor | Sequence[float],
    contrasts: Sequence[float | None],
    token_turn: torch.Tensor,
    selected_turns: Sequence[int | None],
    credit_lambda: float,
    credit_cap: float,
) -> torch.Tensor:
    """Batched :func:`credit_coefficients`: row b equals the single form on row b.

    Args:
        arm: one of ``"O"``, ``"B"``, ``"M"``, ``"E"`` (one arm per batch).
        advantages: ``(B,)`` terminal group advantages A (tensor or sequence of
            finite floats).
        contrasts: length-B sequence of D (finite float) or ``None``.
        token_turn: ``(B, T)`` integer tensor, turn index per generated token,
            ``-1`` elsewhere (padding included).
        selected_turns: length-B sequence of the selected turn (int >= 0) or ``None``.
        credit_lambda: λ >= 0.
        credit_cap: c > 0.

    Returns:
        ``(B, T)`` float32 tensor on ``token_turn.device``.

    Raises:
        ValueError: as :func:`credit_coefficients`, plus length/shape mismatches
            between ``advantages``, ``contrasts``, ``selected_turns`` and
            ``token_turn``'s batch dimension (the message names the argument
            and, for a bad element, its index).

    source: the design page, "Credit arms"
    """
    arm = _check_arm(arm)
    lam, cap = _check_hyper(credit_lambda, credit_cap)
    tt = _check_token_turn(token_turn, 2)
    B = tt.shape[0]
    dev = tt.device

    if isinstance(advantages, torch.Tensor):
        if advantages.dim() != 1 or advantages.shape[0] != B:
            raise ValueError(f"advantages must have shape ({B},), got {tuple(advantages.shape)}")
        adv_t = advantages.detach().to(device=dev, dtype=torch.float64)
        if adv_t.numel() and not bool(torch.isfinite(adv_t).all()):
            raise ValueError("advantages must be finite")
    else:
        adv_list = list(advantages)
        if len(adv_list) != B:
            raise ValueError(f"advantages must have length {B}, got {len(adv_list)}")
        adv_t = torch.tensor(
            [_as_float(f"advantages[{i}]", a) for i, a in enumerate(adv_list)],
            dtype=torch.float64,
            device=dev,
        )

    d_list = list(contrasts)
    if len(d_list) != B:
        raise ValueError(f"contrasts must have length {B}, got {len(d_list)}")
    d_vals = [_check_contrast(f"contrasts[{i}]", d) for i, d in enumerate(d_list)]
    d_t = torch.tensor(
        [math.nan if d is None else d for d in d_vals], dtype=torch.float64, device=dev
    )

    s_list = list(selected_turns)
    if len(s_list) != B:
        raise ValueError(f"selected_turns must have length {B}, got {len(s_list)}")
    turns = [_check_turn(f"selected_turns[{i}]", t) for i, t in enumerate(s_list)]
    sel_t = torch.tensor(
        [_NO_TURN if t is None else t for t in turns], dtype=torch.long, device=dev
    )
    return _kernel(arm, adv_t, d_t, tt, sel_t, lam, cap)


@dataclass(frozen=True)
class CreditStats:
    """Diagnostics of one rollout's credit (one ledger/log row).

    Attributes:
        arm: ``"O"``, ``"B"``, ``"M"`` or ``"E"``.
        L: generated tokens of the rollout (tokens).
        m: generated tokens of the selected turn (tokens; 0 when nothing selected).
        s: shrinkage in (0, 1]. Arms B/M: the shared ``min(1, c/(λ·|D|·L/m))``.
            Arm E: the equivalent clip factor ``min(1, c/(λ·|A|·L/m))``, so that
            ``C_E = s·λ·A·L/m``. 1.0 whenever ``applied`` is False.
        cap_active: ``s < 1`` (the cap bound the coefficient).
        signed_mass: ``Σ_t C(t)`` (advantage units × tokens).
        l1_mass: ``Σ_t |C(t)|``.
        applied: False when ``C ≡ 0`` by rule (arm O, no selection, empty turn,
            missing contrast); True otherwise, even if D == 0 or A == 0.
        reason: when not applied, one of ``"arm_O"``, ``"no_selection"``,
            ``"empty_turn"``, ``"no_contrast"`` (checked in that order); else None.

    source: the design page, "Credit arms"
    """

    arm: str
    L: int
    m: int
    s: float
    cap_active: bool
    signed_mass: float
    l1_mass: float
    applied: bool
    reason: str | None = None


def _no_credit_reason(arm: str, turn: int | None, m: int, d: float | None) -> str | None:
    """Why a rollout gets C ≡ 0 (``arm_O``, ``no_selection``, ``empty_turn``,
    ``no_contrast``; checked in that order), or None when credit applies."""
    if arm == "O":
        return "arm_O"
    if turn is None:
        return "no_selection"
    if m == 0:
        return "empty_turn"
    if arm != "E" and d is None:
        return "no_contrast"
    return None


def credit_stats(
    arm: str,
    *,
    contrast: float | None,
    token_turn: torch.Tensor,
    selected_turn: int | None,
    credit_lambda: float,
    credit_cap: float,
    advantage: float | None = None,
) -> CreditStats:
    """Counts, shrinkage and coefficient mass of one rollout's credit.

    Args:
        arm: one of ``"O"``, ``"B"``, ``"M"``, ``"E"``.
        contrast: D (finite float) or ``None``; ignored by arm E.
        token_turn: ``(T,)`` integer tensor, turn per generated token, ``-1`` elsewhere.
        selected_turn: selected turn (int >= 0) or ``None``.
        credit_lambda: λ >= 0.
        credit_cap: c > 0.
        advantage: terminal group advantage A; required for arm E (its
            coefficients depend on A), optional and unused otherwise.

    Returns:
        :class:`CreditStats`; the masses are summed (in float64) from exactly
        the tensor :func:`credit_coefficients` returns.

    Raises:
        ValueError: as :func:`credit_coefficients`, and when ``arm == "E"`` and
            ``advantage`` is None.

    source: the design page, "Credit arms"
    """
    arm = _check_arm(arm)
    lam, cap = _check_hyper(credit_lambda, credit_cap)
    d = _check_contrast("contrast", contrast)
    tt = _check_token_turn(token_turn, 1)
    turn = _check_turn("selected_turn", selected_turn)
    if advantage is None:
        if arm == "E":
            raise ValueError("advantage is required for arm 'E' (C_E depends on A)")
        adv = 0.0
    else:
        adv = _as_float("advantage", advantage)

    L = int((tt >= 0).sum())
    m = 0 if turn is None else int((tt == turn).sum())

    reason = _no_credit_reason(arm, turn, m, d)
    if reason is not None:
        return CreditStats(arm, L, m, 1.0, False, 0.0, 0.0, False, reason)

    x = adv if arm == "E" else d
    assert x is not None
    s = _shrinkage(lam, x, L / m, cap)
    c = credit_coefficients(
        arm,
        advantage=adv,
        contrast=d,
        token_turn=tt,
        selected_turn=turn,
        credit_lambda=lam,
        credit_cap=cap,
    ).double()
    return CreditStats(
        arm=arm,
        L=L,
        m=m,
        s=s,
        cap_active=s < 1.0,
        signed_mass=float(c.sum()),
        l1_mass=float(c.abs().sum()),
        applied=True,
        reason=None,
    )
