"""Shared by the op and kernel tests: central finite differences, the two paths every fused kernel has
(numba's compiled loops, and the named NumPy chain that runs where numba is missing), and a call on a set
number of the pool's threads."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

from engine.fast import compiled, thread_pool


def numeric_grad(fn: Callable[..., np.ndarray], arrays: list[np.ndarray], i: int, weights,
                 eps: float = 1e-6) -> np.ndarray:
    """d sum(fn(*arrays) * weights) / d arrays[i] by central differences (fn takes and gives arrays)."""
    grad = np.zeros_like(arrays[i])
    for pos in np.ndindex(arrays[i].shape):
        values = []
        for step in (eps, -eps):
            shifted = [a.copy() for a in arrays]
            shifted[i][pos] += step
            values.append(float((fn(*shifted) * weights).sum()))
        grad[pos] = (values[0] - values[1]) / (2 * eps)
    return grad


def kernel_paths(request) -> Iterator[str]:
    """Body of a fixture parametrized over ("compiled", "numpy"): run the test on that path; the compiled
    one skips, saying so, where numba is not installed."""
    if request.param == "numpy":
        with compiled.disabled():
            yield request.param
        return
    if compiled.load("kernels_jit") is None:
        pytest.skip("numba is not installed: the compiled path is not available")
    yield request.param


def on_threads(n: int, fn):
    """fn() with the pool at n threads (restored after)."""
    before = thread_pool.threads()
    thread_pool.set_threads(n)
    try:
        return fn()
    finally:
        thread_pool.set_threads(before)
