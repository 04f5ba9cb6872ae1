"""Data parallelism by hand: the readable start, before ddp.py.

Every rank holds the whole model and the whole optimizer. In each step every rank
  1. computes the gradients of the loss on its own slice of the global batch;
  2. averages them over the ranks with a ring all-reduce written out below over the communicator's
     point-to-point sendrecv: a reduce-scatter (each rank ends with the sum over all ranks of one shard
     of the gradient), then an all-gather (each rank passes its finished shard around the ring);
  3. runs AdamW on the whole gradient, the same on every rank, so every rank takes the same step.

N ranks thus train what one process trains on the whole batch, up to the rounding of the sums' order.
ddp.py adds gradients that backward writes straight into one flat buffer (here they are copied),
buckets all-reduced while backward runs, loss scaling, rank 0's weights broadcast at the start (here
every rank builds the same model from one seed) and checkpoints; engine/comm/ring.py is this ring with
segments and reduce-on-receive. Next: by_hand_zero1.py.
`python -m engine.parallel.data.by_hand_ddp` prints N ranks against one.
"""

from __future__ import annotations

import numpy as np

from engine import ops
from engine.comm import Communicator, run_ranks, shard_bounds
from engine.nn import GPT, Module
from engine.optim import AdamW

VOCAB, BLOCK = 30, 8
ADAMW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)  # nanoGPT's, as the configs'


def tiny_gpt() -> GPT:
    """2 layers, width 10, float64: 2830 parameters, a count that 3 and 4 do not divide, so the ring's
    shards differ in size. No biases: the attention key bias has an exactly-zero true gradient, so its
    computed one is rounding noise that Adam would blow up into steps of random sign."""
    return GPT(VOCAB, BLOCK, n_layer=2, n_head=2, n_embd=10, bias=False, dtype=np.float64)


def random_batches(steps: int, rows: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """`steps` global batches of `rows` random token windows: inputs x and next tokens y."""
    tokens = np.random.default_rng(seed).integers(0, VOCAB, (steps, rows, BLOCK + 1))
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


# ---- the ring ------------------------------------------------------------------------------------

def ring_reduce_scatter(comm: Communicator, flat: np.ndarray) -> tuple[int, int]:
    """Sum `flat` over the ranks, one shard (shard_bounds) per rank: afterwards this rank's shard holds
    the sum of every rank's; the rest holds partial sums. Returns the shard's [lo, hi)."""
    world, rank = comm.world_size, comm.rank
    shards = [shard_bounds(flat.size, world, r) for r in range(world)]
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        # Pass right the shard we just added to; add our part to the one coming from the left. After
        # N - 1 steps our own shard has come round holding all N ranks' parts.
        out, into = shards[(rank - step - 1) % world], shards[(rank - step - 2) % world]
        incoming = np.empty(into[1] - into[0], flat.dtype)
        # sendrecv, not send then recv: on a socket transport a large send blocks until the peer
        # receives, and every rank sending at once would deadlock.
        comm.sendrecv(right, flat[out[0]:out[1]], left, incoming)
        flat[into[0]:into[1]] += incoming
    return shards[rank]


def ring_all_gather(comm: Communicator, flat: np.ndarray) -> None:
    """Every rank's shard of `flat` to every rank: pass each finished shard once around the ring."""
    world, rank = comm.world_size, comm.rank
    shards = [shard_bounds(flat.size, world, r) for r in range(world)]
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        out, into = shards[(rank - step) % world], shards[(rank - step - 1) % world]
        comm.sendrecv(right, flat[out[0]:out[1]], left, flat[into[0]:into[1]])


def ring_all_reduce_mean(comm: Communicator, flat: np.ndarray) -> None:
    """The mean of `flat` over the ranks, on every rank: reduce-scatter, divide our shard, all-gather."""
    lo, hi = ring_reduce_scatter(comm, flat)
    flat[lo:hi] /= comm.world_size
    ring_all_gather(comm, flat)


# ---- one model, its parameters in one flat array -------------------------------------------------

def flatten_parameters(model: Module) -> np.ndarray:
    """The model's parameters copied into one flat array, each parameter left a view of its part, so an
    optimizer that updates the flat array in place updates the model."""
    params = model.parameters()
    flat = np.concatenate([p.data.reshape(-1) for p in params])
    start = 0
    for p in params:
        p.data = flat[start:start + p.data.size].reshape(p.data.shape)
        start += p.data.size
    return flat


def decay_mask(model: Module) -> np.ndarray:
    """Weight decay on matrices only, not on LayerNorm weights or biases (nanoGPT's rule, flat.py's)."""
    return np.concatenate([np.full(p.data.size, p.data.ndim >= 2) for p in model.parameters()])


def gradient(model: Module, x: np.ndarray, y: np.ndarray, weight: float = 1.0) -> np.ndarray:
    """d(weight · mean cross-entropy of model(x) against y) / d parameters, as one flat array."""
    params = model.parameters()
    for p in params:
        p.grad = None  # backward then writes a fresh gradient instead of adding to last step's
    (ops.cross_entropy(model(x), y) * weight).backward()
    grads = [np.zeros_like(p.data) if p.grad is None else p.grad for p in params]  # None: loss not reached
    return np.concatenate([g.reshape(-1) for g in grads])


# ---- training --------------------------------------------------------------------------------------

def train_rank(comm: Communicator, emit, model_fn, batches, adamw: dict = ADAMW) -> dict:
    """One rank's training (a run_ranks rank_fn): its final parameters and its Adam state's size."""
    model = model_fn()
    flat = flatten_parameters(model)
    opt = AdamW(flat, np.zeros_like(flat), decay_mask=decay_mask(model), **adamw)
    for x, y in batches:
        lo, hi = shard_bounds(len(x), comm.world_size, comm.rank)  # this rank's rows
        # The mean over our rows, weighted by our share of the batch (exactly 1 when N divides it): the
        # mean of the ranks' gradients is then the gradient of the mean over the whole batch.
        opt.grads[:] = gradient(model, x[lo:hi], y[lo:hi], comm.world_size * (hi - lo) / len(x))
        ring_all_reduce_mean(comm, opt.grads)
        opt.step()
    return {"params": flat.copy(), "optimizer_elements": opt.m.size + opt.v.size}


def train_on_ranks(world: int, batches, model_fn=tiny_gpt, adamw=ADAMW, rank_fn=train_rank) -> list[dict]:
    """Every rank's `rank_fn` result (train_rank's), `world` ranks as threads of this process."""
    return run_ranks(world, "threads", rank_fn, args=(model_fn, batches, adamw), timeout_s=60)


def train_alone(batches, model_fn=tiny_gpt, adamw: dict = ADAMW) -> np.ndarray:
    """The same training in one process on the whole batch, no communication: what N ranks must match."""
    model = model_fn()
    flat = flatten_parameters(model)
    opt = AdamW(flat, np.zeros_like(flat), decay_mask=decay_mask(model), **adamw)
    for x, y in batches:
        opt.grads[:] = gradient(model, x, y)
        opt.step()
    return flat


if __name__ == "__main__":
    batches = random_batches(steps=3, rows=12)
    alone = train_alone(batches)
    for n in (1, 2, 3, 4):
        ranks = train_on_ranks(n, batches)
        worst = max(float(np.abs(r["params"] - alone).max()) for r in ranks) / np.abs(alone).max()
        print(f"{n} ranks: largest difference from one process {worst:.1e} of the largest parameter")
