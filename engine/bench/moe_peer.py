"""The expert-parallel race: our MoE step (experts split over an EP group, two all-to-alls per MoE block)
against a PyTorch twin of it, in the same rank processes, over gloo.

PyTorch has no expert-parallel module of its own; the twin is written as torchtitan's MoE is: a router
(softmax, top-k, the chosen weights renormalised when k > 1, dropless), the rank's tokens sorted by expert,
the split sizes exchanged first (an all_to_all_single of the counts), then the rows dispatched by
torch.distributed's all_to_all_single_autograd (its backward is the mirror exchange),
each local expert run on the rows every rank sent it, the outputs combined back the same way and summed
into their tokens with the routing weights. The load-balancing loss is Switch's, on the rank's own tokens,
as ours. Gradients: the replicated parameters all-reduced and averaged over the data ranks; an expert's
gradient already sums every rank's tokens (the all-to-all brought them), so it is divided by the same
count; the clipping norm counts each expert once (their squares summed over the EP group).

Raced layouts: every rank one EP group member (world_size = parallel.expert, data parallelism over the
same ranks, no tensor, pipeline or context axis), dropless routing. Imports torch inside functions only.
"""

from __future__ import annotations

from typing import Any

from engine.bench.cp_peer import average_gradients, start_step
from engine.bench.ddp_peer import race_in_ranks
from engine.config import Config

TWIN = "torch-all-to-all-by-hand"  # PyTorch has no expert-parallel module: torchtitan's dispatch, in torch


def unraced(cfg: Config) -> str | None:
    """Why the twin cannot race cfg's layout, or None."""
    p, m = cfg.parallel, cfg.model
    if m.kind != "gpt" or not m.n_experts or p.expert != p.world_size or m.capacity_factor > 0:
        return ("the PyTorch expert-parallel twin races an MoE GPT with dropless routing (capacity_factor 0) "
                "on parallel.expert = world_size only")
    return None


def race_moe(cfg: Config, warmup: int = 5, steps: int = 20) -> dict | None:
    """Our expert-parallel step and the twin's, processes backend, taking turns in the same ranks."""
    if why := unraced(cfg):
        raise ValueError(why)
    report = race_in_ranks(cfg, "engine.bench.moe_peer:moe_peer", warmup, steps)
    if report is not None:
        report.update(twin=TWIN, ep=cfg.parallel.expert, n_experts=cfg.model.n_experts, top_k=cfg.model.top_k)
    return report


def moe_peer(cfg: Config, comm, ours):
    """The twin's step in a rank of the race (its whole model built again from the seed)."""
    from engine.config.build import build_model
    return TorchEP(cfg, comm.rank, build_model(cfg, ours.dataset), ours.dataset).step


