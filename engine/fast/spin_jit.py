"""A worker's wait and a product's block as compiled code (numba) holding no GIL: spin_pool's loops.

Why compiled: a worker that waits for its next share by polling in Python takes the GIL the caller's own
Python needs (measured: no gain, docs/benchmarks.md); one that sleeps costs a thread wake-up per hand-off
(42-82 us on the 2-core virtual machines). Here the worker polls a word of shared memory with the GIL
released, for a bounded number of polls, and runs a product's share itself: a call of MKL's cblas_?gemm
through its address, never back in Python.

The words are read and written with atomic loads and stores (acquire / release): a plain load in a loop is
one the compiler may hoist out of it. The polls do not use the CPU's spin-wait hint (x86 `pause`): on the
virtual machines a vCPU that runs `pause` in a loop is descheduled by the hypervisor (pause-loop exiting;
measured: a pause took 8 ns alone, 550 ns in a loop while another thread polled).
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

# ctl's words, a cache line apart: the caller writes POSTED (and the job's words before it) and STOP; whoever
# takes a posted job (the worker, or the caller taking back a share nobody started) moves CLAIMED to it; the
# worker writes DONE when it finishes one it took.
POSTED, CLAIMED, DONE, STOP_FLAG = 0, 8, 16, 24
CTL_WORDS = 32
# job's words: what to run and its arguments (gemm: CBLAS's row-major arguments, addresses as integers)
# (SET_LOCAL: MKL_Set_Num_Threads_Local's address: each block runs on one MKL thread)
KIND, FN, TRANS_A, TRANS_B, M, N, K, A, LDA, B, LDB, C, LDC, SET_LOCAL = range(14)
JOB_WORDS = 16
GEMM32, GEMM64, PYTHON = 1, 2, 3  # job kinds; PYTHON: the worker returns to run it in Python
TIMED_OUT, RUN_PYTHON, STOPPED, PREEMPTED = 0, 1, 2, 3  # serve()'s answers
WORKER_DID, CALLER_DID, STILL_RUNNING = 0, 1, 2  # finish()'s answers


def _load_typing(typingctx, arr, idx):
    """arr[idx] (int64), an atomic load with acquire ordering."""
    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, sig.args[0], ary, [args[1]])
        return builder.load_atomic(ptr, "acquire", 8)
    return types.int64(arr, idx), codegen


_load: Any = intrinsic(_load_typing)  # Any: mypy cannot type a numba intrinsic's call


def _store_typing(typingctx, arr, idx, value):
    """arr[idx] = value (int64), an atomic store with release ordering."""
    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, sig.args[0], ary, [args[1]])
        builder.store_atomic(args[2], ptr, "release", 8)
        return context.get_dummy_value()
    return types.void(arr, idx, value), codegen


_store: Any = intrinsic(_store_typing)  # Any: mypy cannot type a numba intrinsic's call


def _claim_typing(typingctx, arr, idx, expected, new):
    """arr[idx] = new if it is `expected` (an atomic compare-and-swap): whether this thread swapped it."""
    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, sig.args[0], ary, [args[1]])
        pair = builder.cmpxchg(ptr, args[2], args[3], "acq_rel", "acquire")
        return builder.extract_value(pair, 1)
    return types.boolean(arr, idx, expected, new), codegen


_claim: Any = intrinsic(_claim_typing)  # Any: mypy cannot type a numba intrinsic's call


def _gemm_codegen(scalar_ir):
    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        ptr = ir.IntType(8).as_pointer()
        args_ir = [i32] * 6 + [scalar_ir, ptr, i32, ptr, i32, scalar_ir, ptr, i32]
        fnty = ir.FunctionType(ir.VoidType(), args_ir)
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        a = [builder.trunc(x, i32) for x in args[1:]]
        p = [builder.inttoptr(x, ptr) for x in args[1:]]
        one, zero = ir.Constant(scalar_ir, 1.0), ir.Constant(scalar_ir, 0.0)
        # (order, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); order 101 = row-major
        builder.call(fn, [ir.Constant(i32, 101), a[0], a[1], a[2], a[3], a[4], one, p[5], a[6], p[7], a[8],
                          zero, p[9], a[10]])
        return context.get_dummy_value()
    return codegen


def _sgemm_typing(typingctx, fn, ta, tb, m, n, k, a, lda, b, ldb, c, ldc):
    """cblas_sgemm at address fn: C = A B, row-major, alpha 1, beta 0 (every argument an int64)."""
    return types.void(*([types.int64] * 12)), _gemm_codegen(ir.FloatType())


_sgemm: Any = intrinsic(_sgemm_typing)  # Any: mypy cannot type a numba intrinsic's call


def _dgemm_typing(typingctx, fn, ta, tb, m, n, k, a, lda, b, ldb, c, ldc):
    """cblas_dgemm at address fn, as _sgemm."""
    return types.void(*([types.int64] * 12)), _gemm_codegen(ir.DoubleType())


_dgemm: Any = intrinsic(_dgemm_typing)  # Any: mypy cannot type a numba intrinsic's call


def _cycles_typing(typingctx):
    """The CPU's time-stamp counter (llvm.readcyclecounter)."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                            "llvm.readcyclecounter")
        return builder.call(fn, [])
    return types.int64(), codegen


