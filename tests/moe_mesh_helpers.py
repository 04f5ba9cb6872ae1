"""A tiny float64 mixture-of-experts GPT for the tests that train it beside tensor, pipeline and context
parallelism (tests/parallel/test_moe_*.py), and its one-device twin.

The one device runs the same global batch in dp x m micro-batches: a data-parallel rank's micro-batch j is
one device's micro-batch (rank x m + j) (engine.data.slice_bounds), and the load-balancing loss and a
capacity are taken over a micro-batch's tokens, so these are the batches one device must see to train the
same model (with one micro-batch per data-parallel rank the loss term would be one over twice the tokens).
"""

from __future__ import annotations

from tests.pp_train_helpers import pp_config

MOE = {"model__n_experts": 4, "model__top_k": 2, "model__moe_every": 1, "model__aux_loss_coef": 0.1}


def moe_config(world: int = 1, pipeline: int = 1, m: int = 1, tensor: int = 1, context: int = 1,
               expert: int = 1, rows: int = 2, **over) -> dict:
    """pp_config's tiny GPT (float64, 4 blocks, 4 heads, width 16) with 4 experts, top-2, in every block."""
    dp = world // (pipeline * tensor * context)
    settings = {**MOE, "parallel__expert": expert, "parallel__context": context,
                "train__global_batch": rows * m * dp, **over}
    return pp_config(world, pipeline, m, tensor=tensor, rows=rows, **settings)


def one_device_config(world: int, pipeline: int = 1, m: int = 1, tensor: int = 1, context: int = 1,
                      rows: int = 2, **over) -> dict:
    """The one-device run of moe_config(world, pipeline, m, tensor, context, ..., rows): the same global batch
    in dp x m micro-batches."""
    dp = world // (pipeline * tensor * context)
    cfg = moe_config(1, 1, m * dp, rows=rows, **over)
    assert cfg["train"]["global_batch"] == rows * m * dp
    return cfg
