"""The one dtype policy: the names a config may use, what they resolve to, which are 16-bit, and the
wider dtype that optimizer state and elementwise math run in.

    name    array dtype            bytes   master / compute dtype
    fp32    float32                4       float32 (no master copy: the parameters are updated in place)
    fp16    float16                2       float32
    bf16    ml_dtypes.bfloat16     2       float32 (NumPy has no bfloat16 of its own)
    fp64    float64                8       float64 (exact parity tests)

The master weights of mixed precision and the arithmetic of the fused ops share one rule: float64
stays float64, everything else widens to float32, as matrix units and fused GPU kernels do.

This module is also the seam for the array module: `xp` is what the engine makes arrays with
(NumPy). A GPU array module with NumPy's interface would be chosen here, in one place.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

xp = np  # the array module

DTYPES = ("fp32", "fp16", "bf16", "fp64")  # config names, in the order docs and menus list them
LOW_PRECISION_NAMES = ("fp16", "bf16")

_ARRAY_DTYPES = {"fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16),
                 "fp32": np.dtype(np.float32), "fp64": np.dtype(np.float64)}
_LONG_NAMES = {dtype.name: name for name, dtype in _ARRAY_DTYPES.items()}  # "float16" -> "fp16", ...

LOW_PRECISION = tuple(_ARRAY_DTYPES[name] for name in LOW_PRECISION_NAMES)  # float16, bfloat16


def resolve_dtype(dtype) -> np.dtype:
    """np.dtype of a config name ("fp16", "bf16", "fp32", "fp64"), a long name ("bfloat16") or a dtype."""
    if isinstance(dtype, str):
        dtype = _ARRAY_DTYPES.get(_LONG_NAMES.get(dtype, dtype), dtype)
    return np.dtype(dtype)


def config_name(dtype) -> str:
    """The config name of a dtype: "fp16" for float16, ..."""
    return _LONG_NAMES[resolve_dtype(dtype).name]


def is_low_precision(dtype) -> bool:
    """True for the 16-bit floats (float16, bfloat16), by name or dtype."""
    return resolve_dtype(dtype) in LOW_PRECISION


def master_dtype(dtype) -> np.dtype:
    """What optimizer state and elementwise math use for arrays of `dtype`: float64 stays float64,
    everything else float32."""
    return np.dtype(np.float64) if resolve_dtype(dtype) == np.float64 else np.dtype(np.float32)


compute_dtype = master_dtype  # the fused ops widen exactly as the optimizer does


def itemsize(dtype) -> int:
    """Bytes per element of a config name or dtype."""
    return resolve_dtype(dtype).itemsize
