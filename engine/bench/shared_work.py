"""`python -m engine.bench.shared_work`: the pieces of a step that engine.fast.thread_pool shares among a
rank's threads, timed at one thread and at two (BLAS and engine.fast.thread_pool both), at gpt-mini's and
mlp's sizes.

Why a separate bench: on a shared 2-core machine whole-step 2-thread timings swing with other people's
load; a piece timed many times in a row, taking the fastest calls, says whether sharing it gains anything.
Prints, per piece, the fastest and the lower-quartile milliseconds at each thread count.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import ml_dtypes
import numpy as np

from engine import ops
from engine.comm.cores import limited
from engine.fast import lowp
from engine.optim import AdamW
from engine.tensor import Tensor


def fastest(fn: Callable[[], object], calls: int = 40) -> tuple[float, float]:
    """(fastest, lower quartile) seconds of `calls` calls of fn."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[0], times[calls // 4]


def pieces() -> dict[str, Callable[[], object]]:
    """name -> one call of the piece, on inputs made once."""
    rng = np.random.default_rng(0)
    cases: dict[str, Callable[[], object]] = {}
    for n in (813_696, 1_863_690):  # gpt-mini's and mlp's parameter counts
        p, g = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        cases[f"AdamW update, {n:,} elements"] = AdamW(p, g, lr=1e-3, weight_decay=0.1).step
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        name = np.dtype(dtype).name
        q, k, v = (Tensor(rng.standard_normal((32, 4, 64, 32)).astype(dtype), requires_grad=True)
                   for _ in range(3))
        grad = np.ones((32, 4, 64, 32), dtype)

        def attention(q=q, k=k, v=v, grad=grad) -> None:
            ops.causal_attention(q, k, v).backward(grad)
        cases[f"attention fwd+bwd [32, 4, 64, 32], {name}"] = attention
        x, w, b = (Tensor(rng.standard_normal(s).astype(dtype)) for s in ((2048, 128), (512, 128), (512,)))

        def linear(x=x, w=w, b=b) -> None:
            ops.linear(x, w, b)

        a, c = (rng.standard_normal(1 << 20).astype(np.float32).astype(dtype) for _ in range(2))

        def gradient_sum(a=a, c=c) -> None:
            lowp.add(a, c, out=a)
        cases[f"linear with bias (2048, 128) x (128, 512), {name}"] = linear
        cases[f"gradient sum in place, 1 Mi elements, {name}"] = gradient_sum
    return cases


def main() -> None:
    cases = pieces()
    results: dict[int, dict[str, tuple[float, float]]] = {}
    for threads in (1, 2):
        with limited(threads):
            results[threads] = {name: fastest(fn) for name, fn in cases.items()}
    print(f"{'piece':58} {'1 thread ms':>16} {'2 threads ms':>16} {'gain':>6}")
    for name in cases:
        (a1, q1), (a2, q2) = results[1][name], results[2][name]
        print(f"{name:58} {1e3 * a1:7.2f} /{1e3 * q1:7.2f} {1e3 * a2:7.2f} /{1e3 * q2:7.2f} {a1 / a2:5.2f}x")


if __name__ == "__main__":
    main()
