"""The reductions every collective applies (sum, avg, max), and the buffer rule they share.

float16 and bfloat16 are reduced pairwise in float32 and rounded back after each addition — the same
values as native float16/bfloat16 arithmetic (float32 has more than twice their precision, so the
double rounding is harmless) at float32 speed. avg is a sum divided by the number of ranks once, by the
rank that holds the finished sum; it is defined for floating dtypes only.
"""

from __future__ import annotations

import numpy as np

from engine.comm.base import Reduce
from engine.dtypes import LOW_PRECISION

OPS = ("sum", "avg", "max")


def reducer(op: str, dtype: np.dtype) -> Reduce:
    """``reduce(acc, incoming)``: fold incoming into acc in place (avg folds as a sum)."""
    if op not in OPS:
        raise ValueError(f"unknown reduction {op!r}; expected one of {OPS}")
    if op == "avg" and dtype.kind != "f" and dtype not in LOW_PRECISION:
        raise TypeError(f"op 'avg' needs a floating dtype, got {dtype}; use 'sum' and divide yourself")
    ufunc = np.maximum if op == "max" else np.add
    if dtype in LOW_PRECISION:
        def reduce_low(acc: np.ndarray, inc: np.ndarray) -> None:
            # inf (and inf - inf = nan) are legitimate fp16 results: the loss scaler skips them
            with np.errstate(over="ignore", invalid="ignore"):
                acc[...] = ufunc(acc.astype(np.float32), inc.astype(np.float32)).astype(dtype)
        return reduce_low

    def reduce_native(acc: np.ndarray, inc: np.ndarray) -> None:
        ufunc(acc, inc, out=acc)
    return reduce_native


def divide(view: np.ndarray, count: int) -> None:
    """avg's last step: the finished sum over ``count`` ranks, divided in place."""
    if view.dtype in LOW_PRECISION:
        view[...] = (view.astype(np.float32) / count).astype(view.dtype)
    else:
        view /= count


def check_buffer(buf: np.ndarray) -> np.dtype:
    if not isinstance(buf, np.ndarray) or buf.ndim != 1 or not buf.flags.c_contiguous:
        raise ValueError("collectives work in place on a flat, C-contiguous 1-D numpy array")
    return buf.dtype


def segments(view: np.ndarray, segment_bytes: int) -> list[np.ndarray]:
    """``view`` cut into pieces of at most segment_bytes (at least one element each)."""
    step = max(1, segment_bytes // view.itemsize)
    return [view[i:i + step] for i in range(0, view.size, step)]


def exchange(comm, dst: int, outgoing: np.ndarray, src: int, incoming: np.ndarray, reduce: Reduce | None,
             segment_bytes: int) -> None:
    """Send ``outgoing`` to dst while ``incoming`` arrives from src (reduced into it when ``reduce``),
    segment by segment, so the transport reduces one piece while the next is still arriving. Both
    sides cut at the same offsets, so segment j of a send meets segment j of a receive; the two may
    differ in length (uneven shards), hence the one-sided tail."""
    outs, ins = segments(outgoing, segment_bytes), segments(incoming, segment_bytes)
    for j in range(max(len(outs), len(ins))):
        if j < len(outs) and j < len(ins):
            comm.sendrecv(dst, outs[j], src, ins[j], reduce)
        elif j < len(outs):
            comm.send(dst, outs[j])
        else:
            comm.recv(src, ins[j], reduce)
