"""Differentiable ops on Tensors, and the one matrix-product kernel.

Each op computes its result with NumPy and hands `tensor.make` a backward closure. Closures keep
activation arrays (listed in `saved=` for the memory ledger) but read a Parameter's `.data` only when
backward runs, because ZeRO-3 frees parameter storage between forward and backward. A backward
treats its incoming gradient as read-only: that array may be shared with other edges. A backward that
returns only new arrays of its own says so (`make(..., fresh=True)`: GELU, layer norm), and the tape adds
other gradients into those in place (a residual stream's gradient into layer norm's) rather than into a
new array. A backward returns each gradient in its input's dtype: 16-bit gradients are rounded at every
op, as 16-bit training does (loss scaling exists because they underflow).

Low precision: float16 and ml_dtypes.bfloat16 products go through `matmul_kernel` (float32 inside);
elementwise work runs in float32 on exactly widened operands (engine.fast.lowp), never in NumPy's own
16-bit arithmetic: adds bit for bit as NumPy would, and the fused ops (linear with its bias, layer norm,
attention, GELU, cross-entropy) keep their whole computation in float32 and round only what they
return or keep, once, as matrix units and fused GPU kernels do. float64 stays float64.
"""

from __future__ import annotations

import math

import numpy as np

from engine.dropout_rng import DropoutRNG
from engine.dtypes import LOW_PRECISION, compute_dtype
from engine.fast import blas, flash, halfconv, heap, kernels, lowp, thread_pool
from engine.tensor import Parameter, ScatterGrad, Tensor, defer, deferring_weights, make

heap.keep_freed_memory()  # a step's large temporaries are reused, not faulted in again each op


# ---- helpers ---------------------------------------------------------------------------------------

def matmul_kernel(a: np.ndarray, b: np.ndarray, out_dtype=None) -> np.ndarray:
    """THE matrix product (engine.fast.blas picks the library). NumPy has no BLAS for 16-bit floats
    (~0.3 GFLOP/s), so those operands are widened exactly to float32 and multiplied there; the product is
    rounded to `out_dtype` (default: the operands' dtype; float32 keeps it unrounded for a fused epilogue
    such as a bias)."""
    out_dtype = np.result_type(a.dtype, b.dtype) if out_dtype is None else np.dtype(out_dtype)
    if a.dtype in LOW_PRECISION or b.dtype in LOW_PRECISION or out_dtype in LOW_PRECISION:
        # An fp16 overflow becomes inf (and inf x 0 nan): results the loss scaler finds and skips.
        with np.errstate(over="ignore", invalid="ignore"):
            return lowp.narrow(blas.gemm(lowp.widen(a), lowp.widen(b)), out_dtype)
    return blas.gemm(a, b)  # MKL's sgemm where the optional mkl extra is installed, else np.matmul


def _sum(x: np.ndarray, axis, keepdims: bool = False) -> np.ndarray:
    """Sum, accumulating 16-bit floats in float32."""
    if x.dtype in LOW_PRECISION:
        return x.sum(axis, dtype=np.float32, keepdims=keepdims).astype(x.dtype)
    return x.sum(axis, keepdims=keepdims)


def _row_sum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis (kept, size 1) as a matrix-vector product: on rows of ~100 elements
    BLAS is ~5x faster than NumPy's reduction. 16-bit floats accumulate in float32."""
    n = a.shape[-1]
    return matmul_kernel(a.reshape(-1, n), np.ones((n, 1), a.dtype)).reshape(*a.shape[:-1], 1)


def _col_sum(a: np.ndarray) -> np.ndarray:
    """Sum over the rows of a 2-D array, the same way."""
    return matmul_kernel(np.ones((1, a.shape[0]), a.dtype), a).reshape(a.shape[1])


