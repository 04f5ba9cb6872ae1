"""TensorBoard event files in RUN_DIR/tensorboard: `tensorboard --logdir runs` shows every run.

Written with the `tensorboard` package's own event-file writer and protocol buffers (the ones PyTorch's
SummaryWriter writes through), as classic scalar summaries: one Event per step holding that step's
values. Not tensorboardX: it imports PyTorch whenever PyTorch is installed, which the engine never does.
"""

from __future__ import annotations

import time
from itertools import groupby
from pathlib import Path
from typing import Any

from engine.sinks.scalars import Point

FLUSH_S = 2.0  # a live `tensorboard --logdir` sees new points within a few seconds


def logdir(run_dir: str | Path) -> Path:
    """Where a run's event files go."""
    return Path(run_dir) / "tensorboard"


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, run_dir: Path, log_cfg) -> None:
        self.logdir = logdir(run_dir)
        self._writer: Any = None

    def open(self, started) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self._writer = EventFileWriter(str(self.logdir), flush_secs=FLUSH_S)

    def where(self) -> str:
        return f"event files in {self.logdir} (tensorboard --logdir {self.logdir})"

    def write(self, points: list[Point]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        assert self._writer is not None
        now = time.time()
        for step, group in groupby(points, key=lambda p: p.step):
            values = [Summary.Value(tag=p.tag, simple_value=p.value) for p in group]
            self._writer.add_event(Event(wall_time=now, step=step, summary=Summary(value=values)))

    def close(self, status: str) -> None:
        if self._writer is not None:
            self._writer.close()  # flushes, stops the writer's thread, closes the file


SINK = TensorBoardSink
