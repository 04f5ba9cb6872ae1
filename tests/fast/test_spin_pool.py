"""The polling workers (engine.fast.spin_pool) and the products split among them (engine.fast.blas): every
block and every share runs exactly once, on the worker or, when it has not started it, on the caller; the
products equal np.matmul (float64 to 1e-12, float32 within a k-term dot product's round-off), and a
worker's exception reaches the caller."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from numeric_helpers import on_threads

from engine.fast import blas, spin_pool, thread_pool
from engine.fast.compiled import load

JIT = load("spin_jit")
pytestmark = pytest.mark.skipif(JIT is None, reason="needs numba (the polling workers are compiled loops)")
MKL = blas._library()


@pytest.fixture(autouse=True)
def polling_workers(monkeypatch):
    """The pools these tests make (on_threads) have polling workers, whatever the default."""
    monkeypatch.setattr(thread_pool, "SPIN", True)


def _operands(rng, dtype, m=300, k=70, n=90):
    x = rng.standard_normal((m, k)).astype(dtype)
    w = rng.standard_normal((n, k)).astype(dtype)
    return {"weight transposed": (x, w.T), "left transposed": (np.ascontiguousarray(x.T).T, w.T),
            "few rows: split by columns": (x[:20], w.T), "column slices": (x[:, 3:60], w[:, :57].T)}


@pytest.mark.skipif(MKL is None, reason="products are split only on MKL (the `mkl` extra)")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_split_products_equal_numpy(dtype, monkeypatch):
    monkeypatch.setattr(blas, "SPLIT_MACS", 1)  # split even these small products
    monkeypatch.setattr(spin_pool.Worker, "calm", lambda self: False)  # even when preempted (under load)
    split = []
    inner = blas._split_product
    monkeypatch.setattr(blas, "_split_product", lambda *a: split.append(inner(*a)) or split[-1])
    for name, (a, b) in _operands(np.random.default_rng(0), dtype).items():
        out = on_threads(3, lambda a=a, b=b: blas.gemm(a, b))
        exact = a.astype(np.float64) @ b.astype(np.float64)
        if dtype == np.float64:
            np.testing.assert_allclose(out, exact, rtol=0, atol=1e-12, err_msg=name)
        else:  # |error| <= k eps sum |a||b| (a k-term dot product in float32)
            bound = a.shape[1] * np.finfo(np.float32).eps * (np.abs(a) @ np.abs(b)).astype(np.float64)
            assert np.all(np.abs(out - exact) <= bound), name
    assert split and all(split)


def _gemm_words(jit, a, b, out):
    """A GEMM job's words for out = a @ b (all C-contiguous float64)."""
    (m, k), n = a.shape, b.shape[1]
    words = np.zeros(jit.JOB_WORDS, np.int64)
    words[:14] = (jit.GEMM64, MKL.address[np.dtype(np.float64)], blas._NO_TRANS, blas._NO_TRANS, m, n, k,
                  a.ctypes.data, k, b.ctypes.data, n, out.ctypes.data, n, MKL.address["set_local"])
    return words


@pytest.mark.skipif(MKL is None, reason="a product job calls MKL")
def test_a_block_runs_once_on_the_worker_or_else_on_the_caller():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((40, 30)), rng.standard_normal((30, 20))
    worker = spin_pool.start(1, "test-spin")[0]
    try:
        for caller_first in (False, True):
            out = np.zeros((40, 20))
            worker.job[:] = _gemm_words(worker.jit, a, b, out)
            if caller_first:  # the worker stopped: a posted block is the caller's to run
                worker.stop()
            seq = worker.post()
            if not caller_first:
                assert worker.jit.wait_done(worker.ctl, seq, 1 << 40)  # the worker ran it
            answer = worker.jit.finish_gemm(worker.ctl, worker.job, seq, 1 << 40)
            assert answer == (worker.jit.CALLER_DID if caller_first else worker.jit.WORKER_DID)
            np.testing.assert_allclose(out, a @ b, rtol=0, atol=1e-12)
    finally:
        worker.stop()


def test_a_python_share_runs_once_and_its_exception_reaches_the_caller():
    worker = spin_pool.start(1, "test-spin")[0]
    ran = []
    try:
        def fails():
            ran.append(threading.get_ident())
            raise ValueError("from the worker")
        worker.job[worker.jit.KIND], worker.task = worker.jit.PYTHON, fails
        seq = worker.post()
        while worker.ctl[worker.jit.CLAIMED] != seq:  # the worker took it: the caller cannot take it back
            pass
        assert worker.take_back(seq) is None
        with pytest.raises(ValueError, match="from the worker"):
            worker.wait_python(seq)
        assert ran == [worker.thread.ident]
    finally:
        worker.stop()


def test_thread_ranks_sharing_the_pool_run_every_item_once():
    """Thread ranks of one process share the workers: one that finds a worker busy runs its share itself."""
    seen: list[list[int]] = [[], []]

    def rank(r: int) -> None:
        for _ in range(50):
            thread_pool.split(lambda lo, hi: seen[r].extend(range(lo, hi)), 64, grain=8)

    def both() -> None:
        threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    on_threads(2, both)
    assert sorted(seen[0]) == sorted(seen[1]) == sorted(list(range(64)) * 50)
