"""The multi-rank race: our step against a PyTorch peer (gloo, CPU) in the same processes; here DDP.

Every rank process of a `processes` launch holds both: our Trainer on our communicator, and the PyTorch
twin of the same model (engine/bench/torch_peer.py: same shapes, same initial weights) wrapped in
torch.nn.parallel.DistributedDataParallel over a gloo process group, with the same global batch cut
the same way (engine.data.rank_slice, micro-batches under no_sync()), AdamW with our decay groups,
gradient clipping, the same bucket cap and the same threads per rank (torch.set_num_threads gets the
figure our rank's pools were limited to). The two libraries take turns in blocks of steps, all ranks
together (a barrier starts each block), so both see the same machine load; each block's first SETTLE
steps are not timed (the other library's threads are still winding down). A step's time is the
slowest rank's median: the slowest rank sets the pace of data parallelism.

`race_in_ranks` is that machinery for any peer: engine/bench/tp_peer.py races PyTorch's tensor
parallelism with it.

Imports torch inside the rank function only: the engine never depends on PyTorch.
"""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Callable

import numpy as np

from engine.comm.collectives import broadcast
from engine.comm.launch import run_ranks
from engine.config import Config, replace, to_dict

SETTLE, KEEP = 3, 5  # steps after a switch of library that are not timed; steps kept per block


def init_gloo(comm) -> None:
    """torch.distributed's gloo group over the same ranks: rank 0 picks a free loopback port and
    broadcasts it on our communicator."""
    import torch.distributed as dist
    port = np.zeros(1, np.int64)
    if comm.rank == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port[0] = probe.getsockname()[1]
    broadcast(comm, port)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{int(port[0])}", rank=comm.rank,
                            world_size=comm.world_size)


def race_ddp(cfg: Config, warmup: int = 5, steps: int = 20) -> dict | None:
    """Our step and PyTorch DDP's on cfg's world size, processes backend, taking turns; None when
    PyTorch is not installed. Step times in seconds; `comm_share`: ours, the share of the step our
    ranks waited on communication after backward."""
    return race_in_ranks(cfg, "engine.bench.ddp_peer:ddp_peer", warmup, steps)


def race_in_ranks(cfg: Config, make_peer: str, warmup: int = 5, steps: int = 20) -> dict | None:
    """Our Trainer and a PyTorch peer in the same `processes` ranks, taking turns in blocks of steps (the
    module docstring); None when PyTorch is not installed. `make_peer` names a function of engine.bench
    ("engine.bench.module:function": rank arguments cross as JSON, so a name, not the function) that runs
    in every rank once torch.distributed's gloo group is up, make_peer(cfg, comm, ours), and returns the
    peer's step, a function of the step index."""
    try:
        import torch  # noqa: F401 - only checking it is there
    except ImportError:
        return None
    cfg = replace(replace(cfg, "train.steps", warmup + steps + 1), "train.eval_every", 0)
    world = cfg.parallel.world_size
    results = run_ranks(world, "processes", _race_rank, args=(to_dict(cfg), warmup, steps, make_peer),
                        timeout_s=max(cfg.parallel.timeout_s, 120.0),
                        threads_per_rank=cfg.parallel.threads_per_rank)
    ours = max(statistics.median(r["ours"]) for r in results)
    theirs = max(statistics.median(r["torch"]) for r in results)
    wait = max(statistics.median(r["waits"]) for r in results)
    first = results[0]
    return {"ours_s": ours, "torch_s": theirs, "ratio": ours / theirs, "comm_share": wait / ours,
            "tokens": first["tokens"], "threads_per_rank": first["threads"], "torch": first["version"],
            "world_size": world, "global_batch": cfg.train.global_batch}


