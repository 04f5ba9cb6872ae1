"""AdamW on flat arrays, learning-rate schedules and global-norm clipping.

The optimizer sees one flat parameter array and one flat gradient array (the whole buffer or one rank's
shard: it knows nothing of sharding) and updates them in place, no per-parameter loops. Its arithmetic
follows torch.optim.AdamW (single-tensor path) operation for operation. Where numba is installed the
update is one compiled pass (engine.fast.optim_jit.adamw: the same operations, the same bits), each of the
rank's threads taking one contiguous range; elsewhere, vectorised NumPy in cache-sized chunks. The
gradient norm's sum of squares is a compiled pass too.
"""

from __future__ import annotations

import math

import numpy as np

from engine.fast import lowp, thread_pool
from engine.fast.compiled import load

SCHEDULES = ("constant", "cosine")  # lr_at's schedules
CHUNK = 1 << 16  # elements per pass of the update: its two scratch rows stay in cache
SHARE_FROM = 4 * CHUNK  # elements per thread at least before an update is shared among the rank's threads


def adamw_scratch(numel: int, dtype) -> np.ndarray:
    """The scratch an AdamW over `numel` elements works in: two rows of min(numel, CHUNK) elements.
    Optimizers that never step at the same time may share one (sized for the largest)."""
    return np.empty((2, max(1, min(numel, CHUNK))), dtype=dtype)


