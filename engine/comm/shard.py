"""The shard rule: which elements of a buffer each rank owns.

Every collective that splits a buffer (reduce-scatter, all-gather, the all-reduces built from them) cuts
it by this rule, and ZeRO owns its ranges by it, so a rank's shard of a reduce-scatter is exactly the
range its optimizer updates.
"""

def shard_bounds(n: int, world_size: int, rank: int, start: int = 0) -> tuple[int, int]:
    """[lo, hi) of `rank`'s shard of n elements beginning at `start`: the first n mod N shards get one
    extra element, so when N divides n every shard is n / N long. THE shard rule: collectives split
    buffers by it, ZeRO owns ranges by it."""
    base, extra = divmod(n, world_size)
    lo = start + rank * base + min(rank, extra)
    return lo, lo + base + (rank < extra)
