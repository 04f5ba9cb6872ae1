"""Small GPT runs with pipeline parallelism whose memory the ledger measures, and the estimate each rank's
ledger is held against (tests/memory/test_pp_memory.py). Shapes: vocabulary 13, 4 heads of width 4, context
8, 2 rows per micro-batch per data-parallel rank, dropout on, tied embeddings (the last stage holds a
copy), n_layer one more than the stages, so the cut is uneven and the stages differ."""

from __future__ import annotations

from engine.bench.memory import measure_rank
from engine.comm.launch import run_ranks
from engine.config import from_dict, to_dict
from engine.memory.estimator import MemoryEstimate
from engine.memory.ledger import CATEGORIES, MODEL_STATES, PHASES
from engine.memory.pipeline import estimate_ranks
from engine.parallel.mesh import Mesh

CHUNKS = {"gpipe": 1, "1f1b": 1, "interleaved": 2, "zb-h1": 1}


def pp_memory_config(p: int, m: int, schedule: str, dtype: str = "fp64", world: int | None = None,
                     **over) -> dict:
    world = world or p
    tensor = over.pop("tensor", 1)
    d = {"name": "pp-memory", "seed": 5,
         "model": {"kind": "gpt", "n_layer": p * CHUNKS[schedule] + 1, "n_head": 4, "n_embd": 16,
                   "block_size": 8, "dropout": 0.1, "bias": True, "vocab_size": 13, "tie_weights": True},
         "data": {"kind": "synthetic-lm", "n_samples": 256},
         "train": {"steps": 2, "global_batch": 2 * m * world // (p * tensor), "micro_batches": m,
                   "eval_every": 0, "eval_batches": 1},
         "parallel": {"world_size": world, "pipeline": p, "tensor": tensor, "schedule": schedule,
                      "chunks": CHUNKS[schedule], "bucket_cap_mb": 0.002},
         "precision": {"dtype": dtype, "init_scale": 256.0}}
    for key, value in over.items():
        section, name = key.split("__")
        d.setdefault(section, {})[name] = value
    return to_dict(from_dict(d))


def measured(cfg_dict: dict, steps: int = 2) -> list[dict]:
    """Every rank's ledger over `steps` training steps (engine.bench.memory.measure_rank), in rank order."""
    world = cfg_dict["parallel"]["world_size"]
    return run_ranks(world, "threads", measure_rank, args=(cfg_dict, steps), timeout_s=120)


def estimate_of_rank(cfg_dict: dict) -> dict[int, MemoryEstimate]:
    """Global rank -> the estimate of its pipeline rank."""
    cfg = from_dict(cfg_dict)
    per_stage, mesh = estimate_ranks(cfg), Mesh.of(cfg.parallel)
    return {r: per_stage[mesh.coords(r).pp] for r in range(cfg.parallel.world_size)}


def mismatches(result: dict, e: MemoryEstimate) -> list[str]:
    """Where one rank's ledger and its estimate differ: model states at rest, each category's own maximum
    per phase, and the total at each phase's peak (empty: equal to the byte)."""
    rank, out = result["rank"], []
    for c in MODEL_STATES:
        if result["at_rest"][c] != e.states[c]:
            out.append(f"rank {rank} at rest {c}: ledger {result['at_rest'][c]}, estimate {e.states[c]}")
    for phase in PHASES:
        for c in CATEGORIES:
            got, want = result["maxima"][phase][c], e.maxima[phase][c]
            if got != want:
                out.append(f"rank {rank} {phase} {c}: ledger {got}, estimate {want}")
        got, want = sum(result["peaks"][phase].values()), sum(e.by_phase[phase].values())
        if got != want:
            out.append(f"rank {rank} {phase} peak total: ledger {got}, estimate {want}")
    return out
