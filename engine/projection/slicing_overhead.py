"""What time-slicing costs compute beyond the share of a core it leaves each rank.

Where ranks outnumber the host's cores, the scheduler runs them in turns, and a rank's compute stretches
by the ranks per core (engine.projection.compute's demand factor) — and by a little more: each turn
starts on caches the other rank filled, so the same step takes more CPU time than it does on a core of its
own. Measured, not assumed, with the model itself and no more than two ranks (the calibration's limit):
two single-threaded ranks train the model alone (as compute_calibration does), once each pinned to a core
of its own, once both pinned to one core, and

    overhead = (forward + backward, both on one core) / (2 × (forward + backward, a core each))

On this 2-core machine, gpt-mini's model at 8 rows per micro-batch: 41.6 ms a step on a core each, 84-90
ms on one (overhead 1.01-1.08; backward, with the larger working set, stretches more than forward).
"""

from __future__ import annotations

import os
import statistics

from engine.comm.launch import run_ranks
from engine.config import Config, from_dict, to_dict
from engine.projection.compute_calibration import one_rank_config, time_phases

RANKS = 2


def measure_slicing_overhead(cfg: Config, dtypes, rows: int, cores: list[int], steps: int,
                             warmup: int) -> dict[str, float]:
    """{dtype: overhead} of cfg's model at `rows` rows per micro-batch ({} on a host of one core)."""
    if len(cores) < RANKS or not hasattr(os, "sched_setaffinity"):
        return {}
    args = (to_dict(cfg), list(dtypes), rows, steps, warmup)
    spread = run_ranks(RANKS, "processes", _pinned_rank, (*args, cores[:RANKS]), timeout_s=300.0,
                       threads_per_rank=1)
    stacked = run_ranks(RANKS, "processes", _pinned_rank, (*args, [cores[0]] * RANKS), timeout_s=300.0,
                        threads_per_rank=1)
    return {d: statistics.mean(r[d] for r in stacked) / (RANKS * statistics.mean(r[d] for r in spread))
            for d in dtypes}


def _pinned_rank(comm, emit, cfg_dict: dict, dtypes: list[str], rows: int, steps: int, warmup: int,
                 cores: list[int]) -> dict:
    """One rank on core `cores[rank]`: forward + backward seconds of its model alone, per dtype."""
    os.sched_setaffinity(0, {cores[comm.rank]})
    out = {}
    for dtype in dtypes:
        phases = time_phases(comm, from_dict(one_rank_config(cfg_dict, dtype, rows), source="<calibration>"),
                             steps, warmup)
        out[dtype] = phases["forward"] + phases["backward"]
    return out
