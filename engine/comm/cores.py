"""How many threads each rank's compute pools get: its share of the host's cores.

Why: NumPy's BLAS (OpenBLAS, MKL, BLIS) and any OpenMP runtime start one thread per core in every
process. N ranks on one host then run N × cores busy threads on `cores` cores and fight over them: a
2-rank run on 2 cores took 2-4x longer per step than one rank. So each rank limits its pools to its
share, through threadpoolctl, which reaches the already loaded libraries at run time (environment
variables such as OPENBLAS_NUM_THREADS only work before a library loads).

    threads = parallel.threads_per_rank, or when 0 (auto): max(1, cores ÷ ranks sharing them)

cores: the CPUs this process may run on (os.sched_getaffinity, which reflects a binding by mpiexec,
srun or taskset). The ranks sharing them, by backend:

    threads    world_size: one process, one pool serving every rank thread, so world_size × threads
               never exceeds the cores
    processes  world_size: nanoDist starts every rank on this host, with the launcher's CPUs
    tcp        LOCAL_WORLD_SIZE (torchrun's name) when set, else the ranks on this host as the peers
               report them at start-up (same host name)
    mpi        the launcher's ranks per node (LOCAL_SIZE_ENV: Open MPI, MPICH's Hydra, MVAPICH, srun),
               else the ranks on this host as the peers report them

On tcp and mpi the peers also report their CPU sets, and only local ranks whose CPUs overlap this
rank's count: a launcher that binds each rank to its own cores leaves each rank all of them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
from collections.abc import Iterator, Mapping

import numpy as np

from engine.fast import thread_pool

# Environment variables in which MPI launchers state how many ranks they started on this node, in the
# order they are trusted. srun's is a compressed list over nodes (see _slurm_tasks_here).
LOCAL_SIZE_ENV = ("OMPI_COMM_WORLD_LOCAL_SIZE",   # Open MPI's mpirun
                  "MPI_LOCALNRANKS",              # MPICH's Hydra mpiexec (and Intel MPI)
                  "MV2_COMM_WORLD_LOCAL_SIZE",    # MVAPICH2
                  "SLURM_STEP_TASKS_PER_NODE",    # srun: e.g. "4(x2),3", one entry per node
                  "SLURM_NTASKS_PER_NODE")        # sbatch/srun --ntasks-per-node
TCP_LOCAL_SIZE_ENV = "LOCAL_WORLD_SIZE"           # torchrun's name for the ranks on this host
MAX_CPUS = 4096                                   # CPU ids a peer's report can name
_HOST_KEY_BYTES = 16
REPORT_BYTES = _HOST_KEY_BYTES + MAX_CPUS // 8    # one rank's row of the start-up exchange


def usable_cores() -> set[int]:
    """The CPU ids this process may run on (its affinity mask; every CPU where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def share(cores: int, ranks: int) -> int:
    """One rank's threads when `ranks` ranks share `cores` cores: never below one."""
    return max(1, cores // max(1, ranks))


def resolve(configured: int, cores: int, sharing: int) -> int:
    """parallel.threads_per_rank as configured, or its auto value (0) for `sharing` ranks on `cores`."""
    if configured < 0:
        raise ValueError(f"threads_per_rank must be >= 0 (0 = auto), got {configured}")
    return configured or share(cores, sharing)


def launcher_local_size(backend: str, environ: Mapping[str, str] = os.environ) -> int | None:
    """Ranks on this host as the launcher states it (tcp: LOCAL_WORLD_SIZE; mpi: LOCAL_SIZE_ENV), or None."""
    names = (TCP_LOCAL_SIZE_ENV,) if backend == "tcp" else LOCAL_SIZE_ENV if backend == "mpi" else ()
    for name in names:
        value = environ.get(name, "").strip()
        count = _slurm_tasks_here(value, environ) if name == "SLURM_STEP_TASKS_PER_NODE" else _int(value)
        if count:
            return count
    return None


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) > 0 else None


def _slurm_tasks_here(value: str, environ: Mapping[str, str]) -> int | None:
    """This node's entry of srun's compressed tasks-per-node list ("4(x2),3": nodes 0-1 run 4, node 2
    runs 3), picked by SLURM_NODEID."""
    node_id = environ.get("SLURM_NODEID", "").strip()
    if not value or not node_id.isdigit():
        return None
    node = int(node_id)
    counts: list[int] = []
    for part in value.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node] if node < len(counts) and counts[node] > 0 else None


# ---- what the peers report (tcp and mpi) ----

def host_report(cores: set[int], host: str | None = None) -> np.ndarray:
    """This rank's row of the start-up exchange: a key of its host name, then its CPU set as bits."""
    key = hashlib.blake2b((host or socket.gethostname()).encode(), digest_size=_HOST_KEY_BYTES).digest()
    bits = np.zeros(MAX_CPUS, dtype=bool)
    bits[[c for c in cores if 0 <= c < MAX_CPUS]] = True
    return np.concatenate([np.frombuffer(key, np.uint8), np.packbits(bits)])


def sharing_from_reports(reports: np.ndarray, rank: int) -> int:
    """The ranks on this rank's host whose CPUs overlap its own (itself included), from every rank's
    host_report row."""
    rows = reports.reshape(-1, REPORT_BYTES)
    mine = rows[rank]
    local = [row for row in rows if bytes(row[:_HOST_KEY_BYTES]) == bytes(mine[:_HOST_KEY_BYTES])]
    overlapping = [row for row in local if np.any(row[_HOST_KEY_BYTES:] & mine[_HOST_KEY_BYTES:])]
    return max(1, len(overlapping))


def exchange_reports(comm, cores: set[int]) -> np.ndarray:
    """Every rank's host_report, gathered to all (a collective: every rank calls it at start-up)."""
    from engine.comm.collectives import all_gather
    table = np.zeros(REPORT_BYTES * comm.world_size, dtype=np.uint8)
    table[comm.rank * REPORT_BYTES:(comm.rank + 1) * REPORT_BYTES] = host_report(cores)  # its shard
    all_gather(comm, table)
    return table


def threads_for_peer_rank(comm, backend: str, configured: int,
                          environ: Mapping[str, str] = os.environ) -> int:
    """A tcp or mpi rank's threads: its CPUs shared by the local ranks that overlap them (the launcher's
    local size, when it states one, caps the count the host names give)."""
    cores = usable_cores()
    reports = exchange_reports(comm, cores) if comm.world_size > 1 else host_report(cores)
    overlapping = sharing_from_reports(reports, comm.rank)
    stated = launcher_local_size(backend, environ)
    sharing = min(overlapping, stated) if stated else overlapping
    return resolve(configured, len(cores), sharing)


# ---- applying the limit ----

@contextlib.contextmanager
def limited(threads: int) -> Iterator[None]:
    """Every thread pool threadpoolctl finds (BLAS, OpenMP), and engine.fast.kernels' own, limited to
    `threads` inside the block."""
    from threadpoolctl import threadpool_limits
    before = thread_pool.threads()
    with threadpool_limits(limits=threads):
        thread_pool.set_threads(threads)
        try:
            yield
        finally:
            thread_pool.set_threads(before)


def apply(threads: int) -> None:
    """Limit this process's pools to `threads` for good (a rank process, before it builds anything)."""
    from threadpoolctl import threadpool_limits
    threadpool_limits(limits=threads)
    thread_pool.set_threads(threads)


def blas_threads() -> int | None:
    """The thread count threadpoolctl reports for this process's BLAS, or None when none is loaded."""
    from threadpoolctl import threadpool_info
    return next((int(p["num_threads"]) for p in threadpool_info() if p.get("user_api") == "blas"), None)
