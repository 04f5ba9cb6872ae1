"""The parts a per-rank memory estimate is built from, shared by the estimator (estimator.py) and the
pipeline estimate (pipeline.py), which builds on them per pipeline rank: the estimate itself
(MemoryEstimate), a replica's model states (the ZeRO table in estimator.py: model_states, shard_count), the
timeline that replays the arrays held through a step (Timeline, optimizer_phase), and the arrays a GPT keeps
for backward (gpt_saves). The formulas are estimator.py's docstring's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.dtypes import is_low_precision, itemsize, master_dtype
from engine.memory.ledger import CATEGORIES, PHASES, peak_phase
from engine.memory.tensor_parallel import TensorSplit
from engine.optim import CHUNK, NORM_CHUNK
from engine.parallel.data.buckets import aligned_buckets
from engine.parallel.data.flat import FlatLayout
from engine.parallel.mesh import Mesh


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-rank bytes: model states at rest, and per phase the categories at its estimated peak."""

    n_params: int
    world_size: int
    zero_stage: int
    dtype: str
    checkpointing: str
    micro_batch: int  # rows per rank per micro-batch
    states: dict = field(default_factory=dict)
    by_phase: dict = field(default_factory=dict)  # phase -> categories when its total peaks
    maxima: dict = field(default_factory=dict)  # phase -> each category's own maximum
    pipeline_rank: int = 0  # under pipeline parallelism, the pipeline rank this estimate is of
    stages: tuple[int, ...] = ()  # and the virtual stages it holds (engine.memory.pipeline)

    def phase(self, name: str) -> dict[str, int]:
        return dict(self.by_phase[name])

    def phases(self) -> dict[str, dict[str, int]]:
        return {name: self.phase(name) for name in PHASES}

    def peak(self) -> tuple[str, dict[str, int]]:
        """(phase, categories) of the phase with the highest total (engine.memory.ledger.peak_phase: on a
        tie the later phase, as the ledger's readers take it)."""
        phases = self.phases()
        phase = peak_phase(phases)
        assert phase is not None  # every estimate has the three phases
        return phase, phases[phase]

    def category_peaks(self) -> dict[str, int]:
        """Each category's own maximum over the step."""
        return {c: max(p[c] for p in self.maxima.values()) for c in CATEGORIES}


# ---------------------------------------------------------------------- model states

@dataclass(frozen=True)
class ModelStates:
    """What a rank's replica holds over the parameters `shapes`: model states by category, the AdamW
    pieces (elements each update covers), stage 3's padded units and the optimizer's scratch bytes."""

    states: dict
    pieces: list[int]
    units: list[int]
    scratch: int


def model_states(cfg, shapes) -> ModelStates:
    """The ZeRO table (engine.memory.estimator's docstring) over `shapes` (a rank's own parameters, in the
    replica's order)."""
    stage, dtype, shards = cfg.parallel.zero_stage, cfg.precision.dtype, shard_count(cfg)
    s, ms, low = itemsize(dtype), master_dtype(dtype).itemsize, is_low_precision(dtype)
    n = sum(math.prod(shape) for _, shape, _ in shapes)
    pieces, units = _pieces(shapes, cfg, shards, stage)  # elements each AdamW updates; stage-3 units
    owned = sum(pieces)
    states = {
        "parameters": s * ({0: n, 3: owned}.get(stage, owned * shards)),
        "gradients": s * ({0: n, 1: owned * shards}.get(stage, owned)),
        "master": 4 * owned if low else 0,
        "adam_m": ms * owned,
        "adam_v": ms * owned,
    }
    return ModelStates(states, pieces, units, 2 * ms * min(max(pieces), CHUNK))  # AdamW's, for the whole run


def optimizer_phase(timeline: Timeline, cfg, rest: ModelStates) -> None:
    """The optimizer step: the gradient norm passes through one float64 buffer of min(largest piece,
    NORM_CHUNK) elements; after it, a mixed-precision update makes an fp32 copy of the owned gradients."""
    norm_buf = 8 * min(max(rest.pieces), NORM_CHUNK)
    grad32 = 4 * sum(rest.pieces) if is_low_precision(cfg.precision.dtype) else 0
    timeline.peaks["optimizer"] = timeline.maxima["optimizer"] = {
        **timeline.base, "temporaries": rest.scratch + max(norm_buf, grad32)}


