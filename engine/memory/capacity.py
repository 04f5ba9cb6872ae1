"""Will a run fit on this machine? Checked before any rank starts, so a size the machine cannot hold is
one line naming the setting, not a MemoryError (or the OOM killer) inside a rank.

The need is the estimator's peak per rank (engine.memory.estimator: model states, activations, buffers,
temporaries) times the ranks this machine runs, plus the training data each of them builds, plus what a
rank costs before it holds a byte of the model (fixed_bytes: a rank process's own interpreter and engine,
a rank thread's stack); the supply is the memory the machine has available now (Linux: MemAvailable).
`run.check_memory = false` starts anyway — for a machine whose memory the check misjudges (swap,
overcommit, a container's own limit).
"""
from __future__ import annotations

import os

from engine.comm import cores
from engine.config import ConfigError
from engine.memory.estimator import estimate

# bytes each synthetic sample costs while its dataset is built (float64 draws and their temporaries;
# the LM stream is built through Python lists of ints)
_CLASSIFICATION_BYTES_PER_FEATURE = 24
_LM_BYTES_PER_TOKEN = 48

# What a rank process started by the processes backend holds besides the bytes the estimator counts: its
# interpreter, the engine and NumPy it imports, the kernels numba compiles, the allocator's slack. Measured
# on a 2-rank `--preset quickstart -b processes` run (Linux, Python 3.11, NumPy 2, numba) by reading each
# rank's /proc/PID/smaps_rollup every 0.5 s: at the peak each rank held 95 MB Private_Dirty (192 MB Rss),
# of which the ledger's peak was 13 MB; the rest, ~82 MB, rounded up to 90 MB. Libraries' code pages
# (Shared_Clean, 95 MB) are shared by every rank through the page cache: counted once, not per rank (counting
# Rss per rank would refuse a 64-rank run needing ~6 GB as needing ~12 GB).
RANK_PROCESS_BYTES = 90 * 10**6
SHARED_CODE_BYTES = 95 * 10**6
# A rank thread shares its interpreter with the launcher (already running, so already outside what is
# available); it adds its stack and its communication thread's. Measured as the Rss growth of 512 threads
# that each ran a matmul and a 200-deep recursion: 45 kB a thread; two threads a rank, rounded up.
RANK_THREAD_BYTES = 100 * 10**3


def available_memory() -> int | None:
    """Bytes of memory available to new allocations now, or None where the system does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def local_ranks(cfg) -> int:
    """Ranks this machine runs: all of them for threads and processes; for tcp and mpi what the launcher
    says runs on this host (LOCAL_WORLD_SIZE, MPI's local size), else parallel.ranks_per_node, else 1."""
    p = cfg.parallel
    if p.backend in ("threads", "processes"):
        return p.world_size
    return cores.launcher_local_size(p.backend) or max(p.ranks_per_node, 1)


def fixed_bytes(cfg) -> tuple[int, int, str]:
    """(bytes each rank on this machine costs before it holds any model state, bytes its ranks share once,
    what that is in words). Only ranks nanoDist starts count: tcp and mpi ranks were started by their
    launcher and already hold their interpreters."""
    backend = cfg.parallel.backend
    if backend == "processes":
        return RANK_PROCESS_BYTES, SHARED_CODE_BYTES, "interpreter"
    if backend == "threads":
        return RANK_THREAD_BYTES, 0, "thread stacks"
    return 0, 0, ""


def data_bytes(cfg) -> int:
    """Bytes one rank's synthetic dataset takes to build (0 for corpora read from files: the file bounds
    them)."""
    d, m = cfg.data, cfg.model
    if d.kind == "synthetic-classification":
        return d.n_samples * (m.widths[0] + 1) * _CLASSIFICATION_BYTES_PER_FEATURE
    if d.kind == "synthetic-lm":
        return d.n_samples * m.block_size * _LM_BYTES_PER_TOKEN
    return 0


def check_data_fits(cfg, available: int | None = None) -> None:
    """ConfigError when the ranks' synthetic datasets alone cannot fit (checked before building one)."""
    need = data_bytes(cfg) * local_ranks(cfg)
    _check(cfg, need, "data.n_samples", f"the synthetic data of {local_ranks(cfg)} rank(s) would take "
           f"{_size(need)} to build", "lower data.n_samples", available)


def check_fits(cfg, vocab: int | None = None, available: int | None = None) -> None:
    """ConfigError when the ranks on this machine would need more memory than it has available."""
    ranks = local_ranks(cfg)
    _, categories = estimate(cfg, vocab).peak()
    per_rank = sum(categories.values())
    fixed, shared, fixed_what = fixed_bytes(cfg)
    data = data_bytes(cfg)
    need = (fixed + per_rank + data) * ranks + shared
    noun = {"processes": ("rank process", "rank processes"), "threads": ("rank thread", "rank threads")}.get(
        cfg.parallel.backend, ("rank", "ranks"))[ranks > 1]
    each = " each" if ranks > 1 else ""
    parts = [f"{_size(fixed)} {fixed_what}{each}"] if fixed else []
    parts.append(f"{_size(per_rank)} by the estimate{each}")
    parts += [f"{_size(data)} data{each}"] if data else []
    parts += [f"{_size(shared)} shared code once"] if shared else []
    what = (f"{ranks} {noun} would need about {_size(need)} at the peak "
            f"({' + '.join(parts)}; `nanodist-tui memory` breaks the estimate down)")
    fix = "fewer ranks (-n)" + (", or the threads backend" if cfg.parallel.backend == "processes" else "")
    _check(cfg, need, "run.check_memory", what, f"{fix}; or make the model or batch smaller, or use ZeRO, "
           "16-bit precision or checkpointing", available)


def _check(cfg, need: int, key: str, what: str, fix: str, available: int | None) -> None:
    if not cfg.run.check_memory:
        return
    available = available_memory() if available is None else available
    if available is None or need <= available:
        return
    raise ConfigError(key, f"{what}, but this machine has {_size(available)} available",
                      f"{fix}; or --set run.check_memory=false to start anyway", source="this machine")


def _size(n: int) -> str:
    for unit, factor in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= factor:
            return f"{n / factor:.4g} {unit}"
    return f"{n / 1e3:.4g} kB"
