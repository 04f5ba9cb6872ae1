"""The per-rank communication thread: collectives submitted by the replica run here, in order, while
the training thread goes on with backward."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class CommTask:
    """One submitted communication task; wait() blocks until it ran and re-raises its error."""

    def __init__(self, fn: Callable[[], object]):  # its result is not kept
        self.fn = fn
        self.done = threading.Event()
        self.error: BaseException | None = None

    def wait(self) -> None:
        self.done.wait()
        if self.error is not None:
            raise self.error


class CommWorker:
    """Runs communication tasks in submission order on one thread per rank, off the training thread.

    Every rank submits the same tasks in the same order (buckets and layers in a fixed order), so the
    collectives inside them match up across ranks. Nothing else may drive the communicator while tasks
    are pending: callers `wait_all()` before running collectives themselves. With one rank (or
    `inline=True`) tasks run at once on the caller's thread. After a failure the remaining tasks are
    skipped and every wait re-raises the first error.
    """

    def __init__(self, rank: int, inline: bool = False):
        self._error: BaseException | None = None
        self._pending: list[CommTask] = []
        self._thread = None
        if not inline:
            self._queue: queue.Queue = queue.Queue()
            self._thread = threading.Thread(target=self._run, name=f"comm-rank{rank}", daemon=True)
            self._thread.start()

    def submit(self, fn: Callable[[], object]) -> CommTask:
        task = CommTask(fn)
        if self._thread is None:
            self._execute(task)
            task.wait()
        else:
            self._pending = [t for t in self._pending if not t.done.is_set()]
            self._pending.append(task)
            self._queue.put(task)
        return task

    def wait_all(self) -> None:
        pending, self._pending = self._pending, []
        for task in pending:
            task.done.wait()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while (task := self._queue.get()) is not None:
            self._execute(task)

    def _execute(self, task: CommTask) -> None:
        try:
            if self._error is None:
                task.fn()
        except BaseException as e:  # handed to the training thread by wait()
            self._error = e
        finally:
            task.error = self._error
            task.done.set()
