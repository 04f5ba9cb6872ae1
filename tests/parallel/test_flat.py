"""FlatBuffer: every parameter and gradient is a view of one buffer; shards and buckets are slices."""

import ml_dtypes
import numpy as np
import pytest

from engine.dtypes import master_dtype, resolve_dtype
from engine.parallel.data.flat import FlatBuffer


class P:
    """Stand-in parameter: only .data, .grad and .name, like engine.tensor.Parameter."""

    def __init__(self, name, shape, rng):
        self.name, self.data, self.grad = name, rng.normal(size=shape).astype(np.float32), None


def make_params(shapes=((3, 4), (4,), (5, 2, 2), (1,), (7,)), seed=0):
    rng = np.random.default_rng(seed)
    return [P(f"p{i}", s, rng) for i, s in enumerate(shapes)]


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32", "fp64"])
def test_params_become_views_with_their_values(dtype):
    params = make_params()
    originals = [p.data.copy() for p in params]
    flat = FlatBuffer(params, dtype, pad_to=4)
    assert flat.data.dtype == resolve_dtype(dtype) and flat.data.ndim == 1
    for p, orig in zip(params, originals):
        assert np.shares_memory(p.data, flat.data) and np.shares_memory(p.grad, flat.grad)
        assert p.data.shape == orig.shape and p.data.dtype == resolve_dtype(dtype)
        np.testing.assert_array_equal(p.data, orig.astype(resolve_dtype(dtype)))
        assert not p.grad.any()


def test_offsets_and_padding_are_exact():
    params = make_params()
    flat = FlatBuffer(params, "fp32", pad_to=8)
    assert [(s.name, s.start, s.end, s.shape) for s in flat.slots] == [
        ("p0", 0, 12, (3, 4)), ("p1", 12, 16, (4,)), ("p2", 16, 36, (5, 2, 2)), ("p3", 36, 37, (1,)),
        ("p4", 37, 44, (7,))]
    assert (flat.numel, flat.size, flat.padding) == (44, 48, 4)
    assert not flat.data[44:].any()
    assert FlatBuffer(make_params(), pad_to=4).padding == 0
    for world in range(1, 9):
        assert FlatBuffer(make_params(), pad_to=world).padding <= world - 1


def test_writes_through_views_land_in_the_flat_buffers():
    params = make_params()
    flat = FlatBuffer(params, "fp32", pad_to=3)
    params[2].data[1, 0, 1] = 42.0
    assert flat.data[16 + 1 * 4 + 0 * 2 + 1] == 42.0
    params[0].grad += 1.0  # the tape accumulates in place into p.grad
    params[4].grad[...] = np.arange(7)
    np.testing.assert_array_equal(flat.grad[:12], 1.0)
    np.testing.assert_array_equal(flat.grad[37:44], np.arange(7))
    flat.data[12:16] = -1  # and the other way round
    np.testing.assert_array_equal(params[1].data, -1)
    for i, p in enumerate(params):
        assert np.shares_memory(flat.view(flat.grad, i), p.grad)


def test_bind_repoints_reassigned_attributes():
    params = make_params()
    flat = FlatBuffer(params, "fp32")
    params[0].data = np.zeros((3, 4), np.float32)  # e.g. ZeRO-3 freed and replaced the storage
    params[0].grad = None
    flat.bind()
    assert np.shares_memory(params[0].data, flat.data) and np.shares_memory(params[0].grad, flat.grad)


def test_without_grad_buffer_leaves_grads_alone():
    params = make_params()
    flat = FlatBuffer(params, "fp32", grad=False)
    assert flat.grad is None and all(p.grad is None for p in params)


@pytest.mark.parametrize("world", range(1, 9))
def test_shards_tile_the_buffer_as_views(world):
    flat = FlatBuffer(make_params(), "fp32", pad_to=world)
    flat.grad[:] = np.arange(flat.size)
    shards = [flat.shard(r, world) for r in range(world)]
    assert all(np.shares_memory(s, flat.data) for s in shards)
    assert len({len(s) for s in shards}) == 1
    np.testing.assert_array_equal(np.concatenate(shards), flat.data)
    grad_shards = [flat.grad_shard(r, world) for r in range(world)]
    np.testing.assert_array_equal(np.concatenate(grad_shards), flat.grad)
    assert flat.shard_range(world - 1, world)[1] == flat.size


