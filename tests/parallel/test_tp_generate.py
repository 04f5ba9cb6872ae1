"""Sampling from a tensor-parallel GPT (layout.generate: GPT.generate fed the whole logits) draws exactly the
tokens one device draws, on every rank of the group, with and without sequence parallelism (prompts whose
length t does not divide are padded on the right); a whole model's stand-in (model_layout) is its own
generate."""

from __future__ import annotations

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from engine.parallel.tensor import model_layout
from tests.tp_helpers import tiny_gpt, tp_model

PROMPT = np.array([[1, 4, 7], [2, 2, 9]])  # 3 tokens: no t in {2, 4} divides it


def _sample(model, layout, temperature, top_k):
    return layout.generate(model, PROMPT, 10, temperature, np.random.default_rng(7), top_k)


def _sample_rank(comm, emit, t, sp, temperature, top_k):
    model = tp_model(comm, t, lambda: tiny_gpt(dropout=0.1), sp)
    return _sample(model, model.tensor_parallel, temperature, top_k)


@pytest.mark.parametrize("temperature, top_k", [(0.0, 0), (1.0, 0), (0.8, 3)],
                         ids=["greedy", "sample", "top-k"])
@pytest.mark.parametrize("t, sp", [(2, False), (2, True), (4, True)], ids=["tp2", "tp2+sp", "tp4+sp"])
def test_tensor_parallel_sampling_draws_what_one_device_draws(t, sp, temperature, top_k):
    dense = tiny_gpt(dropout=0.1)
    expected = _sample(dense, model_layout(dense), temperature, top_k)
    np.testing.assert_array_equal(expected, dense.generate(PROMPT, 10, temperature, np.random.default_rng(7),
                                                           top_k))
    for tokens in run_ranks(t, "threads", _sample_rank, args=(t, sp, temperature, top_k), timeout_s=60):
        np.testing.assert_array_equal(tokens, expected)
