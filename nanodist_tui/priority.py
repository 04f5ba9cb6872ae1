"""The workbench draws at a lower CPU priority than the training it watches.

A run's ranks keep every core busy, and they move in step: a rank preempted for a few milliseconds of
drawing holds up the ring, and with it every other rank. So the thread that draws (Textual's event loop)
sets its own nice value to UI_NICE (Linux, where the nice value is a property of each thread): when a
rank and the workbench want the same core, the rank runs and the panes redraw a little later; on a
machine with cores to spare nothing changes. `bench ui` measures what the workbench costs (README, "What
the workbench costs").

UI_NICE is 0 (the process's own) since keys have to answer within 0.1 s while training: at 10, with
quickstart's four rank processes on two cores, the drawing thread got a few per cent of a core and a tab
key took 0.1 s in the median and up to 1.2 s to show (docs/workbench.md, "Key latency"; `bench ui-keys`).
The workbench stays cheap by drawing little (panes once a second, plots every other time), not by
yielding: the mechanism is kept for a caller that wants a lower value.

A thread starts at the priority of the thread that creates it, and an unprivileged process cannot raise a
priority again. So the jobs (training, with the rank threads and rank processes they start) must not be
started by the drawing thread: `run_at_normal_priority` hands each job to a fresh thread made by one
spawner thread, which was started before any priority was lowered and keeps the process's own.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

# The spawner lives as long as the process: a later workbench must find it at normal priority.
SPAWNER = "nanodist-spawner"
UI_NICE = 0  # the drawing thread's nice value (0 is the default, 19 the lowest priority): see above

_spawns: queue.SimpleQueue[Callable[[], None]] | None = None
_lock = threading.Lock()


def start_spawner() -> None:
    """Start the spawner thread (once per process); call it before `lower_this_thread`."""
    global _spawns
    with _lock:
        if _spawns is not None:
            return
        spawns: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()

        def spawn_loop() -> None:
            while True:
                threading.Thread(target=spawns.get(), name="nanodist-engine", daemon=True).start()

        threading.Thread(target=spawn_loop, name=SPAWNER, daemon=True).start()
        _spawns = spawns


def run_at_normal_priority(fn: Callable[[], Any]) -> Any:
    """fn() on a thread at the process's own priority; waits for it, returns what it returns (or raises what
    it raised). Without a spawner, fn() runs here."""
    if _spawns is None:
        return fn()
    done: Future = Future()

    def body() -> None:
        try:
            done.set_result(fn())
        except BaseException as e:  # handed to the waiting thread, which raises it
            done.set_exception(e)

    _spawns.put(body)
    return done.result()


def lower_this_thread(nice: int = UI_NICE) -> bool:
    """Raise the calling thread's nice value to at least `nice` (Linux only: elsewhere setpriority would
    apply to the whole process). True if it is lowered."""
    if not sys.platform.startswith("linux"):
        return False
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        return True
    except OSError:
        return False
