"""Tensor parallelism by hand: one pre-LN transformer block on t ranks, in plain NumPy, before plan.py.

Rank r holds 1/t of each weight matrix and computes 1/t of the block's products:

    h = LN1(x)                          every rank, whole: x is the same on every rank
    qkv_r = h @ Wqkv_r.T + b_r          column-parallel: rank r's heads of q, of k and of v
    a_r = attention(q_r, k_r, v_r)      heads never mix: nothing to communicate
    x = x + sum_r(a_r @ Wo_r.T) + bo    row-parallel: partial sums, all-reduced (g); the bias added once
    the MLP the same way: up column-parallel (4h/t features), GELU, down row-parallel, all-reduce

Backward is the mirror. A row-parallel output's gradient is whole on every rank (g's backward: nothing
to do); a column-parallel product's input gradient is a partial sum on each rank: an all-reduce (f's
backward). Two all-reduces forward, two backward, of b·s·h each; weight gradients need none. plan.py does
this to a whole GPT through the autograd (vocabulary split, sequence parallelism too).
`python -m engine.parallel.tensor.by_hand_tp` prints t ranks against one device.
"""

from __future__ import annotations

import numpy as np

from engine.comm import Communicator, all_reduce, run_ranks


def shard(dense: dict[str, np.ndarray], t: int, r: int) -> dict[str, np.ndarray]:
    """Rank r's slices of a block's dense weights (named as Block.named_parameters())."""
    def rows(a: np.ndarray, sections: int = 1) -> np.ndarray:  # output features: part r of each section
        return np.concatenate([np.split(section, t)[r] for section in np.split(a, sections)])
    p = dict(dense)  # the LayerNorms and the row-parallel biases stay whole
    for name in ("attn.c_attn.weight", "attn.c_attn.bias", "mlp.layers.0.weight", "mlp.layers.0.bias"):
        p[name] = rows(dense[name], 3 if "c_attn" in name else 1)  # q, k, v split on their own: whole heads
    for name in ("attn.c_proj.weight", "mlp.layers.1.weight"):
        p[name] = np.split(dense[name], t, axis=1)[r]  # input features: part r
    return p


def summed(comm: Communicator, partial: np.ndarray) -> np.ndarray:
    """The sum over the ranks of every rank's `partial`: the all-reduce of both f and g."""
    buf = np.ascontiguousarray(partial).copy()
    all_reduce(comm, buf.reshape(-1))
    return buf


def layer_norm(x, w, b, eps=1e-5):
    rstd = 1 / np.sqrt(x.var(-1, keepdims=True) + eps)
    xhat = (x - x.mean(-1, keepdims=True)) * rstd
    return xhat * w + b, (xhat, rstd)


def layer_norm_backward(dy, w, cache):
    xhat, rstd = cache
    dxhat = dy * w
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, (dy * xhat).sum((0, 1)), dy.sum((0, 1))


C, K = np.sqrt(2 / np.pi), 0.044715  # GPT-2's tanh GELU


def gelu(u):
    return 0.5 * u * (1 + np.tanh(C * (u + K * u**3)))


def gelu_grad(u):
    th = np.tanh(C * (u + K * u**3))
    return 0.5 * (1 + th) + 0.5 * u * (1 - th**2) * C * (1 + 3 * K * u**2)


def heads(a, n):  # [b, s, n·d] -> [b, n, s, d]
    return a.reshape(a.shape[0], a.shape[1], n, -1).transpose(0, 2, 1, 3)


def merged(a):  # the inverse: [b, n, s, d] -> [b, s, n·d]
    return a.transpose(0, 2, 1, 3).reshape(a.shape[0], a.shape[2], -1)


def attention(q, k, v):
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)  # causal: no looking ahead
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p @ v, p


def attention_backward(dy, q, k, v, p):
    dp = dy @ v.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / np.sqrt(q.shape[-1])
    return ds @ k, ds.swapaxes(-1, -2) @ q, p.swapaxes(-1, -2) @ dy


def flat(a):  # [b, s, n] -> [b·s, n]: a weight's gradient sums over every token
    return a.reshape(-1, a.shape[-1])


