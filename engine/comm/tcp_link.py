"""One link of the socket transport (engine.comm.tcp) and the state machines of one message over it.

A `Link` is one authenticated TCP connection to a peer (set up by rendezvous.py), with its outgoing bytes,
its received frames and, on the same host, the shared-memory segments both ways. A `SendOp` or `RecvOp` moves
one message a step at a time, never blocking: socket mode sends a DATA frame and the payload (an emulated
link in PACE_BYTES pieces, each when its Pacer releases it); shared-memory mode fills the segment's slots and
sends SHM headers, and the receiver ACKs each slot it has read (reducing straight out of it where asked).
Every header is validated (wire.unpack) before any payload is touched; a bad one raises ProtocolError
naming the peer.
"""

from __future__ import annotations

import collections
import logging
import socket
import time

import numpy as np

from engine.comm import wire
from engine.comm.base import ProtocolError, RankFailure, Reduce, Signals, StopRequested
from engine.comm.emulation import Pacer
from engine.comm.shm import Segment

log = logging.getLogger("nanodist.comm")

DEFAULT_MAX_BYTES = 1 << 34  # 16 GiB per message; collectives send 4 MiB segments
PACE_BYTES = 256 << 10  # an emulated socket-mode link releases its payload in pieces of this size


class Link:
    """The connection to one peer: socket, optional segments, outgoing queue, incoming parser."""

    def __init__(self, me: int, peer: int, sock: socket.socket, signals: Signals,
                 out_seg: Segment | None = None, in_seg: Segment | None = None,
                 max_bytes: int = DEFAULT_MAX_BYTES, pacer: Pacer | None = None):
        sock.setblocking(False)
        self.pacer = pacer  # None: the link is not emulated
        self.me, self.peer, self.sock, self.signals, self.max_bytes = me, peer, sock, signals, max_bytes
        self.out_seg, self.in_seg = out_seg, in_seg
        self.shm = out_seg is not None and in_seg is not None
        self.free: collections.deque[int] = collections.deque(
            range(out_seg.slots) if out_seg is not None and self.shm else ())
        self.tx: collections.deque = collections.deque()
        self.inbox: collections.deque = collections.deque()  # SHM frames not yet consumed
        self.rx_op: RecvOp | None = None
        self.rx_payload = False  # a DATA payload for rx_op is being read
        self._header = bytearray(wire.HEADER.size)
        self._got = 0
        self.bye: int | None = None
        self.eof = False

    def flush(self) -> bool:
        progressed = False
        while self.tx:
            try:
                sent = self.sock.send(self.tx[0])
            except BlockingIOError:
                break
            except OSError:
                self.eof = True
                raise self.closed_error() from None
            progressed = True
            if sent == len(self.tx[0]):
                self.tx.popleft()
            else:
                self.tx[0] = memoryview(self.tx[0])[sent:]
        return progressed

    def read(self) -> bool:
        """Read what is available without blocking; a socket-mode link never reads past rx_op."""
        progressed = False
        while not self.eof:
            if self.rx_payload:
                assert self.rx_op is not None  # rx_payload is set only by rx_op.accept
                if not self.rx_op.read_payload():
                    break
                progressed = True
                continue
            if not self.shm and (self.rx_op is None or self.rx_op.finished):
                break
            try:
                got = self.sock.recv_into(memoryview(self._header)[self._got:])
            except BlockingIOError:
                break
            except OSError:
                got = 0
            if got == 0:
                self.eof = True
                break
            progressed = True
            self._got += got
            if self._got == len(self._header):
                self._got = 0
                self._dispatch()
        return progressed

    def _dispatch(self) -> None:
        try:
            frame = wire.unpack(self._header, self.max_bytes)
        except wire.FrameError as exc:
            raise self.protocol_error(str(exc)) from None
        if frame.kind == wire.BYE:
            self.bye = frame.flags
        elif frame.kind == wire.ACK:
            if not self.shm or self.out_seg is None or frame.slot >= self.out_seg.slots \
                    or frame.slot in self.free:
                raise self.protocol_error(f"acknowledged slot {frame.slot} it does not hold")
            self.free.append(frame.slot)
        elif frame.kind == wire.SHM:
            empty = frame.slot == wire.NO_SLOT and frame.nbytes == 0
            fits = self.shm and self.in_seg is not None and frame.slot < self.in_seg.slots \
                and 0 < frame.nbytes <= self.in_seg.slot_bytes
            if not (self.shm and (empty or fits)):
                raise self.protocol_error(f"shared-memory frame for slot {frame.slot} does not fit")
            self.inbox.append(frame)
        elif self.shm:
            raise self.protocol_error("inline data on a shared-memory link")
        elif self.rx_op is None:  # not reached: read() takes no header in socket mode without a receive
            raise self.protocol_error("a data frame while no receive was waiting")
        else:
            self.rx_op.accept(frame)

    def protocol_error(self, what: str) -> ProtocolError:
        log.error("rank %d: malformed frame from rank %d: %s", self.me, self.peer, what)
        return ProtocolError(self.peer, f"sent a malformed frame to rank {self.me}: {what}")

    def closed_error(self) -> Exception:
        if self.bye == wire.BYE_STOP or self.signals.stop.is_set():
            return StopRequested(f"rank {self.peer} stopped while rank {self.me} waited for it")
        if self.bye == wire.BYE_DONE:
            return RankFailure(self.peer, f"finished while rank {self.me} still expected messages from it")
        return RankFailure(self.peer, "connection closed unexpectedly (the process died or was killed)")


