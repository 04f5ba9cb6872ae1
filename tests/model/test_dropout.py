"""Dropout follows the global row, not the rank: N ranks (and any split into micro-batches) draw the masks
one process draws for the same rows, so they train what one process trains; activation checkpointing's
recompute and resuming from a checkpoint keep that."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from engine.config import from_dict
from engine.dropout_rng import DropoutRNG
from engine.run.job import resume_training
from engine.trainer import Trainer
from tests.parallel_helpers import tiny_gpt
from tests.run_helpers import state_at, step_losses, train

P = 0.25


def test_a_rows_mask_does_not_depend_on_the_run_of_rows_it_is_drawn_in():
    rng = DropoutRNG(11)
    rng.begin(step=4, first_row=0)
    whole = rng.keep_mask((6, 3, 5), P)
    pieces = []
    for first, rows in ((0, 2), (2, 1), (3, 3)):
        rng.begin(step=4, first_row=first)
        pieces.append(rng.keep_mask((rows, 3, 5), P))
    np.testing.assert_array_equal(np.concatenate(pieces), whole)
    rng.begin(step=4, first_row=0)
    rng.keep_mask((6, 3, 5), P)
    assert not np.array_equal(rng.keep_mask((6, 3, 5), P), whole)  # the next site: other masks
    rng.begin(step=5, first_row=0)
    assert not np.array_equal(rng.keep_mask((6, 3, 5), P), whole)  # the next step: other masks
    assert not np.array_equal(DropoutRNG(12).keep_mask((6, 3, 5), P), whole)  # another seed


def test_masks_keep_with_probability_one_minus_p_and_rows_are_independent():
    rng = DropoutRNG(0)
    mask = rng.keep_mask((400, 1000), P)
    assert abs(mask.mean() - (1 - P)) < 0.005
    per_row = mask.mean(axis=1)
    assert per_row.std() < 3 * np.sqrt(P * (1 - P) / 1000)  # no row shares another's draws
    assert not any(np.array_equal(mask[0], row) for row in mask[1:])
    assert DropoutRNG(0).keep_mask((3, 4), 0.0).all()


@pytest.fixture
def masks(monkeypatch):
    """Every mask row drawn, by (step, site, global row): {key: [row bytes, ...]} per recorded run."""
    runs: list[dict] = []
    lock = threading.Lock()
    real = DropoutRNG.keep_mask

    def recording(self, shape, p):
        step, first, site = self.step, self.first_row, self.site
        mask = real(self, shape, p)
        with lock:
            for i, row in enumerate(mask):
                runs[-1].setdefault((step, site, first + i), []).append(row.tobytes())
        return mask

    monkeypatch.setattr(DropoutRNG, "keep_mask", recording)

    def new_run() -> dict:
        runs.append({})
        return runs[-1]
    return new_run


def _train(comm, emit, cfg_dict, steps):
    trainer = Trainer(from_dict(cfg_dict), comm)
    try:
        losses = [trainer.train_step()["loss"] for _ in range(steps)]
        return {"losses": losses, "params": trainer.replica.flat.data.copy()}
    finally:
        trainer.replica.close()


def run(cfg, world, steps=5):
    cfg = dict(cfg, parallel=dict(cfg["parallel"], world_size=world))
    return run_ranks(world, "threads", _train, args=(cfg, steps), timeout_s=60)


def dropout_gpt(**over):
    return tiny_gpt(model__dropout=P, precision__dtype="fp64", train__global_batch=12, **over)


def assert_same_training(multi, single, rtol=1e-12):
    np.testing.assert_allclose(multi[0]["losses"], single["losses"], rtol=rtol)
    scale = np.abs(single["params"]).max()
    for rank in multi:
        np.testing.assert_allclose(rank["params"], single["params"], rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("world, micro, recompute", [(1, 2, "none"), (2, 1, "none"), (3, 1, "none"),
                                                     (3, 2, "none"), (2, 1, "blocks"), (3, 2, "every:2")],
                         ids=lambda v: str(v))
def test_dropout_ranks_train_what_one_process_trains(masks, world, micro, recompute):
    single_masks = masks()
    single = run(dropout_gpt(), 1)[0]
    multi_masks = masks()
    multi = run(dropout_gpt(train__micro_batches=micro, memory__checkpointing=recompute), world)
    assert single_masks.keys() == multi_masks.keys()
    for key, rows in multi_masks.items():  # the same bits for every row, whoever drew it (recomputes too)
        assert set(rows) == set(single_masks[key]) and len(set(rows)) == 1, key
    assert_same_training(multi, single)
    no_dropout = run(tiny_gpt(precision__dtype="fp64", train__global_batch=12), 1)[0]
    assert abs(no_dropout["losses"][-1] - single["losses"][-1]) > 1e-3  # the masks did matter


def test_resuming_at_another_world_size_keeps_the_masks(tmp_path):
    sets = ["model.dropout=0.2", "precision.dtype=fp64", "train.global_batch=12", "train.steps=6",
            "checkpoint.every=3"]
    whole, whole_events = train(tmp_path / "one", *sets)
    first_half, _ = train(tmp_path / "two", *sets, "parallel.world_size=2")
    resumed: list = []
    summary = resume_training(first_half["run_dir"], ["parallel.world_size=3"], step=3,
                              on_event=resumed.append)
    expected = {s: v for s, v in step_losses(whole_events).items() if s > 3}
    got = step_losses(resumed)
    assert sorted(got) == sorted(expected)
    np.testing.assert_allclose([got[s] for s in sorted(got)], [expected[s] for s in sorted(expected)],
                               rtol=1e-12)
    mine, theirs = state_at(summary["run_dir"]), state_at(whole["run_dir"])
    np.testing.assert_allclose(mine["master"], theirs["master"], rtol=1e-10,
                               atol=1e-12 * np.abs(theirs["master"]).max())
