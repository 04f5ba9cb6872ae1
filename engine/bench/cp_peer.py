"""The context-parallel race: our CP step (ring attention) against a PyTorch twin of it, in the same rank
processes, over gloo.

PyTorch's own context parallelism (torch.distributed.tensor.experimental.context_parallel, ring attention
over scaled_dot_product_attention) cannot run here: on a CPU, SDPA dispatches to
aten._scaled_dot_product_flash_attention_for_cpu, for which PyTorch 2.13 registers no sharding strategy
(its ring attention covers the CUDA flash, memory-efficient and cuDNN kernels), so the first attention
under the context manager raises NotImplementedError. So the twin is written by hand in PyTorch
("torch-ring-by-hand"), with PyTorch's own pieces everywhere else:

    model       the twin of our dense GPT (engine/bench/torch_peer.py, our initial weights), each block's
                attention swapped for RingAttention; positions' embedding looked up at the rank's
                global positions
    layout      the same sequence layout as ours (zigzag: rank r holds chunks r and 2c-1-r of 2c)
    attention   per ring step, every (query chunk, key chunk) block the causal mask leaves (a later key
                chunk skipped, a diagonal one masked), as torch ops (QKᵀ, mask, logsumexp, PV); the
                blocks merged by their log-sum-exps (the online softmax)
    the hops    K and V stacked into one tensor sent to the next rank of the CP group and received from
                the previous one (torch.distributed isend/irecv over gloo) inside an autograd Function
                whose backward sends the gradient the other way: autograd's backward is the ring's
                backward (each hop depends on the last, so every rank runs them in one order)
    gradients   averaged over the data x context ranks (they hold the same weights) by one all-reduce of
                the flattened gradients; global-norm clipping and AdamW with our decay groups

Imports torch inside functions only: the engine never depends on PyTorch.
"""

from __future__ import annotations

from typing import Any

from engine.bench.ddp_peer import race_in_ranks
from engine.config import Config

TWIN = "torch-ring-by-hand"  # what raced: PyTorch's own CP does not run on a CPU (the module docstring)


def race_cp(cfg: Config, warmup: int = 5, steps: int = 20) -> dict | None:
    """Our context-parallel step and the PyTorch twin's on cfg's layout (dp x cp), processes backend, taking
    turns in the same ranks; None when PyTorch is not installed."""
    if why := unraced(cfg):
        raise ValueError(why)
    report = race_in_ranks(cfg, "engine.bench.cp_peer:cp_peer", warmup, steps)
    if report is not None:
        report.update(twin=TWIN, cp=cfg.parallel.context, dp=cfg.parallel.world_size // cfg.parallel.context,
                      layout=cfg.parallel.context_layout)
    return report


def unraced(cfg: Config) -> str | None:
    """Why the twin cannot race cfg's layout, or None."""
    p = cfg.parallel
    if max(p.tensor, p.pipeline, p.expert) > 1 or cfg.model.kind != "gpt" or cfg.model.n_experts:
        return ("the PyTorch ring-attention twin races a dense GPT on data x context layouts only "
                "(parallel.tensor, parallel.pipeline and parallel.expert 1, model.n_experts 0)")
    return None


def cp_peer(cfg: Config, comm, ours):
    """The twin's step in a rank of the race (its dense model built again from the seed)."""
    from engine.config.build import build_model
    return TorchCP(cfg, comm.rank, build_model(cfg, ours.dataset), ours.dataset).step


def _hop():
    """The autograd Function of one ring hop (made on first use: torch is imported inside functions)."""
    import torch
    import torch.distributed as dist

    class Hop(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, send_to: int, recv_from: int):
            ctx.ranks = send_to, recv_from
            return _exchange(x, send_to, recv_from)

        @staticmethod
        def backward(ctx, grad):
            send_to, recv_from = ctx.ranks
            return _exchange(grad.contiguous(), recv_from, send_to), None, None

    def _exchange(x, send_to: int, recv_from: int):
        out = torch.empty_like(x)
        ops: list[Any] = [dist.isend(x.contiguous(), send_to), dist.irecv(out, recv_from)]
        for op in ops:
            op.wait()
        return out

    return Hop


