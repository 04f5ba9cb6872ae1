"""Dropout under context parallelism (engine.parallel.context.dropout): every rank draws its positions'
part of the one-device masks, so CP trains what one device trains with dropout on (float64).

- a token-wise mask of a rank is the one-device mask's rows of its positions (and under sequence
  parallelism, the tensor rank's slice of those), element for element;
- ring attention with dropout equals whole-sequence attention dropped by the one-device [B, H, T, T] mask:
  c in {2, 4}, contiguous and zigzag, causal and not, output and dq, dk, dv within 1e-12 (and with query
  tiles of the fused kernel, and drawing a row at a time);
- the Trainer at CP 2 and 4 (both layouts), CP 2 x TP 2 (and with SP), dropout 0.1: the first step's loss
  and every gradient within 1e-12 of one device's, parameters after 3 clipped steps within 1e-10."""

from __future__ import annotations

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from engine.dropout_rng import DropoutRNG
from engine.parallel.context import dropout as cp_dropout
from engine.parallel.context.dropout import ContextMaskRNG, attention_dropout, context_rng
from engine.parallel.context.layout import SequenceLayout
from engine.parallel.context.ring_attention import Ring, ring_backward, ring_forward
from engine.parallel.tensor.dropout import ShardedMaskRNG
from tests.cp_helpers import full_attention, gather, problem
from tests.cp_train_helpers import cp_config, grad_rank
from tests.tp_train_helpers import assert_trains_like, train_rank

P, SEED, STEP, FIRST_ROW = 0.3, 7, 2, 5


def _rng() -> DropoutRNG:
    rng = DropoutRNG(SEED)
    rng.begin(STEP, FIRST_ROW)
    return rng


def close(actual, expected, rel=1e-12):
    np.testing.assert_allclose(actual, expected, rtol=rel, atol=rel * np.abs(expected).max())


