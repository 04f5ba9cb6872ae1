"""Every op's gradient against central finite differences (float64), its value against engine.reference,
and the tape's contracts."""

import threading

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numeric_helpers import numeric_grad

from engine import ops, reference
from engine.dropout_rng import DropoutRNG
from engine.tensor import Parameter, Tensor, make, no_grad, set_tape_observer


def tensor_numeric_grad(fn, arrays, i, weights):
    """Finite differences of an op on Tensors: each shifted input wrapped, evaluated without the tape."""
    def on_arrays(*shifted):
        with no_grad():
            return fn(*[Tensor(a) for a in shifted]).data
    return numeric_grad(on_arrays, arrays, i, weights)


def check_grads(fn, *arrays, rtol=1e-6, atol=1e-8, seed=0):
    """Backward of fn (a random projection of its output) equals finite differences for every input."""
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    tensors = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    out = fn(*tensors)
    weights = np.random.default_rng(seed).standard_normal(out.shape)
    out.backward(weights)
    for i, t in enumerate(tensors):
        np.testing.assert_allclose(t.grad, tensor_numeric_grad(fn, arrays, i, weights), rtol=rtol, atol=atol,
                                   err_msg=f"input {i}")


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# ---- gradients vs finite differences ---------------------------------------------------------------

BROADCAST_PAIRS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((3, 4), ()), ((1,), (2, 3))]


@pytest.mark.parametrize("op", [ops.add, ops.sub, ops.mul, ops.div])
@pytest.mark.parametrize("sa,sb", BROADCAST_PAIRS)
def test_binary_ops_broadcast(op, sa, sb):
    a, b = rand(*sa, seed=1), rand(*sb, seed=2)
    if op is ops.div:
        b = np.sign(b) * (np.abs(b) + 0.5)  # keep away from zero
    check_grads(op, a, b)


@given(st.lists(st.integers(1, 3), min_size=0, max_size=3), st.lists(st.booleans(), min_size=3, max_size=3),
       st.integers(0, 3))
@settings(max_examples=20, deadline=None)
def test_broadcast_gradients_any_shapes(shape, ones, drop):
    """b is a's shape with some axes set to 1 and some leading axes removed: mul must unbroadcast."""
    b_shape = tuple(1 if one else n for n, one in zip(shape, ones))[drop:]
    check_grads(ops.mul, rand(*shape, seed=3), rand(*b_shape, seed=4))


def test_unary_ops():
    x = rand(3, 4)
    check_grads(ops.neg, x)
    check_grads(lambda t: ops.power(t, 3), x)
    check_grads(lambda t: ops.power(t, 0.5), np.abs(x) + 0.5)
    check_grads(ops.gelu, x * 3)


def test_gelu_is_gpt2_tanh_approximation():
    x = np.linspace(-6, 6, 101)
    np.testing.assert_allclose(ops.gelu(Tensor(x)).data, reference.gelu(x), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)),
                                   ((2, 1, 3, 4), (3, 4, 5)), ((3, 4), (2, 4, 5))])
def test_matmul(sa, sb):
    check_grads(ops.matmul, rand(*sa, seed=1), rand(*sb, seed=2))


def test_linear_with_and_without_bias():
    x, w, b = rand(2, 3, 4, seed=1), rand(5, 4, seed=2), rand(5, seed=3)
    check_grads(ops.linear, x, w, b)
    check_grads(ops.linear, x, w)
    np.testing.assert_allclose(ops.linear(Tensor(x), Tensor(w), Tensor(b)).data, x @ w.T + b)


def test_shape_ops():
    x = rand(2, 3, 4)
    check_grads(lambda t: t.reshape(4, 6), x)
    check_grads(lambda t: t.transpose(2, 0, 1), x)
    check_grads(lambda t: t.T, x)
    check_grads(lambda t: ops.concat([t, t * 2, t[:, :1]], axis=1), x)
    check_grads(lambda t: ops.concat(ops.split(t, [1, 3], axis=-1)[::-1], axis=-1), x)
    check_grads(lambda t: ops.astype(t, np.float64) * 1.5, x)


INDEXES = [(slice(1, 3),), (0, slice(None), 2), (Ellipsis, 1), (np.array([0, 2, -3, 0]),),
           (np.array([1, 1]), slice(None), np.array([0, 3])), (np.array([[1, 0], [1, 1]]),)]


@pytest.mark.parametrize("index", INDEXES)
def test_getitem_including_repeated_indices(index):
    check_grads(lambda t: t[index], rand(3, 3, 4))


