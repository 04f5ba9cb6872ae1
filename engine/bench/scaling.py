"""`bench scaling`: strong and weak scaling on the processes backend, ours and PyTorch DDP side by side.

    strong  the preset's global batch G, split over N ranks:   efficiency = T(1) / (N · T(N))
    weak    G rows per rank, a global batch of N · G:          efficiency = T(1) / T(N)

T(N) is the step time at N ranks (engine.bench.ddp_peer.race_ddp: both libraries in the same rank
processes, taking turns, each rank with its share of the host's cores). N = 1 is the same
measurement for both series. Without PyTorch, ours is timed alone (engine.bench.step.time_ours).
"""

from __future__ import annotations

from engine.bench.ddp_peer import race_ddp
from engine.bench.step import time_ours
from engine.config import Config, replace

MODES = ("strong", "weak")


def scaling(cfg: Config, worlds: tuple[int, ...] = (1, 2, 4), warmup: int = 3, steps: int = 10) -> dict:
    """Rows {mode, world_size, global_batch, ours_s, torch_s (None without PyTorch), ours_tokens_per_s,
    torch_tokens_per_s, ours_efficiency, torch_efficiency, comm_share (ours), ratio}, strong then weak.
    A world size the global batch cannot be split over raises ConfigError (a user mistake)."""
    base = replace(cfg, "parallel.backend", "processes")
    configs = {(mode, n): _config(base, mode, n) for mode in MODES for n in worlds}  # all validated first
    measured: dict[tuple[int, int], dict] = {}
    rows = []
    for (mode, n), c in configs.items():
        key = (n, c.train.global_batch)  # strong and weak at N = 1 are one configuration
        if key not in measured:
            measured[key] = _measure(c, warmup, steps)
        rows.append({"mode": mode, "world_size": n, "global_batch": c.train.global_batch, **measured[key]})
    for mode in MODES:
        series = [r for r in rows if r["mode"] == mode]
        one = next((r for r in series if r["world_size"] == 1), None)
        for r in series:
            for who in ("ours", "torch"):
                t, t1 = r[who + "_s"], one and one[who + "_s"]
                factor = r["world_size"] if mode == "strong" else 1
                r[who + "_efficiency"] = t1 / (factor * t) if t and t1 else None
    return {"preset": cfg.name, "worlds": list(worlds), "rows": rows}


def _config(base: Config, mode: str, n: int) -> Config:
    batch = base.train.global_batch * (n if mode == "weak" else 1)
    return replace(replace(base, "train.global_batch", batch), "parallel.world_size", n)


def _measure(cfg: Config, warmup: int, steps: int) -> dict:
    race = race_ddp(cfg, warmup, steps)
    if race is None:
        ours = time_ours(cfg, warmup, steps)
        race = {"ours_s": ours["step_s"], "torch_s": None, "comm_share": ours["comm_share"],
                "tokens": ours["tokens"], "ratio": None}
    tokens = race["tokens"]
    return {"ours_s": race["ours_s"], "torch_s": race["torch_s"], "ratio": race["ratio"],
            "comm_share": race["comm_share"], "ours_tokens_per_s": tokens / race["ours_s"],
            "torch_tokens_per_s": tokens / race["torch_s"] if race["torch_s"] else None}