@pytest.mark.parametrize("c, kind", [(2, "zigzag"), (2, "contiguous"), (4, "zigzag"), (3, "contiguous")])
def test_token_masks_are_the_one_device_rows_of_a_ranks_positions(c, kind):
    layout, shape, s = SequenceLayout(kind, c), (3, 72, 5), 72
    whole = _rng().keep_mask(shape, P)
    for rank in range(c):
        base = _rng()
        mine = ContextMaskRNG(base, layout, rank).keep_mask((3, s // c, 5), P)
        np.testing.assert_array_equal(mine, whole[:, layout.positions(s, rank)])
        assert base.site == 1  # one site, counted on the model's rng
        for t in (2, 3):  # sequence parallelism inside the slice: tensor rank i's part of it
            local = whole[:, layout.positions(s, rank)]
            for i in range(t):
                base = _rng()
                sharded = context_rng(ShardedMaskRNG(base, t, i), base, ContextMaskRNG(base, layout, rank))
                part = sharded.keep_mask((3, s // c // t, 5), P)
                np.testing.assert_array_equal(part, np.split(local, t, axis=1)[i])


def _ring_rank(comm, emit, kind: str, causal: bool, arrays: list, merge_gap: int | None) -> dict:
    if merge_gap is not None:  # ranks are threads: every rank sees it
        cp_dropout.MERGE_GAP = merge_gap
    layout = SequenceLayout(kind, comm.world_size)
    q, k, v, g = (np.ascontiguousarray(layout.local(np.asarray(a), comm.rank, axis=2)) for a in arrays)
    ring = Ring(comm, layout, causal)
    b, h, t, _ = q.shape
    drop = attention_dropout(_rng(), P, True, (b, h, t * comm.world_size), q.dtype, q.dtype)
    out, lse = ring_forward(ring, q, k, v, True, drop)
    dq, dk, dv = ring_backward(ring, q, k, v, out, lse, g, drop)
    return {"out": out, "dq": dq, "dk": dk, "dv": dv, "positions": layout.positions(t * comm.world_size,
                                                                                    comm.rank)}


RING = [(c, kind, causal, 16) for c in (2, 4) for kind in ("contiguous", "zigzag")
        for causal in (True, False)]
RING += [(2, "contiguous", True, 256), (2, "zigzag", False, 256)]  # blocks of several query tiles (64)


@pytest.mark.parametrize("c, kind, causal, t", RING, ids=[f"c{c}-{k}-{'causal' if ca else 'full'}-t{t}"
                                                          for c, k, ca, t in RING])
def test_ring_attention_drops_what_one_device_drops(c, kind, causal, t, monkeypatch):
    q, k, v, g = problem((2, 3, t, 8), seed=c + t)
    keep = _rng().keep_mask((2, 3, t, t), P)
    assert 0 < keep.mean() < 1
    gaps = [None] if t == 16 else [None, 0]  # 0: every query row drawn on its own
    for gap in gaps:
        monkeypatch.setattr(cp_dropout, "MERGE_GAP", cp_dropout.MERGE_GAP)  # restored after the test
        ranks = run_ranks(c, "threads", _ring_rank, args=(kind, causal, [q, k, v, g], gap), timeout_s=120)
        for key, expected in zip(("out", "dq", "dk", "dv"), full_attention(q, k, v, g, causal, keep, P)):
            close(gather(ranks, key, t), expected)


def _run(world: int, cfg: dict, fn=train_rank, steps: int | None = 3) -> list[dict]:
    args = (cfg,) if steps is None else (cfg, steps)
    return run_ranks(world, "threads", fn, args=args, timeout_s=180)


GRAD = [(2, 2, "zigzag", 1), (2, 2, "contiguous", 1), (4, 4, "zigzag", 1), (4, 4, "contiguous", 1),
        (4, 2, "zigzag", 2), (4, 2, "contiguous", 2)]  # (world, context, layout, tensor)


@pytest.mark.parametrize("world, c, layout, t", GRAD, ids=[f"w{w}-cp{c}-{k}-tp{t}" for w, c, k, t in GRAD])
def test_first_step_with_dropout_equals_one_device(world, c, layout, t):
    one = _run(1, cp_config(dropout=0.1, model__block_size=16), grad_rank, None)[0]
    undropped = _run(1, cp_config(model__block_size=16), grad_rank, None)[0]
    assert abs(one["loss"] - undropped["loss"]) > 1e-4  # the masks act (1e8 times the tolerance)
    for r in _run(world, cp_config(world, c, layout, t, dropout=0.1, model__block_size=16), grad_rank, None):
        assert r["loss"] == pytest.approx(one["loss"], rel=1e-12)
        for name, g in one["grads"].items():
            g = np.asarray(g)
            np.testing.assert_allclose(r["grads"][name], g, rtol=1e-12, atol=1e-12 * np.abs(g).max(),
                                       err_msg=name)


TRAIN = [(2, 2, "zigzag", 1, {}), (2, 2, "contiguous", 1, {}), (4, 4, "zigzag", 1, {}),
         (4, 4, "contiguous", 1, {}), (4, 2, "zigzag", 2, {}),
         (4, 2, "contiguous", 2, {"parallel__sequence_parallel": True}),
         (2, 2, "zigzag", 1, {"memory__checkpointing": "blocks", "train__micro_batches": 2})]


@pytest.mark.parametrize("world, c, layout, t, over", TRAIN, ids=[
    f"w{w}-cp{c}-{k}-tp{t}" + "".join(f"-{key.split('__')[1]}" for key in o) for w, c, k, t, o in TRAIN])
def test_trainer_with_dropout_equals_one_device(world, c, layout, t, over):
    """3 clipped AdamW steps (the masks change with the step); with sequence parallelism inside each slice,
    and with a recomputed block (its masks drawn again) and two micro-batches (keyed by their first row)."""
    one_over = {k: v for k, v in over.items() if not k.startswith("parallel__")}
    one = _run(1, cp_config(dropout=0.1, model__block_size=16, **one_over))[0]
    ranks = _run(world, cp_config(world, c, layout, t, dropout=0.1, model__block_size=16, **over))
    assert_trains_like(ranks, one)
