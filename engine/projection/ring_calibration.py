"""Ring attention's blocks timed on this machine, for the projection of context parallelism on a calibrated
machine (context.py).

A CP rank's attention is not the one-device attention's FLOPs scaled: it computes blocks of two kinds
(engine.parallel.context.blocks) — a diagonal block with the fused causal kernel (its products only up to
the diagonal), a whole block (an earlier chunk's keys) in NumPy, its whole square of scores exponentiated —
and merges each into the running output. On a CPU neither costs its FLOPs at the model's rate, and a
zigzag rank computes 2c + 1 small blocks where a contiguous one computes up to c large ones. So the
calibration times, at a rank's rows and heads and with the calibration's busy ranks:

    one_device   the fused causal attention over the whole context (what the calibrated model ran)
    diagonal     a diagonal block of a chunk, with its merge          forward and backward
    whole        a whole block of a chunk, with its merge             (backward: with the gradients'
                                                                      accumulation into dK, dV)

for both layouts' chunks (s/2c zigzag, s/c contiguous). What a pass costs around its blocks, and what a hop
adds beside them, are ring_pass_calibration.py's.
"""

from __future__ import annotations

import time

import numpy as np

from engine.dtypes import compute_dtype
from engine.fast import flash
from engine.parallel.context import blocks
from engine.projection.quantile import low_quantile

REPEATS = 9
KINDS = ("diagonal", "whole")
PHASES = ("forward", "backward")


def chunk_sizes(block_size: int, degree: int) -> list[int]:
    """The chunk sizes of a rank's blocks: zigzag's s/2c and contiguous's s/c."""
    return sorted({block_size // (2 * degree), block_size // degree})


def key(kind: str, phase: str, chunk: int | None = None) -> str:
    """The key of a kernel's seconds among one degree's figures (one_device has no chunk)."""
    return f"ring_{kind}_{phase}_s" if chunk is None else f"ring_{chunk}_{kind}_{phase}_s"


def degree_key(degree: int, name: str) -> str:
    """The calibration's key of one of ring attention's figures (key, ring_pass_calibration's pass_key and
    hop_key) for a context-parallel degree: the rank's rows and chunks, so every figure, depend on it."""
    return f"cp{degree}_{name}"


def time_ring_blocks(rows: int, heads: int, head_dim: int, block_size: int, degree: int, dtype: str,
                     repeats: int = REPEATS) -> dict[str, float]:
    """{key: low-quantile seconds} of every kernel above, on [rows, heads, tokens, head_dim] operands in the
    compute dtype."""
    rng = np.random.default_rng(0)
    cdt = compute_dtype(dtype)

    def operands(tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        q, k, v, g = (rng.standard_normal((rows, heads, tokens, head_dim)).astype(cdt) for _ in range(4))
        return q, k, v, g
    out = _one_device(*operands(block_size), rows * heads, repeats)
    for chunk in chunk_sizes(block_size, degree):
        for kind in KINDS:
            forward_s, backward_s = _block(*operands(chunk), kind == "diagonal", repeats)
            out[key(kind, "forward", chunk)], out[key(kind, "backward", chunk)] = forward_s, backward_s
    return out


def _one_device(q, k, v, g, grain: int, repeats: int) -> dict[str, float]:
    """The fused causal attention over the whole context, forward and backward."""
    o, lse, one = np.empty_like(q), np.empty(q.shape[:-1], q.dtype), q.dtype.type(1.0)

    def backward() -> None:
        dq, dk, dv = (np.empty_like(a) for a in (q, k, v))
        flash.backward(q, k, v, o, lse, g, dq, dk, dv, None, one, grain)
    return {key("one_device", "forward"): _timed(lambda: flash.forward(q, k, v, o, lse, None, one, grain),
                                                 repeats),
            key("one_device", "backward"): _timed(backward, repeats)}


def _block(q, k, v, g, diagonal: bool, repeats: int) -> tuple[float, float]:
    """One block and its merge, forward; its backward and the gradients' accumulation, as the ring runs
    them."""
    merged, running = np.zeros_like(q), np.full(q.shape[:-1], -np.inf, q.dtype)
    o_blk, lse_blk = blocks.forward(q, k, v, diagonal)
    d_rows = np.einsum("...i,...i->...", g, o_blk)
    dq, dkv = np.zeros_like(q), np.zeros((2, *k.shape), q.dtype)

    def forward() -> None:
        blocks.merge(merged, running, *blocks.forward(q, k, v, diagonal))

    def backward() -> None:
        dq_blk, dk_blk, dv_blk = blocks.backward(q, k, v, g, d_rows, lse_blk, diagonal, o_blk)
        dq.__iadd__(dq_blk)
        dkv[0] += dk_blk
        dkv[1] += dv_blk
    return _timed(forward, repeats), _timed(backward, repeats)


def _timed(fn, repeats: int) -> float:
    fn()  # warm-up
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - t0)
    return low_quantile(seconds)
