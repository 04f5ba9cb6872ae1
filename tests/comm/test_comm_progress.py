"""Starved or hung (engine/comm/progress.py): a rank that is slow but still computing is waited on past
the timeout and the run completes. That a rank which stopped making progress is still named within the
timeout is tests/comm/test_comm_failure.py's test_silent_rank_times_out_and_is_named."""

from __future__ import annotations

import threading
import time

import comm_helpers
import pytest

from engine.comm import run_ranks
from engine.comm.progress import Board, Watch


@pytest.mark.parametrize("backend", ["threads", pytest.param("processes", marks=pytest.mark.slow)])
def test_a_slow_rank_is_not_named_as_hung(backend):
    """Rank 1 computes for 2.5 s before each of its all-reduces, over twice the 1 s timeout its peers wait
    with, sending nothing meanwhile: they keep waiting, and every step's sum is exact."""
    start = time.monotonic()
    steps = run_ranks(3, backend, comm_helpers.slow_rank, (1, 2.5, 3), timeout_s=1.0)
    assert steps == [3, 3, 3]
    assert time.monotonic() - start >= 3 * 2.5  # it really waited past the timeout, three times


def test_a_sleeping_rank_shows_no_progress_and_a_computing_one_does():
    """The board's mark, read against what the two threads really do: one sleeps, one loops."""
    board, stop = Board.local(2), threading.Event()

    def sleeper():
        board.register(0)
        stop.wait()

    def worker():
        board.register(1)
        while not stop.is_set():
            sum(range(1000))

    threads = [threading.Thread(target=sleeper), threading.Thread(target=worker)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.2)
        before = board.mark(0), board.mark(1)
        time.sleep(0.3)
        assert board.mark(0) == before[0]
        assert board.mark(1)[1] > before[1][1]
        board.wait_on(1, 0)  # a waiting rank counts by its beats only: its polling is not progress
        assert board.mark(1) == board.mark(1) == (0, 0)
        board.beat(1)
        assert board.mark(1) == (1, 0)
    finally:
        stop.set()
        for t in threads:
            t.join()


def test_the_chain_of_waits_ends_at_the_rank_not_waiting():
    board = Board.local(4)
    board.wait_on(0, 2)
    board.wait_on(2, 1)
    assert [board.chain_end(r) for r in range(4)] == [1, 1, 1, 3]  # 0 -> 2 -> 1; 3 waits on nobody
    board.wait_on(1, 0)  # a cycle: every rank waits, nobody is at the end; the peer itself is blamed
    assert [board.chain_end(r) for r in range(3)] == [0, 1, 2]


def test_a_watch_on_a_silent_peer_expires_at_the_timeout():
    board = Board.local(2)
    watch, start = Watch(board, 0.4), time.monotonic()
    while not watch.expired(1):
        time.sleep(0.01)
    assert 0.4 <= time.monotonic() - start < 0.4 + 0.2