def test_embedding_scatter_adds_repeated_rows():
    idx = np.array([[1, 3, 1], [0, 1, 3]])
    check_grads(lambda w: ops.embedding(idx, w), rand(5, 4))


def test_an_index_that_picks_no_rows_adds_no_gradient():
    """A gather of no rows (an expert no token reached) beside one of rows 1, 1 and 3: the weight's gradient
    is the second alone, counted by hand (the scatter of nothing used to fail on its first row)."""
    w = Tensor(rand(5, 4), requires_grad=True)
    nothing, some = ops.embedding(np.array([], dtype=np.int64), w), ops.embedding(np.array([1, 1, 3]), w)
    (ops.sum(nothing) + ops.sum(some)).backward()
    expected = np.zeros((5, 4))
    expected[1], expected[3] = 2.0, 1.0
    np.testing.assert_array_equal(w.grad, expected)


@pytest.mark.parametrize("axis,keepdims",
                         [(None, False), (0, False), (-1, True), ((0, 2), False), ((1,), True)])
def test_sum_and_mean(axis, keepdims):
    x = rand(2, 3, 4)
    check_grads(lambda t: ops.sum(t, axis, keepdims), x)
    check_grads(lambda t: t.mean(axis, keepdims), x)
    np.testing.assert_allclose(Tensor(x).mean(axis, keepdims).data, x.mean(axis, keepdims=keepdims))


def test_layer_norm():
    x, w, b = rand(2, 3, 5, seed=1) * 2 + 1, rand(5, seed=2), rand(5, seed=3)
    check_grads(lambda *t: ops.layer_norm(*t), x, w, b)
    check_grads(lambda *t: ops.layer_norm(*t), x, w)
    expected, _, _ = reference.layer_norm(x, w, b, 1e-5)
    np.testing.assert_allclose(ops.layer_norm(Tensor(x), Tensor(w), Tensor(b)).data, expected, rtol=1e-12)


def test_causal_attention_value_and_grads():
    q, k, v = rand(2, 2, 5, 3, seed=1), rand(2, 2, 5, 3, seed=2), rand(2, 2, 5, 3, seed=3)
    check_grads(ops.causal_attention, q, k, v)
    out = ops.causal_attention(Tensor(q), Tensor(k), Tensor(v)).data
    np.testing.assert_allclose(out, reference.causal_attention(q, k, v), rtol=1e-12)
    v_future = v.copy()
    v_future[..., 3:, :] += 1.0  # changing later positions leaves earlier outputs alone
    later = ops.causal_attention(Tensor(q), Tensor(k), Tensor(v_future)).data
    np.testing.assert_array_equal(later[..., :3, :], out[..., :3, :])


def test_attention_dropout_grads_with_a_fixed_mask():
    def attend(q, k, v):
        return ops.causal_attention(q, k, v, 0.3, DropoutRNG(7), training=True)
    check_grads(attend, rand(1, 2, 4, 3, seed=1), rand(1, 2, 4, 3, seed=2), rand(1, 2, 4, 3, seed=3))


def test_cross_entropy_value_and_grads():
    logits, targets = rand(2, 3, 6) * 3, np.array([[0, 5, 2], [2, 2, 1]])
    check_grads(lambda t: ops.cross_entropy(t, targets), logits)
    expected = reference.cross_entropy(logits, targets)
    np.testing.assert_allclose(ops.cross_entropy(Tensor(logits), targets).data, expected, rtol=1e-12)


def test_cross_entropy_is_stable_and_float32_for_low_precision():
    logits = Tensor(np.array([[1000.0, 0.0], [0.0, -1000.0]], dtype=np.float16), requires_grad=True)
    loss = ops.cross_entropy(logits, np.array([0, 1]))
    assert loss.dtype == np.float32 and np.isfinite(loss.item())
    loss.backward()
    assert logits.grad.dtype == np.float16 and np.isfinite(logits.grad).all()


def test_dropout_grads_reproducibility_and_scale():
    x = rand(4, 5)
    check_grads(lambda t: ops.dropout(t, 0.4, DropoutRNG(3), True), x)
    a = ops.dropout(Tensor(x), 0.4, DropoutRNG(3), True).data
    b = ops.dropout(Tensor(x), 0.4, DropoutRNG(3), True).data
    np.testing.assert_array_equal(a, b)
    kept = a != 0
    np.testing.assert_allclose(a[kept], x[kept] / 0.6)
    big = ops.dropout(Tensor(np.ones(100_000)), 0.25, DropoutRNG(0), True).data
    assert abs((big == 0).mean() - 0.25) < 0.01
    t = Tensor(x)
    assert ops.dropout(t, 0.4, DropoutRNG(3), training=False) is t


