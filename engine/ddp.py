"""Distributed data parallelism (ZeRO stage 0): every rank holds everything, gradients are averaged.

Parameters and gradients live in one flat buffer each (engine.flat), so a gradient bucket is a
slice. Buckets (`bucket_cap_mb`) run in reverse parameter order, roughly the order backward
produces gradients; when the last gradient of a bucket is ready its all-reduce is handed to this
rank's communication thread and runs while backward continues. Buckets are issued strictly in
index order, so every rank issues the same collectives in the same order. With gradient
accumulation only the last micro-batch synchronises (like PyTorch's `no_sync`).

`NaiveDataParallel` is the teaching version: one all-reduce of the whole buffer after backward.
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np

from engine.amp import make_scaler
from engine.comm.collectives import all_reduce, broadcast
from engine.flat import FlatBuffer, resolve_dtype
from engine.optim import AdamW, sum_of_squares

_LOW_PRECISION = (np.dtype(np.float16), resolve_dtype("bf16"))


class DataParallel:
    """Replicated parameters, gradients and optimizer state; bucketed, overlapped all-reduce."""

    def __init__(self, cfg, model, comm):
        self.comm, self.world = comm, comm.world_size
        self.params = model.parameters()
        self.flat = FlatBuffer(self.params, dtype=cfg.precision.dtype)
        if self.world > 1:
            broadcast(comm, self.flat.data, root=0)  # every rank starts from rank 0's weights
        self.low_precision = self.flat.dtype in _LOW_PRECISION
        if self.low_precision:  # fp32 master weights and gradients for the optimizer
            self.master = self.flat.master_copy()
            self.master_grad = np.zeros_like(self.master)
        else:
            self.master, self.master_grad = self.flat.data, self.flat.grad
        o = cfg.optim
        self.optimizer = AdamW(self.master, self.master_grad, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                               weight_decay=o.weight_decay, decay_mask=self.flat.decay_mask())
        self.scaler = make_scaler(cfg.precision)
        self.overlap = cfg.parallel.overlap
        self.buckets = self.flat.buckets(int(cfg.parallel.bucket_cap_mb * 2**20))
        self._bucket_of = self.flat.bucket_map(int(cfg.parallel.bucket_cap_mb * 2**20))
        self._expected = [0] * len(self.buckets)
        for p in self.params:
            self._expected[self._bucket_of[id(p)]] += 1
        self._sync = True
        self._comm = _CommThread(comm) if self.world > 1 else None
        self.comm_wait_s = 0.0
        self._events: list = []
        self._remove_hooks = [p.register_grad_ready_hook(self._on_grad_ready) for p in self.params]

    # ------------------------------------------------------------------ gradients

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale

    @property
    def bytes_sent(self) -> int:
        """Payload bytes this rank sent in the current step (all phases)."""
        return self.comm.meter.bytes_sent() if self.comm.meter is not None else 0

    def zero_grad(self) -> None:
        self.flat.zero_grad()

    def begin_micro(self, sync: bool) -> None:
        """Only the micro-batch with sync=True all-reduces; earlier ones just accumulate."""
        self._sync = sync and self.world > 1
        self._ready = [0] * len(self.buckets)
        self._next = 0

    def backward(self, loss, factor: float) -> None:
        """Backpropagate loss × factor × the loss scale (the scale is 1 unless fp16 scaling is on)."""
        scale = self.scaler.scale * factor
        (loss * scale if scale != 1.0 else loss).backward()

    def _on_grad_ready(self, p) -> None:
        if not (self._sync and self.overlap):
            return
        b = self._bucket_of[id(p)]
        self._ready[b] += 1
        while self._next < len(self.buckets) and self._ready[self._next] == self._expected[self._next]:
            self._launch(self._next)

    def _launch(self, b: int) -> None:
        start, end = self.buckets[b]
        self._comm.submit(self.flat.grad[start:end])
        self._next = b + 1

    def finish_backward(self) -> None:
        """Issue the buckets not yet issued (unused parameters, overlap off), wait for all of them."""
        if not self._sync:
            self.comm_wait_s = 0.0
            self._finish_master_grad()
            return
        while self._next < len(self.buckets):
            self._launch(self._next)
        t0 = time.perf_counter()
        self._comm.wait()
        self.comm_wait_s = time.perf_counter() - t0
        self._finish_master_grad()

    def _finish_master_grad(self) -> None:
        if self.low_precision:
            self.master_grad[:] = self.flat.grad  # upcast into the fp32 optimizer gradient
        inv = 1.0 / self.scaler.scale
        if inv != 1.0:
            self.master_grad *= inv

    def grad_norm(self) -> float:
        return float(np.sqrt(sum_of_squares(self.master_grad)))

    # ------------------------------------------------------------------ update

    def step(self, lr: float, clip: float, step: int) -> bool:
        """Apply the update unless the gradients overflowed; False means the step was skipped."""
        found = self.scaler.check(self.master_grad, self.flat)
        change = self.scaler.update(step, found)
        if change is not None:
            self._events.append(change)
        if found is not None:
            return False
        if clip != 1.0:
            self.master_grad *= clip
        self.optimizer.step(lr)
        if self.low_precision:
            self.flat.load_master(self.master)
        return True

    def drain_events(self) -> list:
        out, self._events = self._events, []
        return out

    def close(self) -> None:
        for remove in self._remove_hooks:
            remove()
        if self._comm is not None:
            self._comm.close()


class NaiveDataParallel(DataParallel):
    """No buckets, no overlap: after backward, one all-reduce of the whole gradient buffer."""

    def _on_grad_ready(self, p) -> None:
        pass

    def finish_backward(self) -> None:
        t0 = time.perf_counter()
        if self._sync:
            all_reduce(self.comm, self.flat.grad, op="avg")
        self.comm_wait_s = time.perf_counter() - t0
        self._finish_master_grad()


class _CommThread:
    """One thread per rank that runs bucket all-reduces in submission order, off the backward thread."""

    def __init__(self, comm):
        self.comm = comm
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"comm-rank{comm.rank}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (buf := self._queue.get()) is not None:
            try:
                if self._error is None:
                    all_reduce(self.comm, buf, op="avg")
            except BaseException as e:  # handed to the training thread in wait()
                self._error = e
            finally:
                self._queue.task_done()

    def submit(self, buf: np.ndarray) -> None:
        self._queue.put(buf)

    def wait(self) -> None:
        self._queue.join()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)