class SendOp:
    def __init__(self, link: Link, arr: np.ndarray):
        self.link, self.dtype, self.shape = link, arr.dtype, arr.shape
        self.bytes = arr.reshape(-1).view(np.uint8)
        self.pos, self.queued, self.headed = 0, False, False
        self.start: float | None = None  # emulated link: when this message's transfer starts
        self.held_until = 0.0  # emulated link: the next piece waits until then (0: not held)

    @property
    def done(self) -> bool:
        return self.queued and not self.link.tx

    @property
    def wants_read(self) -> bool:  # waiting for the peer to free a slot
        return self.link.shm and not self.queued and not self.link.free

    def step(self) -> bool:
        link, progressed = self.link, False
        if link.pacer is not None and self.start is None:
            self.start = link.pacer.begin(self.bytes.size, time.monotonic())
        if self.queued:
            pass
        elif not link.shm:
            progressed = self._queue_payload()
        else:
            if not link.free:
                progressed = link.read()
            progressed |= self._fill_slots()
        return link.flush() or progressed

    def _released(self, end_byte: int) -> bool:
        """Whether bytes up to `end_byte` may go out now (always, on a link that is not emulated)."""
        pacer = self.link.pacer
        if pacer is None or self.start is None:
            return True
        at = pacer.release_at(self.start, end_byte)
        self.held_until = at if time.monotonic() < at else 0.0
        return not self.held_until

    def _queue_payload(self) -> bool:
        """Socket mode: the DATA header, then the payload (in PACE_BYTES pieces on an emulated link)."""
        link, total = self.link, self.bytes.size
        piece = PACE_BYTES if link.pacer is not None else max(total, 1)
        progressed = False
        while not self.queued:
            end = min(total, self.pos + piece)
            if not self._released(end):
                break
            if not self.headed:
                link.tx.append(wire.pack(wire.DATA, self.dtype, self.shape, total))
                self.headed = True
            if end > self.pos:
                link.tx.append(self.bytes[self.pos:end].data)  # ndarray.data: a memoryview of the array
            self.pos, self.queued, progressed = end, end == total, True
        return progressed

    def _fill_slots(self) -> bool:
        link, total = self.link, self.bytes.size
        if total == 0:
            if not self._released(0):
                return False
            link.tx.append(wire.pack(wire.SHM, self.dtype, (0,), 0, wire.FLAG_LAST, wire.NO_SLOT))
            self.queued = True
            return True
        seg = link.out_seg
        assert seg is not None  # only shared-memory links fill slots
        progressed = False
        while self.pos < total and link.free:
            size = min(seg.slot_bytes, total - self.pos)
            if not self._released(self.pos + size):
                break
            slot = link.free.popleft()
            seg.slot(slot, size)[:] = self.bytes[self.pos:self.pos + size]
            self.pos += size
            last = wire.FLAG_LAST if self.pos == total else 0
            link.tx.append(wire.pack(wire.SHM, self.dtype, (size // self.dtype.itemsize,), size, last, slot))
            link.flush()  # the peer starts on this piece while we copy the next one
            progressed = True
        self.queued = self.pos == total
        return progressed


class RecvOp:
    def __init__(self, link: Link, out: np.ndarray, reduce: Reduce | None, scratch: np.ndarray):
        self.link, self.reduce, self.scratch, self.dtype = link, reduce, scratch, out.dtype
        self.flat = out.reshape(-1)
        self.bytes = self.flat.view(np.uint8)
        self.pos = self.fill = 0
        self.finished = False
        self.held_until = 0.0  # receives are never held: the sender paces
        link.rx_op = self

    @property
    def done(self) -> bool:
        return self.finished and not self.link.tx

    @property
    def wants_read(self) -> bool:
        return not self.finished

    def step(self) -> bool:
        link = self.link
        progressed = link.read()
        while link.inbox and not self.finished:
            self._consume(link.inbox.popleft())
            link.flush()  # hand the slot back at once
            progressed = True
        if self.finished and link.rx_op is self:
            link.rx_op = None
        return link.flush() or progressed

    def accept(self, frame: wire.Frame) -> None:
        """A DATA header arrived for this receive: it must describe exactly ``out``."""
        if frame.dtype != self.dtype or frame.nbytes != self.bytes.size:
            raise self.link.protocol_error(f"sent {frame.dtype}{list(frame.shape)} but rank "
                                           f"{self.link.me} expected {self.dtype}[{self.flat.size}]")
        self.link.rx_payload = frame.nbytes > 0
        self.finished = frame.nbytes == 0

    def read_payload(self) -> bool:
        want = min(self.bytes.size - self.pos, self.scratch.size)
        target = self.bytes[self.pos:] if self.reduce is None else self.scratch[self.fill:want]
        try:
            got = self.link.sock.recv_into(target.data)
        except BlockingIOError:
            return False
        except OSError:
            got = 0
        if got == 0:
            self.link.eof = True
            return False
        if self.reduce is None:
            self.pos += got
        else:
            self.fill += got
            if self.fill == want:
                self._reduce(self.scratch[:want])
                self.fill = 0
        if self.pos == self.bytes.size:
            self.finished, self.link.rx_payload = True, False
        return True

    def _consume(self, frame: wire.Frame) -> None:
        end = self.pos + frame.nbytes
        if frame.dtype != self.dtype or end > self.bytes.size or \
                bool(frame.flags & wire.FLAG_LAST) != (end == self.bytes.size):
            raise self.link.protocol_error(f"a piece of {frame.nbytes} bytes of {frame.dtype} does not fit "
                                           f"the expected {self.dtype}[{self.flat.size}]")
        if frame.nbytes:
            assert self.link.in_seg is not None  # SHM frames are accepted only on shared-memory links
            piece = self.link.in_seg.slot(frame.slot, frame.nbytes)
            if self.reduce is None:
                self.bytes[self.pos:end] = piece
                self.pos = end
            else:
                self._reduce(piece)
            self.link.tx.append(wire.pack(wire.ACK, slot=frame.slot))
        self.finished = bool(frame.flags & wire.FLAG_LAST)

    def _reduce(self, piece: np.ndarray) -> None:
        assert self.reduce is not None  # called only for a reduce-on-receive
        start = self.pos // self.dtype.itemsize
        self.reduce(self.flat[start:start + piece.size // self.dtype.itemsize], piece.view(self.dtype))
        self.pos += piece.size
