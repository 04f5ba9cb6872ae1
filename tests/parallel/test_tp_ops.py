"""The pieces of tensor parallelism, float64 on the threads backend: how weights are cut (q, k and v by
whole heads; a padded vocabulary) and joined again; the conjugate ops f and g and the sequence-parallel
gather, reduce-scatter and scatter, forward and backward, against their definitions; the vocab-parallel
embedding (bitwise the dense lookup) and cross-entropy (equal to one device's, keeping no b·s·V array);
each rank's part of the one-device dropout masks; the plan's refusals."""

from __future__ import annotations

import numpy as np
import pytest

from engine import ops
from engine.comm.launch import run_ranks
from engine.dropout_rng import DropoutRNG
from engine.nn import GPT, MLP
from engine.parallel.tensor import ShardSpec, parallelize, vocab_parallel_cross_entropy
from engine.parallel.tensor.dropout import ShardedMaskRNG
from engine.parallel.tensor.mappings import (
    copy_to_tensor_parallel,
    gather_sequence,
    reduce_from_tensor_parallel,
    reduce_scatter_sequence,
    scatter_sequence,
)
from engine.parallel.tensor.vocab import masked_embedding, vocab_slice
from engine.tensor import Tensor, set_tape_observer
from tests.tp_helpers import tiny_gpt, tp_group

# ---- cutting weights ---------------------------------------------------------------------------------


@pytest.mark.parametrize("t", [1, 2, 3, 4])
@pytest.mark.parametrize("axis, length, sections", [(0, 12, 3), (1, 12, 1), (0, 11, 1), (0, 5, 1)])
def test_shards_join_back_into_the_dense_array(t, axis, length, sections):
    dense = np.random.default_rng(0).standard_normal((length, 4) if axis == 0 else (4, length))
    spec = ShardSpec(axis=axis, length=length, parts=t, sections=sections)
    shards = [spec.shard(dense, r) for r in range(t)]
    assert len({s.shape for s in shards}) == 1  # padding gives every rank the same shape
    np.testing.assert_array_equal(spec.unshard(shards), dense)


def test_a_fused_qkv_weight_is_cut_into_whole_heads_of_q_k_and_v():
    width, t = 8, 2  # rows 0-7 are q, 8-15 k, 16-23 v
    dense = np.arange(3 * width)[:, None] * np.ones((1, width))
    shard = ShardSpec(axis=0, length=3 * width, parts=t, sections=3).shard(dense, 1)
    assert shard[:, 0].tolist() == [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23]


def test_a_vocabulary_t_does_not_divide_is_padded_at_the_end():
    spec = ShardSpec(axis=0, length=11, parts=4)
    assert [vocab_slice(spec, r) for r in range(4)] == [(0, 3), (3, 3), (6, 3), (9, 2)]
    assert not spec.shard(np.ones((11, 2)), 3)[2].any()  # the padding row is zero


# ---- the conjugate ops -------------------------------------------------------------------------------

OPS = {"f": copy_to_tensor_parallel, "g": reduce_from_tensor_parallel, "gather": gather_sequence,
       "reduce-scatter": reduce_scatter_sequence, "scatter": scatter_sequence}


def _op_rank(comm, emit, name, xs, gs):
    x = Tensor(xs[comm.rank].copy(), requires_grad=True)
    y = OPS[name](x, tp_group(comm, comm.world_size))
    y.backward(gs[comm.rank])
    return y.data, x.grad


def _expected(name, xs, gs, r, t):
    """(forward, backward) of op `name` on rank r from the definitions."""
    n = xs[0].shape[1] // t if name in ("reduce-scatter", "scatter") else xs[0].shape[1]
    mine = slice(r * n, (r + 1) * n)
    if name == "f":
        return xs[r], sum(gs)
    if name == "g":
        return sum(xs), gs[r]
    if name == "gather":
        return np.concatenate(xs, axis=1), sum(gs)[:, r * n:(r + 1) * n]
    if name == "reduce-scatter":
        return sum(xs)[:, mine], np.concatenate(gs, axis=1)
    return xs[r][:, mine], np.concatenate(gs, axis=1)  # scatter: x is the same on every rank


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("t", [2, 3])
def test_each_op_forward_and_backward(name, t):
    rng = np.random.default_rng(t)
    sequence = {"gather": (2, 2 * t), "reduce-scatter": (2 * t, 2), "scatter": (2 * t, 2)}  # in, out
    s_in, s_out = sequence.get(name, (6, 6))
    xs = [rng.standard_normal((2, s_in, 3)) for _ in range(t)]
    if name == "scatter":
        xs = [xs[0]] * t
    gs = [rng.standard_normal((2, s_out, 3)) for _ in range(t)]
    for r, (y, grad) in enumerate(run_ranks(t, "threads", _op_rank, args=(name, xs, gs), timeout_s=30)):
        want_y, want_grad = _expected(name, xs, gs, r, t)
        np.testing.assert_allclose(y, want_y, rtol=1e-14, atol=1e-14)
        np.testing.assert_allclose(grad, want_grad, rtol=1e-14, atol=1e-14)


