"""Data parallelism: replicas that wrap a finished model and a communicator (passed in, never global).

The model never knows it is distributed; a replica finds what it needs through the model's own API
(`parameters()`, `units()` for ZeRO-3's per-layer gathers, forward hooks, grad-ready hooks).

    file                 what
    by_hand_ddp.py       the readable start: a ring all-reduce written over send/recv, one after backward
    by_hand_zero1.py     then ZeRO-1 the same way: reduce-scatter, update the shard, all-gather parameters
    ddp.py               stage 0 (DDP): bucketed all-reduce overlapped with backward
    zero12.py            stages 1-2: optimizer state (and, stage 2, gradients) sharded over buckets
    zero3.py             stage 3: parameters sharded too, gathered layer by layer
                         (both shard over the world, or hybrid: inside a node, replicated across nodes)
    replica.py           the skeleton every replica shares (scaler, step, events, hooks, comm thread)
    topology.py          how its collectives run: all-reduce algorithm, node grid, "auto"'s crossovers,
                         and where ZeRO shards (the world, or each node under hybrid sharding)
    shard_optimizer.py   AdamW over the ranges a rank owns; overflow check; gradient norm
    tensor_split.py      those ranges under tensor parallelism: shards, replicas, partial (SP) gradients
    buckets.py           gradient buckets aligned to the world size
    worker.py            the per-rank communication thread

The replica interface, what the trainer calls in each step (and nothing else):

    zero_grad()                  start a step: clear gradients and the step's wait figure
    begin_micro(sync)            before each micro-batch; sync=True on the last one of the step
    backward(loss, factor)       backpropagate loss × factor × the loss scale, launching communication
                                 for gradients as they become ready
    finish_backward()            wait for the step's communication; this rank's gradients are final
    grad_norm() -> float         global unscaled gradient norm (collective where gradients are sharded)
    step(lr, clip, step) -> bool overflow check, then update; False when the step was skipped (fp16
                                 overflow: parameters, moments and step counter unchanged)
    drain_events() -> list       LossScaleChange events since the last call
    close()                      remove hooks, stop the communication thread

    loss_scale, scaler           the current scale and the scaler (its state goes into checkpoints)
    comm_wait_s, bytes_sent      seconds this step waited on communication; payload bytes it sent
    flat                         the standard layout (`slots`: every parameter's name and shape)

Checkpoint state, in the standard flat layout (parameter order, padded to the world size), fp32:

    owned_range() -> (lo, hi)    the elements this rank writes
    optimizer_state() -> dict    master, m, v over owned_range() and the step (collective)
    load_optimizer_state(full)   take this rank's part of unpadded full-length master, m, v, step

Threading: the trainer calls everything on the rank's thread; a replica's communication runs on its
CommWorker thread, and nothing else drives the communicator until finish_backward() returns. A replica of
a tensor-parallel model (engine.parallel.tensor), whose forward and backward drive the same transport on
the rank's thread, runs its communication there too (no second thread).

Under tensor parallelism `comm` is the rank's data-parallel group (engine.parallel.mesh), not the world:
the replica averages and shards over the ranks that hold the same tensor-parallel shard, and completes
the gradient norm, the overflow flag and sequence parallelism's partial gradients over the TP group
(tensor_split.py).
"""

from __future__ import annotations

from engine.parallel.data.ddp import DataParallel
from engine.parallel.data.zero3 import Zero3Replica
from engine.parallel.data.zero12 import ZeroReplica

REPLICAS: dict[int, type] = {0: DataParallel, 1: ZeroReplica, 2: ZeroReplica, 3: Zero3Replica}
ZERO_STAGES = tuple(REPLICAS)


def make_replica(cfg, model, comm):
    """The replica for cfg.parallel.zero_stage, wrapping `model` on this rank's `comm`."""
    stage = cfg.parallel.zero_stage
    if stage not in REPLICAS:
        raise ValueError(f"parallel.zero_stage must be one of {list(REPLICAS)}, got {stage}")
    return REPLICAS[stage](cfg, model, comm)
