"""JSON lines between the launcher and its rank processes — never pickle.

Plain JSON plus numpy: arrays travel as {"__ndarray__": base64, "dtype": name, "shape": [...]}
with the dtype taken from the wire allowlist only; numpy scalars become Python numbers; tuples
become lists. Anything else that json cannot encode is an error at the sender.
"""

from __future__ import annotations

import base64
import json

import numpy as np

from engine.comm.wire import DTYPE_NAMES


def dumps(obj) -> bytes:
    return json.dumps(obj, default=_encode, allow_nan=True).encode()


def loads(data: bytes | str):
    return json.loads(data, object_hook=_decode)


def as_sent(event: dict) -> dict:
    """The event as a rank process would deliver it (through JSON), so every backend hands the
    launcher the same plain dicts and a non-serialisable event fails on threads too."""
    return loads(dumps(event))


def _encode(obj):
    if isinstance(obj, np.ndarray):
        if obj.dtype.name not in DTYPE_NAMES:
            raise TypeError(f"arrays of {obj.dtype} cannot cross a process boundary")
        return {"__ndarray__": base64.b64encode(np.ascontiguousarray(obj).tobytes()).decode(),
                "dtype": obj.dtype.name, "shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable (use dicts, lists, numbers, "
                    f"strings and numpy arrays)")


def _decode(obj: dict):
    if "__ndarray__" not in obj:
        return obj
    name = obj.get("dtype")
    dtype = DTYPE_NAMES.get(name) if isinstance(name, str) else None
    shape = obj.get("shape")
    if dtype is None or not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError("malformed array in a JSON message")
    raw = base64.b64decode(obj["__ndarray__"])
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
