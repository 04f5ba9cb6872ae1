"""What a benchmark ran on: the CPU's model, the BLAS NumPy loaded (library, version, the kernel set it
picked for this CPU, threads), and the machine's measured float32 peak, so that a step time can be read as
the fraction of the machine it used.

The peak is measured, not taken from a data sheet: a virtual machine's cores, its clock and the BLAS
kernel it selects all move the figure, and a large single-precision matrix product is the fastest thing
these steps do. Best of a few, so that a noisy neighbour lowers it as little as possible.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from pathlib import Path

PEAK_N = 2048  # the peak's matrices: n x n float32, large enough for the BLAS's best blocking
PEAK_REPEATS = 5


def _cpuinfo_field(name: str) -> str | None:
    """The first `name: value` line's value in /proc/cpuinfo (None where there is no such file or line)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(name):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """The CPU's model name: /proc/cpuinfo, else lscpu, else what platform knows."""
    if model := _cpuinfo_field("model name"):
        return model
    if shutil.which("lscpu"):
        try:
            out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        found = re.search(r"^Model name:\s*(.+)$", out, re.MULTILINE)
        if found:
            return found.group(1).strip()
    return platform.processor() or platform.machine() or "unknown"


# the x86 flags of bfloat16 arithmetic in hardware (dot products, matrix tiles)
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def bf16_arithmetic() -> list[str]:
    """Which of BF16_FLAGS the CPU reports (/proc/cpuinfo): where none, a bfloat16 product is float32
    arithmetic plus conversions in every library, and PyTorch's bf16 autocast pays for them op by op."""
    flags = set((_cpuinfo_field("flags") or "").split())
    return [f for f in BF16_FLAGS if f in flags]


def blas_libraries() -> list[dict]:
    """Each BLAS threadpoolctl finds loaded: internal_api (openblas, mkl, blis), version, architecture (the
    kernel set chosen for this CPU, e.g. SkylakeX or Haswell), num_threads, threading_layer. MKL, which the
    engine's products run on with the `mkl` extra (engine/fast/blas.py), loads here if it has not yet, after
    torch (engine/bench/torch_first.py), so that the list names it."""
    from threadpoolctl import threadpool_info

    import engine.bench.torch_first  # noqa: F401 - before MKL loads
    from engine.fast import blas
    blas.backend()
    keys = ("internal_api", "version", "architecture", "num_threads", "threading_layer")
    return [{k: info.get(k) for k in keys} for info in threadpool_info() if info.get("user_api") == "blas"]


def sgemm_peak(threads: int, n: int = PEAK_N, repeats: int = PEAK_REPEATS) -> dict:
    """The best float32 GFLOP/s of `repeats` n x n x n matrix products (2·n³ FLOPs each) on `threads` threads:
    the projection's own peak measurement (engine.projection.calibrate), with the threads limited."""
    from engine.comm.cores import limited
    from engine.projection.calibrate import peak_matmul_flops
    with limited(threads):
        flops = peak_matmul_flops(n, repeats)
    return {"n": n, "repeats": repeats, "threads": threads, "best_s": 2.0 * n**3 / flops,
            "gflops": flops / 1e9}


def describe(threads: int, n: int = PEAK_N, repeats: int = PEAK_REPEATS) -> dict:
    """The CPU, the BLAS libraries and the measured peak, as one JSON-ready dict."""
    return {"cpu": cpu_model(), "bf16_arithmetic": bf16_arithmetic(), "blas": blas_libraries(),
            "peak": sgemm_peak(threads, n, repeats)}

