"""The pipeline race: our pipeline step against PyTorch's own pipelining (torch.distributed.pipelining on
gloo, CPU), in the same rank processes.

Every rank holds our Trainer and a PyTorch twin of the same dense model (engine/bench/torch_peer.py: same
shapes, same initial weights), cut into the same stages (`stage_blocks`: the blocks each stage holds) and
run by PyTorch's schedule of the same name:

    gpipe         ScheduleGPipe                  1f1b   Schedule1F1B
    interleaved   ScheduleInterleaved1F1B         zb-h1  ScheduleInterleavedZeroBubble (one stage per rank)

Stage s is a torch Module (`_stage_module`): the first adds the embeddings, the last the final LayerNorm,
the head and (in the schedule's loss_fn) the mean cross-entropy; stage s sits on pipeline rank s % p, as
ours. A tied head is untied into a copy on the last stage, and the two copies' gradients are summed over
the (first, last) pair after the schedule's step, as our executor does. The data-parallel gradient reduce
is an all-reduce of each stage's gradients over its dp group; then global-norm clipping (the norm over
every stage) and AdamW with our decay groups. Dropout is left to torch (the raced presets train without).

Imports torch inside functions only: the engine never depends on PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from engine.bench.ddp_peer import race_in_ranks
from engine.config import Config

TORCH_SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
                   "interleaved": "ScheduleInterleaved1F1B", "zb-h1": "ScheduleInterleavedZeroBubble"}


def race_pp(cfg: Config, warmup: int = 5, steps: int = 20) -> dict | None:
    """Our pipeline step and PyTorch pipelining's on cfg's layout (processes backend, taking turns in the
    same ranks: engine.bench.ddp_peer.race_in_ranks); None when PyTorch is not installed."""
    if why := unraced(cfg):
        raise ValueError(why)
    report = race_in_ranks(cfg, "engine.bench.pp_peer:pp_peer", warmup, steps)
    if report is not None:
        report.update(pp=cfg.parallel.pipeline, schedule=cfg.parallel.schedule,
                      micro_batches=cfg.train.micro_batches)
    return report


def unraced(cfg: Config) -> str | None:
    """Why PyTorch's pipelining cannot race cfg's layout, or None."""
    p = cfg.parallel
    if max(p.tensor, p.context, p.expert) > 1:
        return ("the PyTorch pipeline twin races data x pipeline layouts only (parallel.tensor, context and "
                "expert 1)")
    if cfg.model.kind != "gpt":
        return "the PyTorch pipeline twin cuts the GPT only, not an MLP model"
    if p.pipeline_emulate_ms > 0:
        return "an emulated pipeline (parallel.pipeline_emulate_ms > 0) computes nothing to race"
    if p.schedule == "zb-h1" and p.chunks != 1:
        return "PyTorch's zero-bubble schedule is raced with one stage per rank (parallel.chunks = 1)"
    return None


def pp_peer(cfg: Config, comm, ours) -> Callable[[int], float]:
    """PyTorch pipelining's step in a rank of the race: the twin of the dense model our trainer started
    from, built again from the seed (ours holds only its stages)."""
    from engine.config.build import build_model
    cut = [(s.first_block, s.first_block + s.n_blocks) for s in ours.model.runner.split.stages]
    return TorchPP(cfg, comm.rank, build_model(cfg, ours.dataset), ours.dataset, cut).step


def stage_blocks(cfg: Config, dense_model) -> list[tuple[int, int]]:
    """[first block, end) of each of the p·v stages, as our split cuts the dense model (parameter balance
    or given counts: a balance by measured time would measure again, and might cut elsewhere)."""
    from engine.parallel.pipeline.split import split_model
    p = cfg.parallel
    balance = getattr(p, "stage_balance", "params")
    cut = split_model(dense_model, p.pipeline * p.chunks, "params" if balance == "time" else balance)
    return [(s.first_block, s.first_block + s.n_blocks) for s in cut.stages]


class TorchPP:
    """This rank's PyTorch pipeline peer: its stages of the twin, the schedule, AdamW over its stages'
    parameters, and `step(i)` on global batch i (returns the mean loss on the last stage's rank, else 0)."""

    def __init__(self, cfg: Config, rank: int, dense_model, dataset,
                 cut: list[tuple[int, int]] | None = None):
        import torch
        import torch.distributed as dist
        from torch.distributed import pipelining

        from engine.bench.torch_peer import torch_adamw, torch_model_from
        from engine.parallel.mesh import Mesh
        mesh = Mesh.of(cfg.parallel)
        p, count = mesh.pp, mesh.pp * cfg.parallel.chunks
        self.cfg, self.dataset = cfg, dataset
        coords = mesh.coords(rank)
        self.dp_rank, self.dp = coords.dp, mesh.dp
        torch.manual_seed(cfg.seed)
        twin: Any = torch_model_from(dense_model)
        tied = p > 1 and twin.lm_head.weight is twin.wte.weight
        if tied:  # each end keeps its copy; their gradients are summed after the step
            twin.lm_head.weight = torch.nn.Parameter(twin.wte.weight.detach().clone())
        pp_group = _group(dist, mesh.groups("pp"), rank)
        self.dp_group = _group(dist, mesh.groups("dp"), rank) if mesh.dp > 1 else None
        self.tied_group = _group(dist, _tied_pairs(mesh), rank) if tied else None
        ranges = cut or stage_blocks(cfg, dense_model)  # ours, where our trainer cut it
        mine = [s for s in range(count) if s % p == coords.pp]
        self.modules = [_stage_module(twin, s, count, ranges[s]) for s in mine]
        self.stages = [pipelining.PipelineStage(m, s, count, torch.device("cpu"), group=pp_group)
                       for m, s in zip(self.modules, mine, strict=True)]
        self.params = [q for m in self.modules for q in m.parameters()]
        # the tied weight's copy on each end, and whether it counts in the norm (the first end's does)
        self.tied = [(m.wte.weight if m.first else m.lm_head.weight, m.first) for m in self.modules
                     if tied and (m.first or m.last)]
        self.is_first, self.is_last = 0 in mine, count - 1 in mine
        schedule_cls = getattr(pipelining, TORCH_SCHEDULES[cfg.parallel.schedule])
        m = cfg.train.micro_batches
        one_stage = schedule_cls in (pipelining.ScheduleGPipe, pipelining.Schedule1F1B)
        self.schedule = schedule_cls(self.stages[0] if one_stage else self.stages, m,
                                     loss_fn=_mean_cross_entropy)
        self.opt = torch_adamw(cast(Any, _ParamsOnly(self.params)), cfg.optim)

    def step(self, i: int) -> float:
        import torch
        import torch.distributed as dist

        from engine.data import rank_slice
        from engine.optim import lr_at
        o = self.cfg.optim
        for group in self.opt.param_groups:
            group["lr"] = lr_at(i, o.schedule, o.lr, o.min_lr, o.warmup_steps, self.cfg.train.steps)
        self.opt.zero_grad(set_to_none=True)
        x, y = rank_slice(self.dataset.global_batch(i, "train"), self.dp_rank, self.dp, 0, 1)
        losses: list = []
        kwargs: dict[str, Any] = {"target": torch.from_numpy(y), "losses": losses} if self.is_last else {}
        self.schedule.step(*((torch.from_numpy(x),) if self.is_first else ()), **kwargs)
        for weight, _ in self.tied:
            dist.all_reduce(weight.grad, group=self.tied_group)
        if self.dp_group is not None:
            for q in self.params:
                dist.all_reduce(q.grad, group=self.dp_group)
                q.grad /= self.dp
        if self.cfg.optim.grad_clip:
            self._clip(self.cfg.optim.grad_clip)
        self.opt.step()
        return float(torch.stack(losses).detach().mean()) if losses else 0.0

    def _clip(self, max_norm: float) -> None:
        """Global-norm clipping, the norm over the whole model: every stage's squares summed over the
        world (each dp replica holds the same gradients: divided by dp), the tied weight counted once."""
        import torch
        import torch.distributed as dist
        skip = {id(w) for w, counts in self.tied if not counts}
        sq = sum((q.grad.double().pow(2).sum() for q in self.params if id(q) not in skip),
                 torch.zeros((), dtype=torch.float64))
        dist.all_reduce(sq)
        norm = float(sq / self.dp) ** 0.5
        coef = min(1.0, max_norm / (norm + 1e-6))
        for q in self.params:
            q.grad.mul_(coef)


def _stage_module(twin, index: int, count: int, blocks: tuple[int, int]):
    """Stage `index` of `count` of the twin as a torch Module: blocks [start, end), with the embeddings on
    the first stage and the final norm and head on the last."""
    import torch
    import torch.nn as tnn

    class Stage(tnn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.last = index == 0, index == count - 1
            if self.first:
                self.wte, self.wpe, self.drop = twin.wte, twin.wpe, twin.drop
            self.blocks = tnn.ModuleList(twin.blocks[blocks[0]:blocks[1]])
            if self.last:
                self.ln_f, self.lm_head = twin.ln_f, twin.lm_head

        def forward(self, x):
            if self.first:
                x = self.drop(self.wte(x) + self.wpe(torch.arange(x.shape[1])))
            for block in self.blocks:
                x = block(x)
            return self.lm_head(self.ln_f(x)) if self.last else x

    return Stage()


class _ParamsOnly:
    """What torch_adamw reads of a model: its parameters."""

    def __init__(self, params: list):
        self._params = params

    def parameters(self):
        return iter(self._params)


def _mean_cross_entropy(logits, target):
    import torch.nn.functional as F
    return F.cross_entropy(logits.flatten(0, 1), target.reshape(-1))


def _group(dist, groups: list[list[int]], rank: int):
    """torch's process group for the one of `groups` that holds `rank` (every rank creates every group,
    in the same order, as torch requires)."""
    mine = None
    for members in groups:
        g = dist.new_group(members)
        if rank in members:
            mine = g
    return mine


def _tied_pairs(mesh) -> list[list[int]]:
    """(first stage, last stage) of each pipeline: the ranks holding the tied weight's two copies."""
    return [[mesh.rank_of(dp=d, pp=0), mesh.rank_of(dp=d, pp=mesh.pp - 1)] for d in range(mesh.dp)]


def twin_losses(cfg: Config, steps: int) -> list[list[float]]:
    """Every rank's losses of the twin's first `steps` steps on cfg's layout (processes backend)."""
    from engine.bench.ddp_peer import twin_losses as losses_of
    if why := unraced(cfg):
        raise ValueError(why)
    return losses_of(cfg, steps, "engine.bench.pp_peer:TorchPP")
