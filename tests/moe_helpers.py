"""Shared by the mixture-of-experts tests: a float64 MoE layer with random weights, routing it can be
forced into (balanced, every token to one expert), and an independent NumPy reference of its forward (a
loop over tokens, written from the formulas in engine/moe.py's docstring, not from its code)."""

from __future__ import annotations

import math

import numpy as np

from engine.dropout_rng import DropoutRNG
from engine.moe import MoE
from engine.nn import init_params

WIDTH = 6


def make_moe(n_experts: int, top_k: int, capacity_factor: float = 0.0, aux: float = 0.01,
             seed: int = 0) -> MoE:
    """A float64 MoE of width WIDTH, weights drawn from `seed` (biases too, so they are tested)."""
    moe = MoE(WIDTH, n_experts, top_k, capacity_factor, aux, True, np.float64, DropoutRNG(0))
    moe._name_parameters()
    init_params(moe, seed)
    rng = np.random.default_rng(seed + 1)
    for _, p in moe.named_parameters():
        p.data[...] = rng.standard_normal(p.shape) * 0.5
    return moe


def tokens(n: int, seed: int = 0, routing: str = "random", expert: int = 0, moe: MoE | None = None
           ) -> np.ndarray:
    """[n, WIDTH] inputs. routing "random": as drawn; "one": feature 0 is 1 and the router's column 0
    sends every token to `expert` first (and to expert+1 second); "balanced": token t picks t % E first,
    (t + 1) % E second. Both need `moe`, whose router they edit (the same edit from every seed)."""
    x = np.random.default_rng(seed + 100).standard_normal((n, WIDTH))
    if routing == "balanced":  # token t picks expert t % E, then (t + 1) % E: every expert n*k/E tokens
        assert moe is not None
        gate = moe.router.gate.weight.data
        e = gate.shape[0]
        x[:, :e] = 0.0
        x[np.arange(n), np.arange(n) % e] = 1.0
        x[np.arange(n), (np.arange(n) + 1) % e] = 0.75
        gate[:, :e] = 40.0 * np.eye(e)
        gate[:, e:] = 0.0
    if routing == "one":
        assert moe is not None
        x[:, 0] = 1.0
        gate = moe.router.gate.weight.data
        gate[:, 0] = 0.0
        gate[expert, 0] = 40.0
        gate[(expert + 1) % gate.shape[0], 0] = 30.0
    return x


def reference_forward(moe: MoE, x: np.ndarray) -> tuple[np.ndarray, float, int]:
    """(output [n, C], aux loss, choices dropped) of `moe` on x [n, C], token by token."""
    gate = moe.router.gate.weight.data
    n, e, k = len(x), gate.shape[0], moe.router.top_k
    cap = math.ceil(moe.router.capacity_factor * n * k / e) if moe.router.capacity_factor else n * k
    taken = [0] * e
    out = np.zeros_like(x)
    picks = np.zeros(e)
    mean_p = np.zeros(e)
    dropped = 0
    for t in range(n):
        logits = gate @ x[t]
        p = np.exp(logits - logits.max())
        p /= p.sum()
        mean_p += p / n
        best = sorted(range(e), key=lambda i: (-p[i], i))[:k]
        w = p[best] / p[best].sum() if k > 1 else p[best]
        for slot, i in enumerate(best):
            picks[i] += 1
            if taken[i] == cap:
                dropped += 1
                continue
            taken[i] += 1
            out[t] += w[slot] * _mlp(moe.experts.mlps[i], x[t])
    aux = moe.aux_loss_coef * e * float((picks / (n * k) * mean_p).sum())
    return out, aux, dropped


def _mlp(mlp, v: np.ndarray) -> np.ndarray:
    up, down = mlp.layers
    h = up.weight.data @ v + up.bias.data
    h = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    return down.weight.data @ h + down.bias.data
