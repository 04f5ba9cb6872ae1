"""The tensor-parallel race: our TP step against PyTorch's own tensor parallelism (gloo, CPU), in the same
rank processes.

Every rank of a `processes` launch holds our Trainer (tensor-parallel over its TP group) and a PyTorch twin
of the same dense model (engine/bench/torch_peer.py), made tensor-parallel by PyTorch itself:
torch.distributed.tensor.parallel's `parallelize_module` on a DeviceMesh over gloo, laid out as our mesh
lays the ranks (dp x tp, TP innermost by default). The twin's plan, in torchtitan's form (its llama plan,
our GPT's modules; sequence parallelism in brackets):

    wte                  RowwiseParallel(input_layouts=Replicate()): the vocabulary's rows split, the
                         lookup all-reduced [reduce-scattered over the sequence]
    wpe                  replicated [its output cut to the rank's positions: the sequence's slice]
    ln_1, ln_2, ln_f     [SequenceParallel: s/t of the tokens, weights replicated]
    attn                 [PrepareModuleInput: all-gather the sequence]
    attn.c_attn          ColwiseParallel: the fused [3C, C] QKV, rows permuted first so rank r's
                         contiguous block is whole heads (its q, then k, then v), as ours holds them
    attn.c_proj          RowwiseParallel [output Shard(1): reduce-scatter]
    mlp                  [PrepareModuleInput: all-gather the sequence]
    mlp.layers.0 / .1    ColwiseParallel / RowwiseParallel [output Shard(1)]
    lm_head              ColwiseParallel(output Shard(-1), DTensor out), tied back to wte's shard
    loss                 loss_parallel(): cross-entropy on vocabulary-sharded logits (no gather)

attention runs n_head / t heads on each rank. Data parallelism over the mesh's dp dimension is PyTorch's
replicate (the FSDP2-based DDP torchtitan composes with TP: a gradient all-reduce over dp). The twin takes
our batches (the dp coordinate's slice, micro-batches with the dp gradient sync on the last only), the
schedule's learning rate, global-norm clipping and AdamW with our decay groups. Dropout is left to the
local tensors (torch seeded alike on every rank): the presets raced train without it.

Imports torch inside functions only: the engine never depends on PyTorch.
"""

from __future__ import annotations

from typing import Any

from engine.bench.ddp_peer import race_in_ranks
from engine.config import Config


def race_tp(cfg: Config, warmup: int = 5, steps: int = 20) -> dict | None:
    """Our tensor-parallel step and PyTorch TP's on cfg's layout (dp x tp, sequence parallelism as cfg
    says), processes backend, taking turns in the same ranks (engine.bench.ddp_peer.race_in_ranks); None
    when PyTorch is not installed. Step times in seconds: the slowest rank's median."""
    dp, tp = tp_axes(cfg)
    report = race_in_ranks(cfg, "engine.bench.tp_peer:tp_peer", warmup, steps)
    if report is not None:
        report.update(dp=dp, tp=tp, sequence_parallel=cfg.parallel.sequence_parallel)
    return report


def tp_peer(cfg: Config, comm, ours):
    """PyTorch TP's step in a rank of the race: the twin of the dense model our trainer started from (built
    again from the seed: ours holds only its shards)."""
    from engine.config.build import build_model
    return TorchTP(cfg, comm.rank, build_model(cfg, ours.dataset), ours.dataset).step


def unraced(cfg: Config) -> str | None:
    """Why the PyTorch TP twin cannot race cfg's layout (an axis besides data and tensor, a model it has
    no plan for), or None."""
    p = cfg.parallel
    if max(p.pipeline, p.context, p.expert) > 1:
        return ("the PyTorch TP twin races data x tensor layouts only (parallel.pipeline, parallel.context "
                "and parallel.expert 1)")
    if cfg.model.kind != "gpt":
        return "the PyTorch TP twin has a plan for the GPT only, not an MLP model"
    return None


