"""The ``threads`` backend: N ranks as threads of one process, exchanging copies through mailboxes.

A send copies the array into the (src, dst) mailbox and returns; a receive waits for the head of
that mailbox. The group shares one Signals object, so the first rank that fails wakes every
blocked rank at once, and each wait also gives up after ``timeout_s`` without progress (PeerTimeout;
progress.py's rule: a peer computing slowly, or starved of a core, keeps it waiting). The group knows
who waits on whom (its progress board), so a timeout blames the rank at the end of the chain of waits —
the one that stopped making progress — not a healthy rank that was itself waiting on it.
"""

from __future__ import annotations

import collections
import threading

import numpy as np

from engine.comm.base import (
    Communicator,
    PeerTimeout,
    ProtocolError,
    RankFailure,
    Reduce,
    Signals,
    StopRequested,
)
from engine.comm.meter import TrafficMeter
from engine.comm.progress import Board, Watch

_POLL_S = 0.1  # how often a blocked receive rechecks the group's failure flag


class ThreadGroup:
    """The shared state of one job: mailboxes, who has closed, and the stop/failure signals."""

    def __init__(self, world_size: int, timeout_s: float = 30.0, signals: Signals | None = None):
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.signals = signals if signals is not None else Signals()
        self._mailboxes: dict[tuple[int, int], collections.deque[np.ndarray]] = {
            (s, d): collections.deque() for s in range(world_size) for d in range(world_size) if s != d}
        self._arrived = [threading.Condition() for _ in range(world_size)]
        self._closed: dict[int, bool] = {}  # rank -> it closed because of a stop request
        self.board = Board.local(world_size)  # beats, and who waits on whom

    def communicator(self, rank: int, meter: TrafficMeter | None = None) -> ThreadCommunicator:
        """Rank `rank`'s communicator; call it on the rank's own thread (its CPU time is its progress)."""
        self.board.register(rank)
        return ThreadCommunicator(self, rank, meter)

    def fail(self, rank: int, cause: str) -> None:
        """Mark the job failed and wake every rank blocked in a receive."""
        self.signals.fail(rank, cause)
        self._wake_all()

    def _wake_all(self) -> None:
        for cond in self._arrived:
            with cond:
                cond.notify_all()

    def _post(self, src: int, dst: int, arr: np.ndarray) -> None:
        self.board.beat(src)
        with self._arrived[dst]:
            self._mailboxes[(src, dst)].append(arr.copy())
            self._arrived[dst].notify_all()

    def _take(self, src: int, dst: int) -> np.ndarray:
        mailbox, cond = self._mailboxes[(src, dst)], self._arrived[dst]
        watch = Watch(self.board, self.timeout_s)
        with cond:
            self.board.wait_on(dst, src)
            try:
                while not mailbox:
                    self.signals.raise_if_failed()
                    if src in self._closed:
                        if self._closed[src] or self.signals.stop.is_set():
                            raise StopRequested(f"rank {src} stopped while rank {dst} waited for it")
                        raise RankFailure(src, f"finished while rank {dst} still expected a message from it")
                    if watch.expired(src):
                        raise self._timeout(src, dst)
                    cond.wait(min(max(watch.remaining(), 0.0), _POLL_S))
            except PeerTimeout:
                raise  # still marked as waiting on src: a rank timing out later follows the chain past us
            except BaseException:
                self.board.done_waiting(dst)
                raise
            self.board.done_waiting(dst)
            self.board.beat(dst)
            return mailbox.popleft()

    def _try_take(self, src: int, dst: int) -> np.ndarray | None:
        """The head of the (src, dst) mailbox if a message is there, else None (never waits)."""
        with self._arrived[dst]:
            mailbox = self._mailboxes[(src, dst)]
            if not mailbox:
                return None
            self.board.beat(dst)
            return mailbox.popleft()

    def _timeout(self, src: int, dst: int) -> PeerTimeout:
        """Blame the end of the chain dst -> src -> (whom src waits on) -> ...: the rank that is not
        waiting on anyone stopped communicating (in a cycle of waits, `src`)."""
        chain, culprit = [dst], src
        while (further := self.board.waiting(culprit)) is not None and culprit not in chain:
            chain.append(culprit)
            culprit = further
        if culprit in chain:
            culprit, chain = src, [dst]
        waited = ", ".join(map(str, chain))
        ranks = f"rank{'s' * (len(chain) > 1)} {waited}"
        return PeerTimeout(culprit, f"made no progress for {self.timeout_s:g} s ({ranks} waited on it)")

    def _close(self, rank: int) -> None:
        self._closed[rank] = self.signals.stop.is_set()
        self._wake_all()


class ThreadCommunicator(Communicator):
    def __init__(self, group: ThreadGroup, rank: int, meter: TrafficMeter | None = None):
        super().__init__(rank, group.world_size, group.timeout_s, meter, group.signals)
        self._group = group
        self._posted: dict[int, collections.deque[list]] = {}  # src -> posted receives [out, done], in order

    def close(self) -> None:
        self._group._close(self.rank)

    def _send(self, dst: int, arr: np.ndarray) -> None:
        self.signals.raise_if_failed()
        self._group._post(self.rank, dst, arr)

    def _recv(self, src: int, out: np.ndarray, reduce: Reduce | None) -> None:
        self._deliver(src, self._group._take(src, self.rank), out, reduce)

    def _deliver(self, src: int, message: np.ndarray, out: np.ndarray, reduce: Reduce | None) -> None:
        if message.dtype != out.dtype or message.size != out.size:
            raise ProtocolError(src, f"sent {message.dtype}[{message.size}] but rank {self.rank} "
                                     f"expected {out.dtype}[{out.size}]")
        if reduce is None:
            np.copyto(out.reshape(-1), message.reshape(-1))
        else:
            reduce(out.reshape(-1), message.reshape(-1))

    def _sendrecv(self, dst: int, send_arr: np.ndarray, src: int, recv_arr: np.ndarray,
                  reduce: Reduce | None) -> None:
        self._send(dst, send_arr)  # never blocks: the mailbox holds a copy
        self._recv(src, recv_arr, reduce)

    def _exchange(self, sends: list[tuple[int, np.ndarray]], recvs: list[tuple[int, np.ndarray]]) -> None:
        for dst, arr in sends:  # copies into mailboxes: none blocks, so the receives below cannot deadlock
            self._send(dst, arr)
        for src, out in recvs:
            self._recv(src, out, None)

    def _post(self, sends: list[tuple[int, np.ndarray]], recvs: list[tuple[int, np.ndarray]]) -> object:
        """The sends are copies in the mailboxes at once (complete); the receives wait in order per source."""
        for dst, arr in sends:
            self._send(dst, arr)
        handle = []
        for src, out in recvs:
            entry = [src, out, False]
            self._posted.setdefault(src, collections.deque()).append(entry)
            handle.append(entry)
        self._progress()
        return handle

    def _test(self, handle: object) -> bool:
        self._progress()
        return all(entry[2] for entry in handle)  # type: ignore[attr-defined]

    def _complete(self, handle: object) -> None:
        for entry in handle:  # type: ignore[attr-defined]
            queue = self._posted[entry[0]]
            while not entry[2]:  # the source's earlier receives first: its messages come in order
                self._land(queue, self._group._take(entry[0], self.rank))

    def _progress(self) -> None:
        for src, queue in self._posted.items():
            while queue and (message := self._group._try_take(src, self.rank)) is not None:
                self._land(queue, message)

    def _land(self, queue: collections.deque, message: np.ndarray) -> None:
        src, out, _ = head = queue.popleft()
        self._deliver(src, message, out, None)
        head[2] = True
