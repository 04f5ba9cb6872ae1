"""Work shared among a rank's threads (engine.fast.thread_pool) gives the bits one thread gives, and really
runs on that many threads."""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import pytest
from numeric_helpers import on_threads

from engine import ops
from engine.dropout_rng import DropoutRNG
from engine.fast import lowp, thread_pool
from engine.optim import SHARE_FROM, AdamW
from engine.tensor import Tensor

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("threads", [2, 3])
def test_split_runs_every_item_once_on_as_many_threads_as_the_pool_has(threads):
    seen: list[tuple[int, int, int]] = []
    gate = threading.Barrier(threads, timeout=10)  # every range waits for the others: they run at once

    def work(lo: int, hi: int) -> None:
        gate.wait()
        seen.append((lo, hi, threading.get_ident()))
    on_threads(threads, lambda: thread_pool.split(work, 100, grain=10))
    assert sorted(i for lo, hi, _ in seen for i in range(lo, hi)) == list(range(100))
    assert len({ident for *_, ident in seen}) == threads


def test_run_shares_blocks_only_when_the_first_block_says_it_repays_the_hand_offs():
    """Blocks that each take many hand-offs' time (a sleep, which lets go of the GIL as a compiled loop
    does) run on both threads; blocks far shorter than a hand-off stay on the caller's thread. Every
    block runs once either way, with the same bounds."""
    import time

    def blocks_run(per_block_s: float) -> list[tuple[int, int, int]]:
        seen: list[tuple[int, int, int]] = []

        def work(lo: int, hi: int) -> None:
            if per_block_s:
                time.sleep(per_block_s)
            seen.append((lo, hi, threading.get_ident()))
        on_threads(2, lambda: thread_pool.run(work, 10 * 64 + 5, 64))
        return sorted(seen)
    assert on_threads(2, thread_pool.handoff_s) > 0 and thread_pool.handoff_s() == 0.0  # one thread: no pool
    bounds = [(lo, min(lo + 64, 645)) for lo in range(0, 645, 64)]
    slow, fast = blocks_run(0.02), blocks_run(0.0)
    assert [b[:2] for b in slow] == [b[:2] for b in fast] == bounds
    assert len({ident for *_, ident in slow}) == 2
    assert {ident for *_, ident in fast} == {threading.get_ident()}


def test_split_stays_on_the_callers_thread_below_two_grains_and_when_nested():
    idents = []
    on_threads(2, lambda: thread_pool.split(lambda lo, hi: idents.append(threading.get_ident()), 15, grain=8))
    assert idents == [threading.get_ident()]
    inner: list[int] = []

    def outer(lo: int, hi: int) -> None:  # a nested split runs inside the share that made it
        here = threading.get_ident()
        thread_pool.split(lambda a, b: inner.append(threading.get_ident() == here), 1000)
    on_threads(2, lambda: thread_pool.split(outer, 2))
    assert inner == [True, True]


def attention_bits(dtype, p: float):
    rng = np.random.default_rng(0)
    q, k, v = (Tensor(rng.standard_normal((6, 3, 40, 16)).astype(dtype), requires_grad=True)
               for _ in range(3))
    y = ops.causal_attention(q, k, v, p, DropoutRNG(5) if p else None, training=True)
    y.backward(rng.standard_normal(y.shape).astype(dtype))
    return y.data, q.grad, k.grad, v.grad


@pytest.mark.parametrize("dtype", DTYPES + [np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("p", [0.0, 0.2])
def test_attention_shared_by_batch_rows_gives_one_threads_bits(dtype, p, monkeypatch):
    monkeypatch.setattr(ops, "ATTENTION_SHARE_MACS", 1)  # share even these small heads
    one = on_threads(1, lambda: attention_bits(dtype, p))
    for threads in (2, 4):
        many = on_threads(threads, lambda: attention_bits(dtype, p))
        assert all(same_bits(a, b) for a, b in zip(one, many))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adamw_shared_among_threads_gives_one_threads_bits(dtype):
    n = 2 * SHARE_FROM + 12_345  # two shares, the second with a partial last chunk

    def train():
        rng = np.random.default_rng(3)
        params = rng.standard_normal(n).astype(dtype)
        grads = np.empty_like(params)
        opt = AdamW(params, grads, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1,
                    decay_mask=rng.random(n) < 0.7)
        for _ in range(3):
            grads[:] = rng.standard_normal(n)
            opt.step()
        return params, opt.m, opt.v
    one = on_threads(1, train)
    for threads in (2, 3):
        assert all(same_bits(a, b) for a, b in zip(one, on_threads(threads, train)))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_large_adds_shared_among_threads_give_numpys_bits(dtype):
    rng = np.random.default_rng(4)
    n = lowp.SHARED_ADD_FROM[dtype != np.float32] + 777
    a, b = (rng.standard_normal(n).astype(np.float32).astype(dtype) for _ in range(2))
    want = lowp.narrow(lowp.widen(a) + lowp.widen(b), dtype)  # the unshared definition

    def both():
        out = a.copy()
        lowp.add(out, b, out=out)  # in place, as the tape sums
        return lowp.add(a, b), out
    for result in on_threads(2, both):
        assert same_bits(result, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_large_copies_into_a_gradient_give_narrows_bits_at_one_thread_and_two(dtype):
    """lowp.copy_into (how the tape writes a step's first gradient over a flat buffer's stale one): a float32
    gradient rounded into `dtype` as narrow() rounds it, with the pool at one thread and at two."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(lowp.SHARED_ADD_FROM[True] + 333).astype(np.float32) * 1e3
    want = lowp.narrow(x, dtype)

    def copy():
        out = np.full(x.shape, 7, dtype)
        lowp.copy_into(x, out)
        return out
    for threads in (1, 2):
        assert same_bits(on_threads(threads, copy), want)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_linear_with_bias_shared_among_threads_gives_the_whole_array_bits(dtype):
    rng = np.random.default_rng(6)
    x = Tensor(rng.standard_normal((3 * thread_pool.BLOCK // 64 + 5, 48)).astype(dtype))
    w, b = (Tensor(rng.standard_normal(shape).astype(dtype)) for shape in ((64, 48), (64,)))
    wide = ops.matmul_kernel(x.data, w.data.T, out_dtype=np.float32)
    want = lowp.narrow(wide + lowp.widen(b.data), dtype)  # the product, the bias added, rounded once
    for threads in (1, 2):
        assert same_bits(on_threads(threads, lambda: ops.linear(x, w, b).data), want)


def test_shares_run_under_the_callers_numpy_error_state():
    states: list[dict] = []
    with np.errstate(over="ignore", invalid="raise"):  # as a backward under fp16 loss scaling sets it
        on_threads(2, lambda: thread_pool.split(lambda lo, hi: states.append(np.geterr()), 2))
    assert len(states) == 2 and all(s["over"] == "ignore" and s["invalid"] == "raise" for s in states)