def tp_axes(cfg: Config) -> tuple[int, int]:
    """(dp, tp) of cfg's layout; ValueError where the twin does not race it (`unraced`)."""
    if why := unraced(cfg):
        raise ValueError(why)
    return cfg.parallel.world_size // cfg.parallel.tensor, cfg.parallel.tensor


def device_mesh(cfg: Config):
    """torch's DeviceMesh ("dp", "tp") over the default (gloo) group, each rank where our mesh puts it:
    grid[d][t] is our rank at dp d, tp t (with the default order, init_device_mesh's row-major layout)."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    from engine.parallel.mesh import Mesh
    mesh = Mesh.of(cfg.parallel)
    grid = [[mesh.rank_of(dp=d, tp=t) for t in range(mesh.tp)] for d in range(mesh.dp)]
    return DeviceMesh("cpu", torch.tensor(grid), mesh_dim_names=("dp", "tp"))


def heads_first_qkv(weight, n_head: int, t: int):
    """The fused QKV rows [q; k; v] (each C rows, heads in order) reordered to [q_0 k_0 v_0 | q_1 k_1 v_1 |
    ...]: part r holds the q, k and v of heads r·a/t .. (r+1)·a/t - 1. ColwiseParallel splits the rows
    contiguously t ways, so each rank then gets whole heads. A weight [3C, C] or a bias [3C]."""
    import torch
    if n_head % t:
        raise ValueError(f"{n_head} heads do not split {t} ways")
    q, k, v = weight.chunk(3, dim=0)
    return torch.cat([x.chunk(t, dim=0)[r] for r in range(t) for x in (q, k, v)])


def tp_twin(model, mesh, sequence_parallel: bool, fused_attention: bool = False):
    """PyTorch's tensor-parallel twin of our dense GPT `model` (its weights, exactly) on the "tp" dimension
    of `mesh`, by the plan in this module's docstring; this rank's shards are DTensor parameters."""
    import torch
    from torch.distributed.tensor import Replicate, Shard, distribute_module
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    from engine.bench.torch_peer import torch_model_from
    tp_mesh = mesh["tp"]
    t, sp = tp_mesh.size(), sequence_parallel
    twin: Any = torch_model_from(model, fused_attention=fused_attention)  # a TorchGPT
    tied = twin.lm_head.weight is twin.wte.weight
    seq = Shard(1) if sp else Replicate()  # the residual stream's layout between the parallel regions
    norm: dict[str, Any] = {"ln_1": SequenceParallel(), "ln_2": SequenceParallel()} if sp else {}
    gather = {"attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
              "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
              } if sp else {}
    with torch.no_grad():
        for block in twin.blocks:
            attn = block.attn
            attn.c_attn.weight.copy_(heads_first_qkv(attn.c_attn.weight, attn.n_head, t))
            if attn.c_attn.bias is not None:
                attn.c_attn.bias.copy_(heads_first_qkv(attn.c_attn.bias, attn.n_head, t))
            attn.n_head //= t
            parallelize_module(block, tp_mesh, {
                **norm, **gather,
                "attn.c_attn": ColwiseParallel(),
                "attn.c_proj": RowwiseParallel(output_layouts=seq),
                "mlp.layers.0": ColwiseParallel(),
                "mlp.layers.1": RowwiseParallel(output_layouts=seq),
            })
    parallelize_module(twin, tp_mesh, {
        "wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        **({"ln_f": SequenceParallel()} if sp else {}),
        "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False),
    })
    if tied:  # each style distributed its own copy of the one dense weight: both are Shard(0) of [V, C]
        twin.lm_head.weight = twin.wte.weight
    # The rest replicated, so that every parameter is a DTensor (clipping's norm and the optimizer take one
    # kind): the positions' embedding, its output cut to this rank's slice of the sequence under SP; and
    # without SP the LayerNorms, on the whole (replicated) sequence.
    distribute_module(twin.wpe, tp_mesh, input_fn=_replicated_input,
                      output_fn=_sequence_slice if sp else _local_output)
    if not sp:
        for norm_module in [m for block in twin.blocks for m in (block.ln_1, block.ln_2)] + [twin.ln_f]:
            distribute_module(norm_module, tp_mesh, input_fn=_replicated_input, output_fn=_local_output)
    return twin


def _replicated_input(module, inputs, mesh):
    from torch.distributed.tensor import DTensor, Replicate
    return tuple(DTensor.from_local(x, mesh, [Replicate()], run_check=False) for x in inputs)


def _local_output(module, output, mesh):
    return output.to_local()


def _sequence_slice(module, output, mesh):
    from torch.distributed.tensor import Shard
    return output.redistribute(mesh, [Shard(0)]).to_local()  # forward: a slice; backward: all-gather


def tp_train_step(twin, opt, batch, dp_rank: int, dp: int, cfg: Config, lr: float) -> float:
    """One step of the twin as our trainer takes it: the dp coordinate's slice of the global batch in
    micro-batches (the dp gradient sync on the last one only), the vocab-parallel mean cross-entropy,
    global-norm clipping over every shard, AdamW at the schedule's `lr`. Returns this rank's mean loss."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor.parallel import loss_parallel

    from engine.data import rank_slice
    n_micro = cfg.train.micro_batches
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for micro in range(n_micro):
        x, y = rank_slice(batch, dp_rank, dp, micro, n_micro)
        if dp > 1:
            twin.set_requires_gradient_sync(micro == n_micro - 1)
        with loss_parallel():  # the backward too, as loss_parallel requires
            logits = twin(torch.from_numpy(x))
            loss: Any = F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(y).reshape(-1))  # a DTensor
            (loss / n_micro).backward()
        total += float(loss.detach().to_local())  # replicated: the whole batch's mean
    if cfg.optim.grad_clip:
        torch.nn.utils.clip_grad_norm_(twin.parameters(), cfg.optim.grad_clip)
    opt.step()
    return total / n_micro


