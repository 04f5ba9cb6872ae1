"""What a tensor-parallel block keeps for its backward, counted on the tape (every array an op saves),
element by element, for t in {2, 3, 4}, dropout on:

    inside the tensor-parallel region, 1/t on each rank: attention's qkv 3sbh/t, output sbh/t and
        log-sum-exp b·(a/t)·s; c_proj's input sbh/t; GELU's and the down projection's inputs 4sbh/t each
    the column-parallel products' inputs (the LayerNorms' outputs), whole: 2sbh
    the LayerNorm and dropout region: both LayerNorms' inputs and statistics 2(sbh + 2sb), both residual
        dropout masks 2sbh — whole under TP, 1/t under sequence parallelism (what SP saves)

(docs/tensor-parallel.md draws it.) The column-parallel products keep their gathered input: the same bytes
sent as TP, where Megatron-LM keeps the slice and gathers it again in backward."""

from __future__ import annotations

import pytest

from engine.comm.launch import run_ranks
from engine.tensor import set_tape_observer
from tests.tp_helpers import BLOCK, HEADS, WIDTH, random_batches, tiny_gpt, tp_model

ROWS = 2


class _Kept:
    def __init__(self):
        self.elements = 0

    def on_save(self, node_id, arrays):
        self.elements += sum(a.size for a in arrays)

    def on_free(self, node_id):
        pass


def _kept_rank(comm, emit, t, n_layer, sp):
    model = tp_model(comm, t, lambda: tiny_gpt(n_layer=n_layer, dropout=0.1), sp)
    x, _ = random_batches(1, rows=ROWS)[0]
    kept = _Kept()
    set_tape_observer(kept)
    try:
        model.rng.begin(0, 0)
        model(x)
    finally:
        set_tape_observer(None)
    return kept.elements


def expected_per_block(t: int, sp: bool) -> float:
    b, s, h, a = ROWS, BLOCK, WIDTH, HEADS
    inside = (3 + 1 + 1 + 4 + 4) * s * b * h / t + b * (a // t) * s
    column_inputs = 2 * s * b * h
    region = 2 * (s * b * h + 2 * s * b) + 2 * s * b * h
    return inside + column_inputs + (region / t if sp else region)


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
@pytest.mark.parametrize("t", [2, 3, 4])
def test_elements_kept_per_block(t, sp):
    one, two = (run_ranks(t, "threads", _kept_rank, args=(t, n, sp), timeout_s=60) for n in (1, 2))
    for r in range(t):
        assert two[r] - one[r] == expected_per_block(t, sp)
