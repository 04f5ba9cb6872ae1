"""The by-hand GPipe (engine/parallel/pipeline/by_hand_gpipe.py): p ranks on the threads backend, all forwards
then all backwards over m micro-batches, give one device's losses and gradients (tied embedding summed
between the first and last rank) within 1e-12 relative, float64; it stays under 150 lines; its entry point
prints p ranks against one device."""

from __future__ import annotations

import pytest

from engine.comm.launch import run_ranks
from engine.parallel.pipeline import by_hand_gpipe
from tests.parallel_helpers import by_hand_main
from tests.pp_stage_helpers import assert_matches, micro_batches, model_fn, one_device


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 3), (3, 5), (4, 4)])
def test_by_hand_gpipe_equals_one_device(p, m, tie):
    build, batches = model_fn(n_layer=4, tie_weights=tie), micro_batches(m)
    ranks = run_ranks(p, "threads", by_hand_gpipe.gpipe_rank, args=(build, batches))
    expected = one_device(build, batches)
    grads = {}
    for rank in ranks:
        grads.update(rank["grads"])
    if tie:  # both ranks hold the summed gradient, under its two names
        assert (grads.pop("lm_head.weight") == grads["wte.weight"]).all()
    assert_matches({"losses": ranks[-1]["losses"], "grads": grads}, expected)


def test_by_hand_stays_short_and_prints_p_ranks_against_one_device():
    with open(by_hand_gpipe.__file__) as f:
        assert len(f.readlines()) < 150
    printed = by_hand_main(by_hand_gpipe.__file__, "within")
    assert [ranks for ranks, _ in printed] == ["1", "2", "3", "4"]
    assert all(error < 1e-12 for _, error in printed)
