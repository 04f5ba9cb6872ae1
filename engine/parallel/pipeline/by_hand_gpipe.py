"""Pipeline parallelism by hand: GPipe over p ranks, before the stage runner and the executor.

The model is cut into p stages of contiguous blocks. Rank r holds stage r: rank 0 also the embedding,
the last rank also the final LayerNorm, the output layer and the loss. A step's batch is cut into m
micro-batches, and GPipe runs them in two waves:

    all forwards    rank r receives micro-batch j's activations from r - 1, runs its blocks, sends the
                    result to r + 1 (the last rank computes the loss instead), and keeps the tape;
    all backwards   rank r receives j's output gradient from r + 1, backpropagates through the kept
                    tape and sends the input's gradient to r - 1; the weights' gradients add up over
                    the micro-batches on their own rank, as one device accumulates them.

One activation goes forward and one gradient back per micro-batch and boundary, [b, s, h] each. While
rank 0 runs its first forward the others wait, and the last rank's first backward makes the others wait
again: the bubble, (p - 1) / (m + p - 1) of the step. All m micro-batches' tapes are held at once; 1F1B
(the real schedules, engine.parallel.pipeline) runs the same actions in an order that holds fewer.

A tied output layer: the last rank uses its own copy of wte.weight (every rank built the same model), so
the embedding's gradient is the sum of rank 0's and the last rank's, summed between the two.
`python -m engine.parallel.pipeline.by_hand_gpipe` prints p ranks against one device.
"""

from __future__ import annotations

import numpy as np

from engine import ops
from engine.comm import Communicator, run_ranks
from engine.nn import GPT
from engine.tensor import Tensor


def my_blocks(n_layer: int, p: int, r: int) -> range:
    """Rank r's blocks: n_layer / p each, the first n_layer % p ranks one more."""
    size, extra = divmod(n_layer, p)
    first = r * size + min(r, extra)
    return range(first, first + size + (r < extra))


def stage_forward(model: GPT, r: int, p: int, x, y):
    """Rank r's part of GPT.forward: the hidden state it sends on, or on the last rank the loss."""
    if r == 0:
        x = model.drop(model.wte(x) + model.wpe.weight[:x.shape[1]])
    for b in my_blocks(model.n_layer, p, r):
        x = model.blocks[b](x)
    return ops.cross_entropy(model.lm_head(model.ln_f(x)), y) if r == p - 1 else x


def my_parameters(model: GPT, r: int, p: int) -> dict:
    """The parameters stage r uses, by name (a tied head's weight under both its names when it is here)."""
    names = ["wte.", "wpe."] if r == 0 else []
    names += [f"blocks.{b}." for b in my_blocks(model.n_layer, p, r)]
    names += ["ln_f.", "lm_head."] if r == p - 1 else []
    return {n: q for n, _, _, q in model._owned_parameters() if any(n.startswith(s) for s in names)}


def gpipe_rank(comm: Communicator, emit, model_fn, micro_batches: list) -> dict:
    """A run_ranks rank_fn: one GPipe step; this rank's losses (the last rank's) and parameter gradients."""
    r, p, m = comm.rank, comm.world_size, len(micro_batches)
    model = model_fn()  # the same dense model on every rank; each uses only its stage
    kept, losses = [], []
    for x, y in micro_batches:  # all forwards
        inp = None
        if r > 0:
            buf = np.empty((*x.shape, model.config["n_embd"]), model.wte.weight.dtype)
            comm.recv(r - 1, buf)
            inp = Tensor(buf, requires_grad=True)  # a leaf: its gradient goes back to r - 1
        out = stage_forward(model, r, p, x if r == 0 else inp, y)
        if r < p - 1:
            comm.send(r + 1, out.data)
        else:
            losses.append(float(out.data))
        kept.append((inp, out))
    for inp, out in kept:  # all backwards, in the same order on every rank
        if r == p - 1:
            out.backward(np.asarray(1.0 / m, out.dtype))  # the mean over micro-batches, as one device's
        else:
            grad = np.empty(out.shape, out.dtype)
            comm.recv(r + 1, grad)
            out.backward(grad)
        if inp is not None and inp.grad is not None:  # rank 0's input is token ids: nothing to send
            comm.send(r - 1, inp.grad)
    tied = model.lm_head.weight is model.wte.weight
    if tied and p > 1 and r in (0, p - 1):  # the two copies' gradients summed, the same on both ranks
        mine, theirs = model.wte.weight.grad, np.empty_like(model.wte.weight.grad)
        comm.sendrecv(p - 1 - r, mine, p - 1 - r, theirs)
        model.wte.weight.grad = mine + theirs if r == 0 else theirs + mine  # one order: equal bits on both
    return {"losses": losses, "grads": {n: q.grad for n, q in my_parameters(model, r, p).items()}}


def one_device(model_fn, micro_batches: list) -> dict:
    """The same step on one device: m micro-batches of gradient accumulation, mean loss."""
    model, m = model_fn(), len(micro_batches)
    losses = []
    for x, y in micro_batches:
        loss = ops.cross_entropy(model(x), y)
        losses.append(float(loss.data))
        loss.backward(np.asarray(1.0 / m, loss.dtype))
    return {"losses": losses, "grads": {n: q.grad for n, _, _, q in model._owned_parameters()}}


def tiny_gpt() -> GPT:
    return GPT(vocab_size=11, block_size=8, n_layer=4, n_head=4, n_embd=16, dtype=np.float64)


if __name__ == "__main__":
    tokens = np.random.default_rng(0).integers(0, 11, (6, 2, 9))
    batches = [(t[:, :-1], t[:, 1:]) for t in tokens]
    ref = one_device(tiny_gpt, batches)
    for p in (1, 2, 3, 4):
        ranks = run_ranks(p, "threads", gpipe_rank, args=(tiny_gpt, batches))
        worst = float(np.abs(np.subtract(ranks[-1]["losses"], ref["losses"])).max())
        for rank in ranks:
            for name, g in rank["grads"].items():
                expected = ref["grads"][name]
                worst = max(worst, float(np.abs(g - expected).max() / np.abs(expected).max()))
        print(f"{p} ranks, {len(batches)} micro-batches: losses and gradients within {worst:.1e} "
              "(relative) of one device's")
