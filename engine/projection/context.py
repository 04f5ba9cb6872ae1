"""Context parallelism in the step model: ring attention's hops, on which link, what they cost, and the
busiest rank's attention work. Inert at c = 1: no hops, compute unchanged.

What the engine runs (engine.parallel.context.ring_attention), per block, c ranks, b rows per micro-batch,
s tokens, h the width (h/t under tensor parallelism: the heads split), K and V in the training dtype, dK
and dV in the compute dtype (float32 under 16-bit):

    forward   c − 1 hops, each one message of K and V:      n_kv = 2·b·(s/c)·h·itemsize
    backward  c − 1 hops of K, V and the dK, dV accumulator, then one last hop of dK, dV home:
                                                           n_g  = 2·b·(s/c)·h·compute itemsize
    recompute a checkpointed block's forward hops again

A hop is one batched exchange (engine.comm.exchange): every rank sends to the next and receives from the
previous at once, each array its own message, so a hop costs Σ (α + n·β) over its arrays on the link of the
ring's slowest pair (group_comm.shift_link).

No overlap: a rank computes every block it holds against the K and V in hand, and only then posts the
exchange, and waits for it before the next blocks (ring_attention.py: `_hop` returns when the exchange has
completed). So the hops run on the training thread between the blocks' computations, exposed, as tensor
parallelism's collectives are (Timeline.inline); a ring that sent the next chunk while computing this one
would hide min(hop, blocks) per hop, and nanoDist's does not.

Compute: every layer but attention works on the rank's b·s/c tokens, and the phases are timed at that size
(compute.rate by size). Attention: the engine computes a (query chunk, key chunk) block whole (the
diagonal one's masked square too) and skips those a causal mask empties (layout.py), so a rank's attention
is its blocks × chunk² scores, against the s²/c the count at b·s/c tokens holds (flops.py: the full
square of its queries). The step waits for the busiest rank:

    contiguous  rank r computes r + 1 blocks of (s/c)²: the busiest c, i.e. s²/c (factor 1), the mean
                (c + 1)/2, so busiest/mean = 2c/(c + 1)
    zigzag      every rank 2c + 1 blocks of (s/2c)²: factor (2c + 1)/(4c), busiest/mean 1

The gradient reduce goes over the data × context group (its ranks hold the same weights): step.py's,
on group_comm's "dpcp" placement. With ring attention in the model nanoDist runs that replica's collectives
on the training thread (engine.parallel.data.replica: model_communicates), so they are exposed too.
"""

from __future__ import annotations

import dataclasses

from engine.dtypes import compute_dtype, itemsize
from engine.parallel.context.layout import SequenceLayout
from engine.projection.flops import ModelFlops
from engine.projection.group_comm import group_members, shift_link
from engine.projection.machine import Machine
from engine.projection.timeline import Timeline


class ContextParallel:
    """The CP term of one config on one machine: the hops' bytes and seconds, the busiest rank's attention
    work; `spent_s` and `hops` add up what a step's replay issued."""

    def __init__(self, cfg, rows: int, machine: Machine):
        p, m, dtype = cfg.parallel, cfg.model, cfg.precision.dtype
        self.degree, self.rows, self.n_layer = p.context, rows, m.n_layer
        self.active = self.degree > 1
        self.spent_s, self.hops = 0.0, 0
        if not self.active:
            return
        c, s = self.degree, m.block_size
        self.layout = SequenceLayout(p.context_layout, c)
        width = m.n_embd // p.tensor  # the rank's heads
        self.kv_bytes = 2 * rows * (s // c) * width * itemsize(dtype)
        self.grad_bytes = 2 * rows * (s // c) * width * compute_dtype(dtype).itemsize
        members = group_members(p, "cp", machine.topology.per_node)
        link = shift_link(machine, members, 1)
        self.link = "intra-node" if link is machine.topology.intra else "inter-node"
        self.kv_s, self.grad_s = link.p2p(self.kv_bytes), link.p2p(self.grad_bytes)
        blocks = [self.layout.causal_blocks(r) for r in range(c)]
        self.blocks_busiest, self.blocks_mean = max(blocks), sum(blocks) / c
        chunk = s / self.layout.n_chunks
        self.attention_factor = self.blocks_busiest * chunk * chunk / (s * s / c)

    # ---- compute ---------------------------------------------------------------------------------------

    def tokens(self, tokens: float) -> float:
        """The tokens a rank holds of `tokens`: b·s/c."""
        return tokens / self.degree

    def flops(self, flops: ModelFlops, block_size: int, width: int) -> ModelFlops:
        """The busiest rank's FLOPs: `flops` (the whole model's at the rank's tokens, attention the full
        square of its queries, 4·s·h per token and block) with attention scaled to the blocks it computes."""
        if not self.active:
            return flops
        saved = (1 - self.attention_factor) * 4.0 * block_size * width * flops.tokens
        units = tuple(f - saved for f in flops.unit_forward)
        return dataclasses.replace(flops, forward=flops.forward - saved * len(units), unit_forward=units)

    # ---- the hops ---------------------------------------------------------------------------------------

    @property
    def block_forward_s(self) -> float:
        """One block's forward hops: c − 1 of K and V."""
        return (self.degree - 1) * self.kv_s if self.active else 0.0

    @property
    def block_backward_s(self) -> float:
        """One block's backward hops: c − 1 of K, V and dK, dV, then dK, dV home."""
        return (self.degree - 1) * (self.kv_s + self.grad_s) + self.grad_s if self.active else 0.0

    def forward(self, tl: Timeline, blocks: int | None = None) -> None:
        """The forward hops of `blocks` blocks (one micro-batch's: every block) on the training thread."""
        blocks = self.n_layer if blocks is None else blocks
        self._issue(tl, blocks * self.block_forward_s, blocks * (self.degree - 1))

    def backward(self, tl: Timeline, layer: str, recomputed: bool) -> None:
        """A piece of backward's hops: attention's, and a checkpointed block's recomputed forward's."""
        if not self.active:
            return
        if recomputed:
            self.forward(tl, 1)
        if layer == "attention":
            self._issue(tl, self.block_backward_s, self.degree)

    def _issue(self, tl: Timeline, seconds: float, hops: int) -> None:
        if self.active:
            tl.inline(seconds)
            self.spent_s += seconds
            self.hops += hops

    # ---- what the report shows --------------------------------------------------------------------------

    def summary(self) -> dict:
        """The CP term as the report shows it (empty at c = 1)."""
        if not self.active:
            return {}
        return {"degree": self.degree, "layout": self.layout.kind, "rows": self.rows, "link": self.link,
                "kv_bytes": self.kv_bytes, "grad_bytes": self.grad_bytes, "kv_s": self.kv_s,
                "grad_s": self.grad_s, "block_forward_s": self.block_forward_s,
                "block_backward_s": self.block_backward_s, "hops": self.hops, "step_s": self.spent_s,
                "exposed_s": self.spent_s, "overlap": "none",
                "blocks_busiest": self.blocks_busiest, "blocks_mean": self.blocks_mean,
                "busiest_over_mean": self.blocks_busiest / self.blocks_mean,
                "attention_factor": self.attention_factor}
