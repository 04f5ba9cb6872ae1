"""engine.fast.heap: with glibc's thresholds raised, the large temporaries a training step frees and allocates
again op after op reuse the heap's pages instead of being unmapped and faulted in again. Measured in
fresh processes, with and without the setting, by the page faults the same allocation pattern causes."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")

PATTERN = """
import resource, sys
import numpy as np
from engine.fast import heap
if sys.argv[1] == "kept":
    assert heap.keep_freed_memory() and heap.keep_freed_memory()  # set once; True again later
for warm in (True, False):  # one untimed round, so both start with the blocks once allocated
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(1 if warm else 10):  # temporaries of a few MiB, freed out of order, like a step's
        a = np.ones(1 << 20); b = np.ones(3 << 20); del a; c = np.ones(1 << 19); del b, c
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", PATTERN, mode], capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_freed_temporaries_are_reused_without_page_faults():
    default, kept = faults("default"), faults("kept")
    assert default > 200  # glibc's own thresholds: the blocks are unmapped and faulted back in
    assert kept < default / 10


def test_every_trainer_process_gets_the_setting():
    """engine.ops applies it on import, so every rank (thread or process) that builds a model has it."""
    code = "from engine import ops; from engine.fast import heap; print(heap._done)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "True"