def test_operators_and_scalars():
    x = rand(2, 3)
    check_grads(lambda t: 2.0 * t - 1 + t / 4 - (3 / (t * t + 1)) + (-t) ** 2, x)
    out = np.ones((2, 3)) + Tensor(x)
    assert isinstance(out, Tensor)
    np.testing.assert_allclose(out.data, x + 1)
    assert (Tensor(x.astype(np.float32)) * 0.5).dtype == np.float32


# ---- the matmul kernel -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_matmul_kernel_upcasts_low_precision(dtype, monkeypatch):
    a, b = rand(3, 8, 16, seed=1).astype(dtype), rand(16, 5, seed=2).astype(dtype)
    seen = []
    real = np.matmul
    monkeypatch.setattr(np, "matmul", lambda x, y, **kw: seen.append((x.dtype, y.dtype)) or real(x, y, **kw))
    out = ops.matmul_kernel(a, b)
    assert seen == [(np.float32, np.float32)]
    assert out.dtype == np.dtype(dtype)
    expected = real(a.astype(np.float32), b.astype(np.float32)).astype(dtype)
    np.testing.assert_array_equal(out.astype(np.float32), expected.astype(np.float32))


def test_low_precision_layer_norm_returns_input_dtype():
    x = rand(4, 16, seed=1).astype(np.float16)
    w, b = np.ones(16, np.float16), np.zeros(16, np.float16)
    out = ops.layer_norm(Tensor(x), Tensor(w), Tensor(b))
    ref = ops.layer_norm(*(Tensor(a.astype(np.float32)) for a in (x, w, b)))
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.data.astype(np.float32), ref.data, atol=4e-3)


# ---- tape contracts --------------------------------------------------------------------------------

def test_gradients_accumulate_in_place():
    w = Parameter(rand(3, 4))
    buffer = np.zeros(12)
    w.grad = buffer.reshape(3, 4)  # a view, as a flat gradient buffer would set it
    view = w.grad
    x = Tensor(rand(2, 4, seed=1))
    for _ in range(2):
        ops.linear(x, w).sum().backward()
    assert w.grad is view
    np.testing.assert_allclose(buffer.reshape(3, 4), 2 * np.ones((2, 3)).T @ x.data)


def test_grad_of_a_reused_input_adds_up_without_aliasing():
    x = Tensor(rand(3), requires_grad=True)
    y = x + x  # both edges receive the same upstream array
    (y * 2 + y).sum().backward()
    np.testing.assert_allclose(x.grad, np.full(3, 6.0))


@pytest.mark.parametrize("fresh_first", [True, False])
def test_a_fresh_nodes_gradient_takes_the_others_in_place_and_leaves_them_alone(fresh_first):
    """make(fresh=True): the tape adds another edge's gradient into the array that node returned (the
    leaf keeps it, no copy) and never writes into an array a node without the flag returned."""
    x = Tensor(rand(3, 4), requires_grad=True)
    kept = rand(3, 4, seed=2)
    before, made = kept.copy(), []

    def fresh_backward(g):
        made.append(g * 2.0)
        return (made[-1],)
    handed = make(x.data.copy(), (x,), lambda g: (kept,))  # `kept` is still held here
    owned = make(x.data.copy(), (x,), fresh_backward, fresh=True)
    (owned + handed if fresh_first else handed + owned).sum().backward()
    np.testing.assert_array_equal(kept, before)
    assert x.grad is made[0]
    np.testing.assert_array_equal(x.grad, kept + 2.0)


def test_grad_ready_hook_fires_once_with_the_final_grad_and_early():
    rng = np.random.default_rng(0)
    w1, w2 = Parameter(rng.standard_normal((4, 4)), "w1"), Parameter(rng.standard_normal((4, 4)), "w2")
    tied = Parameter(rng.standard_normal((4, 4)), "tied")
    fired = []
    for p in (w1, w2, tied):
        p.register_grad_ready_hook(lambda p: fired.append((p.name, p.grad.copy(), w1.grad is None)))
    x = Tensor(rng.standard_normal((2, 4)))
    h = ops.gelu(ops.linear(ops.linear(x, tied), w1))
    ops.linear(ops.linear(h, w2), tied).sum().backward()
    names = [name for name, _, _ in fired]
    assert sorted(names) == ["tied", "w1", "w2"]  # once each
    assert names.index("w2") < names.index("w1") < names.index("tied")
    assert fired[names.index("w2")][2], "w2's hook ran before w1's gradient existed: backward can overlap"
    for name, grad, _ in fired:
        np.testing.assert_array_equal(grad, {"w1": w1, "w2": w2, "tied": tied}[name].grad)


