"""ZB-H1 against 1F1B in bytes, as the estimator predicts them (the estimator is held to the ledger to the
byte in test_pp_memory.py): ZB-H1 keeps what W needs from I to W, so no rank holds fewer activation bytes
than under 1F1B, rank 0 (stage 0 keeps everything and its seed gradient until W) holds more, and the
fullest rank can hold more than 1F1B's fullest (docs/pipeline-parallel.md gives the ratios)."""
from __future__ import annotations

import pytest

from engine.config import from_dict
from engine.memory.pipeline import estimate_ranks
from tests.pp_memory_helpers import pp_memory_config


def activation_peaks(p: int, m: int, schedule: str, n_layer: int, checkpointing: str) -> list[int]:
    cfg = pp_memory_config(p, m, schedule, "fp32", model__n_layer=n_layer,
                           memory__checkpointing=checkpointing)
    return [e.category_peaks()["activations"] for e in estimate_ranks(from_dict(cfg))]


@pytest.mark.parametrize("p,m,n_layer,checkpointing,fullest_holds_more", [
    (2, 4, 3, "none", True), (4, 8, 5, "none", True), (4, 8, 8, "none", True), (4, 8, 8, "blocks", True),
    (4, 2, 5, "none", False), (3, 6, 6, "none", True)])
def test_zero_bubble_holds_at_least_1f1b_bytes_and_can_hold_more(p, m, n_layer, checkpointing,
                                                                 fullest_holds_more):
    zb = activation_peaks(p, m, "zb-h1", n_layer, checkpointing)
    one_f_one_b = activation_peaks(p, m, "1f1b", n_layer, checkpointing)
    assert all(z >= o for z, o in zip(zb, one_f_one_b, strict=True))
    assert zb[0] > one_f_one_b[0]
    # p = 4, m = 2: the fullest rank (rank 2) holds as much under both
    assert (max(zb) > max(one_f_one_b)) == fullest_holds_more
