"""A spawned child process and the launcher's end of its pipe: JSON messages only (codec; never pickle).

Used by the processes backend for its ranks (engine.comm.procs) and by sweeps for their jobs
(engine.sweep.jobs): both spawn with multiprocessing 'spawn', talk over a duplex pipe and must always
reap what they started.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Callable

from engine.comm import codec


class ChildProcess:
    """One spawned child: `tell` sends a message down its pipe, `kill` ends it, `reap` kills and joins it."""

    def __init__(self, target: Callable, name: str, daemon: bool):
        ctx = multiprocessing.get_context("spawn")
        ours, theirs = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=target, args=(theirs,), name=name, daemon=daemon)
        self.process.start()
        theirs.close()
        self.conn = ours
        self.exited = self.killed = False
        self.listening = True  # its end of the pipe is still open

    def tell(self, message: dict) -> None:
        with contextlib.suppress(OSError):  # already gone: its exit is handled through its sentinel
            self.conn.send_bytes(codec.dumps(message))

    def kill(self) -> None:
        if self.process.is_alive():
            self.killed = True
            self.process.kill()

    def reap(self) -> None:
        self.kill()
        self.process.join()
        self.conn.close()
