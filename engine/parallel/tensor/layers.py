"""Column- and row-parallel Linear layers: a dense Linear's weight cut t ways, and the one collective each
needs (mappings.py).

    column-parallel  W[out/t, in], b[out/t]   f (or the sequence all-gather), then x @ W.T + b
                     each rank computes its own out/t output features from the whole input
    row-parallel     W[out, in/t], b[out]     x @ W.T, then g (or the sequence reduce-scatter), then + b
                     each rank holds in/t input features and a partial sum of every output; the bias is
                     added once, after the reduce (added before it, it would be summed t times)

A column-parallel layer followed by a row-parallel one (attention's QKV then its output projection; the
MLP's up then down projection) needs nothing between them: the row layer's input features are exactly the
column layer's output features. One all-reduce forward (g) and one backward (f) per pair.
"""

from __future__ import annotations

from engine import ops
from engine.comm.base import Communicator
from engine.nn import Linear, Module
from engine.parallel.tensor.mappings import (
    Tally,
    copy_to_tensor_parallel,
    gather_sequence,
    reduce_from_tensor_parallel,
    reduce_scatter_sequence,
)
from engine.parallel.tensor.slicing import ShardSpec
from engine.tensor import Parameter, Tensor


class ColumnParallelLinear(Module):
    """This rank's out/t output features of a Linear; input whole (or, sequence-parallel, a slice of the
    sequence, gathered first). Output: [..., out/t]. `tally`: where its collectives are counted (or None)."""

    def __init__(self, weight: Parameter, bias: Parameter | None, group: Communicator,
                 sequence_parallel: bool = False, tally: Tally | None = None):
        super().__init__()
        self.weight, self.bias = weight, bias
        self.group, self.sequence_parallel, self.tally = group, sequence_parallel, tally
        self.residual = False  # as Linear's: a projection into the residual stream (its init)

    def forward(self, x: Tensor) -> Tensor:
        if self.sequence_parallel:
            x = gather_sequence(x, self.group, self.tally)
        else:
            x = copy_to_tensor_parallel(x, self.group, self.tally)
        return ops.linear(x, self.weight, self.bias)


class RowParallelLinear(Module):
    """A Linear whose input features are split: input [..., in/t] (a column-parallel layer's output);
    output whole (or, sequence-parallel, this rank's slice of the sequence), bias added after the reduce."""

    def __init__(self, weight: Parameter, bias: Parameter | None, group: Communicator,
                 sequence_parallel: bool = False, tally: Tally | None = None):
        super().__init__()
        self.weight, self.bias = weight, bias
        self.group, self.sequence_parallel, self.tally = group, sequence_parallel, tally
        self.residual = False

    def forward(self, x: Tensor) -> Tensor:
        partial = ops.linear(x, self.weight)
        if self.sequence_parallel:
            y = reduce_scatter_sequence(partial, self.group, self.tally)
        else:
            y = reduce_from_tensor_parallel(partial, self.group, self.tally)
        return y if self.bias is None else y + self.bias


def sharded_parameter(dense: Parameter, spec: ShardSpec, rank: int) -> Parameter:
    """A new Parameter holding rank's shard of `dense`, under the dense parameter's name."""
    return Parameter(spec.shard(dense.data, rank), name=dense.name)


def column_parallel(dense: Linear, group: Communicator, sequence_parallel: bool = False,
                    sections: int = 1, tally: Tally | None = None) -> tuple[ColumnParallelLinear, ShardSpec]:
    """The column-parallel form of `dense` on this rank, and how its weight and bias are cut. `sections`:
    the output features are that many equal blocks, each split on its own (3 for a fused QKV)."""
    t, r = group.world_size, group.rank
    spec = ShardSpec(axis=0, length=dense.weight.shape[0], parts=t, sections=sections)
    bias = None if dense.bias is None else sharded_parameter(dense.bias, spec, r)
    layer = ColumnParallelLinear(sharded_parameter(dense.weight, spec, r), bias, group, sequence_parallel,
                                 tally)
    layer.residual = dense.residual
    return layer, spec


def row_parallel(dense: Linear, group: Communicator, sequence_parallel: bool = False,
                 tally: Tally | None = None) -> tuple[RowParallelLinear, ShardSpec]:
    """The row-parallel form of `dense` on this rank (the bias kept whole: every rank adds it once after
    the reduce), and how its weight is cut."""
    spec = ShardSpec(axis=1, length=dense.weight.shape[1], parts=group.world_size)
    weight = sharded_parameter(dense.weight, spec, group.rank)
    layer = RowParallelLinear(weight, dense.bias, group, sequence_parallel, tally)
    layer.residual = dense.residual
    return layer, spec
