"""Calibrating ``algorithm = "auto"``: time every candidate all-reduce at a ladder of sizes on this
backend, world size and node grid, fit the crossovers (engine.comm.auto.fit) and save them in the tuning
file under the key a training run with the same settings looks up.

The candidates take turns at every size in one run (engine.bench.allreduce), so the comparison is fair
on a noisy machine; "hierarchical" is a candidate only on a two-level grid (more than one node of more
than one rank).
"""

from __future__ import annotations

from pathlib import Path

from engine.bench.allreduce import bench_allreduce
from engine.comm import auto
from engine.comm.emulation import NetworkEmulation

LADDER = tuple(1 << k for k in range(10, 25, 2))  # 1 KiB, 4 KiB, ... 16 MiB


def candidates(world_size: int, ranks_per_node: int) -> tuple[str, ...]:
    two_level = 1 < ranks_per_node < world_size
    return tuple(a for a in auto.CANDIDATES if a != "hierarchical" or two_level)


def calibrate(backend: str, world_size: int, ranks_per_node: int = 0, sizes=LADDER, iters: int = 10,
              warmup: int = 2, path: Path | None = None, network: NetworkEmulation | None = None,
              network_key: str = "") -> dict:
    """Measure (on the emulated ``network``, if given), fit, save under the key naming it; returns
    {key, path, crossovers, rows}."""
    rows = bench_allreduce(backend, world_size, sizes, iters, warmup,
                           algorithm=candidates(world_size, ranks_per_node), ranks_per_node=ranks_per_node,
                           network=network)
    times: dict[int, dict[str, float]] = {}
    for row in rows:
        times.setdefault(row["size"], {})[row["algorithm"]] = row["time_s"]
    crossovers = auto.fit(times)
    key = auto.key(backend, world_size, ranks_per_node, network_key)
    target = path if path is not None else auto.tuning_path()
    auto.save(target, key, crossovers, times)
    return {"key": key, "path": str(target), "crossovers": crossovers, "rows": rows}
