"""Loss scaling for fp16: none, static, or dynamic (torch.amp.GradScaler semantics, DeepSpeed extras).

fp16 gradients below ~6e-8 flush to zero; multiplying the loss by a scale S lifts them into range,
and the optimizer divides by S again. Too large an S overflows to inf/NaN; that step is skipped
(parameters, moments, step counter and LR schedule unchanged) and a dynamic scaler backs off.

Dynamic state machine (defaults = GradScaler's; the arithmetic of torch's `_amp_update_scale_`):
start at `init_scale` (2^16). On overflow: scale × `backoff_factor` (0.5), growth tracker = 0. On a
clean step: tracker + 1; when it reaches `growth_interval` (2000) the scale × `growth_factor` (2) if
that is finite, and the tracker restarts at 0. The scale is a float32 value, as GradScaler's tensor
is (each product is formed in double and rounded to float32).
DeepSpeed extras (inert at their defaults): `hysteresis` = overflows tolerated before backing off
(1 = back off at once; the allowance is restored only when the scale grows, as DeepSpeed's default
`consecutive_hysteresis=False`), and `min_scale` (> 0) = floor: the scale never drops below it, and
an overflow while already at the floor aborts the run with LossScaleError.

Every scaler is present even when disabled (`NoScaler`, scale 1, never skips), so the training loop
has no branches on precision.
"""

from __future__ import annotations

import numpy as np

from engine.dtypes import resolve_dtype
from engine.events import LossScaleChange

MAX_SKIPPED_IN_A_ROW = 50  # overflowing steps in a row before a run is declared stuck


class LossScaleError(RuntimeError):
    """The dynamic scale is stuck at its floor: training cannot make progress."""


# The 16-bit formats' magnitude bits at and above which a value is inf or NaN (its exponent all ones)
_NOT_FINITE_FROM = {resolve_dtype("fp16"): 0x7C00, resolve_dtype("bf16"): 0x7F80}
_CHECK_CHUNK = 1 << 20  # elements of 16-bit bits per pass of all_finite: the pass's temporary stays in cache


def all_finite(grad: np.ndarray) -> bool:
    """Whether every element is finite. 16-bit gradients are checked on their bits, a chunk at a time
    (the largest magnitude's bits against the format's first non-finite ones: integer passes at memory
    speed, where NumPy's isfinite on float16 widens each element)."""
    limit = _NOT_FINITE_FROM.get(grad.dtype)
    if limit is None or not grad.flags.c_contiguous:
        return bool(np.isfinite(grad).all())
    bits = grad.reshape(-1).view(np.uint16)
    for lo in range(0, bits.size, _CHECK_CHUNK):
        if np.max(bits[lo:lo + _CHECK_CHUNK] & np.uint16(0x7FFF), initial=0) >= limit:
            return False
    return True


def find_overflow(grad: np.ndarray, flat, offset: int = 0) -> tuple[str, str] | None:
    """(inf|nan, name of the parameter closest to the loss with a non-finite gradient) or None.

    `grad` is laid out like `flat` from element `offset` (a shard passes its start). Backward
    produces gradients in reverse parameter order, so the highest offending offset overflowed first.
    """
    if all_finite(grad):
        return None
    bad = np.flatnonzero(~np.isfinite(grad))
    kind = "nan" if np.isnan(grad[bad]).any() else "inf"
    last = int(bad[-1]) + offset
    name = next((s.name for s in flat.slots if s.start <= last < s.end), "<padding>")
    return kind, name


