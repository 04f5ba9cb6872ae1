"""What a training step sends, per rank: bytes by communicator (the world, its node, its cross-node
column) and how many of them cross between nodes (`nanodist-tui bench traffic`).

A couple of real steps on the threads backend (the bytes do not depend on the backend), read from the
traffic meter of the last one: exact payload counts, not estimates. "Across nodes" counts the links whose
two ends sit on different nodes of `parallel.ranks_per_node` — the traffic a slow inter-node link carries.
"""

from __future__ import annotations

from engine.comm.launch import run_ranks
from engine.config import from_dict, replace, to_dict
from engine.trainer import Trainer


def traffic_per_step(cfg, steps: int = 2) -> list[dict]:
    """Per rank: {rank, total, by_group: {world|node|cross|...: bytes}, by_phase, across_nodes}, the bytes
    this rank sent in step `steps`."""
    cfg = replace(cfg, "parallel.backend", "threads")
    return run_ranks(cfg.parallel.world_size, "threads", _rank, (to_dict(cfg), steps), timeout_s=120)


def _rank(comm, emit, cfg_dict: dict, steps: int) -> dict:
    cfg = from_dict(cfg_dict, source="<bench traffic>")
    trainer = Trainer(cfg, comm)
    try:
        for _ in range(steps):
            trainer.train_step()
        links = comm.meter.snapshot()
    finally:
        trainer.replica.close()
    per_node = cfg.parallel.ranks_per_node or cfg.parallel.world_size
    by_group: dict[str, int] = {}
    by_phase: dict[str, int] = {}
    for link in links:
        kind = link["group"].rstrip("0123456789") or link["group"]  # node0 -> node, cross1 -> cross
        by_group[kind] = by_group.get(kind, 0) + link["bytes"]
        by_phase[link["phase"]] = by_phase.get(link["phase"], 0) + link["bytes"]
    across = sum(link["bytes"] for link in links
                 if link["dst"] >= 0 and link["src"] // per_node != link["dst"] // per_node)
    return {"rank": comm.rank, "total": sum(by_group.values()), "by_group": by_group, "by_phase": by_phase,
            "across_nodes": across}
