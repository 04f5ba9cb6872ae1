"""Where a finished GPT is cut into pipeline stages: which blocks each stage holds, and what it weighs.

The embedding (wte, wpe and the first dropout) always sits on stage 0, the final LayerNorm and the output
layer (and the loss) on the last stage; the blocks between are cut into contiguous runs, one per stage,
every stage holding at least one block. How many blocks each stage gets:

  "params"  balanced by parameter count: the cut that makes the heaviest stage lightest (ties: the most
            even), the embedding and head counted on their stages, so with many equal blocks the first
            and last stage hold a block less when the embedding and head weigh something;
  "time"    the same, weighing each piece by its measured forward time on a sample batch;
  [n, ...]  given: block counts per stage, summing to n_layer.

This module only describes the cut (engine.parallel.pipeline.stage_module builds the stages from it); the
memory estimator and the workbench read the description.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.config.vocabulary import STAGE_BALANCES
from engine.dropout_rng import DropoutRNG
from engine.nn import GPT, Module
from engine.tensor import Parameter, no_grad


@dataclass(frozen=True)
class StagePart:
    """One virtual stage of the cut: the dense model's blocks [first_block, first_block + n_blocks)."""

    index: int
    first_block: int
    n_blocks: int
    embedding: bool  # wte, wpe and the embedding's dropout
    head: bool  # ln_f, lm_head and the loss
    parameters: int  # elements of the parameters this stage holds (a tied head's copy included)
    parameter_names: tuple[str, ...]  # dense names, in forward order

    @property
    def blocks(self) -> range:
        return range(self.first_block, self.first_block + self.n_blocks)

    @property
    def label(self) -> str:
        """What the stage holds, in words: "embedding, blocks 0-1", "block 2", "blocks 3-4, head"."""
        last = self.first_block + self.n_blocks - 1
        blocks = f"block {last}" if self.n_blocks == 1 else f"blocks {self.first_block}-{last}"
        parts = (["embedding"] if self.embedding else []) + [blocks] + (["head"] if self.head else [])
        return ", ".join(parts)


@dataclass(frozen=True)
class PipelineSplit:
    """The whole cut, stage 0 (embedding) to the last (head). `tied_copy`: the head is tied to the embedding
    and they sit on different stages, so the last stage holds a copy of wte.weight kept in step with it."""

    stages: tuple[StagePart, ...]
    balance: str  # "params", "time" or "given"
    tied_copy: bool

    @property
    def block_counts(self) -> list[int]:
        return [s.n_blocks for s in self.stages]

    def __len__(self) -> int:
        return len(self.stages)


def split_model(model: Module, stages: int, balance: str | Sequence[int] = "params",
                sample: np.ndarray | None = None) -> PipelineSplit:
    """Cut `model` (a GPT) into `stages` contiguous stages; `sample` (token ids [b, t]) is what "time"
    measures the forward on."""
    if not isinstance(model, GPT):
        raise ValueError(f"pipeline parallelism cuts a GPT into stages; a {type(model).__name__} has no "
                         "blocks to cut")
    n_layer = model.n_layer
    if stages < 1 or stages > n_layer:
        raise ValueError(f"cannot cut a GPT of {n_layer} blocks into {stages} pipeline stages: each stage "
                         f"needs a block (1 to {n_layer} stages)")
    if isinstance(balance, str):
        if balance not in STAGE_BALANCES:
            raise ValueError(f"stage balance {balance!r} is not one of {', '.join(STAGE_BALANCES)} or a list "
                             "of block counts")
        weights = _param_weights(model) if balance == "params" else _time_weights(model, sample)
        counts = balanced_counts(weights[1:-1], stages, weights[0], weights[-1])
    else:
        counts = [int(n) for n in balance]
        if len(counts) != stages or sum(counts) != n_layer or min(counts) < 1:
            raise ValueError(f"block counts {counts} must be {stages} numbers of at least 1 that sum to "
                             f"n_layer {n_layer}")
        balance = "given"
    return describe(model, counts, balance)