def forward(comm: Communicator, p: dict, x: np.ndarray, n_head: int):
    """The block's output (whole, on every rank) and what backward needs; n_head: this rank's heads."""
    h1, ln1 = layer_norm(x, p["ln_1.weight"], p["ln_1.bias"])
    qkv = h1 @ p["attn.c_attn.weight"].T + p["attn.c_attn.bias"]  # column-parallel: [b, s, 3h/t]
    q, k, v = (heads(a, n_head) for a in np.split(qkv, 3, axis=-1))
    a, probs = attention(q, k, v)
    x2 = x + summed(comm, merged(a) @ p["attn.c_proj.weight"].T) + p["attn.c_proj.bias"]  # g, then bias
    h2, ln2 = layer_norm(x2, p["ln_2.weight"], p["ln_2.bias"])
    u = h2 @ p["mlp.layers.0.weight"].T + p["mlp.layers.0.bias"]  # column-parallel: [b, s, 4h/t]
    out = x2 + summed(comm, gelu(u) @ p["mlp.layers.1.weight"].T) + p["mlp.layers.1.bias"]  # g, bias
    return out, dict(ln1=ln1, h1=h1, q=q, k=k, v=v, probs=probs, a=merged(a), ln2=ln2, h2=h2, u=u)


def backward(comm: Communicator, p: dict, c: dict, dout: np.ndarray, n_head: int):
    """d(sum(out · dout)) / d x (whole) and / d this rank's parameters (its slices)."""
    g = {"mlp.layers.1.bias": dout.sum((0, 1)), "mlp.layers.1.weight": flat(dout).T @ flat(gelu(c["u"]))}
    du = (dout @ p["mlp.layers.1.weight"]) * gelu_grad(c["u"])  # dout is whole: g's backward is identity
    g["mlp.layers.0.weight"], g["mlp.layers.0.bias"] = flat(du).T @ flat(c["h2"]), du.sum((0, 1))
    dh2 = summed(comm, du @ p["mlp.layers.0.weight"])  # f's backward: every rank's part of dh2, summed
    dln2, g["ln_2.weight"], g["ln_2.bias"] = layer_norm_backward(dh2, p["ln_2.weight"], c["ln2"])
    dx2 = dout + dln2
    g["attn.c_proj.bias"], g["attn.c_proj.weight"] = dx2.sum((0, 1)), flat(dx2).T @ flat(c["a"])
    da = heads(dx2 @ p["attn.c_proj.weight"], n_head)
    dqkv = np.concatenate([merged(d) for d in attention_backward(da, c["q"], c["k"], c["v"], c["probs"])], -1)
    g["attn.c_attn.weight"], g["attn.c_attn.bias"] = flat(dqkv).T @ flat(c["h1"]), dqkv.sum((0, 1))
    dh1 = summed(comm, dqkv @ p["attn.c_attn.weight"])  # f's backward again
    dln1, g["ln_1.weight"], g["ln_1.bias"] = layer_norm_backward(dh1, p["ln_1.weight"], c["ln1"])
    return dx2 + dln1, g


def block_on_rank(comm: Communicator, emit, dense: dict, x, dout, n_head: int) -> dict:
    """A run_ranks rank_fn: this rank's output, input gradient and its slices' gradients."""
    p, local_heads = shard(dense, comm.world_size, comm.rank), n_head // comm.world_size
    out, cache = forward(comm, p, x, local_heads)
    dx, grads = backward(comm, p, cache, dout, local_heads)
    return {"out": out, "dx": dx, "grads": grads}


if __name__ == "__main__":
    from engine.dropout_rng import DropoutRNG
    from engine.nn import Block
    from engine.tensor import Tensor
    rng, n_head = np.random.default_rng(0), 12
    block = Block(24, n_head, 0.0, True, np.float64, DropoutRNG())  # one device, through the autograd
    for p in block.parameters():
        p.data[...] = rng.standard_normal(p.shape) * 0.2
    x, dout = Tensor(rng.standard_normal((2, 8, 24)), requires_grad=True), rng.standard_normal((2, 8, 24))
    out = block(x)
    out.backward(dout)
    dense = {name: p.data for name, p in block.named_parameters()}
    for t in (1, 2, 3, 4):
        ranks = run_ranks(t, "threads", block_on_rank, args=(dense, x.data, dout, n_head))
        worst = max(max(float(np.abs(r["out"] - out.data).max()), float(np.abs(r["dx"] - x.grad).max()))
                    for r in ranks)
        print(f"{t} ranks: output and input gradient within {worst:.1e} of one device's")
