"""Mixture of experts: a router picks k of E expert MLPs for each token; the token's output is the
weighted sum of theirs. Model code only: no communication (expert parallelism, engine.parallel.expert,
swaps `MoE.experts` for a form that runs the experts on other ranks).

    x [B, T, C] -> rows [N, C]                             N = B*T tokens
    router   logits = rows @ W_r.T  [N, E]; P = softmax(logits)
    top-k    the k largest P of each token (ties: the lower expert); weights = those P renormalised
             to sum to 1 when k > 1 (top-1 keeps its P, as Switch does: renormalised it would be 1, and the
             router would learn from the load-balancing loss alone)
    capacity C = ceil(capacity_factor * N * k / E) tokens per expert (0: dropless, no limit); an expert
             keeps the first C of its tokens in position order and drops the rest (Switch's rule, as
             Megatron's drop policy "position"): a dropped token gets nothing from that expert (the
             block's residual carries it), and is counted
    experts  expert e runs on its kept rows, in position order: out_e = MLP_e(rows[kept_e])
    combine  y[n] = sum over n's kept (e, slot) of weight[n, slot] * out_e[n], added in expert order
    aux      aux_loss_coef * E * sum_e f_e * P_e (Switch/GShard load balancing): f_e the share of the N*k
             choices that picked e (before any drop), P_e the mean router probability of e; its gradient
             reaches the router through P only

The routing decisions (top-k, capacity) are integers, taken on the data; the gradient flows through the
weights (the gathered P) and through every expert's rows. `MoE.aux_loss` holds the last forward's loss
term; `add_aux_losses(model, loss)` adds every MoE layer's to the loss that is backpropagated. `MoEGPT` is a
GPT with MoE blocks (engine.nn stays dense and knows nothing of this module); `build_gpt` makes either from a
model spec.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine import ops
from engine.nn import GPT, MLP, Linear, Module, init_params
from engine.recompute import recomputing
from engine.tensor import ScatterGrad, Tensor, make


def softmax(x: Tensor) -> Tensor:
    """Softmax over the last axis, max-subtracted."""
    z = np.exp(x.data - x.data.max(-1, keepdims=True))
    p = z / z.sum(-1, keepdims=True)
    return make(p, (x,), lambda g: (p * (g - (g * p).sum(-1, keepdims=True)),), (p,))


def add_rows(n_rows: int, rows: np.ndarray, values: Tensor) -> Tensor:
    """out[rows[i]] += values[i] into zeros of n_rows rows, repeats added in the order given (so the
    same rows and values give the same bits wherever they are added); backward gathers the rows."""
    out = np.zeros((n_rows, *values.shape[1:]), values.dtype)
    np.add.at(out, rows, values.data)
    return make(out, (values,), lambda g: (g[rows],))


def take_rows(x: Tensor, rows: np.ndarray) -> Tensor:
    """x[rows] for integer rows; backward scatter-adds into x's rows, and gives nothing when no row was
    taken (an expert without tokens: engine.tensor's scatter of zero rows is skipped)."""
    shape, dtype = x.shape, x.dtype
    return make(x.data[rows], (x,), lambda g: (ScatterGrad(rows, g, shape, dtype) if len(rows) else None,))


def renormalise(chosen: Tensor) -> Tensor:
    """chosen / its sum over the last axis, the same bits with a tape or without one: engine.ops.div takes a
    divisor that needs no gradient (no tape: a checkpointed block's forward) as a product with its reciprocal,
    which rounds otherwise than the division the recompute's tape makes."""
    total = chosen.sum(-1, keepdims=True)
    return chosen / total if total.requires_grad else Tensor(chosen.data / total.data)


@dataclass
class Routing:
    """One forward's routing of N tokens: the choices, which survived the capacity, and the weights."""
    experts: np.ndarray   # [N, k] int: the chosen experts, best first
    kept: np.ndarray      # [N, k] bool: the choice was within its expert's capacity
    probs: Tensor         # [N, E] the router's softmax
    weights: Tensor       # [N, k] the combine weights (renormalised when k > 1)

    def rows_of(self, expert: int) -> tuple[np.ndarray, np.ndarray]:
        """(token rows, slots) of the kept choices of `expert`, in position order."""
        rows, slots = np.nonzero((self.experts == expert) & self.kept)
        return rows, slots


def capacity(n_tokens: int, top_k: int, n_experts: int, capacity_factor: float) -> int | None:
    """Tokens each expert may take (None: dropless)."""
    if capacity_factor <= 0:
        return None
    return math.ceil(capacity_factor * n_tokens * top_k / n_experts)


def keep_within_capacity(experts: np.ndarray, n_experts: int, limit: int | None) -> np.ndarray:
    """[N, k] bool: each expert keeps its first `limit` choices in token order."""
    kept = np.ones(experts.shape, bool)
    if limit is None:
        return kept
    for e in range(n_experts):
        rows, slots = np.nonzero(experts == e)  # row-major: token order (a token picks e at most once)
        kept[rows[limit:], slots[limit:]] = False
    return kept


class Router(Module):
    """Linear to the experts' logits (no bias), softmax, top-k, capacity."""

    def __init__(self, n_embd: int, n_experts: int, top_k: int, capacity_factor: float, dtype):
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k {top_k} must be between 1 and the {n_experts} experts")
        self.gate = Linear(n_embd, n_experts, bias=False, dtype=dtype)
        self.n_experts, self.top_k, self.capacity_factor = n_experts, top_k, capacity_factor

    def keep(self, experts: np.ndarray) -> np.ndarray:
        """[N, k] bool: the choices within their expert's capacity, over this router's N tokens (context
        parallelism puts one in its place that decides over a whole sequence's slices)."""
        return keep_within_capacity(experts, self.n_experts,
                                    capacity(len(experts), self.top_k, self.n_experts, self.capacity_factor))

    def forward(self, rows: Tensor) -> Routing:
        probs = softmax(self.gate(rows))
        n = rows.shape[0]
        experts = np.argsort(-probs.data, axis=-1, kind="stable")[:, :self.top_k]
        kept = self.keep(experts)
        chosen = probs[np.arange(n)[:, None], experts]
        weights = renormalise(chosen) if self.top_k > 1 else chosen
        return Routing(experts, kept, probs, weights)


class Experts(Module):
    """The expert MLPs, all on this device: forward(inputs) runs expert e on inputs[e] (its rows).
    `received`: the rows the last forward ran on (a split form, engine.parallel.expert, counts the rows the
    other ranks sent it). `mlps[e]` is None for an expert a split form leaves to another rank."""

    def __init__(self, mlps: Sequence[MLP | None]):
        super().__init__()
        self.mlps = list(mlps)
        self.received = 0

    def forward(self, inputs: list[Tensor]) -> list[Tensor]:
        self.received = sum(len(x.data) for x in inputs)
        return [mlp(x) for mlp, x in zip(self.mlps, inputs) if mlp is not None]


class MoE(Module):
    """A block's MLP as a mixture of `n_experts` MLPs of the dense MLP's shape; forward(x[..., C])."""

    def __init__(self, n_embd: int, n_experts: int, top_k: int, capacity_factor: float,
                 aux_loss_coef: float, bias: bool, dtype, rng):
        super().__init__()
        self.router = Router(n_embd, n_experts, top_k, capacity_factor, dtype)
        mlps = [MLP([n_embd, 4 * n_embd, n_embd], 0.0, bias, dtype, rng) for _ in range(n_experts)]
        for mlp in mlps:
            mlp.layers[-1].residual = True
        self.experts: Experts = Experts(mlps)
        self.aux_loss_coef = aux_loss_coef
        self.aux_loss: Tensor | None = None  # the last forward's load-balancing term
        self.stats: dict = {}                # the last forward's routing figures (routing_stats)
        self.step_stats: list[dict] = []     # every training forward's, until engine.moe_stats takes them

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        routing = self.router(rows)
        e = self.router.n_experts
        picked = [routing.rows_of(i) for i in range(e)]
        outputs = self.experts([take_rows(rows, r) for r, _ in picked])
        weighted = [out * take_rows(routing.weights, r)[np.arange(len(r)), s].reshape(-1, 1)
                    for out, (r, s) in zip(outputs, picked)]
        y = add_rows(len(rows.data), np.concatenate([r for r, _ in picked]), ops.concat(weighted, axis=0))
        self.aux_loss = self._aux_loss(routing)
        self.stats = {**routing_stats(routing, e), "received": self.experts.received,
                      "aux_loss": float(self.aux_loss.data)}
        if self.training and not recomputing():  # a checkpointed block's recompute routes the same tokens
            self.step_stats.append(self.stats)
        return y.reshape(shape)

    def count_choices(self, counts: np.ndarray, choices: int) -> tuple[np.ndarray, int]:
        """The choices each expert got, and of how many, over the tokens f_e balances: this layer's own
        (context parallelism puts one in its place that counts a sequence's slices together)."""
        return counts, choices

    def _aux_loss(self, routing: Routing) -> Tensor:
        n, k = routing.experts.shape
        e = self.router.n_experts
        counts, choices = self.count_choices(np.bincount(routing.experts.reshape(-1), minlength=e), n * k)
        share = counts / choices  # f_e, before drops
        mean_p = routing.probs.sum(axis=0)  # n * P_e
        scale = self.aux_loss_coef * e / n
        return (mean_p * Tensor(share.astype(mean_p.dtype))).sum() * scale


class MoEGPT(GPT):
    """A GPT whose blocks 0, every, 2·every, ... (Megatron's layer frequency) hold an MoE in place of their
    MLP. `moe`: MoE's settings plus "every"; kept in `config` (what checkpoints and exports rebuild from).
    Built as a GPT, its chosen blocks' MLPs then swapped (a block's attributes keep their order, so the
    parameter names and order are the dense layout's with the experts in the MLP's place), named and
    initialised again."""

    def __init__(self, *args, moe: dict, **kwargs):
        super().__init__(*args, **kwargs)
        settings = dict(moe)
        every = settings.pop("every")
        c, bias, dtype = self.config["n_embd"], self.config["bias"], self.wte.weight.dtype
        for i, block in enumerate(self.blocks):
            if i % every == 0:
                # called like an MLP; what reads an MLP's layers (the tensor-parallel plan) is refused beside
                # experts (engine.config.rules_moe)
                block.mlp = MoE(c, **settings, bias=bias, dtype=dtype, rng=self.rng)  # type: ignore[assignment]
        self.config["moe"] = dict(moe)
        self._name_parameters()
        init_params(self, 0)


def build_gpt(**spec) -> GPT:
    """A GPT from its constructor arguments (a GPT's `config`, as model specs store it): an MoEGPT when
    they hold "moe"."""
    return MoEGPT(**spec) if spec.get("moe") else GPT(**spec)


def routing_stats(routing: Routing, n_experts: int) -> dict:
    """Tokens each expert took (after drops), the choices dropped, the mean router entropy (nats)."""
    p = routing.probs.data.astype(np.float64)  # in float64 whatever the training dtype (bf16 has no finfo)
    entropy = float(-(p * np.log(np.maximum(p, np.finfo(np.float64).tiny))).sum(-1).mean())
    kept = np.bincount(routing.experts[routing.kept], minlength=n_experts)
    return {"tokens_per_expert": kept, "dropped": int((~routing.kept).sum()), "entropy": entropy}


def moe_layers(model: Module) -> list[MoE]:
    """The model's MoE layers, in forward order."""
    return [m for m in model.modules() if isinstance(m, MoE)]


def add_aux_losses(model: Module, loss: Tensor) -> Tensor:
    """`loss` plus every MoE layer's load-balancing term from the last forward (loss itself for a model
    without experts, or with a coefficient of 0). Each term goes ahead of the loss (term + loss): backward
    then runs every term's few ops first, freeing each layer's f_e at once (the memory estimate relies on
    it), and reaches every MoE block through its output, as a checkpointed block's recompute does."""
    for layer in moe_layers(model):
        if layer.aux_loss is not None and layer.aux_loss_coef:
            loss = layer.aux_loss + loss
    return loss



def moe_settings(model_cfg) -> dict | None:
    """GPT's `moe` argument from a [model] section (engine.config.ModelConfig), or from a saved model spec
    (a GPT's config: its "moe" entry); None for a dense model."""
    m = model_cfg
    if not getattr(m, "n_experts", 0):
        return getattr(m, "moe", None)
    return dict(n_experts=m.n_experts, top_k=m.top_k, every=m.moe_every, capacity_factor=m.capacity_factor,
                aux_loss_coef=m.aux_loss_coef)


def is_moe_block(model_cfg, block: int) -> bool:
    """Whether block `block` of this [model] (or model spec) is a mixture of experts (GPT's rule)."""
    moe = moe_settings(model_cfg)
    return moe is not None and block % moe["every"] == 0
