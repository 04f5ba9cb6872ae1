"""The point-to-point interface every transport implements, and the errors a rank can raise.

Rules every backend keeps (tests/comm/test_comm_conformance.py checks them on each one):

* Ordering: messages between one (src, dst) pair arrive in the order they were sent (FIFO).
  Messages from different sources are independent of each other.
* Matching: a message is taken by exactly one ``recv`` (or the receive half of a ``sendrecv``)
  whose ``out`` has the same dtype and number of elements; a mismatch raises ProtocolError.
* Buffer ownership: ``send`` returns before the peer has received only if the transport copied
  the bytes first, so once ``send`` returns the caller may overwrite its array. ``recv`` writes
  into ``out`` (preallocated, C-contiguous) and returns when all of it has arrived.
* ``sendrecv(dst, a, src, b)`` sends ``a`` while it receives ``b``: a ring of ranks all calling it
  at once never deadlocks. A plain ``send`` of a large message may block until the peer receives
  it (TCP), so two ranks must never ``send`` to each other at the same time: use ``sendrecv``.
* Reduce-on-receive: ``recv``/``sendrecv`` accept ``reduce(acc, incoming)``. Instead of copying,
  the transport calls it on flat, element-aligned pieces of ``out`` as they land, so collectives
  reduce straight out of a shared-memory slot or socket buffer, overlapping the reduction with
  the rest of the transfer. ``incoming`` is only valid during the call.
* Thread-safety: one thread drives a communicator at a time (DDP drives it from its per-rank
  communication thread; nothing else may call it meanwhile). ``should_stop()`` and the meter may
  be read from any thread.
* Failure: a blocking call gives up after ``timeout_s`` without progress (PeerTimeout naming the
  silent peer) and raises RankFailure promptly once another rank of the job has failed.
* Stop: ``should_stop()`` turns True when the launcher is asked to stop (UI stop, Ctrl-C). A call
  blocked on a peer that has already left because of that stop raises StopRequested.
* Pause: ``should_pause()`` is True while the launcher is asked to hold the job (the trainer then
  waits after its step, engine.trainer); it never interrupts a call.
* Metering: every send (and the send half of every sendrecv) is reported to ``meter``, if set, as
  ``meter.record(phase, src, dst, nbytes, seconds, group)`` with the meter's current labels, global
  ranks and the communicator's ``name`` ("world", or a process group's); ``nbytes`` is the payload
  (fixed frame headers and acknowledgements are not counted).
* Groups: engine.comm.group.Group is a Communicator over a subset of another's ranks that moves its
  bytes through the parent's transport; ``global_rank(r)`` maps one of its ranks to the job's.
"""

from __future__ import annotations

import threading
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np

from engine.comm.meter import WORLD, TrafficMeter, metered

Reduce = Callable[[np.ndarray, np.ndarray], None]


class RankFailure(RuntimeError):
    """Rank ``rank`` failed (raised, died, or stopped answering); ``cause`` says how, in one line."""

    def __init__(self, rank: int, cause: str):
        super().__init__(f"rank {rank} failed: {cause}")
        self.rank = rank
        self.cause = cause


class PeerTimeout(RankFailure):
    """Nothing arrived from (or could be sent to) rank ``rank`` within the timeout."""


class ProtocolError(RankFailure):
    """Rank ``rank`` sent a frame that breaks the protocol (bad header, wrong size or dtype)."""


class StopRequested(Exception):
    """The job was asked to stop and a peer this rank waits on has already left."""


def error_line(exc: BaseException) -> str:
    """The last line of a traceback, e.g. "ValueError: boom" — what a failure message names."""
    lines = traceback.format_exception_only(type(exc), exc)
    return lines[-1].strip() if lines else type(exc).__name__


def blame(rank: int, exc: BaseException) -> tuple[int, str]:
    """Which rank an exception raised on ``rank`` points at, and why."""
    if isinstance(exc, RankFailure):
        return exc.rank, exc.cause
    return rank, error_line(exc)


class Signals:
    """Stop, pause and failure flags shared by every communicator of a job that lives in one process."""

    def __init__(self, stop_event: threading.Event | None = None, pause_event: threading.Event | None = None):
        self.stop = stop_event if stop_event is not None else threading.Event()
        self.pause = pause_event if pause_event is not None else threading.Event()
        self.failure: tuple[int, str] | None = None
        self._lock = threading.Lock()

    def fail(self, rank: int, cause: str) -> bool:
        """Record the job's first failure; later ones are consequences. True if this one was first."""
        with self._lock:
            if self.failure is not None:
                return False
            self.failure = (rank, cause)
            return True

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            raise RankFailure(*self.failure)


