"""ZeRO stages 1 and 2: optimizer state (and, in stage 2, gradients) sharded over the ranks.

Layout: one model-dtype parameter buffer (engine.parallel.data.flat, padded to a multiple of N) cut into
buckets whose lengths are multiples of N (engine.parallel.data.buckets). Rank r owns part r of every bucket:
its optimizer state (fp32 master in mixed precision, Adam m, v) covers exactly those parts, and an ordinary
AdamW runs on each (engine.parallel.data.shard_optimizer). After the update every bucket is all-gathered from
its parts, so all ranks hold the full updated parameters again.

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

import numpy as np

from engine.comm.collectives import broadcast
from engine.parallel.data.buckets import aligned_buckets, part
from engine.parallel.data.flat import FlatBuffer
from engine.parallel.data.replica import ShardedReplica
from engine.parallel.data.shard_optimizer import Piece


class ZeroReplica(ShardedReplica):
    """Stage 1 or 2 (cfg.parallel.zero_stage). Piece and group b are this rank's part of bucket b and
    the bucket itself."""

    flat: FlatBuffer

    def __init__(self, cfg, model, comm):
        stage = cfg.parallel.zero_stage
        if stage not in (1, 2):
            raise ValueError(f"ZeroReplica implements stages 1 and 2, not {stage}")
        super().__init__(cfg, model, comm)
        self.stage = stage
        self.flat = FlatBuffer(self.params, dtype=cfg.precision.dtype, pad_to=self.shards, grad=stage == 1)
        if self.world > 1:
            broadcast(comm, self.flat.data, root=0)  # every rank starts from rank 0's weights
        self.buckets = aligned_buckets(self.flat, int(cfg.parallel.bucket_cap_mb * 2**20), self.shards)
        self.groups = [(b.start, b.end) for b in self.buckets]
        self.parts = [part(b.start, b.end, self.shard_rank, self.shards) for b in self.buckets]
        if stage == 1:
            grads = [self.flat.grad_buffer[lo:hi] for lo, hi in self.parts]
        else:
            self.grad_shard = np.zeros(sum(hi - lo for lo, hi in self.parts), dtype=self.flat.dtype)
            offsets = np.cumsum([0] + [hi - lo for lo, hi in self.parts]).tolist()
            grads = [self.grad_shard[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
        self.ledger.hold("parameters", self.flat.data.nbytes)
        self.ledger.hold("gradients", self.flat.grad_buffer.nbytes if stage == 1 else self.grad_shard.nbytes)
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._buckets_of: list[list[int]] = [[] for _ in self.params]
        for b, bucket in enumerate(self.buckets):
            for i in bucket.members:
                self._buckets_of[i].append(b)
        self._sync = True
        pieces = [Piece(self.flat.data[lo:hi], g, self.flat, lo) for (lo, hi), g in zip(self.parts, grads)]
        self._start(cfg, pieces, sharded=True)

    # ------------------------------------------------------------------ gradients

    def zero_grad(self) -> None:
        if self.stage == 1:
            self.flat.mark_grads_stale()
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
        super().backward(loss, factor)
        if self.stage == 1:
            self.flat.zero_stale()  # before the buckets left unfinished are reduced
        if self._sync:
            while self._next < len(self.buckets):
                self._launch(self._next)

    def _reduce_rest(self) -> None:
        """Stage 1: every bucket not reduce-scattered yet, now. Stage 2 reduces each micro-batch inside
        backward."""
        if self.stage != 1:
            super()._reduce_rest()
        self.flat.zero_stale()
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
        if self.stage == 1:
            buf = self.flat.grad_buffer[slice(*self.groups[b])]
            self._worker.submit(lambda: self.topology.reduce_scatter(buf, "avg"))
        else:
            self._reduce_into_shard(b, lambda buf: self._pack(b, buf))

    def _pack(self, b: int, buf: np.ndarray) -> None:
        """Stage 2: copy the bucket's gradients (zeros where a parameter has none) into its buffer and
        drop every p.grad whose last bucket this was."""
        bucket = self.buckets[b]
        for i in bucket.members:
            p, slot = self.params[i], self.flat.slots[i]
            lo, hi = max(slot.start, bucket.start), min(slot.end, bucket.end)
            if p.grad is not None:
                buf[lo - bucket.start:hi - bucket.start] = p.grad.reshape(-1)[lo - slot.start:hi - slot.start]
            self._copies_left[i] -= 1
            if self._copies_left[i] == 0 and p.grad is not None:
                self.ledger.sub("gradients", p.grad.nbytes)
                p.grad = None

    # ------------------------------------------------------------------ update

    def step(self, lr: float, clip: float, step: int) -> bool:
        """Overflow check (MAX over ranks), then update the owned parts and all-gather every bucket;
        False (nothing changed) when the step is skipped."""
        if not super().step(lr, clip, step):
            return False
        for start, end in self.groups:
            self.topology.all_gather(self.flat.data[start:end])
        return True

    # ------------------------------------------------------------------ checkpoint state

    def _keep_owned(self, b: int, whole: np.ndarray, out: np.ndarray, start: int, end: int) -> None:
        """The flat layout is the standard one: keep the overlap of bucket b with [start, end)."""
        lo, hi = self.groups[b]
        x, y = max(start, lo), min(end, hi)
        if x < y:
            out[x - start:y - start] = whole[x - lo:y - lo]

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
