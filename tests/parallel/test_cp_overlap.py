"""Ring attention overlaps its hops with the blocks: a hop's exchange is in flight while the blocks of the
chunk before it are computed, forward (keys and values) and backward (keys and values, and their
gradients' accumulator), so a pass costs about max(hop, block) per hop, not hop + block.

Both halves are stood in for by sleeps, which take no CPU and so hold under a loaded machine: every block
sleeps BLOCK_S before it computes, and every exchange of the threads transport sleeps LINK_S before it moves
(an emulated slow link). Recorded timestamps show each exchange running inside a block's time; the wall
clock of a pass is below the sum of its blocks and hops by at least half a hop. The results stay within
1e-12 of whole attention (float64) under the delays. And in a training step beside data or tensor
parallelism, one thread at a time drives a rank's transport (engine.comm.base's rule), the helper included."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from engine.comm.threads import ThreadCommunicator
from engine.parallel.context import blocks
from engine.parallel.context.hops import IDLE_S
from engine.parallel.context.layout import SequenceLayout
from engine.parallel.context.ring_attention import Ring, ring_attention
from engine.tensor import Tensor
from tests.cp_helpers import full_attention, gather, problem
from tests.cp_train_helpers import cp_config, traffic_rank

BLOCK_S = LINK_S = 0.2  # the two must overlap; generous beside thread start-up under load
T = 12  # contiguous, non-causal: one block per hop on every rank


def _slowed_block(events: list, kind: str, fn):
    """A block after a sleep, its (kind, rank thread, start, end) recorded."""
    def slow(*args, **kwargs):
        start = time.perf_counter()
        time.sleep(BLOCK_S)
        out = fn(*args, **kwargs)
        events.append((kind, threading.get_ident(), start, time.perf_counter()))
        return out
    return slow


def _slow_link(hops: list, exchange):
    """The threads transport's batch exchange after a sleep, its (rank, start, end) recorded (on whichever
    thread drives it)."""
    def slow(self, sends, recvs):
        start = time.perf_counter()
        time.sleep(LINK_S)
        exchange(self, sends, recvs)
        hops.append((self.rank, start, time.perf_counter()))
    return slow


def _rank(comm, emit, arrays: list, threads: dict) -> dict:
    """Ring attention of this rank's slice, forward and backward, each pass timed."""
    threads[threading.get_ident()] = comm.rank
    layout = SequenceLayout("contiguous", comm.world_size)
    q, k, v, g = (layout.local(np.asarray(a), comm.rank, axis=2) for a in arrays)
    tq, tk, tv = (Tensor(a, requires_grad=True) for a in (q, k, v))
    ring = Ring(comm, layout, causal=False)
    t0 = time.perf_counter()
    out = ring_attention(tq, tk, tv, ring)
    t1 = time.perf_counter()
    out.backward(g)
    t2 = time.perf_counter()
    return {"out": out.data, "dq": tq.grad, "dk": tk.grad, "dv": tv.grad, "passes": (t0, t1, t2),
            "positions": layout.positions(q.shape[2] * comm.world_size, comm.rank)}


def _overlapping(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@pytest.mark.parametrize("c", [2, 3])
def test_hops_move_while_the_blocks_compute(c, monkeypatch):
    events: list = []
    links: list = []
    threads: dict[int, int] = {}
    monkeypatch.setattr(blocks, "forward", _slowed_block(events, "forward", blocks.forward))
    monkeypatch.setattr(blocks, "backward", _slowed_block(events, "backward", blocks.backward))
    monkeypatch.setattr(ThreadCommunicator, "_exchange", _slow_link(links, ThreadCommunicator._exchange))
    q, k, v, g = problem((1, 2, T, 4), seed=c)
    ranks = run_ranks(c, "threads", _rank, args=([q, k, v, g], threads), timeout_s=60)

    for key, expected in zip(("out", "dq", "dk", "dv"), full_attention(q, k, v, g, causal=False)):
        np.testing.assert_allclose(gather(ranks, key, T), expected, rtol=1e-12, atol=1e-12)
    for r, result in enumerate(ranks):
        t0, t1, t2 = result["passes"]
        for name, (start, end), hops_before in (("forward", (t0, t1), c - 1), ("backward", (t1, t2), c)):
            done = sorted(e[2:] for e in events if e[0] == name and threads[e[1]] == r)
            hops = [(a, b) for rank, a, b in links if rank == r and start <= a < end]
            assert len(done) == c, (r, name, done)
            # every block but the last has a hop in flight beside it (before: each hop began after its block)
            for block in done[:-1]:
                assert any(_overlapping(block, hop) for hop in hops), (r, name, block, hops)
            # and the pass saves at least half a hop of the serial sum (before: it took at least that sum,
            # its c blocks and its hops_before exchanges one after the other)
            serial = c * BLOCK_S + hops_before * LINK_S
            assert end - start < serial - LINK_S / 2, (r, name, end - start, serial)


def _exclusive(calls: list, violations: list, in_use: dict, lock: threading.Lock, fn):
    """A transport method that notes which thread drives the communicator, and any call made while another
    thread is inside one."""
    def driven(self, *args, **kwargs):
        me = threading.current_thread()
        with lock:
            owner, depth = in_use.get(id(self), (me, 0))
            if owner is not me:
                violations.append((self.rank, owner.name, me.name))
            in_use[id(self)] = (me, depth + 1)
            calls.append(me.name)
        try:
            return fn(self, *args, **kwargs)
        finally:
            with lock:
                owner, depth = in_use[id(self)]
                if depth == 1:
                    del in_use[id(self)]
                else:
                    in_use[id(self)] = (owner, depth - 1)
    return driven


@pytest.mark.parametrize("tensor", [1, 2], ids=["dp2-cp2-zero1", "cp2-tp2"])
def test_one_thread_drives_a_transport_at_a_time(tensor, monkeypatch):
    """A training step with the ring beside data (ZeRO-1) or tensor parallelism: the hops run on the ring's
    helper thread, and no call reaches a rank's transport while another thread is inside one."""
    calls: list = []
    violations: list = []
    in_use: dict = {}
    lock = threading.Lock()
    for name in ("_send", "_recv", "_sendrecv", "_exchange"):
        monkeypatch.setattr(ThreadCommunicator, name,
                            _exclusive(calls, violations, in_use, lock, getattr(ThreadCommunicator, name)))
    cfg = cp_config(4, 2, tensor=tensor, zero=1 if tensor == 1 else 0)
    ranks = run_ranks(4, "threads", traffic_rank, args=(cfg,), timeout_s=60)
    assert all(r["blocks"] > 0 for r in ranks)
    assert violations == []
    assert any(name.startswith("cp-hops-rank") for name in calls)  # the hops' helper drove some of them
    assert any(not name.startswith("cp-hops-rank") for name in calls)  # and the rank threads the rest


def test_the_helper_threads_end_when_idle():
    """A rank's helper is kept between passes and ends IDLE_S after its last hop: a run leaves none behind."""
    q, k, v, g = problem((1, 2, T, 4), seed=5)
    run_ranks(2, "threads", _rank, args=([q, k, v, g], {}), timeout_s=60)
    deadline = time.monotonic() + IDLE_S + 10  # generous: the threads may wait for a core
    while any(t.name.startswith("cp-hops-rank") for t in threading.enumerate()):
        assert time.monotonic() < deadline, [t.name for t in threading.enumerate()]
        time.sleep(0.05)
