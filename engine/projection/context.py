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
ring's slowest pair (group_comm.shift_link): K = α + n_kv·β, G = α + n_g·β.

Overlap, as the engine runs it (ring_attention.py, hops.py): a hop's exchange is posted on a helper thread
before the blocks of the chunk in hand and waited for after them, one exchange at a time in the order
posted. With B_h the blocks of hop h (h = 0 .. c − 1), a block's attention takes

    forward    Σ_{h<c−1} max(B_h, K) + B_{c−1}
    backward   max(B_0, K) + Σ_{0<h<c−1} max(B_h, G + K) + max(B_{c−1}, G) + G
               (hop h's blocks run beside the previous accumulator's hop and their own K, V's; the
               accumulator's last hop home has no blocks beside it)

and what exceeds Σ B_h is the hops' exposed part: on the training thread (Timeline.inline); the rest is
hidden (counted as overlapped communication). Where the machine was calibrated with a partner
(ring_pass_calibration.py), each hop beside blocks costs at least what a hop measured beside a block added
there: on a host whose cores the ranks fill, the transport's copies and the helper thread take the blocks'
CPU, which no wait shows. B_h is the most any rank computes at hop h (each exchange
joins neighbours, so a hop waits for the slowest rank's blocks), timed as attention's FLOPs (4·(h/t)·b per
score forward, twice that backward) at the phase's rate; without a calibration's hop the CPU the helper
thread takes from the blocks on a shared host is not counted.

Compute: every layer but attention works on the rank's b·s/c tokens, and the phases are timed at that size
(compute.rate by size). Attention: the engine computes a (query chunk, key chunk) block whole (the
diagonal one's masked square too) and skips those a causal mask empties (layout.py), so a rank's attention
is its blocks × chunk² scores, against the s²/c the count at b·s/c tokens holds (flops.py: the full
square of its queries). The step waits for the busiest rank:

    contiguous  rank r computes r + 1 blocks of (s/c)²: the busiest c, i.e. s²/c (factor 1), the mean
                (c + 1)/2, so busiest/mean = 2c/(c + 1)
    zigzag      every rank 2c + 1 blocks of (s/2c)²: factor (2c + 1)/(4c), busiest/mean 1

On a calibrated machine (compute.ring_blocks) the blocks' seconds are the kernels timed there
(ring_calibration.py: a diagonal block with the fused causal kernel, a whole one in NumPy, each with its
merge; at the layout's chunk, the rank's rows and heads), not their FLOPs: B_h is the slowest rank's
diagonal and whole blocks at hop h, scaled so that they add up to the busiest rank's whole pass as timed
with its hops delivered locally (ring_pass_calibration.py: the pairing, widening and accumulating around
the blocks), and the rank's attention is Σ_h B_h in place of the 1/c of the
one-device attention (timed alike) that the calibrated curve holds at the rank's tokens; step.py adds the
difference, per block, forward and backward (extra_forward_s, extra_backward_s).

The gradient reduce goes over the data × context group (its ranks hold the same weights): step.py's,
on group_comm's "dpcp" placement. With ring attention in the model nanoDist runs that replica's collectives
on the training thread (engine.parallel.data.replica: model_communicates), so they are exposed too.
"""

from __future__ import annotations

import dataclasses

from engine.dtypes import compute_dtype, itemsize
from engine.parallel.context.layout import SequenceLayout, block_kind
from engine.projection.flops import ModelFlops
from engine.projection.group_comm import group_members, shift_link
from engine.projection.machine import Machine
from engine.projection.ring_calibration import KINDS, PHASES, key
from engine.projection.ring_pass_calibration import hop_key, pass_key
from engine.projection.timeline import Timeline


class ContextParallel:
    """The CP term of one config on one machine: the hops' bytes and seconds, the busiest rank's attention
    work; `spent_s` and `hops` add up what a step's replay issued."""

    def __init__(self, cfg, rows: int, machine: Machine):
        p, m, dtype = cfg.parallel, cfg.model, cfg.precision.dtype
        self.degree, self.rows, self.n_layer = p.context, rows, m.n_layer
        self.active = self.degree > 1
        self.spent_s, self.transfer_s, self.hops = 0.0, 0.0, 0
        self.extra_forward_s = self.extra_backward_s = 0.0  # per block: measured attention less the curve's
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
        # scores (query x key positions per row) of the most any rank computes at each hop
        self.hop_scores = [max(self._blocks(r, (r - h) % c) for r in range(c)) * chunk * chunk
                           for h in range(c)]
        self.flops_per_score = 4.0 * width * rows  # attention's two products, forward, over the rank's heads
        self.forward_blocks = self.backward_blocks = [0.0] * c
        self.chunk = s // self.layout.n_chunks
        # on a calibrated machine, ring attention's kernels as timed there (ring_calibration.py)
        kernels = machine.compute.ring_blocks(dtype, machine.ranks_on_host, rows * s / (c * p.tensor), c)
        needed = [key(kind, phase, self.chunk) for kind in KINDS for phase in PHASES]
        self.kernels = kernels if kernels and all(k in kernels for k in needed) else None

    def _blocks(self, rank: int, src: int) -> int:
        """Blocks `rank` computes against `src`'s keys (layout.py's causal plan)."""
        return sum(block_kind(a, b, True) is not None
                   for a in self.layout.chunks(rank) for b in self.layout.chunks(src))

    def _kinds(self, rank: int, src: int) -> tuple[int, int]:
        """(diagonal, whole) blocks `rank` computes against `src`'s keys."""
        kinds = [block_kind(a, b, True) for a in self.layout.chunks(rank) for b in self.layout.chunks(src)]
        return kinds.count("diagonal"), kinds.count("full")

    def time_blocks(self, forward_rate: float, backward_rate: float) -> None:
        """B_h of every hop, forward and backward: the kernels' measured seconds where the machine was
        calibrated (scaled to the busiest rank's whole pass where that was timed too), else attention's
        FLOPs at the phase's rate (FLOP/s)."""
        if not self.active:
            return
        if self.kernels is None:
            work = [self.flops_per_score * n for n in self.hop_scores]
            self.forward_blocks = [f / forward_rate for f in work]
            self.backward_blocks = [2 * f / backward_rate for f in work]
            return
        c, t = self.degree, self.kernels
        for phase in PHASES:
            diagonal, whole = t[key("diagonal", phase, self.chunk)], t[key("whole", phase, self.chunk)]
            hops = [max(n * diagonal + w * whole for n, w in (self._kinds(r, (r - h) % c) for r in range(c)))
                    for h in range(c)]
            # the whole pass (ring_pass_calibration.py) holds what the kernels leave out: pairing, widening,
            # accumulating, the loop; spread over the hops in proportion to their blocks
            whole_pass = t.get(pass_key(self.layout.kind, phase))
            if whole_pass is not None and sum(hops) > 0:
                hops = [b * whole_pass / sum(hops) for b in hops]
            # the curve (timed at the rank's tokens with the whole context's attention) holds 1/c of the
            # one-device attention timed at the rank's rows: the blocks replace it
            extra = sum(hops) - t[key("one_device", phase)] / c
            if phase == "forward":
                self.forward_blocks, self.extra_forward_s = hops, extra
            else:
                self.backward_blocks, self.extra_backward_s = hops, extra

    # ---- compute ---------------------------------------------------------------------------------------

    def tokens(self, tokens: float) -> float:
        """The tokens a rank holds of `tokens`: b·s/c."""
        return tokens / self.degree

    def flops(self, flops: ModelFlops, block_size: int, width: int) -> ModelFlops:
        """The busiest rank's FLOPs: `flops` (the whole model's at the rank's tokens, attention the full
        square of its queries, 4·s·h per token and block) with attention scaled to the blocks it computes;
        unscaled where the kernels were timed (their seconds replace the curve's attention instead:
        extra_forward_s, extra_backward_s)."""
        if not self.active or self.kernels is not None:
            return flops
        saved = (1 - self.attention_factor) * 4.0 * block_size * width * flops.tokens
        units = tuple(f - saved for f in flops.unit_forward)
        return dataclasses.replace(flops, forward=flops.forward - saved * len(units), unit_forward=units)

    # ---- the hops ---------------------------------------------------------------------------------------

    def _exposed(self, messages: list[tuple[str, float]], blocks_s: float) -> float:
        """What the hops of `messages` ((kind, transfer seconds): "kv", "grad") add beside `blocks_s` of
        blocks: the wait for transfers longer than them, or where the machine was calibrated with a partner,
        at least what such hops measured beside a block added there (their copies and the helper thread
        take the CPU of a host the ranks fill)."""
        waited = max(0.0, sum(n for _, n in messages) - blocks_s)
        if self.kernels is None or hop_key("kv") not in self.kernels:
            return waited
        return max(waited, sum(self.kernels[hop_key(m)] for m, _ in messages))

    @property
    def block_forward_s(self) -> float:
        """One block's forward hops, the part its blocks do not hide."""
        if not self.active:
            return 0.0
        b = self.forward_blocks
        return sum(self._exposed([("kv", self.kv_s)], b[h]) for h in range(self.degree - 1))

    @property
    def block_backward_s(self) -> float:
        """One block's backward hops, the part its blocks do not hide (the accumulator's last hop home)."""
        if not self.active:
            return 0.0
        b, c, k, g = self.backward_blocks, self.degree, self.kv_s, self.grad_s
        # beside hop h's blocks: K and V ahead (h < c - 1), the accumulator behind (h > 0)
        return sum(self._exposed([("kv", k)] * (h < c - 1) + [("grad", g)] * (h > 0), b[h])
                   for h in range(c)) + g

    @property
    def block_forward_transfer_s(self) -> float:
        """One block's forward hops, hidden or not: c − 1 of K, V."""
        return (self.degree - 1) * self.kv_s if self.active else 0.0

    @property
    def block_backward_transfer_s(self) -> float:
        """One block's backward hops, hidden or not: c − 1 of K, V, c of dK, dV."""
        return (self.degree - 1) * self.kv_s + self.degree * self.grad_s if self.active else 0.0

    def forward(self, tl: Timeline, blocks: int | None = None) -> None:
        """The forward hops of `blocks` blocks (one micro-batch's: every block)."""
        blocks = self.n_layer if blocks is None else blocks
        self._issue(tl, blocks * self.block_forward_s, blocks * self.block_forward_transfer_s,
                    blocks * (self.degree - 1))

    def backward(self, tl: Timeline, layer: str, recomputed: bool) -> None:
        """A piece of backward's hops: attention's, and a checkpointed block's recomputed forward's."""
        if not self.active:
            return
        if recomputed:
            self.forward(tl, 1)
        if layer == "attention":
            self._issue(tl, self.block_backward_s, self.block_backward_transfer_s, 2 * self.degree - 1)

    def _issue(self, tl: Timeline, exposed: float, transfer: float, hops: int) -> None:
        """The exposed part on the training thread; the hidden part counted as communication beside it."""
        if self.active:
            tl.inline(exposed)
            tl.comm_s += transfer - exposed  # hidden behind the blocks: overlapped communication
            self.spent_s += exposed
            self.transfer_s += transfer
            self.hops += hops

    # ---- what the report shows --------------------------------------------------------------------------

    def summary(self) -> dict:
        """The CP term as the report shows it (empty at c = 1)."""
        if not self.active:
            return {}
        return {"degree": self.degree, "layout": self.layout.kind, "rows": self.rows, "link": self.link,
                "kv_bytes": self.kv_bytes, "grad_bytes": self.grad_bytes, "kv_s": self.kv_s,
                "grad_s": self.grad_s, "block_forward_s": self.block_forward_s,
                "block_backward_s": self.block_backward_s,
                "block_forward_transfer_s": self.block_forward_transfer_s,
                "block_backward_transfer_s": self.block_backward_transfer_s,
                "hop_blocks_forward_s": self.forward_blocks, "hop_blocks_backward_s": self.backward_blocks,
                "hops": self.hops, "step_s": self.transfer_s, "exposed_s": self.spent_s,
                "hidden_s": self.transfer_s - self.spent_s,
                "blocks_busiest": self.blocks_busiest, "blocks_mean": self.blocks_mean,
                "busiest_over_mean": self.blocks_busiest / self.blocks_mean,
                "attention_factor": self.attention_factor, "kernels_timed": self.kernels is not None,
                "extra_forward_s": self.extra_forward_s, "extra_backward_s": self.extra_backward_s}
