"""Expert parallelism in the step model: the all-to-alls of every MoE layer, on which link, what they cost,
the max-loaded rank's expert work, and the experts' gradient reduce. Inert at e = 1 (an MoE model's
experts then all run locally: flops.py counts the top_k of E a token reaches).

What the engine runs (engine.parallel.expert.layer, e ranks, E experts, top k, b rows per micro-batch of s
tokens, N = b·s, width h, the training dtype's itemsize), per MoE layer and micro-batch:

    forward   counts    an all-to-all of the E/e row counts per peer           (sizes, then the counts)
              dispatch  the rows to their experts' ranks, S = N·k·h·itemsize a rank (sizes, then rows)
              combine   the experts' outputs back, the mirror                     (sizes, then rows)
    backward  the combine's mirror (the outputs' gradients to the experts), the dispatch's mirror (the inputs'
              gradients back): two more all-to-alls, each sizes then rows

Every all-to-all is engine.comm.alltoall's: the row counts first, one int64 to every peer in one round (all
posted at once: α + (e − 1)·8·β on the group's slowest link), then the payload pairwise: e − 1 steps, at
step j each rank sends its block to the member j on and receives from the member j back, one batched
exchange, so a step costs α + m·β for its m-byte block on the link of that shift's slowest pair
(group_comm.shift_link), and an even payload Σ_j (α + S/e·β) = (e − 1)α + (e − 1)/e·Sβ inside a node. All
on the training thread, inside forward and backward: exposed.

The max-loaded rank sets the step. With balanced routing every rank's experts receive N·k rows (e·N·k
over the group, each rank's E/e experts their share), and every rank's blocks are S/e. A load-imbalance
factor λ (the busiest rank's rows over the mean) scales the busiest rank's received blocks (the pairwise
step waits for the larger of what it sends and receives) and its experts' compute. How λ is chosen:

    given       `imbalance` (the projection's --expert-imbalance), clipped to the bound below
    calibrated  else, on a machine calibrated with this model, λ as its router routed the calibration's
                steps (routing.py: per layer the busiest rank's rows over the mean, the mean over layers,
                the median over forwards), clipped likewise
    default     else DEFAULT_IMBALANCE = 1.0: balanced routing (the memory estimate's assumption too);
                dropless routing has no bound, so the prediction is then the fastest the layer can go
    bound       a capacity (capacity_factor f > 0) keeps at most f·N·k/E rows of each rank per expert, so a
                rank's E/e experts take at most f·N·k: λ ≤ f; and never more than every token's choices
                that can land on one rank's experts: λ ≤ e·min(k, E/e)/k

The experts' gradients are all-reduced over the expert-data-parallel (edp) group, the ranks holding the same
experts, after backward on the training thread (engine.parallel.expert.replica), and the experts' sum of
squares for the gradient norm over the EP group (one fp64 value); the replicated parameters' buckets over
the data × context group as without experts, exposed as well (model_communicates: the replica runs inline).
"""

from __future__ import annotations

import dataclasses
import math

from engine.dtypes import itemsize
from engine.memory.expert import EXPERTS, split_shapes
from engine.memory.tensor_parallel import rank_shapes
from engine.moe import is_moe_block
from engine.parallel.mesh import Mesh
from engine.projection.flops import ModelFlops, active_params
from engine.projection.group_comm import GroupComm, group_members, shift_link
from engine.projection.machine import Machine
from engine.projection.timeline import Timeline

DEFAULT_IMBALANCE = 1.0  # balanced routing, without a measured or given figure
COUNT_BYTES = 8  # an int64 row count


