"""The cut of a GPT into pipeline stages (engine/parallel/pipeline/split.py): balanced by parameters it gives
the published splits (equal blocks when they divide evenly; otherwise, torchtitan's rule, the first and last
stage — which also carry the embedding and the head — a block less), balanced by time it measures, given
counts are taken as given; what it describes is what the stages hold; bad cuts are one line."""

from __future__ import annotations

import numpy as np
import pytest

from engine.nn import MLP
from engine.parallel.pipeline.split import balanced_counts, split_model
from engine.parallel.pipeline.stage import StageRunner
from tests.pp_stage_helpers import micro_batches, model_fn


@pytest.mark.parametrize(("n_layer", "stages", "counts"), [
    (4, 2, [2, 2]), (8, 4, [2, 2, 2, 2]), (6, 4, [1, 2, 2, 1]), (4, 4, [1, 1, 1, 1]), (4, 1, [4]),
])
def test_params_balance_gives_the_published_split(n_layer, stages, counts):
    split = split_model(model_fn(n_layer=n_layer)(), stages, "params")
    assert split.block_counts == counts and split.balance == "params"


def test_balance_weighs_the_embedding_and_head():
    """A heavy first stage keeps fewer blocks: the cut minimises the heaviest stage (brute force agrees)."""
    weights, first, last = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0], 7.0, 2.0
    counts = balanced_counts(weights, 3, first, last)

    def heaviest(c):
        bounds = np.cumsum([0] + list(c))
        loads = [sum(weights[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])]
        loads[0] += first
        loads[-1] += last
        return max(loads)
    every = [(a, b, 8 - a - b) for a in range(1, 7) for b in range(1, 8 - a) if 8 - a - b >= 1]
    assert heaviest(counts) == min(heaviest(c) for c in every)


def test_time_balance_measures_every_block():
    model = model_fn(n_layer=6)()
    split = split_model(model, 3, "time", sample=micro_batches(1)[0][0])
    assert split.balance == "time" and sum(split.block_counts) == 6 and min(split.block_counts) >= 1


def test_given_counts():
    split = split_model(model_fn(n_layer=6)(), 3, [3, 2, 1])
    assert split.block_counts == [3, 2, 1] and split.balance == "given"
    assert [list(s.blocks) for s in split.stages] == [[0, 1, 2], [3, 4], [5]]
    assert [s.label for s in split.stages] == ["embedding, blocks 0-2", "blocks 3-4", "block 5, head"]


@pytest.mark.parametrize("tie", [True, False])
def test_the_description_is_what_the_stages_hold(tie):
    model = model_fn(n_layer=4, tie_weights=tie)()
    dense = {n: p.size for n, p in model.named_parameters()}
    split = split_model(model, 3)
    assert split.tied_copy == tie
    held = [StageRunner(model, split, [s.index]) for s in split.stages]
    for part, runner in zip(split.stages, held):
        names = [n for n, _ in runner.named_parameters()]
        assert list(part.parameter_names) == names
        assert part.parameters == sum(p.size for _, p in runner.named_parameters())
    copy = dense["wte.weight"] if tie else 0  # the last stage's own copy of the tied weight
    assert sum(s.parameters for s in split.stages) == sum(dense.values()) + copy
    assert split.stages[0].embedding and split.stages[-1].head
    assert not any(s.embedding or s.head for s in split.stages[1:-1])


@pytest.mark.parametrize(("stages", "balance", "message"), [
    (5, "params", "cannot cut a GPT of 4 blocks into 5 pipeline stages"),
    (0, "params", "cannot cut a GPT of 4 blocks into 0 pipeline stages"),
    (2, [3, 2], r"block counts \[3, 2\] must be 2 numbers of at least 1 that sum to n_layer 4"),
    (2, [1, 1, 2], r"block counts \[1, 1, 2\] must be 2 numbers"),
    (2, [4, 0], r"block counts \[4, 0\] must be"),
    (2, "flops", "stage balance 'flops' is not one of params, time"),
    (2, "time", "stage balance 'time' measures the forward: pass a sample batch"),
])
def test_bad_cuts_are_one_line(stages, balance, message):
    with pytest.raises(ValueError, match=message) as caught:
        split_model(model_fn(n_layer=4)(), stages, balance)
    assert "\n" not in str(caught.value)


def test_an_mlp_is_refused_in_one_line():
    with pytest.raises(ValueError, match="cuts a GPT into stages; a MLP has no blocks to cut"):
        split_model(MLP([4, 8, 3]), 2)