class AdamW:
    """Decoupled weight decay Adam (Loshchilov & Hutter), PyTorch semantics:
    p *= 1 - lr*wd (where decay_mask); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
    State: m, v (same dtype and length as params) and the step count t.

    Where numba is installed a step is one compiled pass (engine.fast.optim_jit.adamw). Elsewhere it goes
    through the arrays CHUNK elements at a time, its temporaries written into `scratch` (from
    `adamw_scratch`; allocated here unless given, and kept for this path): it allocates nothing, and each
    chunk's working set stays in cache (about twice as fast as whole-array temporaries). Every operation
    is elementwise, so the result is the same bit for bit whatever the chunking and on either path. That
    also lets the rank's threads share a large update (engine.fast.thread_pool.split): each takes a
    contiguous range of the arrays (and, in NumPy, its own columns of the scratch), so sharing allocates
    nothing either."""

    def __init__(self, params: np.ndarray, grads: np.ndarray, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 decay_mask: np.ndarray | None = None, scratch: np.ndarray | None = None):
        if params.ndim != 1 or grads.shape != params.shape:
            raise ValueError(f"AdamW needs flat params and grads of one shape, got {params.shape} and "
                             f"{grads.shape}")
        self.params, self.grads = params, grads
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay
        # Boolean so decay is a masked in-place multiply (no temporary, exact PyTorch rounding).
        self.decay_mask = None if decay_mask is None else np.asarray(decay_mask) != 0
        if self.decay_mask is not None and self.decay_mask.shape != params.shape:
            raise ValueError(f"decay_mask shape {self.decay_mask.shape} != params shape {params.shape}")
        self.scratch = adamw_scratch(params.size, params.dtype) if scratch is None else scratch
        if self.scratch.ndim != 2 or self.scratch.shape[0] != 2 or self.scratch.dtype != params.dtype:
            raise ValueError(f"AdamW scratch must be two rows of {params.dtype}, got {self.scratch.shape} "
                             f"{self.scratch.dtype}")
        self.m = np.zeros_like(params)
        self.v = np.zeros_like(params)
        self.t = 0

    def step(self, lr: float | None = None, unscale: float = 1.0, clip: float = 1.0) -> None:
        """One update. The gradients are read multiplied by `unscale`, then by `clip` (each product rounded
        to their dtype, as scaling them in place first would), and left as they are."""
        lr = self.lr if lr is None else lr
        self.t += 1
        b1, b2 = self.betas
        decay = 1 - lr * self.weight_decay
        bias2 = math.sqrt(1 - b2 ** self.t)
        step_size = -lr / (1 - b1 ** self.t)
        scales = (unscale, clip)
        if not self._step_compiled(decay, bias2, step_size, scales):
            self._step_numpy(decay, bias2, step_size, scales)

    def _step_compiled(self, decay: float, bias2: float, step_size: float, scales: tuple) -> bool:
        """The update as one compiled pass over each thread's range (False where it cannot run: numba
        missing, or arrays that are not contiguous float32 or float64 of one dtype)."""
        arrays = (self.params, self.grads, self.m, self.v)
        dtype = self.params.dtype
        jit = load("optim_jit") if dtype in (np.float32, np.float64) else None
        if jit is None or any(a.dtype != dtype or not a.flags.c_contiguous for a in arrays):
            return False
        b1, b2 = self.betas
        values = (decay, 1 - b1, b2, 1 - b2, bias2, self.eps, step_size) + scales
        consts = tuple(dtype.type(c) for c in values)
        mask = self.decay_mask

        def update(lo: int, hi: int) -> None:  # (a one-element mask where there is none: never read)
            part = np.ones(1, bool) if mask is None else mask[lo:hi]
            jit.adamw(*(a[lo:hi] for a in arrays), part, mask is not None, consts)
        thread_pool.split(update, self.params.size, SHARE_FROM)
        return True

    def _step_numpy(self, decay: float, bias2: float, step_size: float, scales: tuple) -> None:
        """The update in chunks of NumPy passes through the scratch rows, shared among the rank's threads."""
        width, size = self.scratch.shape[1], self.params.size
        shares = max(1, min(thread_pool.threads(), size // SHARE_FROM, width))

        def update_shares(first: int, last: int) -> None:
            """Shares [first, last): share k updates its range of the arrays in its columns of the scratch."""
            for k in range(first, last):
                cols = slice(k * width // shares, (k + 1) * width // shares)
                chunk = cols.stop - cols.start
                for lo in range(size * k // shares, size * (k + 1) // shares, chunk):
                    part = slice(lo, min(size * (k + 1) // shares, lo + chunk))
                    mask = True if self.decay_mask is None else self.decay_mask[part]
                    self._update(self.params[part], self.grads[part], self.m[part], self.v[part], mask,
                                 decay, bias2, step_size, scales, self.scratch[:, cols])
        thread_pool.split(update_shares, shares)

    def _update(self, p, g, m, v, mask, decay: float, bias2: float, step_size: float, scales: tuple,
                scratch: np.ndarray) -> None:
        """One chunk, in place; s and u are its scratch rows (u holds the scaled gradient until its last
        use)."""
        s, u = scratch[0, :p.size], scratch[1, :p.size]
        b1, b2 = self.betas
        if scales != (1.0, 1.0):
            np.multiply(g, scales[0], out=u)
            u *= scales[1]
            g = u
        if self.weight_decay:
            np.multiply(p, decay, out=p, where=mask)
        np.subtract(g, m, out=s)  # torch: exp_avg.lerp_(grad, 1 - beta1)
        s *= 1 - b1
        m += s
        v *= b2
        np.multiply(g, 1 - b2, out=s)  # torch: exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        s *= g
        v += s
        np.sqrt(v, out=s)  # torch: denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        s /= bias2
        s += self.eps
        np.multiply(m, step_size, out=u)  # torch: param.addcdiv_(exp_avg, denom, value=-step_size)
        u /= s
        p += u

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
        raise ValueError(f"unknown schedule {schedule!r}; use one of {SCHEDULES}")
    span = max(1, total_steps - 1 - warmup_steps)
    ratio = min(1.0, (step - warmup_steps) / span)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


NORM_CHUNK = 1 << 20  # elements per float64 pass of sum_of_squares


def sum_of_squares(x: np.ndarray, chunk: int = NORM_CHUNK, buf: np.ndarray | None = None) -> float:
    """Sum of squares accumulated in float64 (any input dtype), `chunk` elements at a time through one
    float64 buffer (`buf`, at least min(chunk, x.size) long; allocated here if not given). Per-shard sums
    add up to the whole buffer's sum, so the global norm can be formed from shards."""
    x = x.reshape(-1)
    jit = load("optim_jit") if x.flags.c_contiguous else None
    if jit is not None and x.dtype in (np.float32, np.float64):
        return float(jit.sum_of_squares(x))  # in float64 too, in one pass (no buffer)
    if jit is not None and lowp.compiled_reads(x.dtype):
        return float(jit.sum_of_squares16(x.view(np.uint16), x.dtype != np.float16))
    return _sum_of_squares_numpy(x, chunk, buf)


def _sum_of_squares_numpy(x: np.ndarray, chunk: int, buf: np.ndarray | None) -> float:
    """sum_of_squares without numba (or for float16 on a CPU without F16C): each chunk widened into the
    float64 buffer, then one dot product."""
    buf = np.empty(min(chunk, x.size), np.float64) if buf is None else buf
    total = 0.0
    for start in range(0, x.size, chunk):
        part = buf[:min(chunk, x.size - start)]
        np.copyto(part, x[start:start + chunk])
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


def warm_up() -> None:
    """Load the compiled sum of squares and update (their cached machine code, float32 and float64) now
    rather than inside the first step (see engine.fast.kernels.warm_up). Does nothing where numba is
    missing."""
    if load("optim_jit") is None:
        return
    for dtype in (np.float32, np.float64):
        sum_of_squares(np.ones(8, dtype))
        for mask in (None, np.ones(8, bool)):
            AdamW(np.ones(8, dtype), np.ones(8, dtype), decay_mask=mask).step()
