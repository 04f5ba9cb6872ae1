"""Matrix products on Intel MKL's cblas_sgemm / cblas_dgemm when the optional `mkl` extra is installed,
else on NumPy's own BLAS (np.matmul).

Why: NumPy's wheels bring OpenBLAS, PyTorch's CPU wheel brings MKL, and on the AVX-512 machines a GPT step's
products (a [rows, width] activation by a transposed weight, and both backward products) run faster on MKL
(docs/benchmarks.md, "MKL's sgemm"). The `mkl` wheel ships libmkl_rt.so into the environment's lib/, with a
C interface that ctypes can call: no compiler, no build step.

gemm(a, b) is np.matmul(a, b) for 2-D float32 or float64 operands of one dtype, written into a new
C-contiguous array. Each operand may be any view whose rows or whose columns are contiguous (a transposed
weight, a reshaped activation, a slice of rows): it is passed as it lies, with a transpose flag and its
leading dimension, never copied. Anything else (other dtypes, batched or empty operands, strides in both
axes, sizes beyond 32-bit BLAS integers) goes to np.matmul, as does everything when MKL is absent or turned
off (DISABLE_VAR=0).

Results are the product to float32 (float64) round-off, as any BLAS gives it, but not OpenBLAS's bits: the
two sum in different orders. MKL's sums depend on its thread count for some shapes, like OpenBLAS's.

Threads: MKL runs its threads on TBB, else on GNU OpenMP; never on its default, Intel OpenMP, whose libiomp5
also answers GNU OpenMP's calls: PyTorch's parallel regions in the same process ran on it, slower. On GNU
OpenMP (PyTorch's own copy when torch is loaded) the products alone were as fast, but in a step MKL's workers
spin after each product on the core the rank's elementwise kernels need (blas_idle.py says the same of
OpenBLAS's), and that spin is the runtime's, shared with PyTorch: it cannot be turned off for MKL alone. TBB's
workers sleep soon. A user's MKL_THREADING_LAYER is kept. MKL starts with the thread count NumPy's BLAS has
when it loads (a rank process limits that first: engine.comm.cores), and threadpoolctl reaches MKL afterwards
like any BLAS it finds, so each rank's limit applies to both.

PyTorch in the same process: torch's CPU wheel links its own MKL statically and exports those symbols, and
libmkl_rt loads MKL's libraries into the process's global symbol scope. torch imported after that binds its
MKL calls to this MKL (measured: its steps ran ~1.4x slower). So MKL loads with the first product, not at
import, and every benchmark imports torch before it computes (engine/bench/__init__.py); torch imported
first keeps its own. A process that imports torch after its first product should set DISABLE_VAR=0.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import sys
import threading

import numpy as np

from engine.fast import thread_pool

DISABLE_VAR = "NANODIST_MKL"  # "0" (or "off", "false", "no"): NumPy's BLAS for every product
_LAYER_VAR = "MKL_THREADING_LAYER"  # a user's choice of MKL's threading runtime is kept
_LAYER_IDS = {"GNU": 3, "TBB": 4}  # mkl_service.h's MKL_THREADING_GNU, MKL_THREADING_TBB
# In order of preference: TBB (the `tbb` wheel's library, beside MKL's), else GNU OpenMP (the system's
# libgomp, or PyTorch's when torch is loaded: the same soname).
_LAYERS = (("TBB", "libtbb.so.12"), ("GNU", "libgomp.so.1"))
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112  # CBLAS's enum values
_INT_MAX = 2**31 - 1  # libmkl_rt's default interface has 32-bit integers (LP64)
# Products of at least SPLIT_MACS multiply-adds are cut into blocks for the rank's polling workers
# (engine.fast.spin_pool), blocks of at least SPLIT_MIN rows (or columns).
SPLIT_MACS = 1 << 21
SPLIT_MIN = 16


class _Mkl:
    """libmkl_rt's gemm entry points and thread control, through ctypes (which releases the GIL per call)."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.path = path
        self.get_threads = lib.MKL_Get_Max_Threads
        self.get_threads.restype, self.get_threads.argtypes = ctypes.c_int, []
        self.set_threads = lib.MKL_Set_Num_Threads
        self.set_threads.restype, self.set_threads.argtypes = None, [ctypes.c_int]
        self.set_local = lib.MKL_Set_Num_Threads_Local  # this thread's count, over the global one
        self.set_local.restype, self.set_local.argtypes = ctypes.c_int, [ctypes.c_int]
        ptr, i = ctypes.c_void_p, ctypes.c_int
        self.gemm = {}
        # for compiled callers (engine.fast.spin_jit): MKL_Set_Num_Threads_Local's, and ?gemm's by dtype
        self.address: dict[object, int | None] = {"set_local": ctypes.cast(self.set_local, ptr).value}
        for dtype, name, scalar in ((np.float32, "cblas_sgemm", ctypes.c_float),
                                    (np.float64, "cblas_dgemm", ctypes.c_double)):
            fn = getattr(lib, name)
            fn.restype = None
            fn.argtypes = [i, i, i, i, i, i, scalar, ptr, i, ptr, i, scalar, ptr, i]
            self.gemm[np.dtype(dtype)] = fn
            self.address[np.dtype(dtype)] = ctypes.cast(fn, ptr).value
        version = ctypes.create_string_buffer(256)
        lib.MKL_Get_Version_String(version, len(version))
        text = version.value.decode(errors="replace")
        self.version = found.group(1) if (found := re.search(r"Version ([0-9.]+)", text)) else text.strip()