def test_no_grad_records_nothing_and_is_per_thread():
    x = Tensor(rand(3), requires_grad=True)
    inside = []
    with no_grad():
        y = ops.gelu(x * 2)
        worker = threading.Thread(target=lambda: inside.append((x * 2).requires_grad))
        worker.start()
        worker.join()
    assert not y.requires_grad and y._node is None
    assert inside == [True]
    assert (x * 2).requires_grad


def test_backward_twice_through_a_freed_graph_raises():
    x = Tensor(rand(3), requires_grad=True)
    y = ops.gelu(x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="freed"):
        y.backward()


class Ledger:
    def __init__(self):
        self.held, self.saves, self.freed = {}, [], []

    def on_save(self, node_id, arrays):
        self.held[node_id] = sum(a.nbytes for a in arrays)
        self.saves.append(arrays)

    def on_free(self, node_id):
        self.freed.append(node_id)
        del self.held[node_id]


def test_observer_sees_exactly_the_saved_arrays_and_their_release():
    ledger = Ledger()
    set_tape_observer(ledger)
    try:
        w = Parameter(rand(5, 4).astype(np.float32))
        x = Tensor(rand(3, 4).astype(np.float32))
        h = ops.linear(x, w)
        g = ops.gelu(h)
        loss = ops.cross_entropy(g, np.array([0, 1, 2]))
        assert ledger.saves[0] == (x.data,)  # the input is kept; the weight is read at backward time
        assert ledger.saves[1][0] is h.data
        assert sum(ledger.held.values()) == x.data.nbytes + h.data.nbytes + g.data.nbytes + 3 * 4 + 3 * 8
        loss.backward()
        assert ledger.held == {} and len(ledger.freed) == 3
        ops.gelu(x * Tensor(np.float32(2), requires_grad=True))  # a graph dropped without backward
        assert ledger.held == {}
    finally:
        set_tape_observer(None)


def test_parameters_are_read_at_backward_time():
    """ZeRO-3 swaps param.data between forward and backward: the backward must use the new array."""
    w = Parameter(np.ones((2, 3)))
    x = Tensor(np.ones((1, 3)), requires_grad=True)
    out = ops.linear(x, w)
    w.data = np.full((2, 3), 5.0)
    out.sum().backward()
    np.testing.assert_allclose(x.grad, np.full((1, 3), 10.0))


def test_backward_hook_runs_before_the_layer_below_it():
    """ZeRO-3 wraps a layer's output: the hook re-gathers the weight before the layer's backward reads it."""
    events = []
    w = Parameter(np.ones((2, 3)))
    w.register_grad_ready_hook(lambda p: events.append("w ready"))
    x = Tensor(np.ones((1, 3)), requires_grad=True)

    def regather():
        events.append("hook")
        w.data = np.full((2, 3), 5.0)
    out = ops.backward_hook(ops.linear(x, w), regather)
    w.data = np.empty(0)  # freed after forward
    out.sum().backward()
    assert events == ["hook", "w ready"]
    np.testing.assert_allclose(x.grad, np.full((1, 3), 10.0))


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_gradients_of_slices_written_into_zeros_or_summed(dtype):
    """Split's parts (disjoint: copied into the zero buffer), a part used twice, and overlapping slices
    (summed where they overlap): the gradient is the sum of the upstream gradients at every element."""
    rng = np.random.default_rng(11)
    x = Tensor(rng.standard_normal((4, 9)).astype(dtype), requires_grad=True)
    a, b, c = ops.split(x, 3, axis=-1)
    left, right = x[:, :5], x[:, 4:]  # overlap in column 4
    weights = [rng.standard_normal(s).astype(dtype) for s in ((4, 3), (4, 3), (4, 3), (4, 5), (4, 5))]
    parts = [a, b, c, left, right]
    loss = ops.sum(parts[0] * Tensor(weights[0]))
    for part, w in zip(parts[1:], weights[1:]):
        loss = loss + ops.sum(part * Tensor(w))
    loss = loss + ops.sum(b * Tensor(weights[1]))  # b twice
    loss.backward()
    want = np.zeros((4, 9))
    for (lo, hi), w in zip([(0, 3), (3, 6), (6, 9), (0, 5), (4, 9), (3, 6)], weights + [weights[1]]):
        want[:, lo:hi] += w.astype(np.float64)
    np.testing.assert_allclose(x.grad.astype(np.float64), want, rtol=1e-2 if dtype == np.float16 else 1e-12)
