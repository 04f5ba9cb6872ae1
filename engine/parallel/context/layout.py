"""Who holds which tokens of a sequence under context parallelism: the layouts, and the causal work they
give each rank.

A sequence of s tokens is cut into equal chunks; each of the c ranks of a context-parallel group holds
some of them, side by side, in sequence order:

    contiguous  c chunks of s/c; rank r holds chunk r
    zigzag      2c chunks of s/(2c); rank r holds chunks r and 2c-1-r

    s = 8 tokens, c = 2      positions  0 1 2 3 4 5 6 7
    contiguous               rank       0 0 0 0 1 1 1 1
    zigzag (4 chunks of 2)   rank       0 0 1 1 1 1 0 0

Causal attention lets a query see only keys at or before it, so a (query chunk, key chunk) block is
whole when the key chunk comes first, triangular on the diagonal, and skipped when the key chunk comes
later. Under the contiguous layout rank r computes r + 1 blocks (the last rank c, the first one): the
busiest rank sets the step, max/mean = 2c/(c+1). Under zigzag each rank pairs an early chunk with its
mirror late one and computes (r + 1) + (2c - r) = 2c + 1 blocks of s/(2c): the same on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.config.vocabulary import CONTEXT_LAYOUTS  # the layouts' names, written once


@dataclass(frozen=True)
class SequenceLayout:
    """How `degree` ranks split each sequence (`kind`: a CONTEXT_LAYOUTS name)."""
    kind: str
    degree: int

    def __post_init__(self) -> None:
        if self.kind not in CONTEXT_LAYOUTS:
            raise ValueError(f"context layout {self.kind!r} is not one of {', '.join(CONTEXT_LAYOUTS)}")
        if self.degree < 1:
            raise ValueError(f"a context-parallel degree must be >= 1, got {self.degree}")

    @property
    def n_chunks(self) -> int:
        """Chunks a sequence is cut into."""
        return 2 * self.degree if self.kind == "zigzag" else self.degree

    def chunks(self, rank: int) -> tuple[int, ...]:
        """The chunk indices `rank` holds, in sequence order."""
        if self.kind == "zigzag":
            return (rank, 2 * self.degree - 1 - rank)
        return (rank,)

    def chunk_length(self, seq_len: int) -> int:
        if seq_len % self.n_chunks:
            raise ValueError(f"a sequence of {seq_len} tokens does not cut into {self.n_chunks} equal chunks "
                             f"({self.kind} layout over {self.degree} ranks)")
        return seq_len // self.n_chunks

    def positions(self, seq_len: int, rank: int) -> np.ndarray:
        """The global positions of `rank`'s tokens of a sequence of `seq_len`, in the order it holds them."""
        n = self.chunk_length(seq_len)
        return np.concatenate([np.arange(c * n, (c + 1) * n) for c in self.chunks(rank)])

    def local(self, a: np.ndarray, rank: int, axis: int = 1) -> np.ndarray:
        """`rank`'s tokens of `a` (whole sequences along `axis`)."""
        return np.take(a, self.positions(a.shape[axis], rank), axis=axis)

    def causal_blocks(self, rank: int) -> int:
        """(query chunk, key chunk) blocks `rank` computes under causal attention."""
        return sum(q + 1 for q in self.chunks(rank))


def block_kind(q_chunk: int, k_chunk: int, causal: bool) -> str | None:
    """"full", "diagonal" (causal inside the block) or None (every score masked: skipped)."""
    if not causal or k_chunk < q_chunk:
        return "full"
    return "diagonal" if k_chunk == q_chunk else None
