"""The fixed frame header of the socket transport, and the dtype allowlist.

Every frame starts with the same 84 bytes: magic, version, kind, dtype code, ndim, flags, slot,
payload length and eight shape dimensions. ``unpack`` checks all of it against limits before the
receiver touches a byte of payload or allocates anything, and never trusts a length it has not
checked against the shape, the dtype and ``max_bytes``. Nothing is ever unpickled.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from engine.dtypes import resolve_dtype

MAGIC = b"NDST"
VERSION = 1
MAX_NDIM = 8
HEADER = struct.Struct("<4sBBBBHHQ8Q")

DATA = 1  # payload follows the header on the socket
SHM = 2   # payload sits in a shared-memory slot of the sender's segment
ACK = 3   # the receiver is done with a shared-memory slot
BYE = 4   # the sender closed its communicator; flags say why
KINDS = (DATA, SHM, ACK, BYE)

FLAG_LAST = 1        # SHM: last piece of a message
BYE_DONE, BYE_STOP = 0, 1
NO_SLOT = 0xFFFF     # SHM: an empty message carries no slot

# code -> dtype; codes are part of the wire format, never renumber.
DTYPES: dict[int, np.dtype] = {
    1: np.dtype(np.float16), 2: resolve_dtype("bf16"), 3: np.dtype(np.float32),
    4: np.dtype(np.float64), 5: np.dtype(np.int8), 6: np.dtype(np.uint8), 7: np.dtype(np.int16),
    8: np.dtype(np.uint16), 9: np.dtype(np.int32), 10: np.dtype(np.uint32), 11: np.dtype(np.int64),
    12: np.dtype(np.uint64), 13: np.dtype(np.bool_),
}
CODES = {dtype: code for code, dtype in DTYPES.items()}
DTYPE_NAMES = {dtype.name: dtype for dtype in DTYPES.values()}


class FrameError(ValueError):
    """A header that fails validation; the message says which check failed."""


@dataclass(frozen=True)
class Frame:
    kind: int
    dtype: np.dtype | None
    shape: tuple[int, ...]
    nbytes: int
    flags: int = 0
    slot: int = 0


def dtype_code(dtype: np.dtype) -> int:
    code = CODES.get(np.dtype(dtype))
    if code is None:
        raise TypeError(f"dtype {np.dtype(dtype)} cannot be sent; allowed: {sorted(DTYPE_NAMES)}")
    return code


def pack(kind: int, dtype: np.dtype | None = None, shape: tuple[int, ...] = (), nbytes: int = 0,
         flags: int = 0, slot: int = 0) -> bytes:
    if len(shape) > MAX_NDIM:
        raise ValueError(f"arrays with more than {MAX_NDIM} dimensions cannot be sent")
    code = dtype_code(dtype) if dtype is not None else 0
    dims = tuple(shape) + (0,) * (MAX_NDIM - len(shape))
    return HEADER.pack(MAGIC, VERSION, kind, code, len(shape), flags, slot, nbytes, *dims)


def unpack(raw: bytes | bytearray | memoryview, max_bytes: int) -> Frame:
    """Parse and validate one header; raises FrameError before anything is allocated."""
    magic, version, kind, code, ndim, flags, slot, nbytes, *dims = HEADER.unpack(raw)
    if magic != MAGIC:
        raise FrameError(f"bad magic {bytes(magic)!r}")
    if version != VERSION:
        raise FrameError(f"unsupported version {version} (this build speaks {VERSION})")
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind}")
    if ndim > MAX_NDIM or any(dims[ndim:]):
        raise FrameError(f"bad ndim {ndim} or stray shape dimensions")
    if nbytes > max_bytes:
        raise FrameError(f"payload of {nbytes} bytes exceeds the limit of {max_bytes}")
    if kind in (ACK, BYE):
        if code or ndim or nbytes:
            raise FrameError("control frame with a payload description")
        return Frame(kind, None, (), 0, flags, slot)
    if code not in DTYPES:
        raise FrameError(f"dtype code {code} not in the allowlist")
    dtype, shape = DTYPES[code], tuple(dims[:ndim])
    if math.prod(shape) * dtype.itemsize != nbytes:
        raise FrameError(f"shape {shape} of {dtype} does not match the payload length {nbytes}")
    return Frame(kind, dtype, shape, nbytes, flags, slot)
