"""The socket transport behind the ``processes`` and ``tcp`` backends.

One authenticated TCP connection per pair of ranks (set up by rendezvous.py). Each call runs a
small non-blocking event loop over the links it touches, so ``sendrecv`` writes and reads at
once and a ring never deadlocks. Two link modes, chosen per link when it is set up:

* socket: a DATA frame (fixed header, wire.py) followed by the payload. The receiver reads the
  payload straight into ``out``, or with reduce-on-receive into a 1 MiB scratch buffer that is
  reduced piece by piece while the rest is still arriving.
* shared memory (same host): the payload goes through slots of the sender's segment (shm.py);
  the socket carries only SHM and ACK headers. The receiver reduces straight out of the slot.

Every header is validated (wire.unpack) before any payload is touched; a bad one raises
ProtocolError naming the peer. Nothing is allocated from a peer-supplied length.

Network emulation (emulation.py): a link with a `Pacer` holds each outgoing piece (a slot, or PACE_BYTES
of a socket payload) until the emulated wire would have delivered it; a held call sleeps in select
until then, and holding counts as progress, so an emulated slow link never trips the timeout.

Progress (progress.py): with a board (the processes backend maps one), every piece that moves bumps this
rank's beats, a blocked call says whom it waits on, and its timeout restarts while the end of its chain
of waits is still making progress; without one (tcp across hosts) only this call's own progress counts.
"""

from __future__ import annotations

import collections
import select
import socket
import time
from collections.abc import Callable

import numpy as np

from engine.comm import wire
from engine.comm.base import (
    Communicator,
    PeerTimeout,
    RankFailure,
    Reduce,
    Signals,
    StopRequested,
)
from engine.comm.emulation import NetworkEmulation, Pacer
from engine.comm.meter import TrafficMeter
from engine.comm.progress import Board, Watch
from engine.comm.tcp_link import Link, RecvOp, SendOp

SCRATCH_BYTES = 1 << 20
_POLL_S = 0.1  # how often a blocked call rechecks the job's failure flag


class _InOrder:
    """Messages over one link in one direction, one after another, as one op of `_run`: a shared-memory
    link's slots and a socket link's receive serve one message at a time, so the next one starts only once
    the one before is queued (a send) or has fully arrived (a receive). `start(i)` makes message i's op."""

    def __init__(self, link: Link, count: int, start: Callable[[int], SendOp | RecvOp]):
        self.link, self._start, self._count = link, start, count
        self._next = 1
        self._op = start(0)

    @property
    def done(self) -> bool:
        return self._next == self._count and self._op.done

    @property
    def wants_read(self) -> bool:
        return self._op.wants_read

    @property
    def held_until(self) -> float:
        return self._op.held_until

    def step(self) -> bool:
        progressed = self._op.step()
        while self._next < self._count and (self._op.queued if isinstance(self._op, SendOp)
                                            else self._op.finished):
            self._op = self._start(self._next)
            self._next += 1
            progressed = self._op.step() or progressed
        return progressed


class _Ticket:
    """One message of a posted batch: done once its op is."""
    done = False


class _Chain:
    """Messages posted (TcpCommunicator._post) over one link in one direction, over any number of batches:
    one after another, as _InOrder, the next one started once the one before is queued (a send) or has fully
    arrived (a receive); each message's ticket done when its own op is. Posted batches stay here between
    calls, and every step moves all of them."""

    def __init__(self, link: Link, start: Callable[[np.ndarray], SendOp | RecvOp]):
        self.link, self._start = link, start
        self.waiting: collections.deque[tuple[np.ndarray, _Ticket]] = collections.deque()  # not started
        self.active: list[tuple[SendOp | RecvOp, _Ticket]] = []  # started, not done

    def add(self, arr: np.ndarray) -> _Ticket:
        ticket = _Ticket()
        self.waiting.append((arr, ticket))
        return ticket

    @property
    def done(self) -> bool:
        return not self.waiting and not self.active

    @property
    def wants_read(self) -> bool:
        return any(op.wants_read for op, _ in self.active)

    @property
    def held_until(self) -> float:
        return min((op.held_until for op, _ in self.active if op.held_until), default=0.0)

    def step(self) -> bool:
        progressed = False
        for op, _ in self.active:
            progressed |= op.step()
        while self.waiting and (not self.active or _released(self.active[-1][0])):
            arr, ticket = self.waiting.popleft()
            op = self._start(arr)
            self.active.append((op, ticket))
            progressed |= op.step()
        for op, ticket in self.active:
            ticket.done = op.done
        self.active = [(op, ticket) for op, ticket in self.active if not ticket.done]
        return progressed