class TorchTP:
    """This rank's PyTorch TP peer: the twin of cfg's dense initial model on the (dp, tp) mesh, its AdamW,
    and `step(i)` on global batch i (the learning rate of our schedule at i)."""

    def __init__(self, cfg: Config, rank: int, dense_model, dataset):
        import torch

        from engine.bench.torch_peer import torch_adamw
        from engine.parallel.mesh import Mesh
        dp, _ = tp_axes(cfg)
        self.cfg, self.dataset = cfg, dataset
        self.dp_rank, self.dp = Mesh.of(cfg.parallel).coords(rank).dp, dp
        torch.manual_seed(cfg.seed)  # the same on every rank: replicated dropout masks agree
        self.mesh = device_mesh(cfg)
        self.twin = tp_twin(dense_model, self.mesh, cfg.parallel.sequence_parallel)
        if dp > 1:
            from torch.distributed._composable.replicate_with_fsdp import replicate
            replicate(self.twin, mesh=self.mesh["dp"])
        self.opt = torch_adamw(self.twin, cfg.optim)

    def step(self, i: int) -> float:
        from engine.optim import lr_at
        o = self.cfg.optim
        lr = lr_at(i, o.schedule, o.lr, o.min_lr, o.warmup_steps, self.cfg.train.steps)
        return tp_train_step(self.twin, self.opt, self.dataset.global_batch(i, "train"), self.dp_rank,
                             self.dp, self.cfg, lr)


def twin_losses(cfg: Config, steps: int) -> list[list[float]]:
    """Every rank's losses of the twin's first `steps` steps on cfg's layout (processes backend)."""
    from engine.bench.ddp_peer import twin_losses as losses_of
    tp_axes(cfg)
    return losses_of(cfg, steps, "engine.bench.tp_peer:TorchTP")
