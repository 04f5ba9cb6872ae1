"""The by-hand data parallelism (engine/parallel/data/by_hand_ddp.py, by_hand_zero1.py): N thread ranks
train what one process trains on the whole batch (float64), whether or not N divides the parameter count
and the batch; the ring's collectives give the mean of the ranks' arrays; ZeRO-1 holds exactly 1/N of
the optimizer state; and both train what the engine's own replicas (make_replica, stages 0 and 1) train
on the same config."""

from __future__ import annotations

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from engine.comm.shard import shard_bounds
from engine.config import from_dict
from engine.config.build import build_dataset, build_model
from engine.parallel.data import by_hand_ddp, by_hand_zero1
from engine.trainer import Trainer
from tests.parallel_helpers import by_hand_main, tiny_gpt, with_parallel

RANK_FNS = {"ddp": by_hand_ddp.train_rank, "zero1": by_hand_zero1.train_rank}


def assert_same_training(multi: np.ndarray, single: np.ndarray, rtol: float = 1e-12) -> None:
    """Relative to the parameters' scale, as tests/parallel/test_ddp.py's assert_matches_single explains:
    an element that passes near zero keeps the rounding of the O(1) terms it came from."""
    np.testing.assert_allclose(multi, single, rtol=rtol, atol=rtol * np.abs(single).max())


def test_the_tiny_model_is_not_divisible_by_3_or_4():
    """So the ring's shards differ in size on 3 and 4 ranks (shard_bounds gives the first ones one more)."""
    n = sum(p.data.size for p in by_hand_ddp.tiny_gpt().parameters())
    assert n == 2830 and n % 3 and n % 4


@pytest.mark.parametrize("kind", sorted(RANK_FNS))
@pytest.mark.parametrize("rows", [12, 10], ids=["12 rows", "10 rows"])  # 10 rows: 3 and 4 ranks uneven
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_n_ranks_train_what_one_process_trains(kind, rows, world):
    batches = by_hand_ddp.random_batches(steps=3, rows=rows, seed=rows)
    alone = by_hand_ddp.train_alone(batches)
    ranks = by_hand_ddp.train_on_ranks(world, batches, rank_fn=RANK_FNS[kind])
    assert np.abs(alone - by_hand_ddp.flatten_parameters(by_hand_ddp.tiny_gpt())).max() > 1e-3  # it trained
    for r in ranks:
        assert_same_training(r["params"], alone)
        # every shard is summed by one rank and then copied: the ranks hold the same bits
        np.testing.assert_array_equal(r["params"], ranks[0]["params"])


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_zero1_holds_one_nth_of_the_optimizer_state(world):
    batches = by_hand_ddp.random_batches(steps=1, rows=4)
    n = 2830
    ddp = by_hand_ddp.train_on_ranks(world, batches)
    zero1 = by_hand_ddp.train_on_ranks(world, batches, rank_fn=by_hand_zero1.train_rank)
    assert [r["optimizer_elements"] for r in ddp] == [2 * n] * world  # m and v for every parameter
    sizes = [hi - lo for lo, hi in (shard_bounds(n, world, rank) for rank in range(world))]
    assert [r["optimizer_elements"] for r in zero1] == [2 * s for s in sizes]  # m and v for the shard
    assert sum(r["optimizer_elements"] for r in zero1) == 2 * n
    assert max(sizes) == -(-n // world)  # 1/N of the parameters, rounded up


def _ring_mean(comm, emit, arrays):
    mine = arrays[comm.rank].copy()
    by_hand_ddp.ring_all_reduce_mean(comm, mine)
    return mine


@pytest.mark.parametrize("world, n", [(2, 7), (3, 10), (4, 3), (4, 4096 + 3)])  # (4, 3): an empty shard
def test_the_ring_all_reduce_gives_the_mean_of_the_ranks_arrays(world, n):
    arrays = [np.random.default_rng(r).standard_normal(n) for r in range(world)]
    for out in run_ranks(world, "threads", _ring_mean, args=(arrays,), timeout_s=30):
        np.testing.assert_allclose(out, np.mean(arrays, axis=0), rtol=1e-14, atol=1e-15)


# ---- by hand, and the engine's replicas, on one config ------------------------------------------------

def _engine_replica(comm, emit, cfg_dict, steps):
    trainer = Trainer(from_dict(cfg_dict), comm)
    for _ in range(steps):
        trainer.train_step()
    trainer.replica.close()
    return np.concatenate([p.data.reshape(-1) for p in trainer.model.parameters()])


def _by_hand(comm, emit, cfg_dict, steps, kind):
    """The config's model, batches and AdamW settings through the by-hand rank function."""
    cfg = from_dict(cfg_dict)
    dataset = build_dataset(cfg)
    batches = [dataset.global_batch(step, "train") for step in range(steps)]
    o = cfg.optim
    adamw = dict(lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay)
    return RANK_FNS[kind](comm, emit, lambda: build_model(cfg, dataset), batches, adamw)["params"]


@pytest.mark.parametrize("kind, stage", [("ddp", 0), ("zero1", 1)])
def test_by_hand_trains_what_the_engines_replica_trains(kind, stage):
    """Constant learning rate and no clipping: what the by-hand files leave out; the rest is the config's."""
    cfg = with_parallel(tiny_gpt(precision__dtype="fp64", optim__grad_clip=0.0, optim__warmup_steps=0,
                                 optim__schedule="constant"), 2, stage, backend="threads")
    engine = run_ranks(2, "threads", _engine_replica, args=(cfg, 4), timeout_s=60)
    by_hand = run_ranks(2, "threads", _by_hand, args=(cfg, 4, kind), timeout_s=60)
    untrained = _by_hand_untrained(cfg)
    assert np.abs(engine[0] - untrained).max() > 1e-3  # the steps really moved the parameters
    for rank in range(2):
        np.testing.assert_allclose(by_hand[rank], engine[rank], rtol=1e-12, atol=1e-14)


def _by_hand_untrained(cfg_dict) -> np.ndarray:
    cfg = from_dict(cfg_dict)
    return np.concatenate([p.data.reshape(-1) for p in build_model(cfg, build_dataset(cfg)).parameters()])


@pytest.mark.parametrize("module", [by_hand_ddp, by_hand_zero1], ids=["by_hand_ddp", "by_hand_zero1"])
def test_the_entry_point_prints_n_ranks_against_one(module):
    printed = by_hand_main(module.__file__, "process ")
    assert [ranks for ranks, _ in printed] == ["1", "2", "3", "4"]
    assert all(error < 1e-12 for _, error in printed), printed
