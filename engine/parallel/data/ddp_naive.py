"""Data parallelism in its plainest form, the readable starting point for engine/parallel/data/ddp.py: no
buckets, no overlap — after backward, one all-reduce of the whole gradient buffer, averaged over the
ranks. Everything else (flat buffers, optimizer, loss scaling, checkpoint state) is DataParallel's.
"""

from __future__ import annotations

import time

from engine.parallel.data.ddp import DataParallel


class NaiveDataParallel(DataParallel):
    """No buckets, no overlap: after backward, one all-reduce of the whole gradient buffer."""

    def _on_grad_ready(self, p) -> None:
        pass

    def finish_backward(self) -> None:
        t0 = time.perf_counter()
        if self._sync:
            self.topology.all_reduce(self.flat.grad_buffer, "avg")
        self.comm_wait_s = time.perf_counter() - t0