def describe(model: GPT, counts: Sequence[int], balance: str) -> PipelineSplit:
    """The description of the cut giving stage i the next counts[i] blocks."""
    tied = model.lm_head.weight is model.wte.weight
    tied_copy = tied and len(counts) > 1
    sizes = {name: p.size for name, p in _named(model)}  # a tied weight under both its names
    parts, first = [], 0
    for i, n in enumerate(counts):
        embedding, head = i == 0, i == len(counts) - 1
        names = _stage_parameter_names(model, first, n, embedding, head, tied_copy)
        parts.append(StagePart(i, first, n, embedding, head, sum(sizes[m] for m in names), tuple(names)))
        first += n
    return PipelineSplit(tuple(parts), balance, tied_copy)


def _stage_parameter_names(model: GPT, first: int, n: int, embedding: bool, head: bool,
                           tied_copy: bool) -> list[str]:
    names = ["wte.weight", "wpe.weight"] if embedding else []
    for b in range(first, first + n):
        names += [f"blocks.{b}.{name}" for name, _ in _named(model.blocks[b])]
    if head:
        names += [f"ln_f.{name}" for name, _ in _named(model.ln_f)]
        if tied_copy or model.lm_head.weight is not model.wte.weight:
            names.append("lm_head.weight")
    return names


def _named(module: Module) -> list[tuple[str, Parameter]]:
    return [(name, p) for name, _, _, p in module._owned_parameters()]


def _param_weights(model: GPT) -> list[float]:
    """Elements of [embedding, block 0, ..., block n-1, head]; a tied head counts its (copied) weight."""
    embedding = model.wte.weight.size + model.wpe.weight.size
    blocks = [sum(p.size for p in b.parameters()) for b in model.blocks]
    head = sum(p.size for p in model.ln_f.parameters()) + model.lm_head.weight.size
    return [float(embedding), *map(float, blocks), float(head)]


def _time_weights(model: GPT, sample: np.ndarray | None, repeats: int = 3) -> list[float]:
    """Seconds of [embedding, block 0, ..., head] forwards on `sample`, the best of `repeats` (no tape)."""
    if sample is None:
        raise ValueError("stage balance 'time' measures the forward: pass a sample batch of token ids")
    idx = np.asarray(sample)
    t = idx.shape[1]
    pieces = [lambda _: model.drop(model.wte(idx) + model.wpe.weight[:t])]
    pieces += [block for block in model.blocks]
    pieces.append(lambda x: model.lm_head(model.ln_f(x)))
    times, x = [], None
    rng = model_rng(model)
    position = rng.position()
    with no_grad():
        for piece in pieces:
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                y = piece(x)
                best = min(best, time.perf_counter() - start)
            times.append(best)
            x = y
    rng.rewind(position)
    return times


def model_rng(model: Module) -> DropoutRNG:
    """The DropoutRNG a GPT's dropout draws from (a GPT always has one)."""
    if model.rng is None:
        raise ValueError(f"a {type(model).__name__} without a DropoutRNG cannot be cut into stages")
    return model.rng


def balanced_counts(block_weights: Sequence[float], stages: int, first_extra: float = 0.0,
                    last_extra: float = 0.0) -> list[int]:
    """Block counts (each >= 1) of the contiguous cut whose heaviest stage is lightest, the first stage also
    carrying `first_extra` and the last `last_extra`; among equal heaviest, the smallest sum of squares."""
    n = len(block_weights)
    prefix = np.concatenate([[0.0], np.cumsum(block_weights)])

    def weight(stage: int, lo: int, hi: int) -> float:
        extra = (first_extra if stage == 0 else 0.0) + (last_extra if stage == stages - 1 else 0.0)
        return float(prefix[hi] - prefix[lo]) + extra

    # best[s][i]: (heaviest, sum of squares, counts) of stages 0..s-1 holding blocks [0, i)
    best: list[dict[int, tuple[float, float, list[int]]]] = [{0: (0.0, 0.0, [])}]
    for s in range(stages):
        row: dict[int, tuple[float, float, list[int]]] = {}
        for lo, (heavy, squares, counts) in best[s].items():
            for hi in range(lo + 1, n - (stages - s - 1) + 1):
                w = weight(s, lo, hi)
                candidate = (max(heavy, w), squares + w * w, counts + [hi - lo])
                if hi not in row or candidate[:2] < row[hi][:2]:
                    row[hi] = candidate
        best.append(row)
    return best[stages][n][2]
