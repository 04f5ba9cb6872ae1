"""The rendezvous port faces the network on multi-host jobs: strangers holding silent connections open or
sending garbage neither stop nor delay a job from starting, a full listener only delays joining ranks
(they retry until the job's timeout), and a refused stranger is logged with its address, never blamed on
a rank."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import queue
import random
import socket
import time

import pytest

from engine.comm import RankFailure, admission
from engine.comm.rendezvous import connect
from tests.socket_helpers import SECRET, job_still_works


def start_job(world_size: int, timeout_s: float, before_peers, peers=None):
    """Rank 0 listens, `before_peers(port)` runs, then ranks `peers` (default 1..N-1) join; returns the
    communicators (or raises what rank 0 raised) and the seconds from the peers' start to the job wired."""
    ports: queue.Queue = queue.Queue()
    peers = range(1, world_size) if peers is None else peers
    with concurrent.futures.ThreadPoolExecutor(world_size) as pool:
        first = pool.submit(connect, 0, world_size, "127.0.0.1", 0, SECRET, timeout_s=timeout_s,
                            on_listening=ports.put)
        port = ports.get(timeout=5)
        held = before_peers(port)
        start = time.monotonic()
        rest = [pool.submit(connect, r, world_size, "127.0.0.1", port, SECRET, timeout_s=timeout_s)
                for r in peers]
        try:
            comms = [first.result(timeout_s + 5)] + [f.result(timeout_s + 5) for f in rest]
        finally:
            for sock in held:
                sock.close()
        return comms, time.monotonic() - start


def strangers(silent: int = 0, garbage: int = 0):
    """Connections that stay open for the whole rendezvous: silent ones, and ones that send garbage."""
    def open_them(port: int) -> list[socket.socket]:
        socks = []
        for i in range(silent + garbage):
            sock = socket.create_connection(("127.0.0.1", port))
            if i >= silent:
                sock.sendall(random.Random(i).randbytes(200))
            socks.append(sock)
        return socks
    return open_them


def test_a_rendezvous_completes_while_strangers_hold_connections_open(caplog):
    """Twelve silent connections and four sending garbage, all held open: with the real 5 s handshake
    deadline, served one at a time they would hold the job for a minute; served at once they cost nothing."""
    ports: list[int] = []

    def before(port):
        opened = strangers(silent=12, garbage=4)(port)
        ports.extend(sock.getsockname()[1] for sock in opened)
        return opened
    with caplog.at_level(logging.WARNING, "nanodist.comm"):
        comms, took = start_job(3, timeout_s=20, before_peers=before)
    assert took < admission.HANDSHAKE_S  # no stranger's handshake deadline was waited out
    refused = [r.getMessage() for r in caplog.records if "refused connection" in r.getMessage()]
    assert len(refused) == 16  # every stranger logged once, by its own address
    for port in ports:
        assert sum(f"127.0.0.1:{port}:" in line for line in refused) == 1
    assert sum("nanoDist handshake" in line for line in refused) == 4  # the garbage, refused for what it is
    job_still_works(comms)


def test_a_full_listener_only_delays_joining_ranks(caplog, monkeypatch):
    """More silent strangers than the listener serves at once: the excess are closed at once, the joining
    ranks are refused while it is full and retry, and get in once the strangers' deadlines free it."""
    monkeypatch.setattr(admission, "MAX_PENDING", 3)
    monkeypatch.setattr(admission, "HANDSHAKE_S", 1.0)
    with caplog.at_level(logging.WARNING, "nanodist.comm"):
        comms, took = start_job(3, timeout_s=15, before_peers=strangers(silent=8))
    assert took < 10
    assert "connections are already being authenticated" in caplog.text
    job_still_works(comms)


def test_a_refused_stranger_is_never_blamed_on_a_rank(caplog, monkeypatch):
    monkeypatch.setattr(admission, "HANDSHAKE_S", 0.3)
    with caplog.at_level(logging.WARNING, "nanodist.comm"), pytest.raises(RankFailure) as failure:
        start_job(3, timeout_s=2, before_peers=strangers(silent=2, garbage=2), peers=[1])
    assert failure.value.rank == 2  # the rank that never came, not a stranger and not healthy rank 1
    assert "still waiting for ranks [2]" in failure.value.cause and "4 other connection(s) refused" in str(
        failure.value)


def test_a_joining_rank_retries_until_rank_0_listens():
    port = _free_port()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        joining = pool.submit(connect, 1, 2, "127.0.0.1", port, SECRET, timeout_s=15)
        time.sleep(1.5)  # rank 0 starts late (its port was not open yet)
        comms = [connect(0, 2, "127.0.0.1", port, SECRET, timeout_s=15), joining.result(15)]
    job_still_works(comms)


def test_a_joining_rank_gives_up_at_the_jobs_timeout_not_before():
    port = _free_port()
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="before the rendezvous timeout"):
        connect(1, 2, "127.0.0.1", port, SECRET, timeout_s=2.0)
    assert 2.0 <= time.monotonic() - start < 4.0


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
