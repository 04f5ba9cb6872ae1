"""ZeRO stages 1 and 2: optimizer state (and, in stage 2, gradients) sharded over the ranks.

Layout: one model-dtype parameter buffer (engine.flat, padded to a multiple of N) cut into buckets
whose lengths are multiples of N (engine.zero_comm.aligned_buckets). Rank r owns part r of every
bucket: its optimizer state (fp32 master in mixed precision, Adam m, v) covers exactly those parts,
and an ordinary AdamW runs on each (engine.zero_shard). After the update every bucket is all-gathered
from its parts, so all ranks hold the full updated parameters again.

Stage 1 keeps a full gradient buffer, as DDP does: micro-batches accumulate into it, and on the last
one each bucket is reduce-scattered (not all-reduced: a rank needs only its part) as soon as its
gradients are ready, overlapping the rest of backward. Traffic per step: reduce-scatter + all-gather
= 2Ψ(N−1)/N elements per rank, the same as DDP's all-reduce.

Stage 2 has no full gradient buffer. The tape leaves each parameter's gradient in `p.grad`; when a
bucket's parameters are all ready their gradients are copied into a bucket buffer, the `p.grad`
arrays are dropped, and the buffer is reduce-scattered on the communication thread and its part r
added into this rank's gradient shard, then freed. A rank holds its gradient shard plus the buckets
in flight (plus the `p.grad` arrays of parameters whose bucket is not complete yet). Gradient
accumulation: every micro-batch is reduce-scattered into the shard (the full gradient never exists
between micro-batches), which costs (M−1)·Ψ(N−1)/N extra elements per step for M micro-batches.
At most two buckets are in flight (double buffering: packing a third waits for the oldest), so a slow
network cannot pile up buffers; with `overlap = false` each bucket is reduced on the spot.
"""

from __future__ import annotations

import time

import numpy as np

from engine.amp import make_scaler
from engine.comm.collectives import all_gather, broadcast, reduce_scatter
from engine.flat import FlatBuffer
from engine.zero_comm import CommWorker, aligned_buckets, part, rank_ledger
from engine.zero_shard import Piece, ShardOptimizer


