"""What context parallelism changes in one rank's memory, for the estimator.

A rank of a context-parallel group of c holds s/c tokens of every sequence of its rows (b rows of s tokens,
width h, t the tensor degree). Everything it keeps for backward is the one-device list over its own tokens:
every activation divides by c, attention's log-sum-exp included (ring attention keeps what the fused
attention keeps: q, k, v, the output and lse of its own tokens, never another rank's keys). The token ids
and targets are the rank's own slices, new arrays of b·s/c each (at c = 1 they are views of the global
batch, which the ledger counts whole).

In flight (communication buffers), while a block's attention runs its ring (engine.parallel.context). A hop
runs during the blocks (double buffering): its receive buffers are held beside what it sends, from its post
to its wait, so longer than when a hop ran after the blocks, but never more of them at once:

    forward    the travelling keys and values 2·b·(s/c)·(h/t) elements of the training dtype, and during
               a hop the received ones as well: 2 x that at the most
    backward   the keys and values again plus their gradients' accumulator (the compute dtype: float32 for
               16-bit training), and the received ones during a hop: 2 x (both) at the most (the keys and
               values of the next hop arrive while the accumulator of the last one is still on its way)

The ring runs once per block forward (again for a recomputed block) and once backward; between blocks it
holds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.dtypes import compute_dtype, itemsize, resolve_dtype


@dataclass(frozen=True)
class ContextSplit:
    """How a rank's sequence divides: `c` the context-parallel degree."""
    c: int = 1

    @classmethod
    def of(cls, cfg) -> ContextSplit:
        return cls(cfg.parallel.context)

    def tokens(self, block_size: int) -> int:
        """Tokens of each sequence this rank holds."""
        return block_size // self.c

    def id_rows(self, global_batch: int, micro: int) -> int:
        """Rows of the token-id and target arrays a rank keeps: the global batch's (views of it) at c = 1,
        its micro-batch's own slices otherwise."""
        return global_batch if self.c == 1 else micro

    def ring_buffers(self, cfg, micro: int) -> tuple[int, int]:
        """(forward, backward): the most bytes a block's ring holds in flight, for `micro` rows."""
        if self.c == 1:
            return 0, 0
        m, dtype = cfg.model, cfg.precision.dtype
        elements = 2 * micro * self.tokens(m.block_size) * (m.n_embd // cfg.parallel.tensor)
        kv, dkv = elements * itemsize(dtype), elements * compute_dtype(resolve_dtype(dtype)).itemsize
        return 2 * kv, 2 * (kv + dkv)


def own_token_ids(groups: list[dict[str, int]], c: int) -> list[dict[str, int]]:
    """gpt_saves' groups with the token ids and targets renamed at c > 1: a context-parallel rank's are its
    own slices of each micro-batch (new arrays), not views of one global batch array, so a pipeline's walk
    (engine.memory.pipeline, whose SHARED names the views) counts them with each micro-batch in flight."""
    if c == 1:
        return groups
    return [{f"{k} (own)" if k in ("idx", "targets") else k: v for k, v in g.items()} for g in groups]


def before_attention(block: dict[str, int], k: int) -> dict[str, int]:
    """What block k keeps by the time its attention runs: its input and ln_1's (gpt_saves' names)."""
    names = (f"x{k}", f"ln_1 stats {k}", f"ln_1 out {k}")
    return {name: block[name] for name in names if name in block}


def attention_part(block: dict[str, int], k: int) -> dict[str, int]:
    """What block k still keeps when backward reaches its attention: the MLP's and c_proj's arrays and ln_2's
    are freed; the LayerNorm, the QKV product's input and attention's own are not."""
    names = (f"qkv {k}", f"attn O {k}", f"attn lse {k}")
    return {**before_attention(block, k), **{name: block[name] for name in names if name in block}}
