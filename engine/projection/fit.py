"""Fitting link figures to measurements: α, β (and γ) by least squares, from nanoDist's own collectives or
from pasted nccl-tests output.

Our ring with p ranks: an all-gather of n bytes takes (p−1)·(α + n/p·β) and a reduce-scatter adds
(p−1)/p·n·γ. So all-gather times against m = n/p (the bytes of one ring step) are a line of intercept
(p−1)·α and slope (p−1)·β, and reduce-scatter minus all-gather at the same size is (p−1)/p·n·γ.

nccl-tests (`all_reduce_perf -b 8 -e 1G -f 2`) prints a table whose rows are

    size  count  type  redop  root  time(us)  algbw  busbw  #wrong  time(us)  algbw  busbw  #wrong

(out-of-place, then in-place). `parse_nccl_tests` reads the size and the out-of-place time of each row;
`fit_nccl_all_reduce` fits the ring all-reduce 2(p−1)·α + 2(p−1)/p·n·β to them, with p the ranks that
ran (nccl-tests prints "nranks" or one "Rank ... device" line per rank; pass `ranks` when it does not).
"""

from __future__ import annotations

import re

import numpy as np


class FitError(ValueError):
    """Measurements that cannot be fitted (too few sizes, unreadable table): one line for the user."""


def line_fit(x, y) -> tuple[float, float]:
    """(intercept, slope) of the line through (x, y) with the least squared RELATIVE error (weights 1/y):
    sizes span decades, and a plain fit would let the largest swamp the latency. The intercept is kept
    >= 0 (a latency is never negative; then the line goes through the origin)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(set(x.tolist())) < 2:
        raise FitError("need measurements at two or more different sizes to fit a latency and a bandwidth")
    w = 1 / np.maximum(y, 1e-12)
    slope, intercept = np.polyfit(x, y, 1, w=w)
    if intercept < 0:
        intercept, slope = 0.0, float(np.sum(w**2 * x * y) / np.sum(w**2 * x * x))
    return float(intercept), float(slope)


def fit_ring(ranks: int, sizes, gather_s, scatter_s=None) -> dict[str, float]:
    """α, β from all-gather times (and γ from reduce-scatter times) of our ring at `sizes` bytes."""
    p = ranks
    steps = [n / p for n in sizes]
    intercept, slope = line_fit(steps, gather_s)
    fitted = {"alpha": intercept / (p - 1), "beta": max(slope / (p - 1), 0.0), "gamma": 0.0}
    if scatter_s is not None:
        extra = [s - g for s, g in zip(scatter_s, gather_s)]
        volume = [(p - 1) / p * n for n in sizes]
        fitted["gamma"] = max(float(np.dot(volume, extra) / np.dot(volume, volume)), 0.0)
    return fitted


# size, count, type, redop, [root,] time, algbw, busbw (older nccl-tests print no root column)
_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(?:-?\d+\s+)?(\d+\.\d*)\s+([\d.]+)\s+([\d.]+)")
_RANKS = re.compile(r"nranks\s*[=:]?\s*(\d+)", re.IGNORECASE)
_RANK_LINE = re.compile(r"^#\s+Rank\s+\d+", re.MULTILINE)


def parse_nccl_tests(text: str) -> tuple[list[tuple[int, float]], int | None]:
    """[(size bytes, out-of-place seconds)] of every row of an nccl-tests table, and the rank count if
    the output names it."""
    rows = [(int(m.group(1)), float(m.group(5)) * 1e-6)
            for line in text.splitlines() if (m := _ROW.match(line))]
    found = _RANKS.search(text)
    ranks = int(found.group(1)) if found else (len(_RANK_LINE.findall(text)) or None)
    return rows, ranks


def fit_nccl_all_reduce(text: str, ranks: int | None = None) -> dict[str, float]:
    """α (s), β (s/byte), the bus bandwidth 1/β (bytes/s) and the rows used, from all_reduce_perf output."""
    rows, named = parse_nccl_tests(text)
    p = ranks or named
    if not rows:
        raise FitError("no nccl-tests rows found (expected lines of size, count, type, redop, root, time, "
                       "algbw, busbw, ...); paste all_reduce_perf's table")
    if not p or p < 2:
        raise FitError("the output does not say how many ranks ran; pass the rank count")
    sizes, seconds = zip(*rows)
    intercept, slope = line_fit(sizes, seconds)
    alpha, beta = intercept / (2 * (p - 1)), slope / (2 * (p - 1) / p)
    return {"ranks": p, "alpha": alpha, "beta": beta, "busbw": 1 / beta if beta else float("inf"),
            "rows": len(rows)}
