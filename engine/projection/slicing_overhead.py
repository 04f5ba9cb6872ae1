"""What time-slicing costs compute beyond the share of a core it leaves each rank.

Where ranks outnumber the host's cores, the scheduler runs them in turns, and a rank's compute stretches
by the ranks per core (engine.projection.compute's demand factor) — and by a little more: each turn
starts on caches the other rank filled, so the same step takes more CPU time than it does on a core of its
own. Measured, not assumed, with the model itself and no more than two ranks (the calibration's limit):
two single-threaded ranks train the model alone (as compute_calibration does), each on a core of its own
and both on one core, in ROUNDS alternations inside one launch, and

    overhead = median over rounds and ranks of (forward + backward, both on one core)
                                                / (2 × (forward + backward, a core each))

Alternating, in the order ABBA (a core each, one core, one core, a core each, ...), because the machine's
speed drifts by 10-30% within a minute on a shared host: measured one after the other in two launches (the
first form), the ratio swung from 0.85 to 1.13 between calibrations minutes apart, and the 4-rank
predictions with it. The pairs are seconds apart, and the drift within a pair cancels over the rounds.

At least 1: below it, the pair on one core gained from the core left idle beside it (a memory bus or a
physical core the two share), a relief that time-sliced ranks, with every core busy, do not get; what
sharing a busy host costs is in the 2-rank curves already.

On this 2-core machine, gpt-mini's model at 8 rows per micro-batch: 41.6 ms a step on a core each, 84-90
ms on one (overhead 1.01-1.08; backward, with the larger working set, stretches more than forward).
"""

from __future__ import annotations

import os
import statistics

from engine.comm.launch import run_ranks
from engine.config import Config, from_dict, to_dict
from engine.projection.compute_calibration import one_rank_config, one_rank_trainer, timed_steps
from engine.projection.quantile import low_quantile

RANKS = 2
ROUNDS = 4  # alternations of a core each and one core for both


def measure_slicing_overhead(cfg: Config, dtypes, rows: int, cores: list[int], steps: int,
                             warmup: int) -> dict[str, float]:
    """{dtype: overhead} of cfg's model at `rows` rows per micro-batch ({} on a host of one core).
    `steps`: timed steps of each placement, spread over the rounds."""
    if len(cores) < RANKS or not hasattr(os, "sched_setaffinity"):
        return {}
    per_round = max(2, steps // ROUNDS)
    results = run_ranks(RANKS, "processes", _alternating_rank,
                        (to_dict(cfg), list(dtypes), rows, per_round, warmup, cores[:RANKS]), timeout_s=300.0,
                        threads_per_rank=1)
    return {d: overhead([pair for r in results for pair in r[d]]) for d in dtypes}


def overhead(pairs: list[tuple[float, float]]) -> float:
    """The overhead from (seconds on a core each, seconds both on one core) pairs (see the docstring)."""
    return max(1.0, statistics.median(stacked / (RANKS * spread) for spread, stacked in pairs))


def placements(rank: int, cores: list[int]) -> list[tuple[str, set[int]]]:
    """Each round's placements of this rank, in ABBA order: ("spread", its own core) and ("stacked", the
    first core, shared by both ranks)."""
    spread, stacked = ("spread", {cores[rank]}), ("stacked", {cores[0]})
    return [p for r in range(ROUNDS) for p in ((spread, stacked) if r % 2 == 0 else (stacked, spread))]


def _alternating_rank(comm, emit, cfg_dict: dict, dtypes: list[str], rows: int, steps: int, warmup: int,
                      cores: list[int]) -> dict:
    """This rank's (spread, stacked) forward + backward seconds per round, per dtype. The affinity is the
    calling thread's, the one that computes (one thread per rank: the BLAS pool runs on it)."""
    out: dict = {}
    for dtype in dtypes:
        trainer = one_rank_trainer(from_dict(one_rank_config(cfg_dict, dtype, rows), source="<calibration>"))
        seconds: dict[str, list[float]] = {"spread": [], "stacked": []}
        try:
            for n, (name, cpus) in enumerate(placements(comm.rank, cores)):
                os.sched_setaffinity(0, cpus)
                # a step on the new core first: its caches are cold (the first placement: the warm-up too)
                phases, _, _ = timed_steps(comm, trainer, warmup if n == 0 else 1, steps)
                seconds[name].append(low_quantile(phases["forward"]) + low_quantile(phases["backward"]))
        finally:
            trainer.replica.close()
        out[dtype] = [[a, b] for a, b in zip(seconds["spread"], seconds["stacked"])]
    return out
