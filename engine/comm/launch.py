"""``run_ranks``: start a job's ranks on one backend, relay their events, fail fast, stop cleanly.

``rank_fn(comm, emit, *args)`` runs once per rank. ``comm`` is the rank's Communicator;
``emit(dict)`` hands a JSON-serialisable dict to ``on_event`` in the launching process, as it
comes out of JSON on every backend (called from rank threads or the launcher's thread, one call
at a time).

Stopping: setting ``stop_event`` (the UI's stop, or the first Ctrl-C in the launching process)
makes ``comm.should_stop()`` True on every rank; poll it between steps and return. Pausing works
the same way: while ``pause_event`` is set, ``comm.should_pause()`` is True on every rank the
launcher started (threads: the shared event; processes: a "pause" / "resume" message down each
rank's pipe); on tcp and mpi only this process's rank sees it, and the ranks share it through the
flags they all-reduce every step (engine.trainer), as they do the stop request. Ranks may
notice at different steps: one blocked on a peer that already left because of the stop gets
StopRequested, which counts as a clean stop (its result is None). To stop every rank at the same
step, all-reduce (max) the flag. After a Ctrl-C, run_ranks re-raises KeyboardInterrupt once the
ranks are down; a second Ctrl-C leaves at once.

Backends:
  threads    a thread per rank in this process (daemon threads; a rank stuck in pure compute
             cannot be killed and is abandoned after ``timeout_s``).
  processes  N processes started with multiprocessing 'spawn' (see procs.py): rank_fn must be
             importable, args/results JSON-simple (numpy arrays allowed), and a launching
             script needs the usual ``if __name__ == "__main__":`` guard.
  tcp        this process is one rank of a job rendezvousing through MASTER_ADDR / MASTER_PORT /
             RANK / WORLD_SIZE / NANODIST_SECRET[_FILE] (see rendezvous.py); on_event sees this
             rank's events only; the result list holds this rank's value only; stop_event
             stops this process's rank (its peers then get StopRequested).
  mpi        this process is one MPI rank (under mpiexec / srun); rank 0's on_event sees every
             rank's events; rank 0 gets every rank's result, other ranks only their own. A rank
             that raises prints its error and aborts the MPI job (MPI cannot stop peers otherwise);
             stop_event is per process, and MPI cannot tell a peer that a rank stopped early:
             stop every rank at the same step (all-reduce the flag).

Threads: every rank limits its BLAS/OpenMP pools to its share of the host's cores before rank_fn
runs (``threads_per_rank``, 0 = auto; the rules are cores.py's) and finds the figure in
``comm.threads_per_rank``. On the threads backend the limit holds for the process while the ranks run.

A failure (a rank raises, dies, or stops answering) stops every other rank within ``timeout_s``
and raises RankFailure(rank, cause) naming the failed rank and the last line of its error.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable

from engine.comm import cores
from engine.comm.base import RankFailure, Signals, StopRequested, blame
from engine.comm.codec import as_sent
from engine.comm.emulation import NetworkEmulation

BACKENDS = ("threads", "processes", "tcp", "mpi")
EMULATING_BACKENDS = ("processes", "tcp")  # the socket transport's: it paces sends (emulation.py)
MPI_ENV = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MPI_LOCALRANKID")


def run_ranks(world_size: int, backend: str, rank_fn: Callable, args: tuple = (),
              on_event: Callable[[dict], None] | None = None, timeout_s: float = 30.0,
              stop_event: threading.Event | None = None, pause_event: threading.Event | None = None,
              threads_per_rank: int = 0, network: NetworkEmulation | None = None) -> list:
    """Run ``rank_fn(comm, emit, *args)`` on every rank; returns the ranks' return values by rank.
    ``network`` (processes and tcp: the socket transport) emulates latency and bandwidth per link."""
    if network is not None and network.active and backend not in EMULATING_BACKENDS:
        raise ValueError("network emulation needs the socket transport (backend "
                         f"{' or '.join(EMULATING_BACKENDS)}), not {backend!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    on_event = on_event or (lambda event: None)
    stop_event = stop_event if stop_event is not None else threading.Event()
    signals = Signals(stop_event, pause_event)
    if backend in ("threads", "processes"):  # every rank on this host, with this process's CPUs
        threads = cores.resolve(threads_per_rank, len(cores.usable_cores()), world_size)
    if backend == "threads":
        with cores.limited(threads):
            return _run_threads(world_size, rank_fn, tuple(args), on_event, timeout_s, signals, threads)
    if backend == "processes":
        from engine.comm.procs import run_processes
        return run_processes(world_size, rank_fn, tuple(args), on_event, timeout_s, signals, threads,
                             network)
    if backend == "tcp":
        from engine.comm.rendezvous import connect_from_env
        comm = connect_from_env(timeout_s=timeout_s, signals=signals, emulation=network)
        if comm.world_size != world_size:
            comm.close()
            raise ValueError(f"WORLD_SIZE is {comm.world_size} but world_size is {world_size}")
        return _run_here(comm, world_size, rank_fn, tuple(args), on_event, threads_per_rank)
    if backend == "mpi":
        from engine.comm.mpi import run_mpi_rank
        return run_mpi_rank(world_size, rank_fn, tuple(args), on_event, timeout_s, signals, threads_per_rank)
    raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")


def process_rank(backend: str) -> int | None:
    """This process's rank when it runs one rank of a job started outside nanoDist (``tcp`` from the
    RANK variable, ``mpi`` from the launcher's); None when this process launches every rank."""
    if backend == "tcp":
        return int(os.environ.get("RANK", "0"))
    if backend == "mpi":
        return next((int(os.environ[name]) for name in MPI_ENV if name in os.environ), 0)
    return None


