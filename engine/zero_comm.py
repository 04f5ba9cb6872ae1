"""What the replicas share for communication: a per-rank communication thread, and gradient buckets
whose sizes are multiples of the world size, so each bucket splits into N equal parts.

Why aligned buckets: a bucket's reduce-scatter (engine.comm.collectives) leaves rank r with part r of
the bucket, and the all-gather after the optimizer step fills the bucket from those same parts. If every
bucket's length is a multiple of N the parts are equal, nothing is padded on the wire, and the rank
owns exactly part r of every bucket: that union is its shard of gradients and optimizer state (the
layout of Megatron's distributed optimizer). Bucket boundaries are the parameter boundaries of
`FlatBuffer.buckets` snapped down to a multiple of N, so a parameter may straddle two buckets; a
bucket is ready when every parameter overlapping it has its gradient.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from engine import memory


class Bucket(NamedTuple):
    """Elements [start, end) of a flat buffer; `members` = indices of the parameters overlapping it."""
    start: int
    end: int
    members: tuple[int, ...]


def aligned_buckets(flat, cap_bytes: float, world: int) -> list[Bucket]:
    """Buckets tiling the padded buffer (its size is a multiple of world), in reverse parameter order
    (the order backward produces gradients), each of a length that is a multiple of world."""
    if flat.size % world:
        raise ValueError(f"buffer of {flat.size} elements does not split into {world} parts")
    cuts = sorted({start - start % world for start, _ in flat.buckets(cap_bytes)} | {flat.size})
    buckets = []
    for start, end in zip(cuts[:-1], cuts[1:]):
        members = tuple(i for i, s in enumerate(flat.slots) if s.start < end and s.end > start)
        buckets.append(Bucket(start, end, members))
    return buckets[::-1]


def part(start: int, end: int, rank: int, world: int) -> tuple[int, int]:
    """Rank's equal part of [start, end) (length a multiple of world): what reduce-scatter leaves it."""
    n = (end - start) // world
    return start + rank * n, start + (rank + 1) * n


def rank_ledger():
    """The calling thread's memory ledger, or one that ignores everything. Replicas capture it at
    construction, because their communication thread reports to it too."""
    return memory.current() or _NoLedger()


class _NoLedger:
    def add(self, category: str, nbytes: int) -> None:
        pass

    sub = hold = add


class Job:
    """One submitted communication job; wait() blocks until it ran and re-raises its error."""

    def __init__(self, fn: Callable[[], None]):
        self.fn = fn
        self.done = threading.Event()
        self.error: BaseException | None = None

    def wait(self) -> None:
        self.done.wait()
        if self.error is not None:
            raise self.error


class CommWorker:
    """Runs communication jobs in submission order on one thread per rank, off the training thread.

    Every rank submits the same jobs in the same order (buckets and layers in a fixed order), so the
    collectives inside them match up across ranks. Nothing else may drive the communicator while jobs
    are pending: callers `wait_all()` before running collectives themselves. With one rank (or
    `inline=True`) jobs run at once on the caller's thread. After a failure the remaining jobs are
    skipped and every wait re-raises the first error.
    """

    def __init__(self, rank: int, inline: bool = False):
        self._error: BaseException | None = None
        self._pending: list[Job] = []
        self._thread = None
        if not inline:
            self._queue: queue.Queue = queue.Queue()
            self._thread = threading.Thread(target=self._run, name=f"comm-rank{rank}", daemon=True)
            self._thread.start()

    def submit(self, fn: Callable[[], None]) -> Job:
        job = Job(fn)
        if self._thread is None:
            self._execute(job)
            job.wait()
        else:
            self._pending = [j for j in self._pending if not j.done.is_set()]
            self._pending.append(job)
            self._queue.put(job)
        return job

    @staticmethod
    def throttle(inflight: list[Job], limit: int) -> float:
        """Wait until fewer than `limit` of the caller's `inflight` jobs are unfinished (call it before
        allocating the next buffer: at most `limit` communication buffers are alive). Returns the
        seconds waited."""
        t0 = time.perf_counter()
        while len(inflight) >= limit:
            inflight.pop(0).wait()
        return time.perf_counter() - t0

    def wait_all(self) -> None:
        pending, self._pending = self._pending, []
        for job in pending:
            job.done.wait()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            self._execute(job)

    def _execute(self, job: Job) -> None:
        try:
            if self._error is None:
                job.fn()
        except BaseException as e:  # handed to the training thread by wait()
            self._error = e
        finally:
            job.error = self._error
            job.done.set()