def _race_rank(comm, emit, cfg_dict: dict, warmup: int, steps: int, make_peer: str) -> dict:
    import importlib

    import torch
    import torch.distributed as dist

    from engine.config import from_dict
    from engine.trainer import Trainer

    cfg = from_dict(cfg_dict, source="<bench race>")
    torch.set_num_threads(max(1, comm.threads_per_rank))
    ours = Trainer(cfg, comm)
    init_gloo(comm)
    try:
        module, _, name = make_peer.partition(":")
        if not module.startswith("engine.bench."):
            raise ValueError(f"{make_peer!r} is not a peer of engine.bench")
        peer_step = getattr(importlib.import_module(module), name)(cfg, comm, ours)

        def torch_step(i: int) -> float:
            t0 = time.perf_counter()
            peer_step(i)
            return time.perf_counter() - t0

        def our_step() -> tuple[float, float]:
            s = ours.train_step()
            return s["step_time_s"], ours.replica.comm_wait_s

        mine: list[tuple[float, float]] = []
        theirs: list[float] = []
        for i in range(warmup):
            our_step()
            torch_step(i)
        i = warmup
        while len(theirs) < steps:
            comm.barrier()
            mine += [our_step() for _ in range(SETTLE + KEEP)][SETTLE:]
            comm.barrier()
            theirs += [torch_step(i + k) for k in range(SETTLE + KEEP)][SETTLE:]
            i += SETTLE + KEEP
        return {"ours": [t for t, _ in mine], "waits": [w for _, w in mine], "torch": theirs,
                "tokens": cfg.train.global_batch * ours.dataset.tokens_per_row,
                "threads": comm.threads_per_rank, "version": torch.__version__}
    finally:
        ours.replica.close()
        dist.destroy_process_group()


def ddp_peer(cfg: Config, comm, ours) -> Callable[[int], None]:
    """PyTorch DDP's step: the twin of our model (built after the replica's broadcast: rank 0's weights
    everywhere) in DistributedDataParallel with our bucket cap, AdamW with our decay groups."""
    from torch.nn.parallel import DistributedDataParallel

    from engine.bench.torch_peer import torch_adamw, torch_model_from
    twin = torch_model_from(ours.model)
    ddp = DistributedDataParallel(twin, bucket_cap_mb=cfg.parallel.bucket_cap_mb)
    opt = torch_adamw(twin, cfg.optim)
    return lambda i: _ddp_step(ddp, twin, opt, ours.dataset.global_batch(i, "train"), comm.rank,
                               comm.world_size, cfg)


def _ddp_step(ddp, twin, opt, batch, rank: int, world: int, cfg) -> None:
    """One PyTorch DDP step as our trainer takes it: this rank's slice of the global batch in
    micro-batches (gradients synchronised on the last one only), mean cross-entropy, global-norm
    clipping, AdamW."""
    import contextlib

    import torch
    import torch.nn.functional as F

    from engine.data import rank_slice
    n_micro = cfg.train.micro_batches
    opt.zero_grad(set_to_none=True)
    for micro in range(n_micro):
        x, y = rank_slice(batch, rank, world, micro, n_micro)
        inputs = torch.from_numpy(x)
        if inputs.is_floating_point():  # MLP features, in the model's dtype as our trainer feeds them
            inputs = inputs.to(next(twin.parameters()).dtype)
        sync = contextlib.nullcontext() if micro == n_micro - 1 else ddp.no_sync()
        with sync:
            logits = ddp(inputs)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).reshape(-1))
            (loss / n_micro).backward()
    if cfg.optim.grad_clip:
        torch.nn.utils.clip_grad_norm_(twin.parameters(), cfg.optim.grad_clip)
    opt.step()


def twin_losses(cfg: Config, steps: int, twin: str) -> list[list[float]]:
    """Every rank's losses of a PyTorch twin's first `steps` steps on cfg's layout (processes backend): the
    check that a peer trains what one device trains. `twin` names its class ("engine.bench.module:Class",
    built as Class(cfg, rank, dense_model, dataset), with step(i) -> this rank's loss)."""
    return run_ranks(cfg.parallel.world_size, "processes", _twin_losses_rank,
                     args=(to_dict(cfg), steps, twin), timeout_s=max(cfg.parallel.timeout_s, 120.0),
                     threads_per_rank=cfg.parallel.threads_per_rank)


def _twin_losses_rank(comm, emit, cfg_dict: dict, steps: int, twin: str) -> list[float]:
    import importlib

    import torch
    import torch.distributed as dist

    from engine.config import from_dict
    from engine.config.build import build_model, load_dataset
    module, _, name = twin.partition(":")
    if not module.startswith("engine.bench."):
        raise ValueError(f"{twin!r} is not a twin of engine.bench")
    cfg = from_dict(cfg_dict, source="<twin>")
    torch.set_num_threads(max(1, comm.threads_per_rank))
    dataset = load_dataset(cfg)
    init_gloo(comm)
    try:
        twin_class = getattr(importlib.import_module(module), name)
        peer = twin_class(cfg, comm.rank, build_model(cfg, dataset), dataset)
        return [peer.step(i) for i in range(steps)]
    finally:
        dist.destroy_process_group()

