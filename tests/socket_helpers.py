"""Jobs wired over real sockets, one thread per rank, for the socket transport's security and
rendezvous tests."""

from __future__ import annotations

import concurrent.futures
import queue

import numpy as np

from engine.comm import all_reduce
from engine.comm.rendezvous import connect

SECRET = b"correct horse battery staple"


def wire_job(world_size=2, use_shm=True, before_peers=None, timeout_s=10.0):
    """Connect ``world_size`` ranks in threads; ``before_peers(port)`` runs once rank 0 listens."""
    ports: queue.Queue = queue.Queue()
    with concurrent.futures.ThreadPoolExecutor(world_size) as pool:
        first = pool.submit(connect, 0, world_size, "127.0.0.1", 0, SECRET, timeout_s=timeout_s,
                            use_shm=use_shm, on_listening=ports.put)
        port = ports.get(timeout=5)
        if before_peers is not None:
            before_peers(port)
        rest = [pool.submit(connect, r, world_size, "127.0.0.1", port, SECRET, timeout_s=timeout_s,
                            use_shm=use_shm) for r in range(1, world_size)]
        return [first.result(timeout_s)] + [f.result(timeout_s) for f in rest], port


def job_still_works(comms) -> None:
    """An all-reduce over the wired job gives the exact sum; then every communicator is closed."""
    with concurrent.futures.ThreadPoolExecutor(len(comms)) as pool:
        bufs = [np.full(1001, c.rank + 1.0) for c in comms]
        list(pool.map(all_reduce, comms, bufs))
    total = sum(range(1, len(comms) + 1))
    assert all((b == total).all() for b in bufs)
    for comm in comms:
        comm.close()
