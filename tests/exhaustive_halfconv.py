"""engine.fast.halfconv against NumPy's own casts on every input: all 2^32 float32 bit patterns down, all 2^16
float16 bit patterns up. Not a test (pytest does not collect it: it takes a few minutes); run it by
hand after touching halfconv or moving to another NumPy:

    python tests/exhaustive_halfconv.py
"""

from __future__ import annotations

import sys
import time

import numpy as np

from engine.fast import halfconv

CHUNK = 1 << 24


def main() -> int:
    t0 = time.perf_counter()
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    up = halfconv.to_float32(halves).view(np.uint32)
    if not np.array_equal(up, halves.astype(np.float32).view(np.uint32)):
        print("float16 -> float32 differs from astype")
        return 1
    for start in range(0, 1 << 32, CHUNK):
        x = np.arange(start, start + CHUNK, dtype=np.uint64).astype(np.uint32).view(np.float32)
        with np.errstate(over="ignore"):
            want = x.astype(np.float16).view(np.uint16)
        got = halfconv.to_float16(x).view(np.uint16)
        if not np.array_equal(got, want):
            bad = int(np.flatnonzero(got != want)[0])
            print(f"float32 bits {start + bad:#010x}: got {int(got[bad]):#06x}, astype {int(want[bad]):#06x}")
            return 1
    seconds = time.perf_counter() - t0
    print(f"all 2^32 float32 and 2^16 float16 bit patterns convert as astype ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