def _layout(x: np.ndarray) -> tuple[int, int] | None:
    """(transpose flag, leading dimension) that hand CBLAS this 2-D view row-major as it lies, or None when
    neither its rows nor its columns are contiguous. A dimension of size 1 has no meaningful stride."""
    (rows, cols), (s0, s1), item = x.shape, x.strides, x.itemsize
    if not x.flags.aligned or s0 % item or s1 % item:
        return None
    if cols == 1 or s1 == item:
        ld = cols if rows == 1 else s0 // item
        return (_NO_TRANS, ld) if ld >= cols else None
    if rows == 1 or s0 == item:
        ld = rows if cols == 1 else s1 // item
        return (_TRANS, ld) if ld >= rows else None
    return None


def _mkl_product(mkl: _Mkl, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """a @ b on MKL, or None when the operands are not a case gemm passes as they lie (module docstring)."""
    if a.ndim != 2 or b.ndim != 2 or a.dtype != b.dtype or a.dtype not in mkl.gemm:
        return None
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2 or min(m, n, k) == 0 or max(m, n, k) > _INT_MAX:
        return None
    la, lb = _layout(a), _layout(b)
    if la is None or lb is None or max(la[1], lb[1]) > _INT_MAX:
        return None
    out = np.empty((m, n), a.dtype)
    if m * n * k < SPLIT_MACS or not _split_product(mkl, a, b, la, lb, out):
        mkl.gemm[a.dtype](_ROW_MAJOR, la[0], lb[0], m, n, k, 1.0, a.ctypes.data, la[1], b.ctypes.data, lb[1],
                          0.0, out.ctypes.data, n)
    return out


_mine = threading.local()  # .words: the calling thread's own block of a split product


def _split_product(mkl: _Mkl, a: np.ndarray, b: np.ndarray, la: tuple[int, int], lb: tuple[int, int],
                   out: np.ndarray) -> bool:
    """out = a @ b in blocks of rows (of columns when there are too few rows), one single-threaded MKL call
    each: the caller's and one per free polling worker (engine.fast.spin_pool), the workers' started from
    their compiled loops. False (nothing done) without free workers (none, all busy or calm)."""
    workers = thread_pool.spin_workers()
    if not workers:
        return False
    held = [w for w in workers if not w.calm() and w.owner.acquire(blocking=False)]
    parts = len(held) + 1
    (m, k), n = a.shape, b.shape[1]
    by_rows = m >= parts * SPLIT_MIN
    if not held or (not by_rows and n < parts * SPLIT_MIN):
        for w in held:
            w.owner.release()
        return False
    jit, item = held[0].jit, a.itemsize
    words = getattr(_mine, "words", None)
    if words is None:
        words = _mine.words = np.zeros(jit.JOB_WORDS, np.int64)
    head = (jit.GEMM32 if a.dtype == np.float32 else jit.GEMM64, mkl.address[a.dtype], la[0], lb[0])
    bounds = [(m if by_rows else n) * i // parts for i in range(parts + 1)]

    def block(into: np.ndarray, lo: int, hi: int) -> None:
        if by_rows:
            step_a = la[1] if la[0] == _NO_TRANS else 1
            shape = (hi - lo, n, k, a.ctypes.data + lo * step_a * item, la[1], b.ctypes.data, lb[1],
                     out.ctypes.data + lo * n * item)
        else:
            step_b = 1 if lb[0] == _NO_TRANS else lb[1]
            shape = (m, hi - lo, k, a.ctypes.data, la[1], b.ctypes.data + lo * step_b * item, lb[1],
                     out.ctypes.data + lo * item)
        into[:14] = (*head, *shape, n, mkl.address["set_local"])
    posted = []
    for w, lo, hi in zip(held, bounds[1:-1], bounds[2:]):
        block(w.job, lo, hi)
        posted.append(w.post())
    block(words, bounds[0], bounds[1])
    try:
        jit.run_job(words)
    finally:
        for w, seq in zip(held, posted):
            try:
                w.finish_gemm(seq)
            finally:
                w.owner.release()
    return True


def _library_paths() -> list[str]:
    """Where the `mkl` wheel puts libmkl_rt: the running environment's lib/ (a virtual environment's, or the
    interpreter's own when pip installed into it)."""
    found: list[str] = []
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        found += sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")))
    return found


def _numpy_blas_threads() -> int | None:
    from threadpoolctl import threadpool_info
    return next((int(p["num_threads"]) for p in threadpool_info()
                 if p.get("user_api") == "blas" and p.get("internal_api") != "mkl"), None)


def _threading_layer(lib: ctypes.CDLL, lib_dir: str) -> bool:
    """MKL's threads on TBB, else on GNU OpenMP, never on its default Intel OpenMP (module docstring);
    a user's MKL_THREADING_LAYER is kept. False when neither runtime loads: then MKL is not used."""
    chosen = os.environ.get(_LAYER_VAR, "").strip().upper()
    for layer, runtime in _LAYERS:
        if chosen and chosen != layer:
            continue
        try:  # MKL opens the runtime by its soname: on the loader's path, or loaded here from the wheel's
            ctypes.CDLL(runtime if layer == "GNU" else os.path.join(lib_dir, runtime))
        except OSError:
            continue
        if chosen:
            return True
        set_layer = lib.MKL_Set_Threading_Layer
        set_layer.restype, set_layer.argtypes = ctypes.c_int, [ctypes.c_int]
        return set_layer(_LAYER_IDS[layer]) == _LAYER_IDS[layer]
    return bool(chosen) and chosen not in _LAYER_IDS  # INTEL or SEQUENTIAL, as the user chose


def _load() -> _Mkl | None:
    """MKL, loaded and sized to NumPy's BLAS's threads; None when turned off or not installed."""
    if os.environ.get(DISABLE_VAR, "").strip().lower() in ("0", "off", "false", "no"):
        return None
    for path in _library_paths():
        try:
            lib = ctypes.CDLL(path)
            if not _threading_layer(lib, os.path.dirname(path)):
                return None
            mkl = _Mkl(lib, path)
        except (OSError, AttributeError):
            continue  # not a loadable libmkl_rt (a wrong architecture, a broken install): NumPy's BLAS
        threads = _numpy_blas_threads()
        if threads:
            mkl.set_threads(threads)
        return mkl
    return None


_MKL: _Mkl | None = None
_loaded = False
_load_lock = threading.Lock()


def _library() -> _Mkl | None:
    """MKL, loaded by the first product (not at import: see "PyTorch in the same process")."""
    global _MKL, _loaded
    if not _loaded:
        with _load_lock:
            if not _loaded:
                _MKL, _loaded = _load(), True
    return _MKL


_sized = threading.local()  # the MKL thread count last set on this thread


def _size_for_this_thread(mkl: _Mkl) -> None:
    """MKL's threads for the calling thread = the rank's thread count (engine.fast.thread_pool, set with the
    BLAS limits by engine.comm.cores). Thread ranks share one process, and a limit that threadpoolctl sets
    on MKL is the setting thread's own (MKL_Set_Num_Threads_Local), not the rank threads': each thread sets
    its own before its first product, and again when the rank's count changes. With polling workers
    (engine.fast.spin_pool) MKL runs on this thread alone: the products large enough to share are split
    among the workers, and MKL's own (TBB) workers, woken by the small ones, would spin on the cores the
    polling workers hold."""
    n = 1 if thread_pool.spin_workers() else thread_pool.threads()
    if getattr(_sized, "n", None) != n:
        mkl.set_local(n)
        _sized.n = n


def gemm(a: np.ndarray, b: np.ndarray, out_dtype=None) -> np.ndarray:
    """np.matmul(a, b), on MKL for 2-D float32/float64 operands it can take as they lie (module docstring);
    cast to `out_dtype` when given and not already the product's dtype."""
    mkl = _library()
    if mkl is not None:
        _size_for_this_thread(mkl)
    out = _mkl_product(mkl, a, b) if mkl is not None else None
    if out is None:
        out = np.matmul(a, b)
    if out_dtype is not None and out.dtype != np.dtype(out_dtype):
        out = out.astype(out_dtype)
    return out


def _products_split() -> bool:
    """Whether products will run on MKL, and so be split among polling workers, without loading MKL (it
    loads with the first product: "PyTorch in the same process")."""
    off = os.environ.get(DISABLE_VAR, "").strip().lower() in ("0", "off", "false", "no")
    return _MKL is not None if _loaded else not off and bool(_library_paths())


thread_pool.products_split = _products_split


def backend() -> str:
    """Which library gemm's products run on: 'mkl <version>' or 'numpy'."""
    mkl = _library()
    return f"mkl {mkl.version}" if mkl is not None else "numpy"


def mkl_threads() -> int | None:
    """MKL's current thread count (None when gemm runs on NumPy's BLAS)."""
    mkl = _library()
    return mkl.get_threads() if mkl is not None else None