def _released(op: SendOp | RecvOp) -> bool:
    """Whether the next message over the same link and direction may start."""
    return op.queued if isinstance(op, SendOp) else op.finished


class TcpCommunicator(Communicator):
    def __init__(self, rank: int, world_size: int, links: dict[int, Link], timeout_s: float = 30.0,
                 meter: TrafficMeter | None = None, signals: Signals | None = None,
                 emulation: NetworkEmulation | None = None):
        super().__init__(rank, world_size, timeout_s, meter, signals)
        self.links = links
        self.emulation = emulation  # what the links' pacers emulate (None: a real network)
        if emulation is not None:
            for peer, link in links.items():
                shape = emulation.shape(rank, peer)
                link.pacer = Pacer(shape) if shape is not None else None
        self._scratch = np.empty(SCRATCH_BYTES, np.uint8)
        self._closed = False
        self.board: Board | None = None  # the job's progress board, where its ranks share one
        self._chains: dict[tuple[int, bool], _Chain] = {}  # (peer, sending) -> posted messages

    def _send(self, dst: int, arr: np.ndarray) -> None:
        self._run([SendOp(self.links[dst], arr)])

    def _recv(self, src: int, out: np.ndarray, reduce: Reduce | None) -> None:
        self._run([RecvOp(self.links[src], out, reduce, self._scratch)])

    def _sendrecv(self, dst: int, send_arr: np.ndarray, src: int, recv_arr: np.ndarray,
                  reduce: Reduce | None) -> None:
        self._run([SendOp(self.links[dst], send_arr), RecvOp(self.links[src], recv_arr, reduce,
                                                                self._scratch)])

    def _exchange(self, sends: list[tuple[int, np.ndarray]], recvs: list[tuple[int, np.ndarray]]) -> None:
        """One event loop over the whole batch: a chain of messages per link and direction."""
        by_link: dict[tuple[int, bool], list[np.ndarray]] = {}
        for peer, arr in sends:
            by_link.setdefault((peer, True), []).append(arr)
        for peer, out in recvs:
            by_link.setdefault((peer, False), []).append(out)
        ops = []
        for (peer, sending), arrays in by_link.items():
            link = self.links[peer]

            def start(i: int, link: Link = link, arrays: list[np.ndarray] = arrays,
                      sending: bool = sending) -> SendOp | RecvOp:
                return SendOp(link, arrays[i]) if sending else RecvOp(link, arrays[i], None, self._scratch)
            ops.append(_InOrder(link, len(arrays), start))
        self._run(ops)

    def _post(self, sends: list[tuple[int, np.ndarray]], recvs: list[tuple[int, np.ndarray]]) -> object:
        tickets = [self._chain(peer, True).add(arr) for peer, arr in sends]
        tickets += [self._chain(peer, False).add(out) for peer, out in recvs]
        self._progress()
        return tickets

    def _test(self, handle: object) -> bool:
        self._progress()
        return all(t.done for t in handle)  # type: ignore[attr-defined]

    def _complete(self, handle: object) -> None:
        """The event loop over every posted message until the batch's are done."""
        if not all(t.done for t in handle):  # type: ignore[attr-defined]
            self._run([c for c in self._chains.values() if not c.done],
                      until=lambda: all(t.done for t in handle))  # type: ignore[attr-defined]

    def _progress(self) -> None:
        if self._closed:
            raise RuntimeError(f"rank {self.rank}: communicator already closed")
        if any(chain.step() for chain in list(self._chains.values())) and self.board is not None:
            self.board.beat(self.rank)

    def _chain(self, peer: int, sending: bool) -> _Chain:
        if (peer, sending) not in self._chains:
            link = self.links[peer]

            def start(arr: np.ndarray) -> SendOp | RecvOp:
                return SendOp(link, arr) if sending else RecvOp(link, arr, None, self._scratch)
            self._chains[peer, sending] = _Chain(link, start)
        return self._chains[peer, sending]

    def _run(self, ops: list, until: Callable[[], bool] | None = None) -> None:
        """Step `ops` until all are done (or `until()` holds), sleeping in select while nothing moves."""
        if self._closed:
            raise RuntimeError(f"rank {self.rank}: communicator already closed")
        watch, board = Watch(self.board, self.timeout_s), self.board
        timed_out = False
        try:
            while True:
                progressed = False
                for op in ops:
                    progressed |= op.step()
                if progressed and board is not None:
                    board.beat(self.rank)
                if until() if until is not None else all(op.done for op in ops):
                    return
                held = [op.held_until for op in ops if op.held_until and not op.done]
                if progressed or held:  # an emulated link holding bytes back is not a silent peer
                    watch.moved()
                if progressed:
                    continue
                self.signals.raise_if_failed()
                for op in ops:
                    if op.link.eof and not op.done and not op.link.inbox:
                        raise op.link.closed_error()
                peer = next(op for op in reversed(ops) if not op.done).link.peer
                if board is not None:
                    board.wait_on(self.rank, peer)
                if watch.expired(peer):
                    # name the end of the chain of waits, not a healthy peer that waits on it too: the
                    # launcher may not hear that peer's own timeout before it has to name someone
                    culprit = peer if board is None else board.chain_end(peer)
                    raise PeerTimeout(culprit, f"did not answer rank {self.rank} for {self.timeout_s:g} s")
                readers = [op.link.sock for op in ops if op.wants_read]
                writers = [op.link.sock for op in ops if op.link.tx]
                wait = min(max(watch.remaining(), 0.0), _POLL_S,
                           *(max(0.0, at - time.monotonic()) for at in held))
                select.select(readers, writers, [], wait)
        except PeerTimeout:
            timed_out = True  # stays marked as waiting on the peer: a rank timing out later follows the chain
            raise
        finally:
            if board is not None and not timed_out:
                board.done_waiting(self.rank)

    def network_report(self) -> dict:
        """What the emulation added on this rank's links: {"network": its one-line description (""
        for a real network), "links": [{peer, messages, bytes, wire_s}] for every emulated link}."""
        links = [{"peer": peer, **link.pacer.report()} for peer, link in sorted(self.links.items())
                 if link.pacer is not None]
        return {"network": self.emulation.describe() if self.emulation else "", "links": links}

    def close(self) -> None:
        """Say goodbye to every peer; when the job is healthy, first wait (up to timeout_s) until
        the peers have taken every slot we filled, so no message is lost in the teardown."""
        if self._closed:
            return
        self._closed = True
        reason = wire.BYE_STOP if self.should_stop() else wire.BYE_DONE
        healthy = self.signals.failure is None
        deadline = time.monotonic() + self.timeout_s
        for link in self.links.values():
            link.tx.append(wire.pack(wire.BYE, flags=reason))
        for link in self.links.values():
            try:
                all_slots = link.out_seg.slots if link.shm and link.out_seg is not None else 0
                while healthy and not link.eof and time.monotonic() < deadline and \
                        (link.tx or len(link.free) < all_slots):
                    if not (link.flush() | (link.shm and link.read())):
                        select.select([link.sock] if link.shm else [], [link.sock] if link.tx else [],
                                      [], _POLL_S)
                link.flush()
            except (RankFailure, StopRequested, OSError):
                pass
            _shut(link.sock)
            for segment in (link.out_seg, link.in_seg):
                if segment is not None:
                    segment.close()


def _shut(sock: socket.socket) -> None:
    """Close without a reset: unread bytes left in the receive queue would make the kernel send RST,
    which can destroy data the peer has not read yet."""
    try:
        while sock.recv(1 << 16):
            pass
    except OSError:
        pass
    sock.close()
