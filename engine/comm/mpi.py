"""The ``mpi`` backend: ranks started by mpiexec / srun, bytes moved by mpi4py point-to-point.

Every array travels as raw bytes (MPI.BYTE), so bfloat16 needs no MPI type: its uint16 bit
patterns go through unchanged. Calls use non-blocking requests polled with a short, growing sleep,
so a silent peer raises PeerTimeout instead of hanging and a waiting rank leaves the CPU to the
others. The communicator works on its own duplicate of the MPI communicator, so application MPI
traffic can never match nanoDist's messages.

``native_all_reduce`` is MPI's own Allreduce — the explicitly named alternative algorithm
"mpi-native" (collectives.all_reduce(..., algorithm="mpi-native")). MPI has no float16/bfloat16
reduction, so those are reduced in float32 and rounded back. Its traffic is opaque: the meter
records the buffer handed to MPI under phase "mpi-native" with dst = -1, not bytes on the wire.
``native_all_to_all`` is MPI's own Alltoallv, all-to-all's "mpi-native" (alltoall.py), metered alike:
the bytes handed to MPI for the other ranks, under the caller's phase, dst = -1.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback

import numpy as np
from mpi4py import MPI

from engine.comm import codec, cores
from engine.comm.base import Communicator, PeerTimeout, ProtocolError, Reduce, Signals, StopRequested, blame
from engine.comm.codec import as_sent
from engine.comm.meter import TrafficMeter
from engine.dtypes import LOW_PRECISION

DATA_TAG, EVENT_TAG, DONE_TAG = 11, 12, 13
MAX_RELAY_BYTES = 1 << 28


class MpiCommunicator(Communicator):
    def __init__(self, mpi_comm=None, timeout_s: float = 30.0, meter: TrafficMeter | None = None,
                 signals: Signals | None = None):
        mpi_comm = (mpi_comm if mpi_comm is not None else MPI.COMM_WORLD).Dup()  # collective call
        super().__init__(mpi_comm.Get_rank(), mpi_comm.Get_size(), timeout_s, meter, signals)
        self._mpi = mpi_comm
        self._scratch = np.empty(0, np.uint8)

    def _send(self, dst: int, arr: np.ndarray) -> None:
        self._wait([self._mpi.Isend(_raw(arr), dst, DATA_TAG)], dst, {})

    def _recv(self, src: int, out: np.ndarray, reduce: Reduce | None) -> None:
        target = out if reduce is None else self._scratch_like(out)
        self._wait([self._mpi.Irecv(_raw(target), src, DATA_TAG)], src, {0: out.nbytes})
        if reduce is not None:
            reduce(out.reshape(-1), target)

    def _sendrecv(self, dst: int, send_arr: np.ndarray, src: int, recv_arr: np.ndarray,
                  reduce: Reduce | None) -> None:
        target = recv_arr if reduce is None else self._scratch_like(recv_arr)
        requests = [self._mpi.Irecv(_raw(target), src, DATA_TAG),
                    self._mpi.Isend(_raw(send_arr), dst, DATA_TAG)]
        self._wait(requests, src, {0: recv_arr.nbytes})
        if reduce is not None:
            reduce(recv_arr.reshape(-1), target)

    def _exchange(self, sends: list[tuple[int, np.ndarray]], recvs: list[tuple[int, np.ndarray]]) -> None:
        # receives first (indices 0..), so the sizes checked after the wait are theirs; MPI keeps the
        # order of messages between two ranks in the order they were posted
        requests = [self._mpi.Irecv(_raw(out), src, DATA_TAG) for src, out in recvs]
        requests += [self._mpi.Isend(_raw(arr), dst, DATA_TAG) for dst, arr in sends]
        peer = recvs[0][0] if recvs else sends[0][0]
        self._wait(requests, peer, {i: out.nbytes for i, (_, out) in enumerate(recvs)})

    def _post(self, sends: list[tuple[int, np.ndarray]], recvs: list[tuple[int, np.ndarray]]) -> object:
        requests = [self._mpi.Irecv(_raw(out), src, DATA_TAG) for src, out in recvs]
        requests += [self._mpi.Isend(_raw(arr), dst, DATA_TAG) for dst, arr in sends]
        peer = recvs[0][0] if recvs else sends[0][0]
        return requests, peer, {i: out.nbytes for i, (_, out) in enumerate(recvs)}

    def _test(self, handle: object) -> bool:
        return all(r.Get_status() for r in handle[0])  # type: ignore[index]  # frees none of them

    def _complete(self, handle: object) -> None:
        self._wait(*handle)  # type: ignore[misc]

    def native_all_reduce(self, buf: np.ndarray, op: str = "sum") -> None:
        if op not in ("sum", "avg", "max"):
            raise ValueError(f"unknown reduction {op!r}")
        start = time.perf_counter()
        work = buf.astype(np.float32) if buf.dtype in LOW_PRECISION else buf
        self._mpi.Allreduce(MPI.IN_PLACE, work, op=MPI.MAX if op == "max" else MPI.SUM)
        if op == "avg":
            work /= self.world_size
        if work is not buf:
            buf[...] = work.astype(buf.dtype)
        if self.meter is not None:
            self.meter.record("mpi-native", self.rank, -1, buf.nbytes, time.perf_counter() - start,
                              algorithm="mpi-native")

    def native_all_to_all(self, sends: list[np.ndarray], phase: str) -> list[np.ndarray]:
        """MPI's own Alltoall of the row counts, then Alltoallv of the rows as raw bytes (alltoall.py's
        "mpi-native"): recvs[j], the rows rank j sent here."""
        start = time.perf_counter()
        counts = np.array([len(arr) for arr in sends], np.int64)
        got = np.empty_like(counts)
        self._mpi.Alltoall(counts, got)
        trailing, dtype = sends[0].shape[1:], sends[0].dtype
        row = dtype.itemsize * int(np.prod(trailing))
        out = np.empty(int(got.sum()) * row, np.uint8)
        self._mpi.Alltoallv([np.concatenate([arr.reshape(-1).view(np.uint8) for arr in sends]),
                             [int(n) * row for n in counts], MPI.BYTE],
                            [out, [int(n) * row for n in got], MPI.BYTE])
        recvs = [part.view(dtype).reshape(int(n), *trailing)
                 for part, n in zip(np.split(out, np.cumsum(got * row)[:-1]), got)]
        if self.meter is not None:
            seconds, others = time.perf_counter() - start, self.world_size - 1
            for name, nbytes in ((phase + "-sizes", 8 * others),
                                 (phase, sum(arr.nbytes for j, arr in enumerate(sends) if j != self.rank))):
                self.meter.record(name, self.rank, -1, nbytes, seconds, algorithm="mpi-native")
        return recvs

    def close(self) -> None:
        if self._mpi != MPI.COMM_NULL:
            self._mpi.Free()

    def _scratch_like(self, out: np.ndarray) -> np.ndarray:
        if self._scratch.size < out.nbytes:
            self._scratch = np.empty(out.nbytes, np.uint8)
        return self._scratch[:out.nbytes].view(out.dtype)

    def _wait(self, requests: list, peer: int, expected: dict[int, int]) -> None:
        """Poll until all requests finish; check receive sizes (index -> bytes) afterwards."""
        statuses = [MPI.Status() for _ in requests]
        deadline, pause = time.monotonic() + self.timeout_s, 0.0
        try:
            while not MPI.Request.Testall(requests, statuses):
                self.signals.raise_if_failed()
                if time.monotonic() > deadline:
                    raise PeerTimeout(peer, f"did not answer rank {self.rank} for {self.timeout_s:g} s")
                time.sleep(pause)
                pause = min(pause * 2 or 2e-6, 1e-3)
        except MPI.Exception as exc:  # e.g. truncation: the peer sent more than out holds
            raise ProtocolError(peer, f"MPI error on rank {self.rank}: {exc.Get_error_string()}") from None
        for index, nbytes in expected.items():
            if statuses[index].Get_count(MPI.BYTE) != nbytes:
                raise ProtocolError(peer, f"sent {statuses[index].Get_count(MPI.BYTE)} bytes but rank "
                                          f"{self.rank} expected {nbytes}")


def _raw(arr: np.ndarray) -> list:
    return [arr.reshape(-1).view(np.uint8), MPI.BYTE]


def run_mpi_rank(world_size, rank_fn, args, on_event, timeout_s, signals: Signals,
                 threads_per_rank: int = 0) -> list:
    """Run this process's rank; rank 0 relays every rank's events to on_event and gathers results."""
    world = MPI.COMM_WORLD
    if world.Get_size() != world_size:
        raise ValueError(f"started with {world.Get_size()} MPI ranks but world_size is {world_size}; "
                         f"run mpiexec -n {world_size}")
    comm = MpiCommunicator(world, timeout_s, signals=signals)
    relay_comm = world.Dup()
    rank, lock = comm.rank, threading.Lock()

    def emit(event: dict) -> None:
        if rank == 0:
            with lock:
                on_event(as_sent(event))
        else:
            relay_comm.Send([np.frombuffer(codec.dumps(event), np.uint8), MPI.BYTE], 0, EVENT_TAG)

    relay = _Relay(relay_comm, emit) if rank == 0 else None
    try:
        comm.threads_per_rank = cores.threads_for_peer_rank(comm, "mpi", threads_per_rank)
        cores.apply(comm.threads_per_rank)
        outcome = {"value": rank_fn(comm, emit, *args)}
    except StopRequested:
        outcome = {"value": None}
    except BaseException as exc:  # noqa: BLE001 - MPI cannot stop the peers any other way
        blamed, cause = blame(rank, exc)
        sys.stderr.write(f"nanodist: rank {blamed} failed: {cause}\n{traceback.format_exc()}")
        sys.stderr.flush()
        world.Abort(1)
    comm.close()
    if relay is None:  # rank != 0
        relay_comm.Send([np.frombuffer(codec.dumps(outcome), np.uint8), MPI.BYTE], 0, DONE_TAG)
        return [outcome["value"] if r == rank else None for r in range(world_size)]
    return relay.finish(outcome["value"], timeout_s)


class _Relay(threading.Thread):
    """Rank 0's thread that receives other ranks' events and final results as JSON bytes."""

    def __init__(self, relay_comm, emit):
        super().__init__(name="nanodist-mpi-relay", daemon=True)
        self.comm, self.emit = relay_comm, emit
        self.results: dict[int, object] = {}
        self.start()

    def run(self) -> None:
        status = MPI.Status()
        while len(self.results) < self.comm.Get_size() - 1:
            if not self.comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
                time.sleep(0.002)
                continue
            size, source, tag = status.Get_count(MPI.BYTE), status.Get_source(), status.Get_tag()
            data = np.empty(min(size, MAX_RELAY_BYTES), np.uint8)
            self.comm.Recv([data, MPI.BYTE], source, tag)
            message = codec.loads(data.tobytes())
            if tag == DONE_TAG:
                self.results[source] = message["value"]
            else:
                self.emit(message)

    def finish(self, own_value, timeout_s: float) -> list:
        self.join(timeout_s)
        return [own_value] + [self.results.get(r) for r in range(1, self.comm.Get_size())]
