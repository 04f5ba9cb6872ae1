"""Failure and stop: a rank that raises, is SIGKILLed or stops answering brings the job down fast,
named; nothing is left running; a stop request ends every rank cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import comm_helpers
import pytest

from engine.comm import RankFailure, run_ranks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie), read from /proc rather than psutil."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def pids_of(events: list[dict]) -> set[int]:
    return {e["pid"] for e in events if "pid" in e}


def rank_threads(before: set[threading.Thread] = frozenset()) -> list[threading.Thread]:
    """Rank threads still running, other than those already running at ``before`` (an abandoned
    rank of an earlier test may still be sleeping)."""
    return [t for t in threading.enumerate() if t.name.startswith("nanodist-rank") and t not in before]


@pytest.mark.parametrize("backend", ["threads", pytest.param("processes", marks=pytest.mark.slow)])
def test_raising_rank_is_named(backend):
    events: list[dict] = []
    before = set(threading.enumerate())
    start = time.monotonic()
    with pytest.raises(RankFailure) as failure:
        run_ranks(3, backend, comm_helpers.fail_on, (1, "raise"), on_event=events.append, timeout_s=10)
    assert failure.value.rank == 1
    assert failure.value.cause == "ValueError: boom on rank 1"
    assert time.monotonic() - start < 10
    assert not any(alive(pid) for pid in pids_of(events) if pid != os.getpid())
    if backend == "threads":
        assert rank_threads(before) == []


@pytest.mark.slow
def test_sigkilled_rank_is_named_and_nothing_is_left():
    events: list[dict] = []

    def on_event(event: dict) -> None:
        events.append(event)
        if event.get("rank") == 1 and event.get("step") == 3:
            os.kill(next(e["pid"] for e in events if e.get("rank") == 1 and "pid" in e), signal.SIGKILL)

    start = time.monotonic()
    with pytest.raises(RankFailure) as failure:
        run_ranks(3, "processes", comm_helpers.fail_on, (-1, "none"), on_event=on_event, timeout_s=10)
    assert failure.value.rank == 1
    assert "SIGKILL" in failure.value.cause
    assert time.monotonic() - start < 10
    assert len(pids_of(events)) == 3 and not any(alive(pid) for pid in pids_of(events))


@pytest.mark.parametrize("backend", ["threads", pytest.param("processes", marks=pytest.mark.slow)])
def test_silent_rank_times_out_and_is_named(backend):
    """Rank 1 stops communicating; rank 2 waits on it, and rank 0 on rank 2 (the ring): the rank named is
    the one at the end of that chain, rank 1, within the timeout (plus the moment taken to gather the
    chain), not a healthy rank that was itself waiting."""
    events: list[dict] = []
    last_step = [time.monotonic()]

    def on_event(event: dict) -> None:
        events.append(event)
        if "step" in event:
            last_step[0] = time.monotonic()

    with pytest.raises(RankFailure) as failure:
        run_ranks(3, backend, comm_helpers.fail_on, (1, "hang", 8.0), on_event=on_event, timeout_s=1.5)
    # within the timeout plus the moment to gather the chain (a slow moment of a loaded 2-core machine
    # included); blaming the wrong rank, or waiting out every rank's timeout in turn, fails
    assert time.monotonic() - last_step[0] < 1.5 + 2.0
    assert failure.value.rank == 1
    assert "waited on it" in failure.value.cause
    if backend == "processes":
        assert not any(alive(pid) for pid in pids_of(events))


@pytest.mark.parametrize("backend", ["threads", pytest.param("processes", marks=pytest.mark.slow)])
def test_stop_event_ends_every_rank_cleanly(backend):
    stop, events = threading.Event(), []
    before = set(threading.enumerate())

    def on_event(event: dict) -> None:
        events.append(event)
        if event["step"] >= 5:
            stop.set()

    start = time.monotonic()
    steps = run_ranks(2, backend, comm_helpers.stop_when_asked, on_event=on_event, timeout_s=10,
                      stop_event=stop)
    assert time.monotonic() - start < 10
    assert len(steps) == 2 and any(s is not None and s >= 5 for s in steps)  # None: stopped while waiting
    if backend == "processes":
        assert not any(alive(pid) for pid in pids_of(events))
    else:
        assert rank_threads(before) == []


LAUNCHER = """
import signal
import comm_helpers
from engine.comm import run_ranks
if __name__ == '__main__':
    # Ctrl-C as a terminal delivers it: a test suite run as a shell's background job (a CI script's `&`)
    # hands its children SIGINT ignored, which would make the launcher deaf to the signal under test
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        run_ranks(2, 'processes', comm_helpers.stop_when_asked,
                  on_event=lambda e: print(e['pid'], flush=True) if e['step'] == 0 else None)
    except KeyboardInterrupt:
        print('interrupted', flush=True)
"""


def start_launcher() -> tuple[subprocess.Popen, set[int]]:
    """A separate launcher process running 2 ranks until told to stop; returns it and the rank pids."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.path.join(REPO, "tests")])}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
    pids = {int(launcher.stdout.readline()) for _ in range(2)}
    assert all(alive(pid) for pid in pids)
    return launcher, pids


def gone_within(pids: set[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(pid) for pid in pids)


@pytest.mark.slow
def test_ranks_exit_when_the_launcher_dies():
    launcher, pids = start_launcher()
    try:
        launcher.kill()
        launcher.wait()
        assert gone_within(pids, 5)
    finally:
        launcher.kill()
        launcher.wait()


@pytest.mark.slow
def test_ctrl_c_stops_every_rank_cleanly():
    launcher, pids = start_launcher()
    try:
        launcher.send_signal(signal.SIGINT)
        line = launcher.stdout.readline().strip()
        assert line == "interrupted", f"the launcher said {line!r}; its stderr: {launcher.stderr.read()!r}"
        assert launcher.wait(10) == 0
        assert gone_within(pids, 1)
    finally:
        launcher.kill()
        launcher.wait()