def shard_count(cfg) -> int:
    """Ranks ZeRO state is split over: the data x context group (the ranks that hold the same weights; the
    world, without tensor or pipeline parallelism), or under hybrid sharding the ranks of one node."""
    p = cfg.parallel
    return (p.ranks_per_node or p.world_size) if p.hybrid else Mesh.of(p).degree("dpcp")


def _pieces(shapes, cfg, shards: int, stage: int) -> tuple[list[int], list[int]]:
    """Elements of each range this rank's optimizer updates, and (stage 3) each unit's padded size,
    outer unit first. Mirrors engine.parallel.data's ddp (one piece), zero12 (part r of every aligned
    bucket) and zero3 (part r of every unit)."""
    if stage == 0:
        return [sum(math.prod(shape) for _, shape, _ in shapes)], []
    if stage in (1, 2):
        layout = FlatLayout([(name, shape) for name, shape, _ in shapes], cfg.precision.dtype, shards)
        buckets = aligned_buckets(layout, int(cfg.parallel.bucket_cap_mb * 2**20), shards)
        return [(b.end - b.start) // shards for b in buckets], []
    groups: dict = {}
    for _, shape, unit in shapes:
        groups[unit] = groups.get(unit, 0) + math.prod(shape)
    outer = [groups.pop(None)] if None in groups else [0]
    units = [math.ceil(k / shards) * shards for k in outer + [groups[u] for u in sorted(groups)]]
    return [u // shards for u in units if u], units


# ---------------------------------------------------------------------- one micro-batch, replayed

class Timeline:
    """Arrays held while one micro-batch runs, and per phase the categories at its highest total."""

    def __init__(self, states: dict[str, int], scratch: int):
        self.base = {**dict.fromkeys(CATEGORIES, 0), **states, "temporaries": scratch}
        self.held: dict[str, int] = {}  # activation arrays by name
        self.extra = dict.fromkeys(("parameters", "gradients", "comm_buffers"), 0)  # ZeRO transients
        self.peaks: dict[str, dict[str, int]] = {}
        self.maxima: dict[str, dict[str, int]] = {}

    def keep(self, arrays: dict[str, int], phase: str) -> None:
        self.held.update(arrays)
        self.mark(phase)

    def drop(self, arrays) -> None:
        for key in arrays:
            self.held.pop(key, None)

    def mark(self, phase: str) -> None:
        cats = dict(self.base)
        for c, v in self.extra.items():
            cats[c] += v
        cats["activations"] = sum(self.held.values())
        if phase not in self.peaks or sum(cats.values()) > sum(self.peaks[phase].values()):
            self.peaks[phase] = cats
        top = self.maxima.setdefault(phase, dict(cats))
        for c, v in cats.items():
            top[c] = max(top[c], v)


# ---------------------------------------------------------------------- what a GPT keeps for backward

def gpt_saves(b, t, c, h, v, n_layer, g, s, f, p, split: TensorSplit | None = None) -> list[dict[str, int]]:
    """Arrays kept for backward, grouped: embedding, each block (first key: its input), head. Under tensor
    parallelism (`split`) the products' outputs divide by t, the LayerNorm and dropout region by split.region
    (engine.memory.tensor_parallel)."""
    split = split or TensorSplit()
    btc, n, r = b * t * c * s, split.t, split.region
    embedding = {"idx": g * t * 8}
    if p:
        embedding["embedding dropout mask"] = b * t * c // r
    groups = [embedding]
    for k in range(n_layer):
        block = {f"x{k}": btc // r, f"ln_1 stats {k}": 2 * b * t * f // r, f"ln_1 out {k}": btc,
                 f"qkv {k}": 3 * btc // n, f"attn O {k}": btc // n, f"attn lse {k}": b * h // n * t * f,
                 f"h {k}": btc // r, f"ln_2 stats {k}": 2 * b * t * f // r, f"ln_2 out {k}": btc,
                 f"fc out {k}": 4 * btc // n, f"gelu out {k}": 4 * btc // n}
        if p:
            block.update({f"resid mask {k}": b * t * c // r, f"mlp mask {k}": b * t * c // r})
        groups.append(block)
    groups.append({f"x{n_layer}": btc // r, "ln_f stats": 2 * b * t * f // r, "ln_f out": btc,
                   "logits": b * t * -(-v // n) * s, "lse": b * t * f, "targets": g * t * 8})
    return groups
