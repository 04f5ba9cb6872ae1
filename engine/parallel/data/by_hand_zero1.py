"""ZeRO stage 1 by hand: by_hand_ddp.py with the optimizer state sharded. Read that first.

In DDP every rank keeps Adam's m and v for every parameter and runs the same update as every other
rank: N copies of the same work and of the largest state (in mixed precision, with an fp32 master,
12 of the 16 bytes per parameter). ZeRO-1 splits that work by the shard rule. In each step every rank
  1. computes the gradients of the loss on its own slice of the global batch (as DDP);
  2. reduce-scatters them: only its own shard of the gradient comes out summed over the ranks;
  3. runs AdamW on its shard of the parameters only, with m and v for that shard only: 1/N of the
     optimizer state and of the update's work;
  4. all-gathers the parameters: every rank's updated shard to every rank, so each again holds the
     whole model for the next forward.

A reduce-scatter and an all-gather are exactly what DDP's all-reduce sends, so the traffic is the
same; the parameters, not the gradients, go round in the second half. AdamW is elementwise, so the
shards' updates together are the whole update, and N ranks again train what one process trains.
zero12.py adds buckets reduced while backward runs, loss scaling and the fp32 master; ZeRO-2 also
frees the gradient outside the shard, ZeRO-3 the parameters (zero3.py).
`python -m engine.parallel.data.by_hand_zero1` prints N ranks against one.
"""

from __future__ import annotations

import numpy as np

from engine.comm import Communicator, shard_bounds
from engine.optim import AdamW
from engine.parallel.data.by_hand_ddp import (
    ADAMW,
    decay_mask,
    flatten_parameters,
    gradient,
    random_batches,
    ring_all_gather,
    ring_reduce_scatter,
    train_alone,
    train_on_ranks,
)


def train_rank(comm: Communicator, emit, model_fn, batches, adamw: dict = ADAMW) -> dict:
    """One rank's training (a run_ranks rank_fn): its final parameters and its Adam state's size (m and
    v: 2 elements per parameter of its shard)."""
    model = model_fn()
    flat = flatten_parameters(model)
    grads = np.zeros_like(flat)
    lo, hi = shard_bounds(flat.size, comm.world_size, comm.rank)  # the shard this rank updates
    # AdamW over views of our shard: it updates flat[lo:hi] in place, and its m and v are hi - lo long.
    opt = AdamW(flat[lo:hi], grads[lo:hi], decay_mask=decay_mask(model)[lo:hi], **adamw)
    for x, y in batches:
        first, last = shard_bounds(len(x), comm.world_size, comm.rank)  # this rank's rows, weighted as DDP
        grads[:] = gradient(model, x[first:last], y[first:last], comm.world_size * (last - first) / len(x))
        ring_reduce_scatter(comm, grads)  # grads[lo:hi] (the same shard rule) now holds the sum over ranks
        grads[lo:hi] /= comm.world_size  # our shard of the mean gradient; the rest of grads is not used
        opt.step()
        ring_all_gather(comm, flat)  # every rank's updated shard to every rank: the whole model again
    return {"params": flat.copy(), "optimizer_elements": opt.m.size + opt.v.size}


if __name__ == "__main__":
    batches = random_batches(steps=3, rows=12)
    alone = train_alone(batches)
    for n in (1, 2, 3, 4):
        ranks = train_on_ranks(n, batches, rank_fn=train_rank)
        worst = max(float(np.abs(r["params"] - alone).max()) for r in ranks) / np.abs(alone).max()
        state = [r["optimizer_elements"] for r in ranks]
        print(f"{n} ranks: largest difference from one process {worst:.1e} of the largest parameter; "
              f"Adam state per rank {state} elements, {2 * alone.size} in DDP")