# ---- the vocabulary ----------------------------------------------------------------------------------

class _SavedSizes:
    """A tape observer: the size of every array an op keeps."""

    def __init__(self):
        self.sizes: list[int] = []

    def on_save(self, node_id, arrays):
        self.sizes += [a.size for a in arrays]

    def on_free(self, node_id):
        pass


def _loss_rank(comm, emit, logits, targets):
    t = comm.world_size
    spec = ShardSpec(axis=2, length=logits.shape[-1], parts=t)
    first, valid = vocab_slice(spec, comm.rank)
    mine = Tensor(spec.shard(logits, comm.rank), requires_grad=True)
    observer = _SavedSizes()
    set_tape_observer(observer)
    try:
        loss = vocab_parallel_cross_entropy(mine, targets, tp_group(comm, t), first, valid)
    finally:
        set_tape_observer(None)
    loss.backward()
    return float(loss.data), mine.grad, observer.sizes


@pytest.mark.parametrize("t, vocab", [(2, 11), (3, 11), (4, 11), (4, 5), (2, 12)])
def test_vocab_parallel_cross_entropy_equals_one_devices(t, vocab):
    rng = np.random.default_rng(vocab)
    logits = rng.standard_normal((2, 3, vocab)) * 3
    targets = rng.integers(0, vocab, (2, 3))
    targets[0, 0] = vocab - 1  # a target in the last, padded slice
    dense = Tensor(logits, requires_grad=True)
    want = ops.cross_entropy(dense, targets)
    want.backward()
    ranks = run_ranks(t, "threads", _loss_rank, args=(logits, targets), timeout_s=30)
    spec = ShardSpec(axis=2, length=vocab, parts=t)
    for loss, _, saved in ranks:
        assert abs(loss - float(want.data)) <= 1e-14 * abs(float(want.data))
        assert max(saved) < targets.size * vocab  # b·s·V/t at most, never b·s·V
    grads = spec.unshard([grad for _, grad, _ in ranks])
    np.testing.assert_allclose(grads, dense.grad, rtol=1e-13, atol=1e-16)
    for r, (_, grad, _) in enumerate(ranks):  # the padded columns take no gradient
        assert not grad[..., vocab_slice(spec, r)[1]:].any()


def test_the_vocab_parallel_embedding_is_the_dense_lookup_bit_for_bit():
    weight = np.random.default_rng(0).standard_normal((11, 4))
    idx = np.array([[0, 3, 10, 9], [5, 5, 2, 8]])
    spec = ShardSpec(axis=0, length=11, parts=3)
    parts = []
    for r in range(3):
        first, valid = vocab_slice(spec, r)
        parts.append(masked_embedding(idx, Tensor(spec.shard(weight, r)), first, valid).data)
    np.testing.assert_array_equal(sum(parts), weight[idx])  # one real row and zeros per token


# ---- dropout -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(3, 12, 5), (2, 4, 6, 6), (4, 8)], ids=["sequence", "heads", "features"])
@pytest.mark.parametrize("t", [2, 4])
def test_each_rank_draws_its_part_of_the_one_device_mask(shape, t):
    one = DropoutRNG(7)
    one.begin(3, 5)
    whole = one.keep_mask(shape, 0.3)
    local = (shape[0], shape[1] // t) + shape[2:]
    for r in range(t):
        base = DropoutRNG(7)
        base.begin(3, 5)
        mine = ShardedMaskRNG(base, t, r).keep_mask(local, 0.3)
        np.testing.assert_array_equal(mine, whole[:, r * local[1]:(r + 1) * local[1]])
        assert base.position() == one.position()  # the site counted once, on the model's own rng


# ---- what the plan refuses ---------------------------------------------------------------------------

def _refusal(comm, emit, make_model, sequence_parallel, x):
    try:
        model = parallelize(make_model(), tp_group(comm, comm.world_size), sequence_parallel)
        if x is not None:
            model(x)
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("make_model, sp, x, words", [
    (lambda: GPT(11, 12, 1, n_head=3, n_embd=24, dtype=np.float64), False, None, "3 heads 2 ways"),
    (tiny_gpt, True, np.zeros((1, 7), int), "sequence of 7 tokens does not divide"),
    (lambda: MLP([4, 8, 8, 3], dtype=np.float64), False, None, "3 layers do not pair up"),
    (lambda: MLP([4, 8, 3], dtype=np.float64), True, None, "an MLP model has none"),
    (lambda: parallelize(tiny_gpt(), _OneRank()), False, None, "tensor-parallel already"),
], ids=["heads", "sequence", "mlp layers", "mlp sequence", "twice"])
def test_what_the_plan_refuses_is_one_line_naming_it(make_model, sp, x, words):
    for message in run_ranks(2, "threads", _refusal, args=(make_model, sp, x), timeout_s=30):
        assert message is not None and words in message and "\n" not in message


class _OneRank:
    """A one-rank group that never communicates (a plan applied twice fails before any collective)."""

    rank, world_size, meter = 0, 1, None
