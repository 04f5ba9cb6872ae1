"""What tensor and sequence parallelism send, counted: per transformer block exactly 2 all-reduces forward
and 2 backward (TP), or 2 all-gathers and 2 reduce-scatters forward and the mirror backward (TP+SP), each
of b·s·h elements; the vocab-parallel loss's three all-reduces of b·s values; the same bytes per block on
every rank with SP as without (the traffic meter, by phase), the whole model differing by exactly the
embedding's scatter and the LayerNorm gradients' sum."""

from __future__ import annotations

from collections import Counter

import pytest

from engine.comm.launch import run_ranks
from tests.parallel_helpers import ring_bytes
from tests.tp_helpers import BLOCK, WIDTH, count_collectives, random_batches, tiny_gpt, tp_model

ROWS = 2
ACTIVATION = ROWS * BLOCK * WIDTH  # b·s·h elements


@pytest.fixture
def calls(monkeypatch):
    """Every collective of the package, as (global rank, kind, phase, elements)."""
    return count_collectives(monkeypatch)


def _step_rank(comm, emit, t, n_layer, sp, x, y):
    model = tp_model(comm, t, lambda: tiny_gpt(n_layer=n_layer), sp, meter=True)
    tp = model.tensor_parallel
    tp.loss(model(x), y).backward()
    tp.reduce_sequence_parallel_grads()
    sent: Counter = Counter()
    for row in comm.meter.snapshot():
        sent[row["phase"]] += row["bytes"]
    return sent


def _run(calls, t, n_layer, sp):
    """Per rank: collectives by (kind, phase, elements), and bytes sent by phase."""
    calls.clear()
    x, y = random_batches(1, rows=ROWS)[0]
    sent = run_ranks(t, "threads", _step_rank, args=(t, n_layer, sp, x, y), timeout_s=60)
    by_rank = [Counter((kind, phase, n) for rank, kind, phase, n in calls if rank == r) for r in range(t)]
    return by_rank, sent


GRAD_SUM = "sp-grad-all-reduce"  # once per step, not per block: its size grows with the blocks


def _per_layer(calls, t, sp):
    """What one more block adds: two layers' counts minus one layer's, on every rank (the gradient sum
    left out); and two layers' counts."""
    one, sent_one = _run(calls, t, 1, sp)
    two, sent_two = _run(calls, t, 2, sp)
    calls_added = [Counter({k: n for k, n in (b - a).items() if k[1] != GRAD_SUM})
                   for a, b in zip(one, two)]
    sent_added = [Counter({k: n for k, n in (b - a).items() if k != GRAD_SUM})
                  for a, b in zip(sent_one, sent_two)]
    return calls_added, sent_added, two, sent_two


TP_BLOCK = {("all-reduce", "tp-fwd-all-reduce", ACTIVATION): 2,
            ("all-reduce", "tp-bwd-all-reduce", ACTIVATION): 2}
SP_BLOCK = {("all-gather", "sp-fwd-all-gather", ACTIVATION): 2,
            ("reduce-scatter", "sp-fwd-reduce-scatter", ACTIVATION): 2,
            ("reduce-scatter", "sp-bwd-reduce-scatter", ACTIVATION): 2,
            ("all-gather", "sp-bwd-all-gather", ACTIVATION): 2}
LOSS = {("all-reduce", "tp-loss-all-reduce", ROWS * BLOCK): 3}  # max, target logit, sum of exp


@pytest.mark.parametrize("t", [2, 3, 4])
def test_collectives_per_block_and_around_the_blocks(calls, t):
    tp_block, _, tp_model_calls, _ = _per_layer(calls, t, False)
    sp_block, _, sp_model_calls, _ = _per_layer(calls, t, True)
    assert all(c == Counter(TP_BLOCK) for c in tp_block)
    assert all(c == Counter(SP_BLOCK) for c in sp_block)
    # two blocks, plus: the embedding's all-reduce forward, the output layer's f backward, the loss
    tp_whole = Counter({k: 2 * v for k, v in TP_BLOCK.items()}) + Counter(LOSS)
    tp_whole[("all-reduce", "tp-fwd-all-reduce", ACTIVATION)] += 1
    tp_whole[("all-reduce", "tp-bwd-all-reduce", ACTIVATION)] += 1
    assert all(c == tp_whole for c in tp_model_calls)
    # SP: the embedding's all-reduce and its scatter (an all-gather backward), the output layer's all-gather
    # (a reduce-scatter backward), the loss, and one all-reduce of the LayerNorms' and row biases' gradients
    sp_whole = Counter({k: 2 * v for k, v in SP_BLOCK.items()}) + Counter(LOSS)
    sp_whole[("all-reduce", "tp-fwd-all-reduce", ACTIVATION)] += 1
    sp_whole[("all-gather", "sp-bwd-all-gather", ACTIVATION)] += 1
    sp_whole[("all-gather", "sp-fwd-all-gather", ACTIVATION)] += 1
    sp_whole[("reduce-scatter", "sp-bwd-reduce-scatter", ACTIVATION)] += 1
    sp_whole[("all-reduce", GRAD_SUM, 2 * (4 * WIDTH + 2 * WIDTH) + 2 * WIDTH)] += 1
    assert all(c == sp_whole for c in sp_model_calls)


@pytest.mark.parametrize("t", [2, 3, 4])
def test_sequence_parallelism_sends_the_same_bytes_per_block(calls, t):
    _, tp_sent, _, tp_total = _per_layer(calls, t, False)
    _, sp_sent, _, sp_total = _per_layer(calls, t, True)
    for r in range(t):
        assert sum(tp_sent[r].values()) == sum(sp_sent[r].values()) > 0
        reduce_scatter, all_gather = ring_bytes(ACTIVATION, t, r)
        assert tp_sent[r]["tp-fwd-all-reduce"] == 2 * 8 * (reduce_scatter + all_gather)  # float64
        # the whole model: SP adds the embedding scatter's all-gather backward and the gradient sum
        extra = 8 * all_gather + sp_total[r][GRAD_SUM]
        assert sum(sp_total[r].values()) == sum(tp_total[r].values()) + extra
