"""A model that is not tensor-parallel, asked what a TensorParallelLayout is asked: the plain loss, its own
logits, nothing sharded, nothing to sum or agree over. `model_layout(model)` (plan.py) hands out this one
for a dense model, so the trainer, the replicas and checkpoints ask the same questions of every model,
without an `if tensor_parallel:` (what `layout.py` answers for a tensor-parallel one).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from engine import ops
from engine.parallel.tensor.slicing import ShardSpec
from engine.tensor import Tensor


class WholeModel:
    degree, rank, sequence_parallel = 1, 0, False
    specs: dict[str, ShardSpec] = {}

    def __init__(self):
        self.tally: Counter = Counter()  # never counts: there are no tensor-parallel collectives

    def collectives_per_layer(self, passes: int = 1) -> dict[str, float]:
        return {}

    def loss(self, logits: Tensor, targets) -> Tensor:
        return ops.cross_entropy(logits, targets)

    def whole_logits(self, logits: np.ndarray) -> np.ndarray:
        return logits

    def is_sharded(self, name: str) -> bool:
        return False

    def sums_partial(self, name: str) -> bool:
        return False

    def sum_partial_grads(self, flat: np.ndarray) -> None:
        pass

    def agree_max(self, flags: np.ndarray) -> None:
        pass

    def combine_sum_of_squares(self, sharded: float, replicated: float) -> float:
        return sharded + replicated

    def generate(self, model, idx, n: int, temperature: float = 1.0, rng=None, top_k: int = 0) -> np.ndarray:
        return model.generate(idx, n, temperature, rng, top_k)
