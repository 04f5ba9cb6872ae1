"""Tensor parallelism inside a mixture of experts: each expert's MLP split over the tensor-parallel group as
a dense block's MLP is (engine.parallel.tensor.plan), the router whole on every rank.

This is Megatron-LM's default (its expert tensor-parallel size defaults to the tensor-parallel size): the
experts keep the tensor split of their (pipeline, tensor) cell, and expert parallelism is carved out of the
data x context ranks of that cell (engine.parallel.mesh), so no mesh changes. Per MoE block, on t ranks:

    input         the block's hidden state, whole on every rank of the group (no sequence parallelism)
    router        whole, replicated: every rank routes the same tokens alike (same top-k, same capacity,
                  same load-balancing term), so the dispatch below is the same on every rank of the group
    expert up     column-parallel (4C/t features)           f: its input's gradient all-reduced in backward
    expert down   row-parallel, bias after the reduce        g: its output all-reduced in forward
    combine       on whole outputs, identical on every rank

Every product a rank computes is a slice of one device's, and every sum one device forms is completed by
the group's all-reduces, so the group trains what one device trains (float64: within rounding). Under
expert parallelism the EP group's members share a tensor rank: member j of one tensor rank's EP group and
member j of another's are tensor partners, receive the same rows and run their shards of the same experts.

Under sequence parallelism a rank holds s/t of the sequence around the blocks' products. The MoE then
runs on the whole sequence, as above: ln_2's output is all-gathered over the group on its way in (backward:
this rank's slice of the input's gradient, which the MoE made whole and the same on every rank: no sum) and
the MoE's output sliced back to this rank's part on its way out (backward: the gradient's slices gathered),
by hooks on ln_2 and the MoE, as torchtitan's PrepareModuleInput/Output redistribute a module's input and
output (parameter names unchanged). ln_2's gradients stay partial, summed over the group with the sequence
region's; the router's and the experts' are whole on every rank.

Why not the other form (experts whole on every tensor rank, EP carved out of data x tensor): without
sequence parallelism the tensor ranks hold the same tokens, so whole experts would either run the same rows
t times or need a second split of the tokens over the tensor group; the split above costs one all-reduce per
expert and direction, and cuts the experts' memory t ways as the dense MLP's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.comm.base import Communicator
from engine.moe import MoE
from engine.optim import sum_of_squares
from engine.parallel.tensor.layers import column_parallel, row_parallel
from engine.parallel.tensor.mappings import Tally, gathered, scatter_sequence, sequence_slice
from engine.tensor import Tensor, make


def shard_experts(moe: MoE, group: Communicator, tally: Tally, record: Callable[..., None]) -> None:
    """Split every expert MLP of `moe` over the tensor-parallel `group`, in place; `record(layer, spec,
    with_bias)` notes how each layer's parameters are cut (under their dense names)."""
    for mlp in moe.experts.mlps:
        if mlp is None:
            raise ValueError("tensor parallelism splits the experts before expert parallelism shares them")
        if len(mlp.layers) != 2 or mlp.drop.p:
            raise ValueError("an expert is split as a two-layer MLP without dropout")
        up, spec = column_parallel(mlp.layers[0], group, False, 1, tally)
        record(up, spec)
        down, down_spec = row_parallel(mlp.layers[1], group, False, tally)
        record(down, down_spec, with_bias=False)
        mlp.layers = [up, down]  # type: ignore[list-item]



def tensor_whole_ranges(flat, lo: int, hi: int, specs) -> list[tuple[int, int]]:
    """[a, b) ranges of flat[lo:hi] (in its own coordinates) holding parameters no tensor split cuts (a
    row-parallel layer's bias): every rank of the tensor group holds them alike, so a norm counts them
    once."""
    return [(max(s.start, lo) - lo, min(s.end, hi) - lo) for s in flat.slots
            if s.name not in specs and max(s.start, lo) < min(s.end, hi)]


def split_sums_of_squares(grad: np.ndarray, whole: list[tuple[int, int]], buf: np.ndarray) -> np.ndarray:
    """[sum of squares of the tensor-split parts of `grad`, of its `whole` ranges], float64."""
    sharded, replicated, at = 0.0, 0.0, 0
    for a, b in [*whole, (grad.size, grad.size)]:
        sharded += sum_of_squares(grad[at:a], buf=buf) if a > at else 0.0
        replicated += sum_of_squares(grad[a:b], buf=buf) if b > a else 0.0
        at = b
    return np.array([sharded, replicated], np.float64)


def gather_around_moe(block, group: Communicator, tally: Tally) -> None:
    """Under sequence parallelism: `block`'s MoE on the whole sequence (the module docstring), in place."""
    block.ln_2.forward_post_hooks.append(lambda module, out: _whole_sequence(out, group, tally))
    block.mlp.forward_post_hooks.append(lambda module, out: scatter_sequence(out, group))


def _whole_sequence(x: Tensor, group: Communicator, tally: Tally) -> Tensor:
    """All-gather the sequence's slices; backward keeps this rank's slice of a gradient every rank holds whole
    and alike (Megatron's gather_from_sequence_parallel_region with tensor_parallel_output_grad False)."""
    phase = "sp-fwd-all-gather"
    tally[phase] += 1
    return make(gathered(group, x.data, phase), (x,), lambda g: (sequence_slice(group, g),))
