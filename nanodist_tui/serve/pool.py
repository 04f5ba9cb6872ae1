"""Generations off the event loop, at most `limit` at a time; one more is refused at once (503), not queued.

The event loop only parses requests and answers them: a generation runs on a worker thread, so /health and
/info (coroutines on the loop) never wait behind one. Refusing past the limit, rather than queueing, keeps an
overloaded server's answer immediate and honest: the client learns it is busy and when to come back, and the
server never holds more work than it can finish.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread

T = TypeVar("T")


class Busy(Exception):
    """Every generation slot is taken; retry after `retry_after_s` seconds."""

    def __init__(self, limit: int, retry_after_s: int) -> None:
        super().__init__(f"all {limit} generation slots are busy; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


class GenerationPool:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0  # read and written on the event loop only: no lock needed
        self._last_s = 1.0
        self._threads: anyio.CapacityLimiter | None = None  # made on the loop, where anyio wants it

    @property
    def retry_after_s(self) -> int:
        """About as long as the last generation took: by then a slot has likely freed up."""
        return max(1, math.ceil(self._last_s))

    async def run(self, fn: Callable[..., T], *args) -> T:
        """fn(*args) on a worker thread; Busy when `limit` generations already run."""
        if self.running >= self.limit:  # no await between the test and the count: nothing slips in
            raise Busy(self.limit, self.retry_after_s)
        self.running += 1
        if self._threads is None:
            self._threads = anyio.CapacityLimiter(self.limit)
        start = time.monotonic()
        try:
            # Not abandoned when the client goes away: the slot frees only once the thread has finished,
            # so the count is the number of threads really generating.
            return await anyio.to_thread.run_sync(fn, *args, limiter=self._threads)
        finally:
            self.running -= 1
            self._last_s = time.monotonic() - start