def unbroadcast(g: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum `g` over the axes that broadcasting added or stretched, giving an array of `shape`."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    stretched = tuple(lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
    return _sum(g, tuple(range(lead)) + stretched).reshape(shape)


def _keep(needed: bool, t: Tensor):
    """How a backward reaches an input's array, or None if it does not need it. A Parameter's array
    is read when backward runs (ZeRO-3 swaps it); an activation's is captured now."""
    if not needed:
        return None
    if isinstance(t, Parameter):
        return lambda: t.data
    array = t.data
    return lambda: array


def _saved(*pairs) -> tuple:
    """The activation arrays kept by `_keep` for these (needed, tensor) pairs: what the ledger counts."""
    return tuple(t.data for needed, t in pairs if needed and not isinstance(t, Parameter))


def _operands(a, b) -> tuple[Tensor, Tensor]:
    """Both operands as Tensors; a Python or NumPy scalar takes the other operand's dtype."""
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return a, b
    if isinstance(a, Tensor):
        return a, Tensor(np.asarray(b, dtype=a.dtype))
    return Tensor(np.asarray(a, dtype=b.dtype)), b


# ---- elementwise -----------------------------------------------------------------------------------

def add(a, b) -> Tensor:
    a, b = _operands(a, b)
    sa, sb = a.shape, b.shape
    return make(lowp.add(a.data, b.data), (a, b), lambda g: (unbroadcast(g, sa), unbroadcast(g, sb)))


def sub(a, b) -> Tensor:
    a, b = _operands(a, b)
    sa, sb = a.shape, b.shape  # a - b is exactly a + (-b), in any floating dtype
    return make(lowp.add(a.data, -b.data), (a, b), lambda g: (unbroadcast(g, sa), unbroadcast(-g, sb)))


def neg(x: Tensor) -> Tensor:
    return make(-x.data, (x,), lambda g: (-g,))


def mul(a, b) -> Tensor:
    a, b = _operands(a, b)
    if b.ndim == 0 and not b.requires_grad:  # scaling by a constant keeps no activation
        s = b.data
        return make(a.data * s, (a,), lambda g: (g * s,))
    need_a, need_b, sa, sb = a.requires_grad, b.requires_grad, a.shape, b.shape
    get_a, get_b = _keep(need_b, a), _keep(need_a, b)

    def backward(g):
        return (unbroadcast(g * get_b(), sa) if need_a else None,
                unbroadcast(g * get_a(), sb) if need_b else None)
    return make(a.data * b.data, (a, b), backward, _saved((need_b, a), (need_a, b)))


def div(a, b) -> Tensor:
    a, b = _operands(a, b)
    if not b.requires_grad:
        return mul(a, Tensor(np.reciprocal(b.data)))
    need_a, sa, sb = a.requires_grad, a.shape, b.shape
    get_a, get_b = _keep(True, a), _keep(True, b)

    def backward(g):
        ga = g / get_b()
        return (unbroadcast(ga, sa) if need_a else None, unbroadcast(-ga * get_a() / get_b(), sb))
    return make(a.data / b.data, (a, b), backward, _saved((True, a), (True, b)))


def power(x: Tensor, exponent: float) -> Tensor:
    get_x = _keep(True, x)
    e = np.asarray(exponent, dtype=x.dtype)
    return make(x.data ** e, (x,), lambda g: (g * e * get_x() ** (e - 1),), _saved((True, x)))


def astype(x: Tensor, dtype) -> Tensor:
    src = x.dtype
    return make(x.data.astype(dtype), (x,), lambda g: (g.astype(src),))


# ---- products --------------------------------------------------------------------------------------

def _swap(a: np.ndarray) -> np.ndarray:
    return a.swapaxes(-1, -2)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Batched, broadcasting a @ b (both at least 2-D). A 2-D `b` is one GEMM over all rows of `a`."""
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"matmul needs operands of at least 2 dimensions, got {a.shape} and {b.shape}")
    need_a, need_b, sa, sb = a.requires_grad, b.requires_grad, a.shape, b.shape
    get_a, get_b = _keep(need_b, a), _keep(need_a, b)
    # a product with a Parameter: under a split backward's input half, that operand's gradient waits
    weight_a, weight_b = isinstance(a, Parameter), isinstance(b, Parameter)
    if b.ndim == 2:  # [..., k] @ [k, n]: flatten the leading dims of a into one GEMM

        def grad_a(g):
            return matmul_kernel(g.reshape(-1, sb[1]), get_b().T).reshape(sa) if need_a else None

        def grad_b(g):
            return matmul_kernel(get_a().reshape(-1, sa[-1]).T, g.reshape(-1, sb[1])) if need_b else None
        out = matmul_kernel(a.data.reshape(-1, sa[-1]), b.data).reshape(*sa[:-1], sb[1])
    else:

        def grad_a(g):
            return unbroadcast(matmul_kernel(g, _swap(get_b())), sa) if need_a else None

        def grad_b(g):
            return unbroadcast(matmul_kernel(_swap(get_a()), g), sb) if need_b else None
        out = matmul_kernel(a.data, b.data)

    def backward(g):
        if (weight_a or weight_b) and deferring_weights():
            ga = defer(lambda: (grad_a(g),), 1, (g,))[0] if weight_a else grad_a(g)
            return ga, (defer(lambda: (grad_b(g),), 1, (g,))[0] if weight_b else grad_b(g))
        return grad_a(g), grad_b(g)
    return make(out, (a, b), backward, _saved((need_b, a), (need_a, b)))


def _add_bias(y: np.ndarray, bias: np.ndarray, dtype) -> np.ndarray:
    """(y + bias) rounded to `dtype`: a product's epilogue, for y [rows, n] in the compute dtype (y is
    written to). Rows in blocks shared among the rank's threads; each block is rounded while it is in
    cache. Every element sees the one add and the one rounding, so the bits are the whole-array ones."""
    rows, n = y.shape
    out = y if y.dtype == np.dtype(dtype) else np.empty(y.shape, dtype)

    def block(lo: int, hi: int) -> None:
        y[lo:hi] += bias
        if out is not y:
            lowp.narrow_into(y[lo:hi], out[lo:hi])
    thread_pool.run(block, rows, max(1, thread_pool.BLOCK // max(1, n)))
    return out


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x[..., in] @ weight[out, in].T + bias[out] (PyTorch's layout): one 2-D GEMM per product. The bias
    is added to the float32 product before its one rounding (a GEMM epilogue); the backward widens the
    incoming gradient once for all three of its products."""
    n_out, n_in = weight.shape
    lead, dtype = x.shape[:-1], x.dtype
    if bias is None:
        y = matmul_kernel(x.data.reshape(-1, n_in), weight.data.T)
    else:
        y = _add_bias(matmul_kernel(x.data.reshape(-1, n_in), weight.data.T, out_dtype=compute_dtype(dtype)),
                      lowp.widen(bias.data), dtype)
    need_x, need_w = x.requires_grad, weight.requires_grad
    get_x, get_w = _keep(need_w, x), _keep(need_x, weight)
    w_dtype, b_dtype = weight.dtype, None if bias is None else bias.dtype

    def weight_grads(g2: np.ndarray) -> tuple:
        gw = matmul_kernel(g2.T, get_x().reshape(-1, n_in), out_dtype=w_dtype) if need_w else None
        return (gw, lowp.narrow(_col_sum(g2), b_dtype)) if b_dtype else (gw,)

    def backward(g):
        g2 = lowp.widen(g.reshape(-1, n_out))
        gx = matmul_kernel(g2, get_w(), out_dtype=dtype).reshape(*lead, n_in) if need_x else None
        if deferring_weights():  # the input half of a split backward: the weight products come later
            return (gx,) + defer(lambda: weight_grads(g2), 1 if b_dtype is None else 2, (g2,))
        return (gx,) + weight_grads(g2)
    inputs = (x, weight) if bias is None else (x, weight, bias)
    return make(y.reshape(*lead, n_out), inputs, backward, _saved((need_w, x), (need_x, weight)))


