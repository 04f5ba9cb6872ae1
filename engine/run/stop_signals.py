"""The signals that ask a run to stop, and how a process that holds ranks answers them.

SIGINT (Ctrl-C), SIGTERM (a scheduler: Slurm's scancel, systemd, Kubernetes) and SIGHUP (the terminal went
away) usually reach every process of a job at once: a terminal and a scheduler signal the whole process group
(Slurm every process of the job step, mpiexec forwards to its ranks). So every process that holds a rank or
launches ranks turns the first one into a stop request (the ranks agree on it through the flags they
all-reduce every step, and each checkpoints after the same step), never into its death. A second signal means
"now": the launcher leaves at once, and a rank process dies by that signal, as it would have without us.

A SIGHUP ignored when the process started (``nohup``) stays ignored: the user asked the run to outlive its
terminal, and a rank process inherits that choice from its launcher.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
Handlers = dict[int, object]


def watched() -> tuple[int, ...]:
    """The stop signals this process should answer: all three, less a SIGHUP it started with ignored."""
    return tuple(sig for sig in STOP_SIGNALS
                 if not (sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN))


def handle(on_signal: Callable[[int], None]) -> Handlers:
    """Call ``on_signal(signum)`` for each stop signal (main thread only); returns the handlers replaced, for
    ``restore``. The handler runs on the main thread between two bytecodes: it must only set flags."""
    return {sig: signal.signal(sig, lambda signum, _frame: on_signal(signum)) for sig in watched()}


def restore(previous: Handlers) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)  # type: ignore[arg-type]  # getsignal's value, handed back as it was


def die_by(signum: int) -> None:
    """End this process by `signum` as if it had no handler: its exit status names the signal."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def rank_process_stop(stop_set: Callable[[], None]) -> None:
    """In a rank process the launcher started: the first stop signal sets the rank's stop flag (so a signal
    to this process alone also stops the whole job after one agreed step), a second one ends the process."""
    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        if len(received) > 1:
            die_by(signum)
        stop_set()

    handle(on_signal)
