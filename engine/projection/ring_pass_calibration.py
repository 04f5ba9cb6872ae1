"""What ring attention costs around its blocks, timed on this machine for the projection of context
parallelism (context.py), beside the blocks' own kernels (ring_calibration.py):

    pass     a rank's whole forward and backward ring pass, each hop's exchange a local copy (a loopback
             group): the blocks and merges, and what the kernels alone leave out: K and V paired for the
             trip, widened copies, the accumulators' sums, the helper thread's hand-offs, the Python of the
             loop. The busiest rank's seconds, for each layout.
    hop      with a partner (the calibration's second busy rank), the seconds one hop to it adds to a
             block computed beside it: K and V (or the dK, dV accumulator) posted, a whole block computed,
             the hop waited for, less the same with the hop delivered locally (as in the pass). On a host
             whose cores the ranks fill, the transport's copies and the helper thread take the CPU the block
             would have had, so a hop costs more than the wait a transfer time beside the block predicts.

Neither is a step of context parallelism: the pass never reaches another rank, and the hop is one exchange
beside one block; the projection puts them together with the layout's blocks and hops (context.py).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from engine.comm.base import Communicator
from engine.config.vocabulary import CONTEXT_LAYOUTS
from engine.dtypes import compute_dtype, resolve_dtype
from engine.parallel.context import blocks
from engine.parallel.context.hops import Hops
from engine.parallel.context.layout import SequenceLayout
from engine.parallel.context.ring_attention import Ring, ring_backward, ring_forward
from engine.projection.quantile import low_quantile
from engine.projection.ring_calibration import PHASES

REPEATS = 9
MESSAGES = ("kv", "grad")  # K and V in the training dtype; the dK, dV accumulator in the compute dtype


def pass_key(layout: str, phase: str) -> str:
    return f"ring_{layout}_pass_{phase}_s"


def hop_key(message: str) -> str:
    return f"ring_hop_{message}_s"


class Loopback(Communicator):
    """Rank `rank` of a group of `world_size` whose exchanges deliver each send to the matching receive: a
    hop brings back what was sent (the shapes a ring sends are the ones it receives). Nothing else."""

    def close(self) -> None:
        pass

    def _send(self, dst: int, arr: np.ndarray) -> None:
        raise NotImplementedError("a loopback group only exchanges")

    def _recv(self, src: int, out: np.ndarray, reduce=None) -> None:
        raise NotImplementedError("a loopback group only exchanges")

    def _sendrecv(self, dst: int, send_arr: np.ndarray, src: int, recv_arr: np.ndarray, reduce=None) -> None:
        raise NotImplementedError("a loopback group only exchanges")

    def _exchange(self, sends: list[tuple[int, np.ndarray]], recvs: list[tuple[int, np.ndarray]]) -> None:
        for (_, sent), (_, out) in zip(sends, recvs, strict=True):
            out[...] = sent


def time_ring_passes(rows: int, heads: int, head_dim: int, block_size: int, degree: int, dtype: str,
                     repeats: int = REPEATS) -> dict[str, float]:
    """{pass_key: seconds} of the busiest rank's loopback pass, for every layout, on [rows, heads, s/c,
    head_dim] operands in the training dtype (the ring widens 16-bit ones, as it does in training)."""
    rng, shape = np.random.default_rng(0), (rows, heads, block_size // degree, head_dim)
    q, k, v, g = (rng.standard_normal(shape).astype(resolve_dtype(dtype)) for _ in range(4))
    out: dict[str, float] = {}
    for layout in CONTEXT_LAYOUTS:
        per_rank = [_pass(Ring(Loopback(r, degree), SequenceLayout(layout, degree)), q, k, v, g, repeats)
                    for r in range(degree)]
        for i, phase in enumerate(PHASES):
            out[pass_key(layout, phase)] = max(seconds[i] for seconds in per_rank)
    return out


def _pass(ring: Ring, q, k, v, g, repeats: int) -> tuple[float, float]:
    forward, backward = [], []
    for _ in range(repeats + 1):  # the first a warm-up
        t0 = time.perf_counter()
        o, lse = ring_forward(ring, q, k, v, count=False)
        t1 = time.perf_counter()
        ring_backward(ring, q, k, v, o, lse, g)
        forward.append(t1 - t0)
        backward.append(time.perf_counter() - t1)
    return low_quantile(forward[1:]), low_quantile(backward[1:])


def time_hops(comm, rows: int, heads: int, head_dim: int, block_size: int, degree: int, dtype: str,
              repeats: int = REPEATS) -> dict[str, float]:
    """{hop_key: seconds} one hop of each message adds to a whole block of s/c tokens computed beside it,
    every rank of `comm` doing the same at once: the median with the hop to the next rank less the median
    with the same hop delivered locally (what the whole pass above already holds), at least 0."""
    rng = np.random.default_rng(comm.rank)
    cdt = compute_dtype(dtype)
    tokens = block_size // degree
    q, k, v = (rng.standard_normal((rows, heads, tokens, head_dim)).astype(cdt) for _ in range(3))
    kv = np.zeros((2, rows, heads, tokens, head_dim), resolve_dtype(dtype))
    message = {"kv": kv, "grad": np.zeros(kv.shape, cdt)}
    seconds: dict[tuple[str, bool], list[float]] = {(m, real): [] for m in MESSAGES for real in (True, False)}
    with Hops(comm) as real_hops, Hops(Loopback(comm.rank, comm.world_size)) as local_hops:
        for i in range(repeats + 1):  # the first a warm-up
            for name, real in seconds:
                comm.barrier()
                t0 = time.perf_counter()
                hop = (real_hops if real else local_hops).post([message[name]], ["calibration"])
                blocks.forward(q, k, v, False)
                hop.wait()
                if i:
                    seconds[name, real].append(time.perf_counter() - t0)
    return {hop_key(m): max(0.0, statistics.median(seconds[m, True]) - statistics.median(seconds[m, False]))
            for m in MESSAGES}