def _f32(x: float) -> float:
    """Round to float32, as GradScaler keeps its scale in a float32 tensor (too large becomes inf)."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


class NoScaler:
    """fp32, fp64 and bf16: scale 1, no checks, nothing skipped."""

    scale = 1.0
    checks_overflow = False  # replicas skip the (MAX-all-reduced) overflow check entirely

    def check(self, grad, flat, offset: int = 0):
        return None

    def update(self, step: int, found) -> None:
        return None

    def state_dict(self) -> dict:
        return {"scale": self.scale}

    def load_state_dict(self, state: dict) -> None:
        pass


class StaticScaler(NoScaler):
    """A fixed scale; overflowing steps are skipped and reported, the scale never changes."""

    checks_overflow = True

    def __init__(self, scale: float):
        self.scale = float(scale)
        self.skipped_in_a_row = 0

    def check(self, grad, flat, offset: int = 0):
        return find_overflow(grad, flat, offset)

    # What to try when every step overflows; a dynamic scaler is already lowering its own scale.
    STUCK_ADVICE = 'lower precision.loss_scale or use "dynamic", lower optim.lr, or train in bf16'

    def _count_skips(self, step: int, found) -> None:
        """A run whose every step overflows makes no progress: stop it with a reason, don't spin."""
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if found is not None else 0
        if self.skipped_in_a_row >= MAX_SKIPPED_IN_A_ROW:
            raise LossScaleError(
                f"{self.skipped_in_a_row} steps in a row overflowed (last: {found[0]} in {found[1]} at step "
                f"{step}, loss scale {self.scale:g}); {self.STUCK_ADVICE}")

    def state_dict(self) -> dict:
        return {"scale": self.scale, "skipped_in_a_row": self.skipped_in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.skipped_in_a_row = int(state.get("skipped_in_a_row", 0))

    def update(self, step: int, found):
        self._count_skips(step, found)
        if found is None:
            return None
        return LossScaleChange(step=step, reason=found[0], old_scale=self.scale, new_scale=self.scale,
                               first_param=found[1])


class DynamicScaler(StaticScaler):
    """GradScaler's back-off / growth, with DeepSpeed's hysteresis and floor."""

    # Halving the scale 50 times in a row did not help: the gradients are not finite at any scale.
    STUCK_ADVICE = ("the gradients overflow at any scale, so the cause is upstream: lower optim.lr, check "
                    "the data for inf/NaN, or train in bf16")

    def __init__(self, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 hysteresis=1, min_scale=0.0):
        super().__init__(_f32(init_scale))
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval, self.hysteresis, self.min_scale = growth_interval, hysteresis, min_scale
        self.growth_tracker = 0  # clean steps since the last overflow or growth
        self.hysteresis_left = hysteresis

    def update(self, step: int, found):
        self._count_skips(step, found)
        old = self.scale
        if found is None:
            self.growth_tracker += 1
            if self.growth_tracker < self.growth_interval:
                return None
            self.growth_tracker = 0
            grown = _f32(old * self.growth_factor)
            if not np.isfinite(grown):  # torch keeps the scale rather than overflow float32
                return None
            self.hysteresis_left = self.hysteresis
            self.scale = grown
            return LossScaleChange(step=step, reason="growth", old_scale=old, new_scale=self.scale,
                                   first_param=None)
        self.growth_tracker = 0
        kind, name = found
        if self.hysteresis_left > 1:  # tolerate this overflow: skip the step, keep the scale
            self.hysteresis_left -= 1
            return LossScaleChange(step=step, reason="hysteresis", old_scale=old, new_scale=old,
                                   first_param=name)
        if self.min_scale > 0 and old <= self.min_scale:
            raise LossScaleError(
                f"loss scale stuck at its floor min_scale={self.min_scale:g} and step {step} still "
                f"overflowed ({kind} in {name}); lower precision.min_scale, lower optim.lr, or train in bf16")
        self.scale = max(_f32(old * self.backoff_factor), self.min_scale)
        return LossScaleChange(step=step, reason=kind, old_scale=old, new_scale=self.scale, first_param=name)

    def state_dict(self) -> dict:
        return {"scale": self.scale, "growth_tracker": self.growth_tracker,
                "hysteresis_left": self.hysteresis_left, "skipped_in_a_row": self.skipped_in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self.growth_tracker = int(state.get("growth_tracker", 0))
        self.hysteresis_left = int(state.get("hysteresis_left", self.hysteresis))
        self.skipped_in_a_row = int(state.get("skipped_in_a_row", 0))


def make_scaler(precision):
    """The scaler for a [precision] config section: fp16 scales, everything else is inert."""
    if precision.dtype != "fp16":
        return NoScaler()
    if precision.loss_scale != "dynamic":
        return StaticScaler(float(precision.loss_scale))
    return DynamicScaler(precision.init_scale, precision.growth_factor, precision.backoff_factor,
                         precision.growth_interval, precision.hysteresis, precision.min_scale)
