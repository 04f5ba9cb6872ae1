"""The gradient side of expert parallelism: the replica interface (engine/parallel/data/__init__.py) over
two kinds of parameters that are reduced over different groups.

    replicated parameters   every data-parallel rank holds them alike: the data-parallel replica (DDP)
                            the trainer made, over the dp group (it leaves the split experts out:
                            engine.parallel.expert.plan.replicated_parameters)
    the split experts       this rank's E/e experts of each MoE layer: their own flat buffer, AdamW over
                            it, all-reduced over the edp group (the ranks holding the same experts)

Scaling. A rank's loss is the mean over its tokens, and data parallelism averages over the D = dp x cp
ranks: a replicated gradient is (1/D) sum over ranks. An expert's gradient on its rank already sums the
tokens of its EP group's e ranks (the all-to-all brought them); summed over the edp group it covers all D
ranks, so it is divided by D: an average over edp (D/e ranks) and then 1/e.

The gradient norm is one over the whole model: the replicated part once, plus every expert once, so the
experts' sum of squares is summed over the EP group (edp members hold the same values). The experts'
reduce runs after backward, on the rank's thread (the model's all-to-alls use the same transport in
backward). Checkpoints of split experts are not built: the trainer saves none under expert parallelism.
"""

from __future__ import annotations

import math

import numpy as np

from engine.comm.collectives import all_reduce, broadcast
from engine.nn import Module
from engine.optim import sum_of_squares
from engine.parallel.data.flat import FlatBuffer
from engine.parallel.data.shard_optimizer import Piece, ShardOptimizer
from engine.parallel.expert.plan import expert_parameters


class AddingLedger:
    """The rank's memory ledger, whose hold() adds to what the data-parallel replica holds instead of
    replacing it: the experts' parameters, gradients and optimizer state live beside the others all run."""

    def __init__(self, ledger):
        self._ledger = ledger

    def hold(self, category: str, nbytes: int) -> None:
        self._ledger.add(category, nbytes)

    def __getattr__(self, name):
        return getattr(self._ledger, name)


class ExpertReplica:
    """`dense` (the data-parallel replica of the replicated parameters) plus this rank's split experts."""

    def __init__(self, dense, cfg, model: Module, ep, edp):
        self.dense, self.ep, self.edp = dense, ep, edp
        params = expert_parameters(model)
        self.experts = FlatBuffer(params, dtype=cfg.precision.dtype)
        if edp.world_size > 1:
            broadcast(edp, self.experts.data, root=0)  # as DDP: the edp group starts from one copy
        ledger = AddingLedger(dense.ledger)
        ledger.hold("parameters", self.experts.data.nbytes)
        ledger.hold("gradients", self.experts.grad_buffer.nbytes)
        piece = Piece(self.experts.data, self.experts.grad_buffer, self.experts, 0)
        self.optimizer = ShardOptimizer(cfg, [piece], edp, sharded=False,
                                        param_names=[str(p.name) for p in params], ledger=ledger)

    def __getattr__(self, name):
        """What the trainer reads of a replica and the experts do not change (scaler, loss_scale, flat,
        comm_wait_s, bytes_sent, drain_events, ...): the data-parallel replica's."""
        return getattr(self.dense, name)

    def zero_grad(self) -> None:
        self.dense.zero_grad()
        self.experts.mark_grads_stale()

    def begin_micro(self, sync: bool) -> None:
        self.dense.begin_micro(sync)

    def backward(self, loss, factor: float) -> None:
        self.dense.backward(loss, factor)
        self.experts.zero_stale()  # an expert no token reached this micro-batch

    def finish_backward(self) -> None:
        """The replicated parameters' reduce (DDP's), then the experts': average over edp, then 1/e."""
        self.dense.finish_backward()
        grad = self.experts.grad_buffer
        if self.edp.world_size > 1:
            all_reduce(self.edp, grad, op="avg")
        grad *= 1.0 / self.ep.world_size

    def grad_norm(self) -> float:
        """The whole model's gradient norm: the replicated part's, and every expert's once."""
        experts = np.array([sum_of_squares(self.experts.grad_buffer)], np.float64)
        if self.ep.world_size > 1:
            all_reduce(self.ep, experts, op="sum")
        return math.sqrt(self.dense.grad_norm() ** 2 + float(experts[0]))

    def step(self, lr: float, clip: float, step: int) -> bool:
        stepped = self.dense.step(lr, clip, step)
        if stepped:
            self.optimizer.update(lr, clip, 1.0)  # fp32 and fp64 only: no loss scale to take out
        return stepped

    def optimizer_state(self) -> dict:
        raise NotImplementedError("checkpoints of split experts (parallel.expert > 1) are not built yet")

    def load_optimizer_state(self, full: dict) -> None:
        raise NotImplementedError("resuming into split experts (parallel.expert > 1) is not built yet: "
                                  "resume with parallel.expert = 1")

    def close(self) -> None:
        self.dense.close()


def with_experts(dense, cfg, model: Module, groups):
    """The replica the trainer steps: `dense` alone for a model without split experts, else an
    ExpertReplica over the rank's EP and edp groups (engine.parallel.mesh.MeshGroups)."""
    if not expert_parameters(model):
        return dense
    return ExpertReplica(dense, cfg, model, groups.ep, groups.edp)
