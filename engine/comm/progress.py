"""Starved or hung: is the rank a waiter waits on still making progress?

The rule. A rank blocked on a peer gives up after ``timeout_s`` during which the rank at the end of its
chain of waits (the peer; or, if the peer itself waits, whom it waits on, and so on) made no progress.
A rank makes progress when either
  * its beat count moves: the transport bumps it at every send, every message taken and every piece
    of a message that lands; or
  * its compute thread runs, or is ready to run and waits for a core (Linux: the first two fields of
    /proc/TID/schedstat, nanoseconds on a CPU and in the run queue). A rank starved of a core, or
    computing slowly among many others, is ready to run; a hung rank (asleep for good, blocked on
    something that never comes) is neither.
A rank that is itself waiting counts by its beats only: its polling uses a little CPU, and a cycle of
ranks that all wait on each other must still time out.

What it cannot tell: a rank spinning in an endless loop looks like one computing, so it is not named
(a stop request still ends the run); where /proc is not readable, only beats count, and a compute
stretch longer than ``timeout_s`` with no communication is named as hung, as before.

The board holds, per rank, [beats, the rank it waits on (-1: none), its compute thread's OS id]. The
threads backend keeps it in memory; the processes backend in a small shared file every rank maps
(each rank writes only its own row: aligned 8-byte stores, which no reader sees half-done); the launcher
unlinks the file once every rank has registered, so a killed launcher leaves nothing behind.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import threading
import time

import numpy as np

BEATS, WAITING, TID = range(3)
_LOOK_S = 1.0  # the most a waiter goes between looks at the end of its chain (timeout_s / 4 when shorter)


class Board:
    def __init__(self, table: np.ndarray, memory: mmap.mmap | None = None):
        self.table = table
        self._memory = memory

    @classmethod
    def local(cls, world_size: int) -> Board:
        table = np.zeros((world_size, 3), np.int64)
        table[:, WAITING] = -1
        return cls(table)

    @classmethod
    def create_file(cls, world_size: int) -> str:
        """A new board file for `world_size` rank processes (0600); the caller unlinks it."""
        root = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        fd, path = tempfile.mkstemp(prefix="nanodist-board-", dir=root)
        try:
            table = np.zeros((world_size, 3), np.int64)
            table[:, WAITING] = -1
            os.write(fd, table.tobytes())
        finally:
            os.close(fd)
        return path

    @classmethod
    def attach(cls, path: str, world_size: int) -> Board | None:
        """The board at `path` mapped into this process, or None if it cannot be (only beats-free timeouts
        then: the rule above degrades to plain silence)."""
        try:
            with open(path, "r+b") as f:
                memory = mmap.mmap(f.fileno(), world_size * 3 * 8)
        except (OSError, ValueError):
            return None
        return cls(np.frombuffer(memory, np.int64).reshape(world_size, 3), memory)

    def register(self, rank: int) -> None:
        """The calling thread is `rank`'s compute thread."""
        self.table[rank, TID] = threading.get_native_id()

    def all_registered(self) -> bool:
        return bool(np.all(self.table[:, TID] != 0))

    def beat(self, rank: int) -> None:
        self.table[rank, BEATS] += 1

    def wait_on(self, rank: int, peer: int) -> None:
        self.table[rank, WAITING] = peer

    def done_waiting(self, rank: int) -> None:
        self.table[rank, WAITING] = -1

    def waiting(self, rank: int) -> int | None:
        peer = int(self.table[rank, WAITING])
        return peer if peer >= 0 else None

    def chain_end(self, peer: int) -> int:
        """Follow peer -> whom it waits on -> ... to a rank not waiting; in a cycle, `peer`."""
        seen = [peer]
        while (nxt := self.waiting(seen[-1])) is not None:
            if nxt in seen:
                return peer
            seen.append(nxt)
        return seen[-1]

    def mark(self, rank: int) -> tuple[int, int]:
        """What changes while `rank` makes progress: (its beats, its thread's ns run or ready to run; 0 while
        it waits itself, or where /proc does not say)."""
        beats = int(self.table[rank, BEATS])
        tid = int(self.table[rank, TID])
        if tid <= 0 or self.waiting(rank) is not None:
            return beats, 0
        return beats, _scheduled_ns(tid)

    def close(self) -> None:
        if self._memory is not None:
            self.table = np.zeros((0, 3), np.int64)  # drop the view before the map goes
            self._memory.close()
            self._memory = None


class Watch:
    """One blocked call's clock: ``expired(peer)`` turns True once ``timeout_s`` passed with neither this
    call moving (``moved()``) nor the end of its chain of waits making progress."""

    def __init__(self, board: Board | None, timeout_s: float):
        self.board, self.timeout_s = board, timeout_s
        self.look_s = min(_LOOK_S, timeout_s / 4)
        self.deadline = self.next_look = 0.0
        self.seen: tuple[int, int, int] | None = None
        self.moved()

    def moved(self) -> None:
        now = time.monotonic()
        self.deadline, self.next_look = now + self.timeout_s, now + self.look_s

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def expired(self, peer: int) -> bool:
        now = time.monotonic()
        if self.board is not None and now >= min(self.next_look, self.deadline):
            self.next_look = now + self.look_s
            end = self.board.chain_end(peer)
            seen = (end, *self.board.mark(end))
            if self.seen is not None and seen != self.seen:
                self.deadline = now + self.timeout_s  # it is still going: starved or slow, not hung
            self.seen = seen
        return now >= self.deadline


def _scheduled_ns(tid: int) -> int:
    try:
        with open(f"/proc/{tid}/schedstat", "rb") as f:
            on_cpu, in_queue = f.read().split()[:2]
        return int(on_cpu) + int(in_queue)
    except (OSError, ValueError):
        return 0
