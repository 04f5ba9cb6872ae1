"""What `parallelize` made of a model, and the model-wide steps that follow from it.

A parameter is either sharded (a ShardSpec says how: its squares differ on every rank) or replicated
(the same on every rank of the group). Three things need to know which is which:

  * the loss: a vocab-parallel model's logits are [b, s, V/t] on each rank (`loss`);
  * under sequence parallelism, the replicated parameters used inside the sequence-parallel region
    (LayerNorms, the row-parallel biases) see only s/t of the tokens on each rank: their gradients are
    partial sums, added up over the group once per step (`reduce_sequence_parallel_grads`), after the
    last backward of the step and before the gradient norm. Forgetting it trains each rank's LayerNorms on
    its own tokens (the ranks drift apart);
  * the global gradient norm: squares of sharded parameters summed over the group, replicated ones
    counted once (`grad_sum_of_squares`).

A data-parallel replica around the model holds its gradients in flat buffers (ZeRO: shards of them), not in
p.grad, so it asks the same three questions by parameter name and hands over flat arrays:
`sums_partial(name)` and `sum_partial_grads(flat)`, `is_sharded(name)` and `combine_sum_of_squares`, and
`agree_max(flags)` (the fp16 overflow flag: every rank of the group skips the same steps). A model that is
not tensor-parallel answers them through whole.WholeModel, so the replica and the trainer ask without an
`if`.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from engine import ops
from engine.comm.base import Communicator
from engine.optim import sum_of_squares
from engine.parallel.tensor.generate import generate
from engine.parallel.tensor.mappings import Tally, all_reduced, collective
from engine.parallel.tensor.slicing import ShardSpec
from engine.parallel.tensor.vocab import gather_vocab, vocab_parallel_cross_entropy, vocab_slice
from engine.tensor import Parameter, Tensor


class TensorParallelLayout:
    """This rank's view of a tensor-parallel model (`model.tensor_parallel`)."""

    def __init__(self, group: Communicator, sequence_parallel: bool, parameters: list[tuple[str, Parameter]],
                 specs: dict[str, ShardSpec], sequence_replicated: list[Parameter],
                 vocab: ShardSpec | None = None, tally: Tally | None = None, units: int = 1):
        self.group, self.sequence_parallel = group, sequence_parallel
        self.parameters, self.specs = parameters, specs
        self.sequence_replicated = sequence_replicated
        self.vocab = vocab  # how the logits' last axis is split; None: the logits are whole (MLP)
        self._partial = {p.name for p in sequence_replicated}
        # the collectives the blocks' (an MLP's layer pairs') parallel layers ran, by phase, until cleared
        self.tally: Tally = Counter() if tally is None else tally
        self.units = units

    @property
    def degree(self) -> int:
        return self.group.world_size

    @property
    def rank(self) -> int:
        """This rank's place in the group: which shard of every sharded parameter it holds."""
        return self.group.rank

    def is_sharded(self, name: str) -> bool:
        return name in self.specs

    def collectives_per_layer(self, passes: int = 1) -> dict[str, float]:
        """The collectives one block ran, by phase, in each of `passes` forward and backward passes since
        `tally` was cleared (a recomputed block's forward counts again): measured, not planned."""
        return {phase: n / (self.units * passes) for phase, n in sorted(self.tally.items())}

    def sums_partial(self, name: str) -> bool:
        """Whether the parameter's gradient is a partial sum over this rank's tokens (sequence parallelism's
        replicated parameters), to be summed over the group once per step."""
        return name in self._partial

    # ---- the loss ----------------------------------------------------------------------------------

    def loss(self, logits: Tensor, targets) -> Tensor:
        """Mean cross-entropy of the model's output: vocab-parallel when the logits are split."""
        if self.vocab is None:
            return ops.cross_entropy(logits, targets)
        first, valid = vocab_slice(self.vocab, self.group.rank)
        return vocab_parallel_cross_entropy(logits, targets, self.group, first, valid)

    def whole_logits(self, logits: np.ndarray) -> np.ndarray:
        """[..., V] from this rank's [..., V/t] (collective): for sampling and tests, not for the loss."""
        return logits if self.vocab is None else gather_vocab(self.group, logits, self.vocab)

    def generate(self, model, idx, n: int, temperature: float = 1.0, rng=None, top_k: int = 0) -> np.ndarray:
        """GPT.generate from the whole logits, every rank of the group alike (collective; generate.py)."""
        return generate(model, self, idx, n, temperature, rng, top_k)

    # ---- gradients ---------------------------------------------------------------------------------

    def reduce_sequence_parallel_grads(self) -> None:
        """Sum the sequence-parallel region's replicated gradients over the group, in one all-reduce (nothing
        without sequence parallelism). Once per step, after every micro-batch's backward."""
        params = self.sequence_replicated
        if not params:
            return
        flat = np.concatenate([_grad(p).reshape(-1) for p in params])
        collective(self.group, "all-reduce", flat, "sp-grad-all-reduce")
        start = 0
        for p in params:
            part = flat[start:start + p.data.size].reshape(p.shape)
            start += p.data.size
            if p.grad is None:
                p.grad = part.copy()
            else:
                p.grad[...] = part  # in place: .grad may be a view into a flat buffer

    def sum_partial_grads(self, flat: np.ndarray) -> None:
        """Sum a flat array of partial gradients (those `sums_partial` names) over the group, in place."""
        collective(self.group, "all-reduce", flat, "sp-grad-all-reduce")

    def agree_max(self, flags: np.ndarray) -> None:
        """Every rank's largest value of each element, in place (a float64 array of flags)."""
        collective(self.group, "all-reduce", flags, "tp-flag-all-reduce", op="max")

    def grad_sum_of_squares(self) -> float:
        """Sum of squares of the whole model's gradient, equal on every rank of the group (collective)."""
        sharded = replicated = 0.0
        for name, p in self.parameters:
            if p.grad is not None:
                if self.is_sharded(name):
                    sharded += sum_of_squares(p.grad)
                else:
                    replicated += sum_of_squares(p.grad)
        return self.combine_sum_of_squares(sharded, replicated)

    def combine_sum_of_squares(self, sharded: float, replicated: float) -> float:
        """The model's sum of squares from this rank's: sharded parts summed over the group, the replicated
        part (the same on every rank) counted once."""
        total = all_reduced(self.group, np.array([sharded], np.float64), "tp-norm-all-reduce")
        return float(total[0]) + replicated

    def grad_norm(self) -> float:
        return math.sqrt(self.grad_sum_of_squares())

    # ---- back to the dense model -------------------------------------------------------------------

    def dense(self, kind: str = "data") -> dict[str, np.ndarray]:
        """Every parameter's dense array ("data") or gradient ("grad"; zeros where None), by name: the
        sharded ones gathered from the group in one all-gather (collective). For exports and tests."""
        arrays = {name: p.data if kind == "data" else _grad(p) for name, p in self.parameters}
        sharded = [name for name, _ in self.parameters if self.is_sharded(name)]
        mine = np.concatenate([arrays[name].reshape(-1) for name in sharded] or [np.zeros(0)])
        everyone = np.empty((self.degree, mine.size), mine.dtype)
        everyone[self.group.rank] = mine
        collective(self.group, "all-gather", everyone.reshape(-1), "tp-gather-dense")
        out = {name: np.array(a) for name, a in arrays.items()}
        start = 0
        for name in sharded:
            shape = arrays[name].shape
            end = start + arrays[name].size
            out[name] = self.specs[name].unshard([row[start:end].reshape(shape) for row in everyone])
            start = end
        return out


def _grad(p: Parameter) -> np.ndarray:
    return np.zeros_like(p.data) if p.grad is None else p.grad
