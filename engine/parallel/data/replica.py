"""The replica skeleton around the shard optimizer: `Replica` for every stage (the loss scaler, the
step with its overflow skip, the scaler's events, the communication thread and the hooks it installs),
`ShardedReplica` for ZeRO 1-3 (gradient groups reduce-scattered into the shard, checkpoint state
regrouped into the standard layout). The interface they implement is written down in
engine/parallel/data/__init__.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext

import numpy as np

from engine.loss_scale import make_scaler
from engine.memory.ledger import rank_ledger
from engine.parallel.context.view import context_of
from engine.parallel.data.flat import FlatLayout
from engine.parallel.data.shard_optimizer import Piece, ShardOptimizer
from engine.parallel.data.topology import Topology
from engine.parallel.data.worker import CommTask, CommWorker
from engine.parallel.expert.plan import replicated_parameters
from engine.parallel.tensor import model_layout


class Replica:
    """What every replica holds and does alike: the loss scaler, the ShardOptimizer over its pieces, the
    step with its overflow skip, the scaler's events, a communication thread and the hooks it installs.
    A subclass lays out and holds its storage between `__init__` and `_start`."""

    def __init__(self, cfg, model, comm):
        self.comm, self.rank, self.world = comm, comm.rank, comm.world_size
        self.topology = Topology(cfg, comm)  # algorithm, node grid, where ZeRO shards
        self.ledger = rank_ledger()  # captured here: the communication thread reports to it too
        self.params = replicated_parameters(model)  # split experts are reduced over their own group
        self.layout = model_layout(model)  # the tensor-parallel split around this replica, if any
        # collectives inside forward and backward (tensor-parallel ones, ring attention's hops)
        self.model_communicates = (self.layout.degree > 1 or context_of(model).degree > 1
                                   or len(self.params) < len(model.parameters()))  # experts' all-to-alls
        self.overlap = cfg.parallel.overlap
        self.comm_wait_s = 0.0
        self._events: list = []
        self._final: set[int] | None = None  # ids of the armed parameters (reduce_when_final); None: none
        # the overflow check of parameters held beside this replica (split experts: engine.parallel.expert),
        # called with this replica's agreed answer and returning the one for both; None: nothing beside
        self.overflow_beside: Callable | None = None

    def _start(self, cfg, pieces: list[Piece], sharded: bool) -> None:
        """Once the storage is laid out: the optimizer over `pieces`, the loss scaler, the communication
        thread (none with one rank: jobs then run inline) and the gradient-ready hooks."""
        self.optimizer = ShardOptimizer(cfg, pieces, self.topology.shard_comm, sharded=sharded,
                                        param_names=[str(p.name) for p in self.params], ledger=self.ledger,
                                        layout=self.layout)
        self.scaler = make_scaler(cfg.precision)
        # One thread drives a communicator at a time (engine.comm.base), and a tensor-parallel model runs
        # its collectives on the rank's thread, inside forward and backward, over the same transport as
        # this replica's group. So with a tensor-parallel model (or ring attention's hops) the replica's
        # collectives run on the rank's thread too, where backward reaches them (in the same order on every
        # rank), not on a second one.
        self._worker = CommWorker(self.rank, inline=self.world == 1 or self.model_communicates)
        self._remove_hooks = [p.register_grad_ready_hook(self._grad_ready) for p in self.params]

    def _grad_ready(self, p) -> None:
        """The hook `_start` installs. While a pipeline arms its parameters (reduce_when_final), only an
        armed parameter's gradient counts, and once: it is that parameter's last of the step."""
        if self._final is not None:
            if id(p) not in self._final:
                return
            self._final.remove(id(p))
        self._on_grad_ready(p)

    def _on_grad_ready(self, p) -> None:
        """p's gradient is final for this backward. Every replica defines it."""
        raise NotImplementedError

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale

    @property
    def bytes_sent(self) -> int:
        """Payload bytes this rank sent in the current step (all phases)."""
        return self.comm.meter.bytes_sent() if self.comm.meter is not None else 0

    def backward(self, loss, factor: float) -> None:
        """Backpropagate loss × factor × the loss scale (the scale is 1 unless fp16 scaling is on). Under
        a scaler that checks for overflow, inf and nan gradients are expected results that it finds and
        skips, so NumPy's warnings about them are off meanwhile."""
        scale = self.scaler.scale * factor
        quiet = np.errstate(over="ignore", invalid="ignore") if self.scaler.checks_overflow else nullcontext()
        with quiet:
            (loss * scale if scale != 1.0 else loss).backward()

    def grad_norm(self) -> float:
        """Global unscaled gradient norm (from the shards' all-reduced sum of squares when sharded)."""
        return self.optimizer.grad_norm(self.scaler.scale)

    def step(self, lr: float, clip: float, step: int) -> bool:
        """Overflow check, then update the owned pieces unless the gradients overflowed; False means the
        step was skipped (the parameters, moments, optimizer step count and, since the trainer then keeps
        its step, the LR schedule stay exactly as they were)."""
        found = self.optimizer.find_overflow(self.scaler)
        if self.overflow_beside is not None:
            found = self.overflow_beside(found)
        scale = self.scaler.scale  # the scale this step's gradients carry
        change = self.scaler.update(step, found)
        if change is not None:
            self._events.append(change)
        if found is not None:
            return False
        self.optimizer.update(lr, clip, scale)
        return True

    def finish_backward(self) -> None:
        """Wait for the step's gradient communication; this rank's gradients (or their shard) are then
        final: still scaled by the loss scale (step() unscales them), and under sequence parallelism
        summed over the tensor-parallel group (the partial ones)."""
        self._finish_communication()
        self.optimizer.sum_partial_grads()

    def _finish_communication(self) -> None:
        raise NotImplementedError

    def begin_micro(self, sync: bool) -> None:
        """Before a micro-batch's backward: `sync` (its gradients are the step's last) lets its buckets go."""
        raise NotImplementedError

    def reduce_when_final(self, params) -> None:
        """Gradients accumulated outside `backward` (a pipeline stage's backwards, in its schedule's order,
        engine.parallel.pipeline.final_reduce): the next gradient each of `params` gets is its last of the
        step. From now on those gradients count towards their buckets, and a bucket whose parameters have
        all had theirs is reduced at once, in bucket order, as the last micro-batch's backward does; any other
        parameter's gradient still just accumulates. reduce_accumulated() reduces the rest."""
        if self._final is None:  # the step's first call: the synchronising backward begins
            self.begin_micro(sync=True)
            self._final = set()
        self._final.update(id(p) for p in params)

    def reduce_accumulated(self) -> None:
        """Gradients were accumulated outside `backward`: reduce those reduce_when_final has not, as the last
        micro-batch's backward would have; finish_backward() then waits for all of it as usual."""
        if self._final is None:
            self.begin_micro(sync=True)
        self._final = None
        self._reduce_rest()

    def _reduce_rest(self) -> None:
        """Issue every bucket not issued yet (zeroing the gradients nothing wrote this step first)."""
        raise NotImplementedError(f"{type(self).__name__} reduces inside its own backward")

    def drain_events(self) -> list:
        out, self._events = self._events, []
        return out

    def close(self) -> None:
        for remove in self._remove_hooks:
            remove()
        self._worker.close()