def _torch_moe(n_embd: int, n_experts: int, top_k: int, coef: float, bias: bool, rank: int, ep: int):
    """One MoE layer of the twin holding this rank's experts (named as ours: experts.mlps.<e>)."""
    import torch
    from torch import nn as tnn

    from engine.bench.torch_peer import TorchMLP

    class Router(tnn.Module):
        def __init__(self):
            super().__init__()
            self.gate = tnn.Linear(n_embd, n_experts, bias=False)

    class Experts(tnn.Module):
        def __init__(self):
            super().__init__()
            per = n_experts // ep
            self.local = range(rank * per, (rank + 1) * per)
            self.mlps = tnn.ModuleDict({str(e): TorchMLP([n_embd, 4 * n_embd, n_embd], 0.0, bias)
                                        for e in self.local})

    class TorchMoE(tnn.Module):
        def __init__(self):
            super().__init__()
            self.router, self.experts, self.aux = Router(), Experts(), None

        def forward(self, x):
            import torch.distributed as dist
            from torch.distributed._functional_collectives import all_to_all_single_autograd as exchange
            rows = x.reshape(-1, x.shape[-1])
            n = rows.shape[0]
            probs = self.router.gate(rows).softmax(-1)
            chosen = torch.argsort(-probs.detach(), dim=-1, stable=True)[:, :top_k]  # ties: the lower expert
            weights = probs.gather(1, chosen)
            if top_k > 1:
                weights = weights / weights.sum(-1, keepdim=True)
            flat = chosen.reshape(-1)
            order = torch.argsort(flat, stable=True)  # expert order, token order within an expert
            counts = torch.bincount(flat, minlength=n_experts)
            per = n_experts // ep
            arrived = torch.empty_like(counts)
            dist.all_to_all_single(arrived, counts)  # split sizes first: [source rank, local expert]
            send, got = counts.view(ep, per).sum(1).tolist(), arrived.view(ep, per).sum(1).tolist()
            world: Any = dist.group.WORLD
            rows_in = exchange(rows[order // top_k], got, send, world)
            pieces = rows_in.split(arrived.tolist())
            local = self.experts.local
            outs = [self.experts.mlps[str(e)](torch.cat(pieces[l::per])) for l, e in enumerate(local)]
            by_source = [o.split(arrived.view(ep, per)[:, l].tolist()) for l, o in enumerate(outs)]
            back = torch.cat([by_source[l][s] for s in range(ep) for l in range(per)])
            returned = exchange(back, send, got, world)
            weighted = returned * weights.reshape(-1)[order].unsqueeze(1)
            y = torch.zeros_like(rows).index_add(0, order // top_k, weighted)
            share = counts.to(probs.dtype) / (n * top_k)
            self.aux = coef * n_experts / n * (probs.sum(0) * share).sum()
            return y.reshape(x.shape)

    return TorchMoE()


class TorchEP:
    """This rank's twin: cfg's MoE GPT with this rank's experts, its AdamW, and `step(i)` on global batch i
    (our schedule's learning rate at i); step returns this rank's mean cross-entropy."""

    def __init__(self, cfg: Config, rank: int, model, dataset):
        import torch

        from engine.bench.torch_peer import TorchGPT, to_torch, torch_adamw
        if why := unraced(cfg):
            raise ValueError(why)
        m, ep = cfg.model, cfg.parallel.expert
        spec = {k: v for k, v in model.config.items() if k != "moe"}
        self.twin: Any = TorchGPT(**spec)
        self.layers: list[Any] = []
        for i, block in enumerate(self.twin.blocks):
            if i % m.moe_every == 0:
                block.mlp = _torch_moe(m.n_embd, m.n_experts, m.top_k, m.aux_loss_coef, m.bias, rank, ep)
                self.layers.append(block.mlp)
        ours = dict(model.named_parameters())
        with torch.no_grad():
            for name, p in self.twin.named_parameters():
                p.copy_(to_torch(ours[name].data))
        self.experts: list[Any] = [p for n, p in self.twin.named_parameters() if ".experts." in n]
        self.replicated: list[Any] = [p for n, p in self.twin.named_parameters() if ".experts." not in n]
        self.cfg, self.dataset, self.rank, self.world = cfg, dataset, rank, cfg.parallel.world_size
        self.opt = torch_adamw(self.twin, cfg.optim)

    def step(self, i: int) -> float:
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F

        from engine.data import rank_slice
        cfg, o = self.cfg, self.cfg.optim
        start_step(self.opt, cfg, i)
        batch, n_micro, total = self.dataset.global_batch(i, "train"), cfg.train.micro_batches, 0.0
        for micro in range(n_micro):
            x, y = rank_slice(batch, self.rank, self.world, micro, n_micro)
            logits = self.twin(torch.from_numpy(x))
            loss = F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(y).reshape(-1))
            aux = sum(layer.aux for layer in self.layers)
            ((loss + aux) / n_micro).backward()
            total += loss.item()
        average_gradients(self.replicated)
        for p in self.experts:  # already the sum over every rank's tokens: the mean over the data ranks
            p.grad /= self.world
        if o.grad_clip:
            squares = torch.stack([(p.grad.double() ** 2).sum() for p in self.experts]).sum()
            dist.all_reduce(squares)  # each expert once: they live on one rank each
            squares += torch.stack([(p.grad.double() ** 2).sum() for p in self.replicated]).sum()
            scale = min(1.0, o.grad_clip / (float(squares.sqrt()) + 1e-6))
            for p in self.twin.parameters():
                p.grad *= scale
        self.opt.step()
        return total / n_micro


def twin_losses(cfg: Config, steps: int) -> list[list[float]]:
    """Every rank's cross-entropy losses of the twin's first `steps` steps (processes backend)."""
    from engine.bench.ddp_peer import twin_losses as losses_of
    if why := unraced(cfg):
        raise ValueError(why)
    return losses_of(cfg, steps, "engine.bench.moe_peer:TorchEP")
