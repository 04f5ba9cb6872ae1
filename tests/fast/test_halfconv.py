"""engine.fast.halfconv against NumPy's own float16 casts, bit for bit (tests/exhaustive_halfconv.py checks
every float32 input; this runs a sample, the rounding ties and the special values), and matmul_kernel on it.
Every path: the compiled loops (engine.fast.halfconv_jit, skipped only where numba is not installed), with the
CPU's conversions and with integer steps, and NumPy's."""

import ml_dtypes
import numpy as np
import pytest

from engine import ops
from engine.fast import blas, halfconv

BIG = 3 * halfconv._CHUNK + 123  # several passes of the downcast, the last one partial


@pytest.fixture(params=["cpu", "integer", "numpy"])
def path(request, monkeypatch) -> bool:
    """use_compiled for halfconv's conversions: each test runs on every path: the compiled loops with the
    CPU's own conversions (F16C) and with integer steps (the loops of a CPU without F16C), and NumPy."""
    if request.param == "numpy":
        return False
    jit = halfconv.compiled()
    if jit is None:
        pytest.skip("numba is not installed: the compiled paths are not available")
    if request.param == "cpu" and not jit.HAS_F16C:
        pytest.skip("this CPU has no F16C: its compiled path is the integer one")
    if request.param == "integer":
        monkeypatch.setattr(jit, "widen_bits", jit._widen_table)
        monkeypatch.setattr(jit, "round_bits", jit._round_integer)
    return True


def astype16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x.astype(np.float16)


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape and got.strides == want.strides
    bits = np.uint16 if got.dtype == np.float16 else np.uint32
    np.testing.assert_array_equal(got.view(bits), want.view(bits))


def test_upcast_of_every_half(path):
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    assert_same_bits(halfconv.to_float32(halves, path), halves.astype(np.float32))


def test_downcast_of_random_bit_patterns(path):
    bits = np.random.default_rng(0).integers(0, 1 << 32, size=4 * BIG, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)  # about 1 in 256 is inf or nan, 1 in 256 a float32 subnormal
    assert_same_bits(halfconv.to_float16(x, path), astype16(x))


def test_downcast_of_ties_and_special_values(path):
    """Every point halfway between two neighbouring halves (ties go to the even one, or to inf past
    65504), one float32 ulp either side of it, and zeros, subnormals, overflow, infinities, nans."""
    halves = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mids = ((halves[:-1] + halves[1:]) / 2).tolist() + [65520.0]  # all exact in float32
    ties = np.array(mids, dtype=np.float32).view(np.uint32)
    special = np.array([0, 1, 0x00800000, 0x33000000, 0x33000001, 0x337FFFFF, 0x387FFFFF, 0x38800000,
                        0x477FEFFF, 0x477FF000, 0x47800000, 0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7F801FFF,
                        0x7F802000, 0x7FC00000, 0x7FFFFFFF], dtype=np.uint32)
    cases = np.concatenate([ties - 1, ties, ties + 1, special])
    x = np.concatenate([cases, cases | 0x80000000]).view(np.float32)  # and their negatives
    assert x.size > halfconv._SMALL  # the vectorised path, not its small-array fallback
    assert_same_bits(halfconv.to_float16(x, path), astype16(x))


@pytest.mark.parametrize("view", ["transposed", "heads", "swapped heads", "strided"])
def test_layout_is_astypes(view, path):
    """Results are laid out as astype lays them out: a product's rounding may depend on the layout."""
    qkv = np.random.default_rng(1).standard_normal((8, 64, 3 * 96)).astype(np.float32) * 300
    heads = qkv[..., :96].reshape(8, 64, 4, 24).transpose(0, 2, 1, 3)
    x = {"transposed": qkv.T, "heads": heads, "swapped heads": heads.swapaxes(-1, -2),
         "strided": qkv[:, ::2, 1:]}[view]
    assert_same_bits(halfconv.to_float16(x, path), astype16(x))
    x16 = astype16(x)
    assert_same_bits(halfconv.to_float32(x16, path), x16.astype(np.float32))


def test_astype_dispatch():
    x = np.linspace(-3, 3, 10_000, dtype=np.float32)
    assert halfconv.astype(x, np.float32) is x
    assert halfconv.astype(x, np.float32, copy=True) is not x
    b = halfconv.astype(x, ml_dtypes.bfloat16)
    assert_same_bits(halfconv.astype(b, np.float32), b.astype(np.float32))
    assert_same_bits(halfconv.astype(halfconv.astype(x, np.float16), np.float32),
                     x.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("shapes", [((2048, 96), (96, 384), False), ((384, 2048), (2048, 96), True),
                                    ((8, 4, 64, 24), (8, 4, 24, 64), False)])
def test_fp16_matmul_kernel_is_the_astype_product(shapes):
    """matmul_kernel through halfconv gives what NumPy's casts around the float32 product give (the product
    on the library the engine's products use: engine.fast.blas, MKL or OpenBLAS, sum in different orders)."""
    (sa, sb, transpose), rng = shapes, np.random.default_rng(2)
    a, b = (rng.standard_normal(s).astype(np.float16) for s in (sa, sb))
    if transpose:  # as linear's backward passes them: views of other arrays
        a, b = np.ascontiguousarray(a.T).T, np.ascontiguousarray(b.T).T
    want = astype16(blas.gemm(a.astype(np.float32), b.astype(np.float32)))
    assert_same_bits(ops.matmul_kernel(a, b), want)


def test_bfloat16_downcast_is_ml_dtypes_bit_for_bit(path):
    """Random bit patterns (inf, nan and subnormals among them), every tie between neighbouring bfloat16
    values near 1 and near the largest finite one, one float32 ulp either side, and the special values."""
    bits = np.random.default_rng(3).integers(0, 1 << 32, size=BIG, dtype=np.uint64).astype(np.uint32)
    ties = np.concatenate([np.arange(0x3F800000, 0x3F900000, 0x10000),  # near 1
                           np.arange(0x7F000000, 0x7F800000, 0x10000)])  # up to the largest finite
    ties = (ties + 0x8000).astype(np.uint32)
    special = np.array([0, 1, 0x7FFF, 0x8000, 0x18000, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0x7F800000,
                        0x7F800001, 0x7F812345, 0x7FC00000, 0x7FFFFFFF], dtype=np.uint32)
    cases = np.concatenate([bits, ties - 1, ties, ties + 1, special])
    x = np.concatenate([cases, cases | 0x80000000]).view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        want, got = x.astype(ml_dtypes.bfloat16), halfconv.to_bfloat16(x, path)
    assert_same_bits(got, want)
    heads = x[: 8 * 64 * 96].reshape(8, 64, 4, 24).transpose(0, 2, 1, 3)  # laid out as astype lays it out
    with np.errstate(over="ignore", invalid="ignore"):
        assert_same_bits(halfconv.to_bfloat16(heads, path), heads.astype(ml_dtypes.bfloat16))


def test_bfloat16_upcast_of_every_value_is_ml_dtypes(path):
    values = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)
    assert_same_bits(halfconv.bfloat16_to_float32(values, path), values.astype(np.float32))
    heads = np.tile(values, 8)[: 8 * 64 * 96].reshape(8, 64, 4, 24).transpose(0, 2, 1, 3)
    assert_same_bits(halfconv.bfloat16_to_float32(heads, path), heads.astype(np.float32))
