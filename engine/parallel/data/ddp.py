"""Distributed data parallelism (ZeRO stage 0): every rank holds everything, gradients are averaged.

Parameters and gradients live in one flat buffer each (engine.parallel.data.flat), so a gradient bucket is a
slice. Buckets (`bucket_cap_mb`) run in reverse parameter order, roughly the order backward
produces gradients; when the last gradient of a bucket is ready its all-reduce is handed to this
rank's communication thread and runs while backward continues. Buckets are issued strictly in
index order, so every rank issues the same collectives in the same order. With gradient
accumulation only the last micro-batch synchronises (like PyTorch's `no_sync`).

The optimizer side (overflow check, grad norm, AdamW, and in mixed precision the fp32 master, with
an fp32 gradient that exists only during the update) is engine.parallel.data.shard_optimizer and the rest
of the replica skeleton (scaler, step, events, communication thread) engine.parallel.data.replica, shared
with ZeRO 1-3: here the optimizer owns one piece, the whole buffer.

Read engine/parallel/data/by_hand_ddp.py first: the same training with no buckets, no overlap and no
replica skeleton, its ring all-reduce written out over send/recv after backward.
"""

from __future__ import annotations

import time

from engine.comm.collectives import broadcast
from engine.parallel.data.flat import FlatBuffer
from engine.parallel.data.replica import Replica
from engine.parallel.data.shard_optimizer import Piece


class DataParallel(Replica):
    """Replicated parameters, gradients and optimizer state; bucketed, overlapped all-reduce."""

    def __init__(self, cfg, model, comm):
        super().__init__(cfg, model, comm)
        self.flat = FlatBuffer(self.params, dtype=cfg.precision.dtype)
        if self.world > 1:
            broadcast(comm, self.flat.data, root=0)  # every rank starts from rank 0's weights
        self.ledger.hold("parameters", self.flat.data.nbytes)
        self.ledger.hold("gradients", self.flat.grad_buffer.nbytes)
        cap = int(cfg.parallel.bucket_cap_mb * 2**20)
        self.buckets, self._bucket_of = self.flat.buckets(cap), self.flat.bucket_map(cap)
        self._expected = [0] * len(self.buckets)
        for p in self.params:
            self._expected[self._bucket_of[id(p)]] += 1
        self._sync = True
        self._start(cfg, [Piece(self.flat.data, self.flat.grad_buffer, self.flat, 0)], sharded=False)

    # ------------------------------------------------------------------ gradients

    def zero_grad(self) -> None:
        self.flat.mark_grads_stale()

    def backward(self, loss, factor: float) -> None:
        super().backward(loss, factor)
        self.flat.zero_stale()  # before any bucket that waited on an unused parameter is reduced

    def begin_micro(self, sync: bool) -> None:
        """Only the micro-batch with sync=True all-reduces; earlier ones just accumulate."""
        self._sync = sync and self.world > 1
        self._ready = [0] * len(self.buckets)
        self._next = 0

    def _on_grad_ready(self, p) -> None:
        if not (self._sync and self.overlap):
            return
        b = self._bucket_of[id(p)]
        self._ready[b] += 1
        while self._next < len(self.buckets) and self._ready[self._next] == self._expected[self._next]:
            self._launch(self._next)

    def _reduce_rest(self) -> None:
        self.flat.zero_stale()  # finish_backward issues the buckets not issued yet

    def _launch(self, b: int) -> None:
        bucket = self.flat.grad_buffer[slice(*self.buckets[b])]
        self._worker.submit(lambda: self.topology.all_reduce(bucket, "avg"))
        self._next = b + 1

    def _finish_communication(self) -> None:
        """Issue the buckets not yet issued (unused parameters, overlap off), wait for all of them."""
        self.comm_wait_s = 0.0
        if not self._sync:
            return
        while self._next < len(self.buckets):
            self._launch(self._next)
        t0 = time.perf_counter()
        self._worker.wait_all()
        self.comm_wait_s = time.perf_counter() - t0

    # ------------------------------------------------------------------ checkpoint state

    def owned_range(self) -> tuple[int, int]:
        """Elements of the flat fp32 state this rank owns: all of them (DDP replicates everything)."""
        return 0, self.flat.numel

    def optimizer_state(self) -> dict:
        """fp32 copies of master (the parameters outside mixed precision), m, v over owned_range()."""
        state = self.optimizer.local_state()
        return {k: (v[:self.flat.numel] if k != "step" else v) for k, v in state.items()}

    def load_optimizer_state(self, full: dict) -> None:
        """Set master, m, v, step and the model-dtype parameters from unpadded full-length arrays."""
        self.optimizer.load_local(full["master"], full["m"], full["v"], full["step"])