def test_shard_needs_padding_to_the_world_size():
    with pytest.raises(ValueError, match="pad_to=3"):
        FlatBuffer(make_params(), "fp32", pad_to=1).shard(0, 3)  # 44 elements


def test_buckets_reverse_order_capped_and_tiling():
    shapes = [(10,), (10,), (30,), (5,), (5,), (5,), (8,)]  # 73 elements, fp32 -> 4 bytes each
    params = make_params(shapes)
    flat = FlatBuffer(params, "fp32", pad_to=4)  # size 76: 3 padding elements
    ranges = flat.buckets(cap_bytes=64)  # 16 elements
    # From the end: [p5, p6 + padding] = 16 elements exactly (p4 would exceed), [p3, p4],
    # [p2 alone: larger than the cap], [p1], [p0].
    assert ranges == [(60, 76), (50, 60), (20, 50), (10, 20), (0, 10)]
    assert all(b[0] == a[1] for a, b in zip(ranges[1:], ranges[:-1]))  # contiguous, reverse order
    starts = {s.start for s in flat.slots}
    assert all(start in starts for start, _ in ranges)  # boundaries at parameter boundaries
    for start, end in ranges:
        inner = [s for s in flat.slots if start <= s.start < end]
        assert (end - start) * 4 <= 64 or len(inner) == 1
    bmap = flat.bucket_map(64)
    assert [bmap[id(p)] for p in params] == [4, 3, 2, 1, 1, 0, 0]
    assert flat.buckets(1e9) == [(0, 76)]
    assert [flat.index_of(p) for p in params] == list(range(7))


def test_bucket_cap_counts_bytes_of_the_buffer_dtype():
    params = make_params([(8,)] * 4)
    assert len(FlatBuffer(params, "fp32").buckets(64)) == 2
    assert len(FlatBuffer(make_params([(8,)] * 4), "fp16").buckets(64)) == 1


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32", "fp64"])
def test_master_dtype(dtype):
    assert master_dtype(dtype) == (np.float64 if dtype == "fp64" else np.float32)


def test_bf16_resolves_to_ml_dtypes():
    assert resolve_dtype("bf16") == np.dtype(ml_dtypes.bfloat16)
    assert resolve_dtype(np.float16) == np.dtype(np.float16)


def test_decay_mask_covers_matrices_only():
    flat = FlatBuffer(make_params(), "fp32", pad_to=8)
    mask = flat.decay_mask()
    assert mask.dtype == bool and mask.shape == (48,)
    assert mask[:12].all() and not mask[12:16].any() and mask[16:36].all() and not mask[36:].any()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_stale_gradients_are_written_over_and_unused_ones_zeroed(dtype):
    """mark_grads_stale + backward + zero_stale leaves, bit for bit, the buffer that clearing it and
    accumulating into zeros leaves (the reference: a second copy of the parameters trained that way on
    the same inputs). Two steps of two micro-batches, one parameter used twice in the graph, and one the
    graph never uses (it holds an earlier step's values until zero_stale)."""
    from engine import ops
    from engine.tensor import Parameter, Tensor
    rng = np.random.default_rng(3)
    dt = resolve_dtype(dtype)
    values = [rng.normal(size=s).astype(dt) for s in [(4, 3), (3,), (5,)]]
    stale = [Parameter(v.copy(), name=f"p{i}") for i, v in enumerate(values)]
    cleared = [Parameter(v.copy(), name=f"p{i}") for i, v in enumerate(values)]
    flat, reference = FlatBuffer(stale, dtype, pad_to=4), FlatBuffer(cleared, dtype, pad_to=4)
    flat.grad[:flat.numel] = 5.0  # an earlier step's gradients (the padding is never written: it stays 0)
    for _step in range(2):
        flat.mark_grads_stale()
        reference.grad.fill(0)
        for _micro in range(2):
            x = rng.normal(size=(2, 4)).astype(dt)
            for w, b, _ in (stale, cleared):
                y = ops.matmul(Tensor(x), w) + b
                (ops.sum(y * y) + ops.sum(b)).backward()
        flat.zero_stale()
        assert not any(p.grad_stale for p in stale)
        assert all(np.shares_memory(p.grad, flat.grad) for p in stale)
        assert flat.grad.any()
        np.testing.assert_array_equal(flat.grad.view(np.uint8), reference.grad.view(np.uint8))
