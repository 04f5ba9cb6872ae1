"""Sampling from a tensor-parallel GPT: GPT.generate, fed the whole logits.

Each rank's forward ends in its [b, s, V/t] slice of the logits (the vocab-parallel output layer), so
generate would sample from a slice. `generate` runs the model's own sampling loop on a view of the model
whose forward gathers the vocabulary (layout.whole_logits: an all-gather of b·s·V, fine for sampling and
never done for the loss). Every rank gathers the same logits and draws with the same generator, so every
rank appends the same tokens: the group stays in step. Under sequence parallelism the sequence is padded
on the right to a multiple of t; causal attention keeps the padding from reaching the real positions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.nn import GPT
from engine.tensor import Tensor


class _WholeLogitsView:
    """What GPT.generate reads of its model (block_size, vocab_size, training, eval, train, calling it),
    with the call returning the whole logits."""

    def __init__(self, model: GPT, layout: Any):
        self.model, self.layout = model, layout
        self.block_size, self.vocab_size = model.block_size, model.vocab_size

    @property
    def training(self) -> bool:
        return self.model.training

    def eval(self):
        return self.model.eval()

    def train(self, mode: bool = True):
        return self.model.train(mode)

    def __call__(self, idx: np.ndarray) -> Tensor:
        length, t = idx.shape[1], self.layout.degree
        if self.layout.sequence_parallel and length % t:
            idx = np.pad(idx, ((0, 0), (0, t - length % t)))
        logits = self.model(idx).data[:, :length]
        return Tensor(self.layout.whole_logits(np.ascontiguousarray(logits)))


def generate(model: GPT, layout: Any, idx, n: int, temperature: float = 1.0,
             rng: np.random.Generator | None = None, top_k: int = 0) -> np.ndarray:
    """GPT.generate on every rank of the group at once (collective: each rank calls it with the same
    arguments and a generator in the same state)."""
    view: Any = _WholeLogitsView(model, layout)
    return GPT.generate(view, idx, n, temperature, rng, top_k)
