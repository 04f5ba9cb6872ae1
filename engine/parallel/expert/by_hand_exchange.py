"""Expert parallelism by hand: two ranks, two experts (rank r holds expert r), top-1 routing, in plain NumPy,
before layer.py. Each rank routes its own tokens; a token whose expert lives on the other rank travels
there and its output travels back:

    p = softmax(x @ Wr.T)            the router, the same weights on both ranks
    e = argmax p, gate = p[e]        top-1: each token's expert and weight (Switch's gate)
    dispatch                         the rows of the other rank's expert: the count first, then the rows
    out = MLP_r(rows)                expert r on its rows from both ranks (mine first, then the peer's)
    combine                          the peer's rows' outputs go back; y = gate * out, in token order

Backward is the mirror: the gradient of each output row goes to the rank that computed it, the expert's
weight gradients sum the rows of both ranks, the rows' gradients come back, and the router's gradient
(through the gate) stays on the token's own rank. layer.py does this for any number of ranks and experts,
top-k and capacity, through the autograd. `python -m engine.parallel.expert.by_hand_exchange` prints two
ranks against one device holding both experts.
"""

from __future__ import annotations

import numpy as np

from engine.comm import Communicator, run_ranks
from engine.reference import gelu, gelu_backward

PREFIX = "experts.mlps."


def swap(comm: Communicator, mine: np.ndarray) -> np.ndarray:
    """Send `mine` to the other rank and receive its rows: the row count first (both ranks then know
    whether rows travel each way), then the rows."""
    peer, count = 1 - comm.rank, np.zeros(1, np.int64)
    comm.sendrecv(peer, np.array([len(mine)], np.int64), peer, count)
    theirs = np.empty((int(count[0]), *mine.shape[1:]), mine.dtype)
    if mine.size and theirs.size:
        comm.sendrecv(peer, mine, peer, theirs)
    elif mine.size:
        comm.send(peer, mine)
    elif theirs.size:
        comm.recv(peer, theirs)
    return theirs


def forward(comm: Communicator, p: dict, x: np.ndarray) -> tuple[np.ndarray, dict]:
    """This rank's output for its tokens x [n, C], and what backward needs."""
    w1, b1 = p[f"{PREFIX}{comm.rank}.layers.0.weight"], p[f"{PREFIX}{comm.rank}.layers.0.bias"]
    w2, b2 = p[f"{PREFIX}{comm.rank}.layers.1.weight"], p[f"{PREFIX}{comm.rank}.layers.1.bias"]
    logits = x @ p["router.gate.weight"].T
    prob = np.exp(logits - logits.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    expert = prob.argmax(-1)
    gate = prob[np.arange(len(x)), expert]
    here = expert == comm.rank  # tokens whose expert this rank holds
    rows = np.concatenate([x[here], swap(comm, x[~here])])  # dispatch
    h = rows @ w1.T + b1
    out = gelu(h) @ w2.T + b2
    n_here = int(here.sum())
    expert_out = np.empty_like(x)
    expert_out[here] = out[:n_here]
    expert_out[~here] = swap(comm, out[n_here:])  # combine: the peer's rows go back, mine come home
    cache = dict(x=x, prob=prob, expert=expert, gate=gate, here=here, rows=rows, h=h, expert_out=expert_out)
    return gate[:, None] * expert_out, cache


def backward(comm: Communicator, p: dict, c: dict, dy: np.ndarray) -> tuple[np.ndarray, dict]:
    """The gradient of this rank's tokens, of the router (from its tokens) and of its expert (from both
    ranks' tokens), given dy = dL/dy."""
    name = f"{PREFIX}{comm.rank}.layers."
    here, n_here = c["here"], int(c["here"].sum())
    d_out = dy * c["gate"][:, None]
    d_rows_out = np.concatenate([d_out[here], swap(comm, d_out[~here])])  # combine's mirror
    g = {name + "1.weight": d_rows_out.T @ gelu(c["h"]), name + "1.bias": d_rows_out.sum(0)}
    dh = gelu_backward(c["h"], d_rows_out @ p[name + "1.weight"])
    g[name + "0.weight"], g[name + "0.bias"] = dh.T @ c["rows"], dh.sum(0)
    d_rows = dh @ p[name + "0.weight"]
    dx = np.empty_like(c["x"])
    dx[here] = d_rows[:n_here]
    dx[~here] = swap(comm, d_rows[n_here:])  # dispatch's mirror: the rows' gradients go home
    d_prob = np.zeros_like(c["prob"])  # the router: through the gate, on the token's own rank
    d_prob[np.arange(len(dy)), c["expert"]] = (dy * c["expert_out"]).sum(-1)
    d_logits = c["prob"] * (d_prob - (d_prob * c["prob"]).sum(-1, keepdims=True))
    g["router.gate.weight"] = d_logits.T @ c["x"]
    return dx + d_logits @ p["router.gate.weight"], g


def moe_on_rank(comm: Communicator, emit, params: dict, xs: list, dys: list) -> dict:
    """A run_ranks rank_fn (two ranks): this rank's output, input gradient and its gradients."""
    if comm.world_size != 2:
        raise ValueError(f"the by-hand exchange runs on two ranks, not {comm.world_size}")
    held = f"{PREFIX}{comm.rank}."  # the router, and this rank's expert only
    mine = {k: v for k, v in params.items() if not k.startswith(PREFIX) or k.startswith(held)}
    out, cache = forward(comm, mine, xs[comm.rank])
    dx, grads = backward(comm, mine, cache, dys[comm.rank])
    return {"out": out, "dx": dx, "grads": grads}


if __name__ == "__main__":
    from engine.dropout_rng import DropoutRNG
    from engine.moe import MoE
    from engine.tensor import Tensor
    rng = np.random.default_rng(0)
    moe = MoE(8, 2, 1, 0.0, 0.0, True, np.float64, DropoutRNG())  # one device, both experts, the autograd
    moe._name_parameters()
    for prm in moe.parameters():
        prm.data[...] = rng.standard_normal(prm.shape) * 0.3
    xs, dys = list(rng.standard_normal((2, 10, 8))), list(rng.standard_normal((2, 10, 8)))
    dense = {n: q.data for n, q in moe.named_parameters()}
    ranks = run_ranks(2, "threads", moe_on_rank, args=(dense, xs, dys))
    worst = 0.0
    for r, got in enumerate(ranks):
        x = Tensor(xs[r].copy(), requires_grad=True)
        moe(x).backward(dys[r])
        worst = max(worst, float(np.abs(got["out"] - moe(Tensor(xs[r])).data).max()),
                    float(np.abs(got["dx"] - x.grad).max()))
    print(f"2 ranks: output and input gradient within {worst:.1e} of one device's")