class Communicator(ABC):
    """Rank ``rank`` of ``world_size``; a transport implements ``_send``, ``_recv``, ``_sendrecv``
    and ``close``."""

    name = WORLD  # what the meter books this communicator's traffic under

    def __init__(self, rank: int, world_size: int, timeout_s: float = 30.0,
                 meter: TrafficMeter | None = None, signals: Signals | None = None):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world of size {world_size}")
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = float(timeout_s)
        self.meter = meter
        self.signals = signals if signals is not None else Signals()
        self.threads_per_rank = 0  # run_ranks sets this rank's share of the host's cores (cores.py)

    def global_rank(self, rank: int) -> int:
        """The job-wide rank of this communicator's rank ``rank`` (the identity, but in a group)."""
        return rank

    def should_stop(self) -> bool:
        """True once the launcher was asked to stop; poll it between steps and return from rank_fn."""
        return self.signals.stop.is_set()

    def should_pause(self) -> bool:
        """True while the launcher is asked to hold the job; poll it between steps."""
        return self.signals.pause.is_set()

    def send(self, dst: int, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr)
        self._check_peer(dst)
        start = time.perf_counter()
        self._send(dst, arr)
        self._record(dst, arr.nbytes, start)

    def recv(self, src: int, out: np.ndarray, reduce: Reduce | None = None) -> None:
        self._check_peer(src)
        _check_out(out)
        self._recv(src, out, reduce)

    def sendrecv(self, dst: int, send_arr: np.ndarray, src: int, recv_arr: np.ndarray,
                 reduce: Reduce | None = None) -> None:
        send_arr = np.ascontiguousarray(send_arr)
        self._check_peer(dst)
        self._check_peer(src)
        _check_out(recv_arr)
        start = time.perf_counter()
        self._sendrecv(dst, send_arr, src, recv_arr, reduce)
        self._record(dst, send_arr.nbytes, start)

    def barrier(self) -> None:
        """Dissemination barrier: ceil(log2 N) rounds of one-byte sendrecv, no rank leaves early."""
        token, incoming = np.zeros(1, np.uint8), np.zeros(1, np.uint8)
        with metered(self.meter, "barrier", "dissemination"):
            distance = 1
            while distance < self.world_size:
                self.sendrecv((self.rank + distance) % self.world_size, token,
                              (self.rank - distance) % self.world_size, incoming)
                distance *= 2

    @abstractmethod
    def close(self) -> None:
        """Release the transport; tells peers whether this rank finished or stopped on request."""

    @abstractmethod
    def _send(self, dst: int, arr: np.ndarray) -> None: ...

    @abstractmethod
    def _recv(self, src: int, out: np.ndarray, reduce: Reduce | None) -> None: ...

    @abstractmethod
    def _sendrecv(self, dst: int, send_arr: np.ndarray, src: int, recv_arr: np.ndarray,
                  reduce: Reduce | None) -> None: ...

    def _exchange(self, sends: list[tuple[int, np.ndarray]], recvs: list[tuple[int, np.ndarray]]) -> None:
        """Post every send and receive at once, return when all are done (engine.comm.exchange)."""
        raise NotImplementedError(f"{type(self).__name__} has no batched exchange")

    # Non-blocking batches (engine.comm.exchange.post): `_post` starts a batch and returns a handle, `_test`
    # says whether it is complete, `_complete` returns once it is, and `_progress` moves what it can of
    # every posted batch without blocking. Batches between two ranks keep their order, as messages do, and
    # completing one moves every batch posted (so two ranks never wait on each other's unmoved sends). One
    # thread posts and completes a communicator's batches. This default is blocking: the batch is exchanged
    # at once and the handle is already complete (the transports that can do better override all four).

    def _post(self, sends: list[tuple[int, np.ndarray]], recvs: list[tuple[int, np.ndarray]]) -> object:
        self._exchange(sends, recvs)
        return None

    def _test(self, handle: object) -> bool:
        return True

    def _complete(self, handle: object) -> None:
        return None  # complete since its post

    def _progress(self) -> None:
        return None  # nothing is ever left to move

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.world_size or peer == self.rank:
            raise ValueError(f"rank {self.rank}: invalid peer {peer} (world size {self.world_size})")

    def _record(self, dst: int, nbytes: int, start: float) -> None:
        if self.meter is not None:
            self.meter.record(self.meter.current_phase, self.global_rank(self.rank), self.global_rank(dst),
                              nbytes, time.perf_counter() - start, self.name)


def _check_out(out: np.ndarray) -> None:
    if not (isinstance(out, np.ndarray) and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("recv needs a preallocated, writeable, C-contiguous numpy array")