# ---- shapes and indexing ---------------------------------------------------------------------------

def reshape(x: Tensor, *shape) -> Tensor:
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    src = x.shape
    return make(x.data.reshape(shape), (x,), lambda g: (g.reshape(src),))


def transpose(x: Tensor, *axes) -> Tensor:
    """Permute axes like ndarray.transpose (no axes: reverse them)."""
    axes = tuple(axes[0]) if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
    axes = axes or tuple(reversed(range(x.ndim)))
    inverse = tuple(np.argsort(axes))
    return make(x.data.transpose(axes), (x,), lambda g: (g.transpose(inverse),))


permute = transpose


def getitem(x: Tensor, index) -> Tensor:
    if isinstance(index, Tensor):
        index = index.data
    shape, dtype = x.shape, x.dtype
    return make(x.data[index], (x,), lambda g: (ScatterGrad(index, g, shape, dtype),))


def split(x: Tensor, sections, axis: int = -1) -> list[Tensor]:
    """`sections` equal parts, or parts of the listed sizes, along `axis` (views; no copy)."""
    n = x.shape[axis]
    sizes = [n // sections] * sections if isinstance(sections, int) else list(sections)
    if np.sum(sizes) != n:
        raise ValueError(f"cannot split an axis of {n} into {sections}")
    lead = (slice(None),) * (axis % x.ndim)
    bounds = np.cumsum([0] + sizes)
    return [getitem(x, lead + (slice(lo, hi),)) for lo, hi in zip(bounds[:-1], bounds[1:])]


def concat(tensors: list[Tensor], axis: int = 0) -> Tensor:
    bounds = np.cumsum([t.shape[axis] for t in tensors])[:-1]
    out = np.concatenate([t.data for t in tensors], axis=axis)
    return make(out, tuple(tensors), lambda g: tuple(np.split(g, bounds, axis=axis)))


def embedding(idx, weight: Tensor) -> Tensor:
    """Rows of weight[V, C] picked by integer idx[...]; the backward scatter-adds into weight."""
    idx = idx.data if isinstance(idx, Tensor) else np.asarray(idx)
    shape, dtype = weight.shape, weight.dtype
    return make(weight.data[idx], (weight,), lambda g: (ScatterGrad(idx, g, shape, dtype),), (idx,))


# ---- reductions ------------------------------------------------------------------------------------

def sum(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    src = x.shape

    def backward(g):
        if not keepdims and axis is not None:
            g = np.expand_dims(g, axis)
        return (np.broadcast_to(g, src),)
    return make(np.asarray(_sum(x.data, axis, keepdims)), (x,), backward)


def mean(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    axes = range(x.ndim) if axis is None else np.atleast_1d(axis)
    count = math.prod(x.shape[a] for a in axes)
    return mul(sum(x, axis, keepdims), 1.0 / count)


# ---- activations and regularisation ----------------------------------------------------------------

def gelu(x: Tensor) -> Tensor:
    """GPT-2's tanh approximation: 0.5 x (1 + tanh(c (x + k x^3))), fused (engine.fast.kernels). Keeps only x,
    in its own dtype: the backward recomputes the tanh."""
    xs = x.data
    return make(kernels.gelu(xs), (x,), lambda g: (kernels.gelu_backward(xs, g),), (xs,), fresh=True)


def dropout(x: Tensor, p: float, rng: DropoutRNG, training: bool) -> Tensor:
    """Zero each element with probability p (mask from `rng`, axis 0 = rows) and scale the rest by 1/(1-p)."""
    if not training or p == 0.0:
        return x
    mask = rng.keep_mask(x.shape, p)
    dtype = x.dtype
    scale = np.asarray(1.0 / (1.0 - p), dtype=dtype).astype(compute_dtype(dtype))  # the dtype's own scale

    def apply(a: np.ndarray) -> np.ndarray:  # a * mask is exact; the scaling rounds once, as NumPy's would
        d = lowp.widen(a) * mask
        d *= scale
        return lowp.narrow(d, dtype)
    return make(apply(x.data), (x,), lambda g: (apply(g),), (mask,))


def backward_hook(x: Tensor, fn) -> Tensor:
    """Identity whose backward calls fn() before passing the gradient on (ZeRO-3 re-gathers here)."""
    def backward(g):
        fn()
        return (g,)
    return make(x.data, (x,), backward)


# ---- fused ops with hand-written backward ----------------------------------------------------------

def layer_norm(x: Tensor, weight: Tensor, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalise the last axis, then scale and shift, fused (engine.fast.kernels). Keeps x (in its own dtype),
    mean and 1/std (float32 inside)."""
    shape, n = x.shape, x.shape[-1]
    xs = np.ascontiguousarray(x.data).reshape(-1, n)
    y, mu, rstd = kernels.layer_norm(xs, weight.data, None if bias is None else bias.data, eps)
    get_w = _keep(True, weight)

    def backward(g):
        w = get_w()
        dx, dw, db = kernels.layer_norm_backward(xs, w, mu, rstd, np.ascontiguousarray(g).reshape(-1, n))
        grads = (dx.reshape(shape), dw.astype(w.dtype, copy=False))
        return grads if bias is None else grads + (db.astype(w.dtype, copy=False),)
    inputs = (x, weight) if bias is None else (x, weight, bias)
    return make(y.reshape(shape), inputs, backward, (x.data, mu, rstd), fresh=True)


ATTENTION_SHARE_MACS = 1 << 20  # multiply-adds per share at least: less does not repay handing it over


def causal_attention_qkv(qkv: Tensor, n_head: int, dropout_p: float = 0.0, rng: DropoutRNG | None = None,
                         training: bool = False) -> Tensor:
    """Causal self-attention on a QKV projection's output: qkv [B, T, 3C] (q, k and v side by side, each
    n_head heads of C / n_head) -> [B, T, C], the heads side by side again, as c_proj takes them.

    The heads are read where they lie in qkv and the output written straight into [B, T, C]; the backward
    writes dq, dk and dv straight into one [B, T, 3C] gradient: no split, transpose or reshape copies.
    Otherwise it is causal_attention on q, k, v [B, n_head, T, C / n_head]: the same results, the same
    dropout masks, the same bytes kept (qkv, the output, the log-sum-exp)."""
    b, t, width = qkv.shape
    if width % (3 * n_head):
        raise ValueError(f"causal_attention_qkv: a last axis of {width} is not 3 x {n_head} heads")
    dtype, cdt = qkv.dtype, compute_dtype(qkv.dtype)
    x = np.ascontiguousarray(qkv.data)
    q, k, v = _heads(x, 3, n_head)
    out = np.empty((b, t, width // 3), dtype)
    o, lse = _heads(out, 1, n_head)[0], np.empty((b, n_head, t), cdt)
    site, keep_scale, grain = _attention_setup(q.shape, dtype, dropout_p, rng, training)
    flash.forward(q, k, v, o, lse, site, keep_scale, grain)

    def backward(g):
        grad = np.empty(x.shape, dtype)
        g4 = _heads(np.ascontiguousarray(g), 1, n_head)[0]
        dq, dk, dv = _heads(grad, 3, n_head)
        flash.backward(q, k, v, o, lse, g4, dq, dk, dv, site, keep_scale, grain)
        return (grad,)
    return make(out, (qkv,), backward, (x, out, lse))


def _heads(a: np.ndarray, parts: int, n_head: int) -> np.ndarray:
    """[parts, B, n_head, T, D] view of a C-contiguous [B, T, parts * n_head * D]."""
    b, t, width = a.shape
    return a.reshape(b, t, parts, n_head, width // (parts * n_head)).transpose(2, 0, 3, 1, 4)


def causal_attention(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0,
                     rng: DropoutRNG | None = None, training: bool = False) -> Tensor:
    """softmax(q k^T / sqrt(D) + causal mask) [dropout] @ v for q, k, v of shape [B, H, T, D] (or [B, ..., T,
    D]: the axes between batch and time count as heads).

    Flash attention (engine.fast.flash): keeps q, k, v, the output and each row's log-sum-exp ([B, H, T] in
    the compute dtype), never the [T, T] probabilities; backward recomputes them tile by tile. With
    dropout the mask is that of `rng.keep_mask((B, H, T, T), p)` for this site, drawn tile by tile in
    forward and again in backward; kept probabilities are scaled by 1 / (1 - p) rounded to q's dtype. In
    float32 throughout for 16-bit inputs: only the output and the gradients are rounded.

    Work is shared among the rank's threads by (batch, head) rows, ATTENTION_SHARE_MACS at least each.
    """
    dtype, cdt = q.dtype, compute_dtype(q.dtype)
    *lead, t, d = q.shape
    shape4 = (lead[0] if lead else 1, math.prod(lead[1:]), t, d)
    qd, kd, vd = (a.data.reshape(shape4[:3] + a.shape[-1:]) for a in (q, k, v))
    out, lse = np.empty(shape4[:3] + vd.shape[-1:], dtype), np.empty(shape4[:3], cdt)
    site, keep_scale, grain = _attention_setup(shape4, dtype, dropout_p, rng, training)
    flash.forward(qd, kd, vd, out, lse, site, keep_scale, grain)

    def backward(g):
        dq, dk, dv = (np.empty(a.shape, dtype) for a in (qd, kd, vd))
        flash.backward(qd, kd, vd, out, lse, g.reshape(out.shape), dq, dk, dv, site, keep_scale, grain)
        return tuple(gr.reshape(a.shape) for gr, a in zip((dq, dk, dv), (q, k, v)))
    return make(out.reshape(*lead, t, vd.shape[-1]), (q, k, v), backward, (qd, kd, vd, out, lse))


def _attention_setup(shape4: tuple, dtype, dropout_p: float, rng: DropoutRNG | None, training: bool):
    """(dropout site or None, keep scale, rows per share) of an attention over q of shape [B, H, T, D]: the
    site draws keep_mask((B, H, T, T), p)'s mask; kept probabilities are scaled by 1 / (1 - p) rounded to the
    inputs' dtype."""
    b, h, t, d = shape4
    cdt = compute_dtype(dtype)
    grain = max(1, math.ceil(ATTENTION_SHARE_MACS / max(1, t * t * d)))
    if not (training and dropout_p > 0.0):
        return None, cdt.type(1), grain
    if rng is None:
        raise ValueError("causal attention with dropout in training needs an rng")
    keep_scale = np.asarray(1.0 / (1.0 - dropout_p), dtype=dtype).astype(cdt)[()]
    return rng.mask_site((b, h, t, t), dropout_p), keep_scale, grain


def cross_entropy(logits: Tensor, targets) -> Tensor:
    """Mean of -log softmax(logits)[target] over all targets; a float32 scalar (float64 for float64
    logits). Keeps the logits and the per-row log-sum-exp; the backward recomputes the softmax."""
    targets = targets.data if isinstance(targets, Tensor) else np.asarray(targets)
    dtype, cdt = logits.dtype, compute_dtype(logits.dtype)
    vocab = logits.shape[-1]
    x, cols = logits.data.reshape(-1, vocab), targets.reshape(-1)
    x32 = halfconv.astype(x, cdt)
    top = x32.max(-1, keepdims=True)
    shifted = x32 - top
    np.exp(shifted, out=shifted)
    lse = np.log(_row_sum(shifted))
    lse += top
    loss = np.asarray(lse.mean() - x32[np.arange(len(x)), cols].mean(), dtype=cdt)
    shape = logits.shape

    def backward(g):
        p = halfconv.astype(x, cdt, copy=True)  # written to below
        p -= lse
        np.exp(p, out=p)
        p[np.arange(len(x)), cols] -= 1
        p *= g / x.shape[0]
        return (lowp.narrow(p, dtype).reshape(shape),)
    return make(loss, (logits,), backward, (x, lse, cols))


# ---- Tensor operators ------------------------------------------------------------------------------

def _install_operators() -> None:
    """Give Tensor its Python operators; they live here so tensor.py stays free of op code."""
    methods = {
        "__add__": add, "__radd__": lambda a, b: add(b, a),
        "__sub__": sub, "__rsub__": lambda a, b: sub(b, a),
        "__mul__": mul, "__rmul__": lambda a, b: mul(b, a),
        "__truediv__": div, "__rtruediv__": lambda a, b: div(b, a),
        "__neg__": neg, "__pow__": power, "__matmul__": matmul, "__getitem__": getitem,
        "reshape": reshape, "transpose": transpose, "sum": sum, "mean": mean, "astype": astype,
        "T": property(lambda self: transpose(self)),
    }
    for name, fn in methods.items():
        setattr(Tensor, name, fn)


_install_operators()
