"""The readable spine: every fused or compiled computation of nanoDist written as plain whole-array NumPy.

engine/fast/kernels.py (threads, blocks, numba loops), engine/ops.py (fused ops with hand-written
backwards) and engine/optim.py (AdamW in place, one compiled pass) are fast versions of the functions
below; the tests hold them equal to these. Read these first: each is the formula and nothing else,
computed in the inputs' dtype (give it float64 to get the exact answer the fast paths approximate).
Nothing here is used in training.
"""

from __future__ import annotations

import math

import numpy as np

GELU_C = math.sqrt(2.0 / math.pi)
GELU_K = 0.044715


# ---- GELU (GPT-2's tanh approximation) -------------------------------------------------------------

def gelu(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(c (x + k x^3))), c = sqrt(2/pi), k = 0.044715."""
    return 0.5 * x * (1 + np.tanh(GELU_C * (x + GELU_K * x * x * x)))


def gelu_backward(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """g · d gelu/dx = g (0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2)), t = tanh(c (x + k x^3))."""
    t = np.tanh(GELU_C * (x + GELU_K * x * x * x))
    return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GELU_C * (1 + 3 * GELU_K * x * x))


# ---- layer norm (over the last axis) ---------------------------------------------------------------

def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, eps: float = 1e-5):
    """(y, mean, rstd): xhat = (x - mean) rstd with rstd = 1 / sqrt(var + eps) over the last axis,
    y = xhat w + b. mean and rstd keep the last axis (size 1)."""
    mean = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(x.var(-1, keepdims=True) + eps)
    y = (x - mean) * rstd * w
    return (y if b is None else y + b), mean, rstd


def layer_norm_backward(x: np.ndarray, w: np.ndarray, g: np.ndarray, eps: float = 1e-5):
    """(dx, dw, db) for layer_norm's y given g = dL/dy: with dxhat = g w,
    dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)); dw = sum(g xhat), db = sum(g) over every
    axis but the last."""
    _, mean, rstd = layer_norm(x, w, None, eps)
    xhat = (x - mean) * rstd
    dxhat = g * w
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    lead = tuple(range(x.ndim - 1))
    return dx, (g * xhat).sum(lead), g.sum(lead)


# ---- causal self-attention (q, k, v: [..., T, D]; or a QKV projection's [B, T, 3C]) -------------------

def causal_attention_probs(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """a = softmax(q k^T / sqrt(D) + mask) over the last axis; the mask is -inf above the diagonal, so a
    query never sees a later position."""
    t = q.shape[-2]
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))  # minus the row's maximum: exp never overflows
    return e / e.sum(-1, keepdims=True)


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(q k^T / sqrt(D) + causal mask) v."""
    return causal_attention_probs(q, k) @ v


def causal_attention_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray):
    """(dq, dk, dv) given g = dL/d out: dv = a^T g; da = g v^T; the softmax's ds = a (da - sum(da a))
    row by row; then dq = ds k / sqrt(D), dk = ds^T q / sqrt(D)."""
    a = causal_attention_probs(q, k)
    da = g @ v.swapaxes(-1, -2)
    ds = a * (da - (da * a).sum(-1, keepdims=True)) / math.sqrt(q.shape[-1])
    return ds @ k, ds.swapaxes(-1, -2) @ q, a.swapaxes(-1, -2) @ g


def heads(x: np.ndarray, n_head: int) -> np.ndarray:
    """[B, T, C] as [B, n_head, T, C / n_head]: head h is columns [h D, (h + 1) D) of every token."""
    b, t, c = x.shape
    return x.reshape(b, t, n_head, c // n_head).transpose(0, 2, 1, 3)


def merged(y: np.ndarray) -> np.ndarray:
    """[B, H, T, D] as [B, T, H D]: the heads side by side again (heads' inverse)."""
    b, h, t, d = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, t, h * d)


def causal_attention_qkv(qkv: np.ndarray, n_head: int) -> np.ndarray:
    """Attention on a QKV projection's output [B, T, 3C] (q, k, v side by side): [B, T, C]."""
    q, k, v = (heads(x, n_head) for x in np.split(qkv, 3, axis=-1))
    return merged(causal_attention(q, k, v))


def causal_attention_qkv_backward(qkv: np.ndarray, n_head: int, g: np.ndarray) -> np.ndarray:
    """d qkv [B, T, 3C] given g = dL/d out [B, T, C]: dq, dk, dv side by side, as q, k, v were."""
    q, k, v = (heads(x, n_head) for x in np.split(qkv, 3, axis=-1))
    return np.concatenate([merged(d) for d in causal_attention_backward(q, k, v, heads(g, n_head))], axis=-1)


# ---- softmax cross-entropy ([..., V] logits, integer targets) --------------------------------------

def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """mean over rows of -log softmax(logits)[target] = logsumexp(logits) - logits[target]."""
    x, cols = logits.reshape(-1, logits.shape[-1]), np.asarray(targets).reshape(-1)
    top = x.max(-1, keepdims=True)
    lse = np.log(np.exp(x - top).sum(-1)) + top[:, 0]
    return (lse - x[np.arange(len(x)), cols]).mean()


def cross_entropy_backward(logits: np.ndarray, targets: np.ndarray, g: float = 1.0) -> np.ndarray:
    """dL/d logits of g · cross_entropy: g (softmax(logits) - onehot(target)) / rows."""
    x, cols = logits.reshape(-1, logits.shape[-1]), np.asarray(targets).reshape(-1)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    p[np.arange(len(x)), cols] -= 1
    return (g * p / len(x)).reshape(logits.shape)


# ---- AdamW (decoupled weight decay, PyTorch's semantics) -------------------------------------------

def adamw_step(p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, t: int, lr: float,
               betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
               decay_mask: np.ndarray | None = None):
    """(p, m, v) after step t (counted from 1), as new arrays:
    p <- p (1 - lr wd) where decay_mask (everywhere without one);
    m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2;
    p <- p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)."""
    b1, b2 = betas
    decay = 1 - lr * weight_decay
    p = p * decay if decay_mask is None else np.where(decay_mask, p * decay, p)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    p = p - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return p, m, v