class ExpertParallel:
    """The EP term of one config on one machine: the all-to-alls' seconds per MoE layer, the busiest rank's
    expert work, the experts' reduce; `spent_s` and `all_to_alls` add up what a step's replay issued."""

    def __init__(self, cfg, vocab: int, rows: int, machine: Machine, imbalance: float | None = None):
        p, m = cfg.parallel, cfg.model
        self.degree, self.rows = p.expert, rows
        self.active = self.degree > 1 and m.kind == "gpt" and m.n_experts > 0
        self.spent_s, self.all_to_alls = 0.0, 0
        if not self.active:
            return
        e, k, n_experts = self.degree, m.top_k, m.n_experts
        self.layers = [i for i in range(m.n_layer) if is_moe_block(m, i)]
        self.bound = e * min(k, n_experts // e) / k
        if m.capacity_factor > 0:
            self.bound = min(self.bound, m.capacity_factor)
        if imbalance is not None:
            self.chosen = "given"
        elif (imbalance := machine.compute.expert_imbalance(e, cfg.precision.dtype,
                                                             machine.ranks_on_host)) is not None:
            self.chosen = "calibrated"
        else:
            self.chosen, imbalance = "default", DEFAULT_IMBALANCE
        self.imbalance = min(imbalance, self.bound)
        self.payload = rows * m.block_size * k * m.n_embd * itemsize(cfg.precision.dtype)  # S: a rank's rows
        per_node = machine.topology.per_node
        members = group_members(p, "ep", per_node)
        self.links = [shift_link(machine, members, j) for j in range(1, e)]
        inside = all(link is machine.topology.intra for link in self.links)
        self.link = "intra-node" if inside else "inter-node"
        busiest = self.imbalance * self.payload / e
        self.rows_s = self._pairwise(busiest)
        slowest = machine.topology.intra if self.link == "intra-node" else machine.topology.inter
        self.sizes_s = slowest.p2p((e - 1) * COUNT_BYTES)  # one round, every peer's count at once
        self.counts_s = self._pairwise(COUNT_BYTES * n_experts // e)
        self.layer_forward_s = self.sizes_s + self.counts_s + 2 * (self.sizes_s + self.rows_s)
        self.layer_backward_s = 2 * (self.sizes_s + self.rows_s)
        shapes = rank_shapes(cfg, vocab)
        _, mine = split_shapes(cfg, shapes)  # this rank's E/e experts of each layer: the estimator's cut
        self.expert_bytes = sum(math.prod(s) for _, s, _ in mine) * itemsize(cfg.precision.dtype)
        every_expert = [row for row in shapes if EXPERTS in row[0]]
        self.expert_params = {k: active_params(cfg, every_expert, k) for k in self.layers}  # per token
        self.edp = Mesh.of(p).degree("edp")
        self.edp_comm = GroupComm(machine, group_members(p, "edp", per_node))
        self.ep_comm = GroupComm(machine, members)

    def _pairwise(self, block: float) -> float:
        """An all-to-all of `block` bytes to each peer: e − 1 shifts, each one message on its link."""
        return sum(link.p2p(block) for link in self.links)

    # ---- compute ---------------------------------------------------------------------------------------

    def flops(self, flops: ModelFlops) -> ModelFlops:
        """The busiest rank's FLOPs: its experts' rows λ times the mean's (flops.py counts the mean, top_k of
        E experts per token)."""
        if not self.active or self.imbalance == 1.0:
            return flops
        extra = {k: (self.imbalance - 1) * 2.0 * n * flops.tokens for k, n in self.expert_params.items()}
        units = tuple(f + extra.get(k, 0.0) for k, f in enumerate(flops.unit_forward))
        return dataclasses.replace(flops, forward=flops.forward + sum(extra.values()), unit_forward=units)

    # ---- the all-to-alls and the reduce ------------------------------------------------------------------

    def forward(self, tl: Timeline) -> None:
        """One micro-batch's forward all-to-alls, every MoE layer's: counts, dispatch, combine."""
        if self.active:
            self._issue(tl, len(self.layers) * self.layer_forward_s, 3 * len(self.layers))

    def backward(self, tl: Timeline, layer: str, recomputed: bool = False) -> None:
        """An MoE block's MLP backward: the combine's and the dispatch's mirrors; a checkpointed MoE block's
        recompute (its first backward piece is its experts') runs its counts, dispatch and combine again first
        (engine.recompute)."""
        if self.active and layer == "mlp.experts":
            if recomputed:
                self._issue(tl, self.layer_forward_s, 3)
            self._issue(tl, self.layer_backward_s, 2)

    def _issue(self, tl: Timeline, seconds: float, count: int) -> None:
        """On the training thread: exposed."""
        tl.inline(seconds)
        self.spent_s += seconds
        self.all_to_alls += count

    def reduces(self) -> list[tuple[float, float]]:
        """(seconds, CPU seconds) of what follows backward: the experts' gradients all-reduced over edp, their
        sum of squares over the EP group (the gradient norm)."""
        if not self.active:
            return []
        edp = [self.edp_comm.all_reduce(self.expert_bytes)] if self.edp > 1 else []
        return edp + [self.ep_comm.scalars(1)]

    # ---- what the report shows --------------------------------------------------------------------------

    def summary(self) -> dict:
        """The EP term as the report shows it (empty at e = 1)."""
        if not self.active:
            return {}
        return {"degree": self.degree, "edp": self.edp, "rows": self.rows, "moe_layers": len(self.layers),
                "link": self.link, "imbalance": self.imbalance, "imbalance_chosen": self.chosen,
                "imbalance_bound": self.bound, "payload_bytes": self.payload,
                "sent_bytes_per_all_to_all": self.payload * (self.degree - 1) / self.degree,
                "layer_forward_s": self.layer_forward_s, "layer_backward_s": self.layer_backward_s,
                "all_to_alls": self.all_to_alls, "step_s": self.spent_s, "exposed_s": self.spent_s,
                "expert_bytes": self.expert_bytes, "reduce_s": sum(s for s, _ in self.reduces())}