_cycles: Any = intrinsic(_cycles_typing)  # Any: mypy cannot type a numba intrinsic's call


def _set_local_typing(typingctx, fn, n):
    """MKL_Set_Num_Threads_Local(n) at address fn: the previous count."""
    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(i32, [i32])
        out = builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [builder.trunc(args[1], i32)])
        return builder.sext(out, ir.IntType(64))
    return types.int64(types.int64, types.int64), codegen


_set_local: Any = intrinsic(_set_local_typing)  # Any: mypy cannot type a numba intrinsic's call


@njit(nogil=True, cache=True)
def run_job(job):  # pragma: no cover - compiled
    """Run a GEMM32 / GEMM64 job from its words, on one MKL thread (this thread's count restored after)."""
    before = _set_local(job[SET_LOCAL], 1)
    if job[KIND] == GEMM32:
        _sgemm(job[FN], job[TRANS_A], job[TRANS_B], job[M], job[N], job[K], job[A], job[LDA], job[B],
               job[LDB], job[C], job[LDC])
    else:
        _dgemm(job[FN], job[TRANS_A], job[TRANS_B], job[M], job[N], job[K], job[A], job[LDA], job[B],
               job[LDB], job[C], job[LDC])
    _set_local(job[SET_LOCAL], before)


@njit(nogil=True, cache=True)
def serve(ctl, job, seen, polls, gap, done):  # pragma: no cover - compiled
    """The worker's loop: mark the Python job `done` done (0: none), wait for ctl[POSTED] to pass `seen`, at
    most `polls` polls since the last job; take the job unless the caller took it back, run a product itself
    and mark it done, and wait again. Returns (answer, the last job seen): RUN_PYTHON for a Python job it
    took (the worker's Python runs it, the next call marks it done), STOPPED, TIMED_OUT, or PREEMPTED when two
    polls were more than `gap` time-stamp cycles apart (the OS gave the core to other work meanwhile: polling
    then only takes cores from others). Marking a Python job done here, not in a call of its own, saves the
    worker taking the GIL back after that call: the rank's thread holds it between ops, and a thread that
    waits for it sleeps (a wake-up per share)."""
    if done:
        _store(ctl, DONE, done)
    left = polls
    last = _cycles()
    while left > 0:
        now = _cycles()
        if now - last > gap:
            return PREEMPTED, seen
        last = now
        if _load(ctl, STOP_FLAG) != 0:
            return STOPPED, seen
        posted = _load(ctl, POSTED)
        if posted == seen:
            left -= 1
            continue
        seen = posted
        if not _claim(ctl, CLAIMED, posted - 1, posted):
            continue  # the caller ran it itself
        if job[KIND] == PYTHON:
            return RUN_PYTHON, seen
        run_job(job)
        _store(ctl, DONE, seen)
        left = polls
        last = _cycles()
    return TIMED_OUT, seen


@njit(nogil=True, cache=True)
def cycles():  # pragma: no cover - compiled
    return _cycles()


@njit(nogil=True, cache=True)
def post(ctl, seq):  # pragma: no cover - compiled
    """ctl[POSTED] = seq, released after the job's words the caller wrote (seq: the last one posted + 1)."""
    _store(ctl, POSTED, seq)


@njit(nogil=True, cache=True)
def take_back(ctl, seq):  # pragma: no cover - compiled
    """The caller takes job seq back if no worker started it: whether it did (then the caller runs it)."""
    return _claim(ctl, CLAIMED, seq - 1, seq)


@njit(nogil=True, cache=True)
def wait_done(ctl, seq, polls):  # pragma: no cover - compiled
    """Poll until ctl[DONE] reaches seq, at most `polls` times: whether it did."""
    for _ in range(polls):
        if _load(ctl, DONE) == seq:
            return True
    return _load(ctl, DONE) == seq


@njit(nogil=True, cache=True)
def finish_gemm(ctl, job, seq, polls):  # pragma: no cover - compiled
    """After the caller's own share: run the worker's share seq here if no worker started it (CALLER_DID),
    else poll for it, at most `polls` times (WORKER_DID when it is done, else STILL_RUNNING)."""
    if _claim(ctl, CLAIMED, seq - 1, seq):
        run_job(job)
        return CALLER_DID
    for _ in range(polls):
        if _load(ctl, DONE) == seq:
            return WORKER_DID
    return WORKER_DID if _load(ctl, DONE) == seq else STILL_RUNNING


@njit(nogil=True, cache=True)
def idle_polls(ctl, polls):  # pragma: no cover - compiled
    """`polls` of serve's polls of a ctl nobody posts to (to time one)."""
    return serve(ctl, ctl[:JOB_WORDS], ctl[POSTED], polls, 1 << 62, 0)[0]