class LaunchError(ValueError):
    """The environment cannot start this backend (missing rendezvous variables, no mpiexec): a user
    mistake, found before any rank starts. str() is one line naming what to set."""


def check_environment(backend: str, world_size: int, environ=os.environ) -> None:
    """Raise LaunchError when `backend` cannot start here as configured."""
    if backend == "tcp":
        for name in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
            if not environ.get(name, "").strip().isdigit():
                raise LaunchError(f"parallel.backend = \"tcp\": environment variable {name} must be set to "
                                  "an integer on every rank (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, "
                                  "as torchrun)")
        if int(environ["WORLD_SIZE"]) != world_size:
            raise LaunchError(f"parallel.world_size = {world_size} but WORLD_SIZE={environ['WORLD_SIZE']}; "
                              "make them equal")
        if int(environ["RANK"]) >= world_size:
            raise LaunchError(f"RANK={environ['RANK']} is not below WORLD_SIZE={world_size}; give each "
                              f"process one of the ranks 0 to {world_size - 1}")
        if not 1 <= int(environ["MASTER_PORT"]) <= 65535:
            raise LaunchError(f"MASTER_PORT={environ['MASTER_PORT']} is not a TCP port; use one from 1 to "
                              "65535 (e.g. 29500), the same on every rank")
        master = environ.get("MASTER_ADDR", "127.0.0.1")
        try:
            socket.getaddrinfo(master, None)
        except (OSError, UnicodeError):
            raise LaunchError(f"MASTER_ADDR={master!r} is not an address this host can resolve; set it to "
                              "rank 0's host name or IP address") from None
        from engine.comm.rendezvous import read_secret  # the socket transport, only for tcp
        try:
            read_secret(environ)
        except ValueError as exc:
            raise LaunchError(f"parallel.backend = \"tcp\": {exc}") from None
    if backend == "mpi" and not any(name in environ for name in MPI_ENV):
        raise LaunchError(f"parallel.backend = \"mpi\" needs ranks started by MPI: run "
                          f"mpiexec -n {world_size} nanodist-tui run ... --backend mpi")


def under_mpi() -> bool:
    """True when this process was started by mpiexec/srun as an MPI rank."""
    return any(name in os.environ for name in MPI_ENV)


def _run_here(comm, world_size, rank_fn, args, on_event, threads_per_rank: int) -> list:
    """One rank in this process (tcp backend); peers notice a failure when its sockets close."""
    results = [None] * world_size
    try:
        comm.threads_per_rank = cores.threads_for_peer_rank(comm, "tcp", threads_per_rank)
        cores.apply(comm.threads_per_rank)
        results[comm.rank] = rank_fn(comm, lambda event: on_event(as_sent(event)), *args)
    except StopRequested:
        pass
    except BaseException as exc:
        comm.signals.fail(*blame(comm.rank, exc))  # close at once, without waiting for peers
        raise RankFailure(*comm.signals.failure) from exc
    finally:
        comm.close()
    return results


def _only_blamed_left(threads: list[threading.Thread], group) -> bool:
    """After a failure, whether the only rank still running is the one blamed (hung in compute: it will
    not notice the failure, so waiting for it only delays naming it)."""
    blamed = group.signals.failure[0]
    return all(not t.is_alive() for r, t in enumerate(threads) if r != blamed)


def _run_threads(world_size, rank_fn, args, on_event, timeout_s, signals: Signals, pool_threads: int) -> list:
    from engine.comm.threads import ThreadGroup

    stop_event = signals.stop
    group = ThreadGroup(world_size, timeout_s, signals)
    results: list = [None] * world_size
    event_lock = threading.Lock()

    def emit(event: dict) -> None:
        event = as_sent(event)
        with event_lock:
            on_event(event)

    def body(rank: int) -> None:
        comm = group.communicator(rank)
        comm.threads_per_rank = pool_threads
        try:
            results[rank] = rank_fn(comm, emit, *args)
        except StopRequested:
            pass
        except BaseException as exc:  # noqa: BLE001 - any rank error fails the job, named
            group.fail(*blame(rank, exc))
        finally:
            comm.close()

    threads = [threading.Thread(target=body, args=(r,), name=f"nanodist-rank{r}", daemon=True)
               for r in range(world_size)]
    for thread in threads:
        thread.start()
    failed_at = stop_at = None
    interrupted = False
    while any(t.is_alive() for t in threads):
        try:
            now = time.monotonic()
            if group.signals.failure is not None and failed_at is None:
                failed_at = now
            if stop_event.is_set() and stop_at is None:
                stop_at = now
            if stop_at is not None and now - stop_at > timeout_s:
                stuck = next(r for r, t in enumerate(threads) if t.is_alive())
                group.fail(stuck, f"did not stop within {timeout_s:g} s of the stop request")
            if failed_at is not None and (now - failed_at > timeout_s or _only_blamed_left(threads, group)):
                break  # ranks stuck in compute are daemon threads: abandon them
            for thread in threads:
                thread.join(0.05)
        except KeyboardInterrupt:
            if interrupted:
                raise
            interrupted = True  # first Ctrl-C: stop cleanly; a second one leaves at once
            stop_event.set()
    if group.signals.failure is not None:
        raise RankFailure(*group.signals.failure)
    if interrupted:
        raise KeyboardInterrupt
    return results