class RingAttention:
    """A TorchAttention's forward as ring attention over `members` (global ranks, CP order) for the rank at
    index `cp_rank`, its tokens laid out by `layout` (engine.parallel.context.layout.SequenceLayout)."""

    def __init__(self, attn, layout, members: list[int], cp_rank: int):
        self.attn, self.layout, self.cp_rank = attn, layout, cp_rank
        c = len(members)
        self.next, self.prev = members[(cp_rank + 1) % c], members[(cp_rank - 1) % c]
        self.hop = _hop()

    def __call__(self, x):
        import torch

        from engine.parallel.context.layout import block_kind
        a = self.attn
        qkv = a.c_attn(x)
        b, t, c = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
        q, k, v = (h.view(b, t, a.n_head, c // a.n_head).transpose(1, 2) for h in qkv.split(c, dim=2))
        mine = self.layout.chunks(self.cp_rank)
        q_chunks = q.chunk(len(mine), dim=2)
        parts: list[list] = [[] for _ in mine]
        kv = torch.stack([k, v])
        degree, idle = self.layout.degree, []
        scale = k.shape[-1] ** -0.5
        for step in range(degree):
            theirs = self.layout.chunks((self.cp_rank - step) % degree)
            k_chunks, v_chunks = (kv[i].chunk(len(theirs), dim=2) for i in (0, 1))
            kinds = [[block_kind(qc, kc, causal=True) for kc in theirs] for qc in mine]
            if not any(any(row) for row in kinds):
                idle.append(kv)
            for qi, got in enumerate(parts):
                for kind, kb, vb in zip(kinds[qi], k_chunks, v_chunks):
                    if kind is None:
                        continue
                    s = (q_chunks[qi] @ kb.transpose(-2, -1)) * scale
                    if kind == "diagonal":
                        n = s.shape[-1]
                        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
                    lse = s.logsumexp(-1, keepdim=True)
                    got.append(((s - lse).exp() @ vb, lse))
            if step < degree - 1:
                kv = self.hop.apply(kv, self.next, self.prev)
        y = torch.cat([_merge(got) for got in parts], dim=2)
        # A hop whose keys no query here may see (the contiguous layout's early ranks) still has a backward
        # the neighbours wait on: a zero term keeps it in the graph, so every rank runs every hop's backward.
        y = y + sum(0.0 * received.sum() for received in idle)
        return a.resid_drop(a.c_proj(y.transpose(1, 2).reshape(b, t, c)))


def _merge(blocks):
    """The blocks' outputs of one query chunk, weighted by their share of the whole softmax."""
    import torch
    total = torch.logsumexp(torch.stack([lse for _, lse in blocks]), dim=0)
    return sum((lse - total).exp() * out for out, lse in blocks)


class TorchCP:
    """This rank's twin: cfg's dense initial model with ring attention over its CP group, its AdamW, and
    `step(i)` on global batch i (our schedule's learning rate at i); step returns this rank's mean loss."""

    def __init__(self, cfg: Config, rank: int, dense_model, dataset):
        from engine.bench.torch_peer import torch_adamw, torch_model_from
        from engine.parallel.context.layout import SequenceLayout
        from engine.parallel.mesh import Mesh
        if why := unraced(cfg):
            raise ValueError(why)
        mesh = Mesh.of(cfg.parallel)
        coords = mesh.coords(rank)
        members = mesh.members("cp", rank)  # global ranks: the hops go over the default (gloo) group
        self.cfg, self.dataset, self.dp_rank, self.dp = cfg, dataset, coords.dp, mesh.dp
        self.layout = SequenceLayout(cfg.parallel.context_layout, mesh.cp)
        self.cp_rank = members.index(rank)
        self.twin: Any = torch_model_from(dense_model)
        blocks: Any = self.twin.blocks
        for block in blocks:
            block.attn.forward = RingAttention(block.attn, self.layout, members, self.cp_rank)
        self.opt = torch_adamw(self.twin, cfg.optim)

    def _forward(self, idx, seq_len: int):
        import torch
        t = self.twin
        x = t.drop(t.wte(idx) + t.wpe(torch.from_numpy(self.layout.positions(seq_len, self.cp_rank))))
        for block in t.blocks:
            x = block(x)
        return t.lm_head(t.ln_f(x))

    def step(self, i: int) -> float:
        import torch
        import torch.nn.functional as F

        from engine.data import rank_slice
        cfg, o = self.cfg, self.cfg.optim
        start_step(self.opt, cfg, i)
        batch, n_micro, total = self.dataset.global_batch(i, "train"), cfg.train.micro_batches, 0.0
        for micro in range(n_micro):
            rows = rank_slice(batch, self.dp_rank, self.dp, micro, n_micro)
            x, y = (self.layout.local(a, self.cp_rank) for a in rows)
            logits = self._forward(torch.from_numpy(x), rows[0].shape[1])
            loss = F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(y).reshape(-1))
            (loss / n_micro).backward()
            total += loss.item()
        average_gradients(list(self.twin.parameters()))  # the world is the data x context ranks
        if o.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.twin.parameters(), o.grad_clip)
        self.opt.step()
        return total / n_micro


def start_step(opt, cfg: Config, i: int) -> None:
    """Step i's learning rate of our schedule on every group of `opt`, and its gradients cleared."""
    from engine.optim import lr_at
    o = cfg.optim
    for group in opt.param_groups:
        group["lr"] = lr_at(i, o.schedule, o.lr, o.min_lr, o.warmup_steps, cfg.train.steps)
    opt.zero_grad(set_to_none=True)


def average_gradients(params: list[Any]) -> None:
    """The parameters' gradients averaged over every rank of the default group, by one all-reduce of them
    flattened (the ranks hold the same weights)."""
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
    grads = [p.grad for p in params]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for g, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        g.copy_(reduced)


def twin_losses(cfg: Config, steps: int) -> list[list[float]]:
    """Every rank's losses of the twin's first `steps` steps on cfg's layout (processes backend)."""
    from engine.bench.ddp_peer import twin_losses as losses_of
    if why := unraced(cfg):
        raise ValueError(why)
    return losses_of(cfg, steps, "engine.bench.cp_peer:TorchCP")
