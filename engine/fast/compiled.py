"""The compiled loops (numba): loaded on first use, None where numba is not installed.

engine.fast.halfconv_jit (16-bit conversions) and engine.fast.kernels_jit (GELU, layer norm) are the fast
paths of engine.fast.halfconv and engine.fast.kernels, which keep NumPy paths for a machine without numba;
`disabled()` runs those (tests compare the two). Loading on first use keeps numba's start-up cost out of
commands that never compute (the command line, the workbench until a run starts).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from types import ModuleType

_loaded: dict[str, ModuleType | None] = {}
_enabled = True


def load(name: str) -> ModuleType | None:
    """engine.<name>, or None where numba is missing or the compiled paths are disabled."""
    if not _enabled:
        return None
    if name not in _loaded:
        try:
            _loaded[name] = importlib.import_module(f"engine.fast.{name}")
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] not in ("numba", "llvmlite"):
                raise
            _loaded[name] = None
    return _loaded[name]


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """The NumPy paths everywhere inside the block (for tests; not thread-safe)."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before
