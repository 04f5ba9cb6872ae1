"""A GPT step's matrix products alone: NumPy's BLAS (np.matmul) against engine.fast.blas.gemm (MKL when the
`mkl` extra is installed), the same operands, taking turns round by round.

    python -m engine.bench.gemm_race [rounds] [threads]

The products are those of engine.ops.linear at the gpt-baby preset (2,048 rows = batch 8 x context 256,
width 384, 6 layers, the tied head over the stdlib corpus's 96 characters): per Linear the forward x @ W.T
(W.T a transposed view), and backward g @ W and g.T @ x (g.T a transposed view), as the engine passes them.
Prints each library's median over the rounds, its GFLOP/s, and the ratio.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from engine.fast import blas

ROWS, WIDTH, LAYERS, VOCAB = 2048, 384, 6, 96


def products(rows: int = ROWS, c: int = WIDTH, layers: int = LAYERS, vocab: int = VOCAB) -> list[tuple]:
    """(a, b) of every product of one step's linear layers, forward and backward."""
    rng = np.random.default_rng(0)
    weights = [(3 * c, c), (c, c), (4 * c, c), (c, 4 * c)] * layers + [(vocab, c)]
    acts = {n: rng.standard_normal((rows, n), dtype=np.float32) for n in {c, 4 * c}}
    grads = {n: rng.standard_normal((rows, n), dtype=np.float32) for n in {3 * c, c, 4 * c, vocab}}
    out = []
    for n_out, n_in in weights:
        w = rng.standard_normal((n_out, n_in), dtype=np.float32)
        out += [(acts[n_in], w.T), (grads[n_out], w), (grads[n_out].T, acts[n_in])]
    return out


def _time(fn, pairs) -> float:
    t0 = time.perf_counter()
    for a, b in pairs:
        fn(a, b)
    return time.perf_counter() - t0


def race(rounds: int = 9, threads: int = 2) -> dict:
    """Median seconds per step's products for each library, alternating which goes first each round."""
    from threadpoolctl import threadpool_limits
    pairs = products()
    flops = sum(2 * a.shape[0] * a.shape[1] * b.shape[1] for a, b in pairs)
    libs = {"numpy": np.matmul, "gemm": blas.gemm}
    times: dict[str, list[float]] = {k: [] for k in libs}
    with threadpool_limits(threads):
        for fn in libs.values():
            _time(fn, pairs)  # warm: MKL loads, pages fault in
        for r in range(rounds):
            for name in (list(libs) if r % 2 == 0 else list(reversed(libs))):
                times[name].append(_time(libs[name], pairs))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"flops": flops, "backend": blas.backend(), "threads": threads, "median_s": med,
            "all_s": times, "ratio": med["gemm"] / med["numpy"]}


def main(argv: list[str]) -> None:
    rounds, threads = (int(argv[0]) if argv else 9), (int(argv[1]) if len(argv) > 1 else 2)
    r = race(rounds, threads)
    print(f"{len(products())} products, {r['flops'] / 1e9:.1f} GFLOP, {threads} thread(s), {rounds} rounds")
    for name, label in (("numpy", "np.matmul"), ("gemm", f"blas.gemm ({r['backend']})")):
        s = r["median_s"][name]
        runs = " ".join(f"{t * 1e3:.0f}" for t in sorted(r["all_s"][name]))
        print(f"  {label:32s} {s * 1e3:7.1f} ms  {r['flops'] / s / 1e9:6.1f} GFLOP/s  (rounds: {runs})")
    print(f"  ratio gemm / np.matmul = {r['ratio']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