class ZeroReplica:
    """Stage 1 (`stage=1`) or stage 2 (`stage=2`); the replica interface of engine.ddp.DataParallel."""

    def __init__(self, cfg, model, comm, stage: int):
        if stage not in (1, 2):
            raise ValueError(f"ZeroReplica implements stages 1 and 2, not {stage}")
        self.stage, self.comm = stage, comm
        self.rank, self.world = comm.rank, comm.world_size
        self.ledger = rank_ledger()
        self.params = model.parameters()
        self.flat = FlatBuffer(self.params, dtype=cfg.precision.dtype, pad_to=self.world, grad=stage == 1)
        if self.world > 1:
            broadcast(comm, self.flat.data, root=0)  # every rank starts from rank 0's weights
        self.buckets = aligned_buckets(self.flat, int(cfg.parallel.bucket_cap_mb * 2**20), self.world)
        self.parts = [part(b.start, b.end, self.rank, self.world) for b in self.buckets]
        if stage == 1:
            grads = [self.flat.grad[lo:hi] for lo, hi in self.parts]
        else:
            self.grad_shard = np.zeros(sum(hi - lo for lo, hi in self.parts), dtype=self.flat.dtype)
            offsets = np.cumsum([0] + [hi - lo for lo, hi in self.parts]).tolist()
            grads = [self.grad_shard[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
        self.ledger.hold("parameters", self.flat.data.nbytes)
        self.ledger.hold("gradients", self.flat.grad.nbytes if stage == 1 else self.grad_shard.nbytes)
        pieces = [Piece(self.flat.data[lo:hi], g, self.flat, lo) for (lo, hi), g in zip(self.parts, grads)]
        self.optimizer = ShardOptimizer(cfg, pieces, comm, sharded=True,
                                        param_names=[s.name for s in self.flat.slots], ledger=self.ledger)
        self.scaler = make_scaler(cfg.precision)
        self.overlap = cfg.parallel.overlap
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._buckets_of: list[list[int]] = [[] for _ in self.params]
        for b, bucket in enumerate(self.buckets):
            for i in bucket.members:
                self._buckets_of[i].append(b)
        self._worker = CommWorker(self.rank, inline=self.world == 1)
        self._sync = True
        self._inflight: list = []  # stage 2: bucket buffers being reduced (at most two)
        self.comm_wait_s = 0.0
        self._events: list = []
        self._remove_hooks = [p.register_grad_ready_hook(self._on_grad_ready) for p in self.params]

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale

    @property
    def bytes_sent(self) -> int:
        """Payload bytes this rank sent in the current step (all phases)."""
        return self.comm.meter.bytes_sent() if self.comm.meter is not None else 0

    # ------------------------------------------------------------------ gradients

    def zero_grad(self) -> None:
        if self.stage == 1:
            self.flat.zero_grad()
        else:
            self.grad_shard.fill(0)
        self.comm_wait_s = 0.0

    def begin_micro(self, sync: bool) -> None:
        """Stage 1 reduces on the last micro-batch only (sync=True); stage 2 reduces every micro-batch."""
        self._sync = sync or self.stage == 2
        self._ready = [0] * len(self.buckets)
        self._copies_left = [len(bs) for bs in self._buckets_of]  # stage 2: buckets yet to copy p.grad
        self._next = 0

    def backward(self, loss, factor: float) -> None:
        """Backpropagate loss × factor × the loss scale, then issue the buckets backward left unfinished
        (parameters without a gradient), so every micro-batch issues every bucket, in order."""
        scale = self.scaler.scale * factor
        (loss * scale if scale != 1.0 else loss).backward()
        if self._sync:
            while self._next < len(self.buckets):
                self._launch(self._next)

    def _on_grad_ready(self, p) -> None:
        if not self._sync:
            return  # stage 1, not the last micro-batch: accumulate in the flat gradient buffer
        i = self._index[id(p)]
        if self.stage == 2 and p.grad is not None:
            self.ledger.add("gradients", p.grad.nbytes)
        for b in self._buckets_of[i]:
            self._ready[b] += 1
        if not self.overlap and self.stage == 1:
            return  # stage 1 without overlap reduces everything after backward
        while self._next < len(self.buckets) and self._bucket_complete(self._next):
            self._launch(self._next)

    def _bucket_complete(self, b: int) -> bool:
        return self._ready[b] == len(self.buckets[b].members)

    def _launch(self, b: int) -> None:
        self._next = b + 1
        bucket, (lo, hi) = self.buckets[b], self.parts[b]
        if self.stage == 1:
            buf = self.flat.grad[bucket.start:bucket.end]
            self._worker.submit(lambda: reduce_scatter(self.comm, buf, op="avg"))
            return
        self.comm_wait_s += self._worker.throttle(self._inflight, 2)  # at most two buckets in flight
        buf = self._pack(b)
        shard = self.optimizer.pieces[b].grad

        def reduce_into_shard() -> None:
            reduce_scatter(self.comm, buf, op="avg")
            np.add(shard, buf[lo - bucket.start:hi - bucket.start], out=shard)
            self.ledger.sub("comm_buffers", buf.nbytes)
        self._inflight.append(self._worker.submit(reduce_into_shard))
        if not self.overlap:
            self.comm_wait_s += self._worker.throttle(self._inflight, 1)

    def _pack(self, b: int) -> np.ndarray:
        """Stage 2: copy the bucket's gradients (zeros where a parameter has none) into a new buffer and
        drop every p.grad whose last bucket this was."""
        bucket = self.buckets[b]
        buf = np.zeros(bucket.end - bucket.start, dtype=self.flat.dtype)
        self.ledger.add("comm_buffers", buf.nbytes)
        for i in bucket.members:
            p, slot = self.params[i], self.flat.slots[i]
            lo, hi = max(slot.start, bucket.start), min(slot.end, bucket.end)
            if p.grad is not None:
                buf[lo - bucket.start:hi - bucket.start] = p.grad.reshape(-1)[lo - slot.start:hi - slot.start]
            self._copies_left[i] -= 1
            if self._copies_left[i] == 0 and p.grad is not None:
                self.ledger.sub("gradients", p.grad.nbytes)
                p.grad = None
        return buf

    def finish_backward(self) -> None:
        """Wait for the buckets in flight: this rank's gradient parts are then final (still scaled by
        the loss scale; step() unscales them)."""
        t0 = time.perf_counter()
        self._worker.wait_all()
        self._inflight.clear()
        self.comm_wait_s += time.perf_counter() - t0

    def grad_norm(self) -> float:
        """Global unscaled gradient norm from the shards (all-reduced sum of squares)."""
        return self.optimizer.grad_norm(self.scaler.scale)

    # ------------------------------------------------------------------ update

    def step(self, lr: float, clip: float, step: int) -> bool:
        """Overflow check (MAX over ranks), then update the owned parts and all-gather every bucket;
        False (nothing changed) when the step is skipped."""
        found = self.optimizer.find_overflow(self.scaler)
        scale = self.scaler.scale  # the scale this step's gradients carry
        change = self.scaler.update(step, found)
        if change is not None:
            self._events.append(change)
        if found is not None:
            return False
        self.optimizer.update(lr, clip, scale)
        for bucket in self.buckets:
            all_gather(self.comm, self.flat.data[bucket.start:bucket.end])
        return True

    def drain_events(self) -> list:
        out, self._events = self._events, []
        return out

    def close(self) -> None:
        for remove in self._remove_hooks:
            remove()
        self._worker.close()

    # ------------------------------------------------------------------ checkpoint state

    def owned_range(self) -> tuple[int, int]:
        """This rank's equal, contiguous share of the padded flat state, as checkpoints store it. (Its
        optimizer really owns part r of every bucket; optimizer_state() regroups.)"""
        n = self.flat.size // self.world
        return self.rank * n, (self.rank + 1) * n

    def optimizer_state(self) -> dict:
        """Master, m, v over owned_range() (fp32 copies) and the step. Collective: the bucket parts are
        all-gathered one bucket and one kind at a time, and each rank keeps its contiguous range."""
        local = self.optimizer.local_state()
        start, end = self.owned_range()
        out = {"step": local["step"]}
        for key in ("master", "m", "v"):
            out[key] = np.zeros(end - start, dtype=local[key].dtype)
            for bucket, (lo, hi), (a, b) in zip(self.buckets, self.parts, self.optimizer.bounds):
                tmp = np.zeros(bucket.end - bucket.start, dtype=local[key].dtype)
                self.ledger.add("temporaries", tmp.nbytes)
                tmp[lo - bucket.start:hi - bucket.start] = local[key][a:b]
                all_gather(self.comm, tmp)
                x, y = max(start, bucket.start), min(end, bucket.end)
                if x < y:
                    out[key][x - start:y - start] = tmp[x - bucket.start:y - bucket.start]
                self.ledger.sub("temporaries", tmp.nbytes)
        return out

    def load_optimizer_state(self, full: dict) -> None:
        """Set this rank's parts of master, m, v, the step, and all model-dtype parameters, from
        unpadded full-length arrays (no communication: every rank reads what it needs)."""
        local = {}
        for key in ("master", "m", "v"):
            padded = np.zeros(self.flat.size, dtype=self.optimizer.m.dtype)
            padded[:self.flat.numel] = full[key]
            local[key] = np.concatenate([padded[lo:hi] for lo, hi in self.parts])
            if key == "master":
                np.copyto(self.flat.data, padded, casting="unsafe")
        self.optimizer.load_local(local["master"], local["m"], local["v"], full["step"])
