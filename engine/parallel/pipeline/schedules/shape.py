"""A shape (ranks, micro-batches, chunks) a schedule cannot run: one line saying which and what works."""

from __future__ import annotations


class ShapeError(ValueError):
    """`parameter` ("ranks", "micro_batches" or "chunks") cannot be `value` here, because `reason`."""

    def __init__(self, parameter: str, value: int, reason: str):
        super().__init__(f"{parameter.replace('_', '-')} = {value}: {reason}")
        self.parameter, self.value, self.reason = parameter, value, reason


def require_one_chunk(name: str, chunks: int) -> None:
    if chunks != 1:
        raise ShapeError("chunks", chunks, f"{name} runs one model chunk per rank; only the interleaved "
                                           "schedule takes more")
