"""Small JSON values between ranks, over the array collectives: rank 0's value on every rank
(`broadcast_json`), and every rank's value on every rank (`all_gather_json`). JSON text only, never pickle:
what arrives is parsed, not executed."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from engine.comm.collectives import all_gather, broadcast

BROADCAST_BYTES = 8192  # what broadcast_json carries at most (paths and ids)


def broadcast_json(comm, value: Any) -> Any:
    """Rank 0's `value` (a few short strings: paths, ids) on every rank."""
    buf = np.zeros(BROADCAST_BYTES, dtype=np.uint8)
    if comm.rank == 0:
        data = json.dumps(value).encode()
        if len(data) > buf.size:
            raise ValueError(f"value too long to share between ranks (over {BROADCAST_BYTES // 1024} KiB)")
        buf[:len(data)] = np.frombuffer(data, dtype=np.uint8)
    broadcast(comm, buf, root=0)
    return json.loads(bytes(buf).rstrip(b"\0").decode())


def all_gather_json(comm, value: Any) -> list:
    """Every rank's `value`, by rank, on every rank: the lengths first, then the texts padded to the longest
    (two all-gathers, so a rank's value may be of any size)."""
    data = json.dumps(value).encode()
    lengths = np.zeros(comm.world_size, dtype=np.int64)
    lengths[comm.rank] = len(data)
    all_gather(comm, lengths)
    width = int(lengths.max())
    texts = np.zeros(comm.world_size * width, dtype=np.uint8)
    texts[comm.rank * width:comm.rank * width + len(data)] = np.frombuffer(data, dtype=np.uint8)
    all_gather(comm, texts)
    return [json.loads(bytes(texts[r * width:r * width + int(lengths[r])]).decode())
            for r in range(comm.world_size)]
