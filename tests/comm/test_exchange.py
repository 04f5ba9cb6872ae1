"""The batched exchange (engine.comm.exchange) on every backend: ranks that each send 32 MiB to every other
rank and receive theirs in one batch (one blocking send at a time deadlocks on TCP and shared memory: each
send waits for a receive the peer has not posted), several messages to one peer kept in order, the bytes
metered per phase, and a batch over a renumbered process group. Non-blocking (exchange.post): the same
swap as two batches both posted before either is waited for, the later one waited for first."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pp_comm_helpers as helpers
import pytest

from engine.comm import run_ranks
from engine.comm.threads import ThreadGroup

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIEXEC = shutil.which("mpiexec")


def check_swap(results: list[dict]) -> None:
    n = len(results)
    big, small = helpers.BIG * 8, [4 * (5 + i) for i in (1, 2, 3)]
    for r, result in enumerate(results):
        assert result["rank"] == r and result["wrong"] == []
        peers = [p for p in range(n) if p != r]
        assert result["sent"] == {**{f"{p}:pp-activation": big for p in peers},
                                  **{f"{p}:pp-gradient": sum(small) for p in peers}}


@pytest.mark.parametrize("world", [2, 3])
def test_swap_on_threads(world):
    check_swap(run_ranks(world, "threads", helpers.swap, timeout_s=60))


@pytest.mark.slow
@pytest.mark.parametrize("shm", ["1", "0"], ids=["shared-memory", "socket"])
def test_swap_on_processes(monkeypatch, shm):
    monkeypatch.setenv("NANODIST_SHM", shm)
    check_swap(run_ranks(2, "processes", helpers.swap, timeout_s=60))


@pytest.mark.parametrize("world", [2, 3])
def test_posted_swap_on_threads(world):
    results = run_ranks(world, "threads", helpers.posted_swap, timeout_s=60)
    check_swap(results)
    assert all(r["first_done"] for r in results)  # threads: sends are copies, every wait takes what came


@pytest.mark.slow
@pytest.mark.parametrize("shm", ["1", "0"], ids=["shared-memory", "socket"])
def test_posted_swap_on_processes(monkeypatch, shm):
    """The first batch's 32 MiB exceed what a link buffers: they move only while a wait runs, and the wait
    for the second batch (queued behind them on each link) is what moves them."""
    monkeypatch.setenv("NANODIST_SHM", shm)
    results = run_ranks(2, "processes", helpers.posted_swap, timeout_s=60)
    check_swap(results)
    assert all(r["first_done"] for r in results)


@pytest.mark.slow
@pytest.mark.parametrize("shm", ["1", "0"], ids=["shared-memory", "socket"])
def test_the_same_swap_one_blocking_call_at_a_time_deadlocks(monkeypatch, shm):
    """What the batch is for: sent one blocking call at a time, the swap above never completes."""
    from engine.comm import RankFailure
    monkeypatch.setenv("NANODIST_SHM", shm)
    with pytest.raises(RankFailure, match=r"did not answer (rank \d )?for 2 s"):
        run_ranks(2, "processes", helpers.one_call_at_a_time, timeout_s=2)


@pytest.mark.parametrize("backend", ["threads", pytest.param("processes", marks=pytest.mark.slow)])
def test_exchange_over_a_renumbered_group(backend):
    results = run_ranks(4, backend, helpers.in_group, timeout_s=60)
    assert all(r["ok"] for r in results)
    # world ranks 1 and 3 are the group's 0 and 1: each sent to the other, booked under the group's name
    assert results[1]["links"] == [[1, 3, "odd", "p2p"]] and results[3]["links"] == [[3, 1, "odd", "p2p"]]


@pytest.mark.slow
@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not on PATH (pip install mpi4py mpich)")
@pytest.mark.parametrize("mode", ["swap", "group", "posted"])
def test_exchange_under_mpiexec(mode):
    pytest.importorskip("mpi4py")
    n = 4 if mode == "group" else 2
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(TESTS), TESTS])}
    command = [MPIEXEC, "-n", str(n), sys.executable, os.path.join(TESTS, "pp_comm_helpers.py"),
               *([mode] if mode != "swap" else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    if mode != "group":
        check_swap(results)
    else:
        assert all(r["ok"] for r in results) and results[1]["links"] == [[1, 3, "odd", "p2p"]]


def test_a_mismatched_receive_is_a_protocol_error_naming_the_peer():
    from engine.comm import ProtocolError
    from engine.comm.exchange import exchange
    group = ThreadGroup(2, timeout_s=5)
    a, b = group.communicator(0), group.communicator(1)
    exchange(a, [(1, np.zeros(3))], [])
    with pytest.raises(ProtocolError, match="rank 0 failed: sent float64\\[3\\] but rank 1 expected"):
        exchange(b, [], [(0, np.zeros(4))])