class ShardedReplica(Replica):
    """ZeRO 1-3: piece i is this rank's part of group i (a bucket or a unit), which spans `groups[i]` =
    [start, end) of the layout the piece's offset counts in. Gradient groups are reduce-scattered on
    the communication thread into the gradient shard; checkpoint state is regrouped into the rank's
    contiguous share of the standard layout (`flat`).

    State is split into `shards` parts and this rank holds part `shard_rank`: over the world, or under
    hybrid sharding over the rank's node (every node then holds the same parts;
    engine.parallel.data.topology)."""

    groups: list[tuple[int, int]]
    flat: FlatLayout

    def __init__(self, cfg, model, comm):
        super().__init__(cfg, model, comm)
        self.shard_rank, self.shards = self.topology.shard_comm.rank, self.topology.shard_comm.world_size
        self._inflight: list[tuple[CommTask, np.ndarray]] = []  # gradient buffers being reduced (<= 2)

    def _reduce_into_shard(self, i: int, pack: Callable[[np.ndarray], None]) -> None:
        """Reduce-scatter group i on the communication thread and add this rank's part into piece i's
        gradient. `pack(buf)` fills the group's new buffer, allocated only once fewer than two are in
        flight (double buffering: a slow network cannot pile up buffers); without overlap the reduction
        is finished before this returns."""
        self._retire(keep=1)
        piece, (start, end) = self.optimizer.pieces[i], self.groups[i]
        buf = np.zeros(end - start, dtype=piece.param.dtype)
        self.ledger.add("comm_buffers", buf.nbytes)
        pack(buf)
        shard, lo = piece.grad, piece.offset - start

        def reduce_into_shard() -> None:
            self.topology.reduce_scatter(buf, "avg")
            np.add(shard, buf[lo:lo + shard.size], out=shard)
        self._inflight.append((self._worker.submit(reduce_into_shard), buf))
        if not self.overlap:
            self._retire(keep=0)

    def _retire(self, keep: int) -> None:
        """Wait until at most `keep` buffers are in flight, oldest first, and release them. A buffer counts
        as held until this rank's thread retires it, whenever its reduction really ended: its task keeps
        it alive until then, and the ledger's figure does not depend on the communication thread's timing."""
        t0 = time.perf_counter()
        while len(self._inflight) > keep:
            task, buf = self._inflight.pop(0)
            task.wait()
            self.ledger.sub("comm_buffers", buf.nbytes)
        self.comm_wait_s += time.perf_counter() - t0

    def _finish_communication(self) -> None:
        """Wait for the groups in flight."""
        t0 = time.perf_counter()
        self._worker.wait_all()
        self.comm_wait_s += time.perf_counter() - t0
        self._retire(keep=0)

    def owned_range(self) -> tuple[int, int]:
        """This rank's equal, contiguous share of the standard padded layout, as checkpoints store it.
        (Its optimizer really owns part r of every group; optimizer_state() regroups.)"""
        return self.flat.shard_range(self.shard_rank, self.shards)

    def optimizer_state(self) -> dict:
        """Master, m, v over owned_range() (fp32 copies) and the step. Collective: each group's parts are
        all-gathered (one group and one kind at a time, as a temporary; inside the node under hybrid
        sharding) and every rank keeps what falls in its range."""
        local = self.optimizer.local_state()
        start, end = self.owned_range()
        out = {"step": local["step"]}
        for key in ("master", "m", "v"):
            out[key] = np.zeros(end - start, dtype=local[key].dtype)
            for i, (piece, (a, b)) in enumerate(zip(self.optimizer.pieces, self.optimizer.bounds)):
                g_start, g_end = self.groups[i]
                whole = np.zeros(g_end - g_start, dtype=local[key].dtype)
                self.ledger.add("temporaries", whole.nbytes)
                lo = piece.offset - g_start  # where this rank's part sits in the group
                whole[lo:lo + b - a] = local[key][a:b]
                self.topology.all_gather(whole)
                self._keep_owned(i, whole, out[key], start, end)
                self.ledger.sub("temporaries", whole.nbytes)
        return out

    def _keep_owned(self, i: int, whole: np.ndarray, out: np.ndarray, start: int, end: int) -> None:
        """Copy what of group i (gathered in `whole`) falls in [start, end) of the standard layout into
        `out`, which covers [start, end)."""
        raise NotImplementedError
