"""AdamW on flat arrays, learning-rate schedules and global-norm clipping.

The optimizer sees one flat parameter array and one flat gradient array (the whole buffer or one rank's
shard: it knows nothing of sharding) and updates them in place with vectorised NumPy, no per-parameter
loops. Its arithmetic follows torch.optim.AdamW (single-tensor path) operation for operation.
"""

from __future__ import annotations

import math

import numpy as np


class AdamW:
    """Decoupled weight decay Adam (Loshchilov & Hutter), PyTorch semantics:
    p *= 1 - lr*wd (where decay_mask); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
    State: m, v (same dtype and length as params) and the step count t."""

    def __init__(self, params: np.ndarray, grads: np.ndarray, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 decay_mask: np.ndarray | None = None):
        if params.ndim != 1 or grads.shape != params.shape:
            raise ValueError(f"AdamW needs flat params and grads of one shape, got {params.shape} and "
                             f"{grads.shape}")
        self.params, self.grads = params, grads
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay
        # Boolean so decay is a masked in-place multiply (no temporary, exact PyTorch rounding).
        self.decay_mask = None if decay_mask is None else np.asarray(decay_mask) != 0
        if self.decay_mask is not None and self.decay_mask.shape != params.shape:
            raise ValueError(f"decay_mask shape {self.decay_mask.shape} != params shape {params.shape}")
        self.m = np.zeros_like(params)
        self.v = np.zeros_like(params)
        self.t = 0

    def step(self, lr: float | None = None) -> None:
        lr = self.lr if lr is None else lr
        b1, b2 = self.betas
        p, g, m, v = self.params, self.grads, self.m, self.v
        self.t += 1
        if self.weight_decay:
            decay = True if self.decay_mask is None else self.decay_mask
            np.multiply(p, 1 - lr * self.weight_decay, out=p, where=decay)
        m += (1 - b1) * (g - m)  # torch: exp_avg.lerp_(grad, 1 - beta1)
        v *= b2
        v += ((1 - b2) * g) * g  # torch: exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = np.sqrt(v)
        denom /= math.sqrt(1 - b2 ** self.t)
        denom += self.eps
        update = m * (-lr / (1 - b1 ** self.t))  # torch: param.addcdiv_(exp_avg, denom, value=-step_size)
        update /= denom
        p += update

    def state_dict(self) -> dict:
        """Plain numpy copies and the step count (checkpoints, resharding)."""
        return {"step": self.t, "m": self.m.copy(), "v": self.v.copy()}

    def load_state_dict(self, state: dict) -> None:
        """Copy state into the existing m, v arrays (in place, so views onto them stay valid)."""
        for key in ("m", "v"):
            if np.shape(state[key]) != self.params.shape:
                raise ValueError(f"optimizer state {key!r} has shape {np.shape(state[key])}, "
                                 f"expected {self.params.shape}")
            np.copyto(getattr(self, key), state[key], casting="same_kind")
        self.t = int(state["step"])


def lr_at(step: int, schedule: str, lr: float, min_lr: float = 0.0, warmup_steps: int = 0,
          total_steps: int = 1) -> float:
    """Learning rate for 0-based `step`. Linear warmup lr*(step+1)/warmup_steps over the first warmup_steps
    steps (both schedules), then "constant": lr; "cosine": half-cosine from lr down to min_lr, reaching
    min_lr exactly at the last step (total_steps - 1) and staying there."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    if schedule != "cosine":
        raise ValueError(f"unknown schedule {schedule!r}; use 'constant' or 'cosine'")
    span = max(1, total_steps - 1 - warmup_steps)
    ratio = min(1.0, (step - warmup_steps) / span)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def sum_of_squares(x: np.ndarray, chunk: int = 1 << 20) -> float:
    """Sum of squares accumulated in float64 (any input dtype), in chunks to bound the temporary.
    Per-shard sums add up to the whole buffer's sum, so the global norm can be formed from shards."""
    x, total = x.reshape(-1), 0.0
    for start in range(0, x.size, chunk):
        part = x[start:start + chunk].astype(np.float64)
        total += float(np.dot(part, part))
    return total


def global_norm_clip_scale(sumsq: float, max_norm: float) -> float:
    """Multiplier for the gradients given their global sum of squares, as torch.nn.utils.clip_grad_norm_:
    min(1, max_norm / (norm + 1e-6)). 1.0 when clipping is off (max_norm <= 0) or the norm is not finite
    (the loss scaler, not clipping, deals with overflow)."""
    norm = math.sqrt(sumsq) if sumsq >= 0 else math.nan
    if max_norm <= 0 or not math.isfinite(norm):
        return 1.0
    return min(1.0, max_norm / (norm + 1e-6))


clip_by_global_norm = global_norm_clip_scale  # the name used in CONTRACTS.md
