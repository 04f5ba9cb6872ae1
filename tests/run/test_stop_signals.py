"""A rank process's answer to the stop signals (engine.run.stop_signals), in a real child process: the first
one sets its stop flag and it lives on (to checkpoint after the agreed step), a second one ends it by that
signal; a SIGHUP it started with ignored (nohup) stays ignored."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# prints "ready", then "stop" once its flag is set; stays alive until killed
CHILD = """
import threading, time
from engine.run import stop_signals
flag = threading.Event()
stop_signals.rank_process_stop(flag.set)
print("ready", flush=True)
flag.wait()
print("stop", flush=True)
time.sleep(60)
"""


def child(sighup=signal.SIG_DFL) -> subprocess.Popen:
    def dispositions() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, sighup)
    proc = subprocess.Popen([sys.executable, "-c", CHILD], env={**os.environ, "PYTHONPATH": REPO},
                            preexec_fn=dispositions, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_the_first_signal_asks_to_stop_and_the_second_kills(sig):
    proc = child()
    try:
        proc.send_signal(sig)
        assert proc.stdout is not None and proc.stdout.readline() == "stop\n"
        assert proc.poll() is None  # alive: it still has its checkpoint to write
        proc.send_signal(sig)
        assert proc.wait(10) == -sig  # killed by that signal, as without a handler
    finally:
        proc.kill()
        proc.wait()


def test_a_sighup_ignored_at_start_stays_ignored():
    proc = child(sighup=signal.SIG_IGN)  # as under nohup
    try:
        proc.send_signal(signal.SIGHUP)
        assert proc.stdout is not None and select.select([proc.stdout], [], [], 0.5)[0] == []  # no stop
        proc.send_signal(signal.SIGTERM)  # still answered
        assert proc.stdout.readline() == "stop\n" and proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
