"""Training FLOPs of a model, from the config alone, and where in backward each gradient becomes final.

The count is PaLM's (Chowdhery et al., appendix B): a forward pass costs 2 FLOPs per parameter per token
(each weight multiplies and adds once), backward twice that, so training costs 6·Ψ·tokens; attention adds
the two T×T products per layer, 2·2·T·C per token forward (QKᵀ and probabilities × V; nanoDist computes
the full square, causal mask or not), 12·L·T·C per token for training. Under full activation checkpointing
every block's forward runs twice: 8·Ψ instead of 6·Ψ, the 4/3 factor. A mixture-of-experts block's Ψ is
what one token multiplies (active_params): its router and top_k of its E experts (engine.moe), not all E.

`backward_events` lists backward in the order nanoDist runs it (engine.nn: the head, then the blocks from
the last, each from its MLP down to its attention's input projection, then the embeddings) as pieces of
work with the parameters whose gradients are final after each: the gradient-ready times the step model
needs to know when a bucket can be sent.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from engine.config.build import param_shapes
from engine.memory.expert import EXPERTS


@dataclass(frozen=True)
class ModelFlops:
    """FLOPs per micro-batch of `tokens` tokens (rows × context for a GPT, rows for an MLP)."""

    params: int
    tokens: int
    forward: float  # the whole model's forward
    unit_forward: tuple[float, ...]  # each unit's forward (GPT blocks, MLP layers), in forward order
    recomputable: bool  # the units are transformer blocks, which activation checkpointing recomputes

    @property
    def block_forward(self) -> float:
        """One recomputable block's forward (0 for a model without them)."""
        return self.unit_forward[0] if self.recomputable and self.unit_forward else 0.0

    @property
    def backward(self) -> float:
        return 2 * self.forward

    @property
    def training(self) -> float:
        """6·Ψ·tokens + attention: what MFU counts (recomputation is not useful work)."""
        return 3 * self.forward


def model_flops(cfg, vocab: int, rows: int) -> ModelFlops:
    """FLOPs of one micro-batch of `rows` sequences (samples) of cfg's model with vocabulary `vocab`."""
    shapes = param_shapes(cfg, vocab)
    params = sum(math.prod(s) for _, s, _ in shapes)
    m = cfg.model
    if m.kind == "mlp":
        layers = [2.0 * sum(math.prod(s) for _, s, unit in shapes if unit == i) * rows
                  for i in range(len(m.widths) - 1)]
        return ModelFlops(params, rows, sum(layers), tuple(layers), False)
    tokens = rows * m.block_size
    attention = 4.0 * m.block_size * m.n_embd * tokens  # QKᵀ and PV, per layer
    blocks = tuple(2.0 * active_params(cfg, shapes, k) * tokens + attention for k in range(m.n_layer))
    # outside the blocks only the head multiplies: wte (tied) or lm_head; wpe and LayerNorms are adds
    head = 2.0 * vocab * m.n_embd * tokens
    return ModelFlops(params, tokens, sum(blocks) + head, blocks, True)


def active_params(cfg, shapes, block: int) -> float:
    """Parameters of a block one token multiplies: all of them, but top_k of an MoE block's E experts (with
    balanced routing; a dropped token multiplies fewer)."""
    m = cfg.model
    share = m.top_k / m.n_experts if m.n_experts else 1.0
    return sum(math.prod(s) * (share if EXPERTS in name else 1.0)
               for name, s, unit in shapes if unit == block)


class FlopsOf:
    """cfg's model FLOPs as a function of tokens per micro-batch, and the model's identity (`signature`:
    what a compute calibration depends on)."""

    def __init__(self, cfg, vocab: int):
        self.cfg, self.vocab = cfg, vocab
        self.tokens_per_row = cfg.model.block_size if cfg.model.kind == "gpt" else 1
        self.signature = model_signature(cfg, vocab)

    def __call__(self, tokens: float) -> ModelFlops:
        rows = tokens / self.tokens_per_row
        if rows == round(rows) and rows >= 1:
            return model_flops(self.cfg, self.vocab, round(rows))
        # a fraction of a row (a tensor-parallel rank's share of the work, tensor_parallel.py): the count is
        # linear in the rows
        one = model_flops(self.cfg, self.vocab, 1)
        return dataclasses.replace(one, tokens=round(rows * one.tokens), forward=rows * one.forward,
                                   unit_forward=tuple(rows * f for f in one.unit_forward))


