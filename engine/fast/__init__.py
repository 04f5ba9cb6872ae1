"""Speed only: nothing here changes a result beyond rounding. Each module is a faster way to compute what
the plain NumPy reference (engine/reference.py) computes, bit for bit or, where its docstring says so, to
float32 rounding (layer norm's compiled rows), and the tests hold them to it.

    file            what
    compiled.py     numba's compiled loops, loaded on first use; None where numba is absent
    kernels.py      fused GELU and layer norm: compiled, one range per thread, else NumPy chains by blocks
    kernels_jit.py  GELU's and layer norm's arithmetic as compiled loops (kernels.py's fast path)
    flash.py        causal attention a query tile at a time against its causal prefix (never T x T per head)
    flash_jit.py    its per-tile scaling, masking, score gradients and key transposes as compiled loops
    lowp.py         16-bit arithmetic done in float32: widen exactly, compute, round once
    halfconv.py     float16 <-> float32 (and bfloat16) conversions, bit for bit what astype gives
    halfconv_jit.py those conversions as compiled loops (halfconv.py's fast path)
    optim_jit.py    AdamW's update in one pass; the gradient norm's sum of squares in vector lanes
    blas.py         matrix products on MKL (the optional `mkl` extra) through ctypes, else np.matmul
    thread_pool.py  work split into blocks and shared among the rank's threads
    spin_pool.py    its polling workers (NANODIST_SPIN=1): no wake-up per share; products split in row blocks
    spin_jit.py     their compiled loops: polling with the GIL released, MKL's gemm called from there
    heap.py         the C allocator's settings for a process that trains
    blas_idle.py    OpenBLAS's idle threads sleep instead of spinning (set before NumPy loads)

Importing this package imports nothing: engine/__init__.py loads blas_idle before NumPy.
"""