def model_signature(cfg, vocab: int) -> str:
    """What a model's compute speed depends on: its shape (not its precision, batch or parallelism)."""
    m = cfg.model
    if m.kind == "mlp":
        return f"mlp {'-'.join(map(str, m.widths))} bias={m.bias} dropout={m.dropout:g}"
    return (f"gpt L{m.n_layer} C{m.n_embd} H{m.n_head} T{m.block_size} V{vocab} bias={m.bias} "
            f"tied={m.tie_weights} dropout={m.dropout:g}")


@dataclass(frozen=True)
class BackwardEvent:
    """A piece of backward: its share of the backward FLOPs, then the parameters (indices into
    param_shapes order) whose gradients are final."""

    share: float
    ready: tuple[int, ...]
    block: int | None = None  # the transformer block (or MLP layer) the work belongs to
    layer: str = ""  # the layer within it ("mlp.layers.0", "attention", ...; "head", "embeddings" outside)


def backward_events(cfg, vocab: int) -> list[BackwardEvent]:
    """Backward in run order, as shares of its FLOPs with the gradients each piece finishes."""
    shapes = param_shapes(cfg, vocab)
    index = {name: i for i, (name, _, _) in enumerate(shapes)}
    numel = {name: math.prod(s) for name, s, _ in shapes}

    def group(prefix: str) -> tuple[int, ...]:
        return tuple(i for name, i in index.items() if name.startswith(prefix))

    def weight(prefix: str) -> float:  # backward FLOPs of a Linear: 4 per weight element per token
        return 4.0 * numel.get(prefix + ".weight", 0)

    m, events = cfg.model, []
    if m.kind == "mlp":
        for i in reversed(range(len(m.widths) - 1)):
            events.append(BackwardEvent(weight(f"layers.{i}"), group(f"layers.{i}."), i, f"layers.{i}"))
    else:
        c, t = m.n_embd, m.block_size
        head = "lm_head" if "lm_head.weight" in index else "wte"
        events.append(BackwardEvent(4.0 * numel[head + ".weight"], group("lm_head.") + group("ln_f."), None,
                                    "head"))
        for k in reversed(range(m.n_layer)):
            pre = f"blocks.{k}."

            def linear(name: str, norm: str = "", pre: str = pre, k: int = k) -> BackwardEvent:
                ready = group(pre + name + ".") + (group(pre + norm + ".") if norm else ())
                return BackwardEvent(weight(pre + name), ready, k, name)
            if pre + "mlp.router.gate.weight" in index:  # an MoE block: its experts' and router's gradients
                mlp = [moe_event(cfg, k, group(pre + "mlp.") + group(pre + "ln_2."), numel)]
            else:
                mlp = [linear("mlp.layers.1"), linear("mlp.layers.0", "ln_2")]
            events += [*mlp, linear("attn.c_proj"),
                       BackwardEvent(8.0 * t * c, (), k, "attention"),  # attention's two products, backward
                       linear("attn.c_attn", "ln_1")]
        events.append(BackwardEvent(0.0, group("wpe.") + group("wte."), None, "embeddings"))  # last
    total = sum(e.share for e in events) or 1.0
    return [BackwardEvent(e.share / total, e.ready, e.block, e.layer) for e in events]


def moe_event(cfg, block: int, ready: tuple[int, ...], numel: dict[str, int]) -> BackwardEvent:
    """An MoE block's MLP in backward, one piece: the experts' Linears (4 FLOPs per weight per token, for the
    top_k of E a token reaches) and the router's, after which every one of their gradients is final."""
    pre, m = f"blocks.{block}.mlp.", cfg.model
    experts = sum(n for name, n in numel.items() if name.startswith(pre) and EXPERTS in name
                  and name.endswith(".weight"))
    return BackwardEvent(4.0 * (experts * m.top_k / m.n_experts + numel[pre + "router.gate.weight"]), ready,
                         block, "mlp.experts")
