"""AdamW against torch.optim.AdamW and engine.reference's AdamW step, one parameter at a time; schedules;
clipping."""

import math

import ml_dtypes
import numpy as np
import pytest
from extras import needs

from engine import reference
from engine.optim import AdamW, global_norm_clip_scale, lr_at, sum_of_squares

SHAPES = [(6, 5), (5,), (4, 3, 2), (7,)]
HYPER = dict(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
STEPS = 20


def lr_schedule(step):
    return lr_at(step, "cosine", 1e-2, min_lr=1e-3, warmup_steps=3, total_steps=STEPS)


def problem(dtype, seed=0):
    """Random per-parameter values, STEPS gradients each, and the flat decay mask (ndim >= 2)."""
    rng = np.random.default_rng(seed)
    params = [rng.normal(size=s).astype(dtype) for s in SHAPES]
    grads = [[rng.normal(size=s).astype(dtype) for s in SHAPES] for _ in range(STEPS)]
    mask = flatten([np.full(math.prod(s), len(s) >= 2) for s in SHAPES])
    return params, grads, mask


def assert_close(actual, expected, rel):
    """Relative to the parameters' scale: a value that lands near 0 after subtracting O(1) terms keeps
    O(1)-sized rounding (torch's CPU kernels use FMA), so elementwise-relative would be unfair there."""
    np.testing.assert_allclose(actual, expected, rtol=rel, atol=rel * np.abs(expected).max())


def flatten(arrays):
    return np.concatenate([a.ravel() for a in arrays])


def make_opt(flat, mask):
    return AdamW(flat, np.zeros_like(flat), lr=1.0, decay_mask=mask, **HYPER)


def train(opt, grads, steps):
    for t in steps:
        opt.grads[:] = flatten(grads[t])
        opt.step(lr_schedule(t))


def run_flat(params, grads, mask):
    flat = flatten(params)
    opt = make_opt(flat, mask)
    train(opt, grads, range(STEPS))
    return flat, opt


def reference_numpy(params, grads):
    """engine.reference.adamw_step in float64, one parameter at a time (decay on matrices only)."""
    out = []
    for i, p in enumerate(params):
        p, m, v = p.astype(np.float64), np.zeros(p.shape), np.zeros(p.shape)
        wd = HYPER["weight_decay"] if p.ndim >= 2 else 0.0
        for t in range(STEPS):
            p, m, v = reference.adamw_step(p, grads[t][i].astype(np.float64), m, v, t + 1, lr_schedule(t),
                                           HYPER["betas"], HYPER["eps"], wd)
        out.append(p.ravel())
    return np.concatenate(out)


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-6), (np.float64, 1e-12)])
def test_matches_torch_adamw(dtype, rtol):
    torch = needs("torch", "torch", "torch.optim.AdamW is the reference")
    params, grads, mask = problem(dtype)
    flat, opt = run_flat(params, grads, mask)
    tparams = [torch.tensor(p, requires_grad=True) for p in params]
    groups = [{"params": [t for t, s in zip(tparams, SHAPES) if len(s) >= 2],
               "weight_decay": HYPER["weight_decay"]},
              {"params": [t for t, s in zip(tparams, SHAPES) if len(s) < 2], "weight_decay": 0.0}]
    topt = torch.optim.AdamW(groups, lr=1.0, betas=HYPER["betas"], eps=HYPER["eps"])
    for t in range(STEPS):
        for tp, g in zip(tparams, grads[t]):
            tp.grad = torch.tensor(g)
        for group in topt.param_groups:
            group["lr"] = lr_schedule(t)
        topt.step()
    expected = flatten([tp.detach().numpy() for tp in tparams])
    assert flat.dtype == dtype and opt.t == STEPS
    assert_close(flat, expected, rtol)
    exp_avg = flatten([topt.state[tp]["exp_avg"].numpy() for tp in tparams])
    assert_close(opt.m, exp_avg, rtol)


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-6), (np.float64, 1e-12)])
def test_matches_per_parameter_numpy_reference(dtype, rtol):
    params, grads, mask = problem(dtype, seed=1)
    flat, _ = run_flat(params, grads, mask)
    assert_close(flat, reference_numpy(params, grads), rtol)


def test_updates_in_place_without_mask_decays_everything():
    params, grads, _ = problem(np.float64, seed=2)
    flat = flatten(params)
    before = flat.copy()
    opt = AdamW(flat, np.zeros_like(flat), lr=0.1, weight_decay=0.5)
    opt.step()  # zero gradient: only decay moves the parameters
    np.testing.assert_allclose(flat, before * (1 - 0.1 * 0.5), rtol=1e-15)
    assert opt.params is flat


def test_shards_step_independently_to_the_same_result():
    """Elementwise update: stepping shards separately (ZeRO) is bitwise the same as the whole."""
    params, grads, mask = problem(np.float32, seed=3)
    whole, _ = run_flat(params, grads, mask)
    flat, flat_grad, cut = flatten(params), np.zeros(whole.size, np.float32), 17
    opts = [AdamW(flat[a:b], flat_grad[a:b], decay_mask=mask[a:b], **HYPER)
            for a, b in ((0, cut), (cut, None))]
    for t in range(STEPS):
        flat_grad[:] = flatten(grads[t])
        for opt in opts:
            opt.step(lr_schedule(t))
    np.testing.assert_array_equal(flat, whole)


def test_state_dict_resume_is_bitwise():
    params, grads, mask = problem(np.float32, seed=4)
    straight, _ = run_flat(params, grads, mask)
    flat = flatten(params)
    first = make_opt(flat, mask)
    train(first, grads, range(STEPS // 2))
    state = first.state_dict()
    assert set(state) == {"step", "m", "v"} and state["step"] == STEPS // 2
    assert not np.shares_memory(state["m"], first.m)
    resumed = make_opt(flat.copy(), mask)
    resumed.load_state_dict(state)
    train(resumed, grads, range(STEPS // 2, STEPS))
    np.testing.assert_array_equal(resumed.params, straight)
    with pytest.raises(ValueError):
        resumed.load_state_dict({"step": 1, "m": np.zeros(3), "v": np.zeros(3)})


def test_lr_schedule_key_points():
    assert lr_at(0, "constant", 0.1) == 0.1
    assert lr_at(999, "constant", 0.1, warmup_steps=0, total_steps=10) == 0.1
    assert lr_at(0, "constant", 0.1, warmup_steps=4) == pytest.approx(0.025)
    assert lr_at(3, "cosine", 0.1, 0.01, warmup_steps=4, total_steps=14) == pytest.approx(0.1)
    assert lr_at(4, "cosine", 0.1, 0.01, warmup_steps=4, total_steps=14) == pytest.approx(0.1)
    assert lr_at(9, "cosine", 0.1, 0.01, warmup_steps=4, total_steps=15) == pytest.approx(0.055)  # midpoint
    assert lr_at(14, "cosine", 0.1, 0.01, warmup_steps=4, total_steps=15) == pytest.approx(0.01)
    assert lr_at(50, "cosine", 0.1, 0.01, warmup_steps=4, total_steps=15) == pytest.approx(0.01)
    lrs = [lr_at(s, "cosine", 0.1, 0.01, warmup_steps=4, total_steps=15) for s in range(4, 15)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    assert lr_at(0, "cosine", 0.1, 0.01, total_steps=1) == 0.1
    with pytest.raises(ValueError):
        lr_at(0, "linear", 0.1)


def test_clip_scale_matches_torch_formula():
    assert global_norm_clip_scale(9.0, 0.0) == 1.0  # off
    assert global_norm_clip_scale(9.0, 5.0) == 1.0  # norm 3 below the max
    assert global_norm_clip_scale(100.0, 5.0) == pytest.approx(5.0 / (10.0 + 1e-6), rel=1e-15)
    assert global_norm_clip_scale(math.inf, 1.0) == 1.0
    assert global_norm_clip_scale(math.nan, 1.0) == 1.0


def test_clip_matches_torch_clip_grad_norm():
    torch = needs("torch", "torch", "torch's clip_grad_norm_ is the reference")
    rng = np.random.default_rng(5)
    grads = [rng.normal(size=s) for s in SHAPES]
    tensors = [torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in SHAPES]
    for t, g in zip(tensors, grads):
        t.grad = torch.tensor(g)
    torch.nn.utils.clip_grad_norm_(tensors, max_norm=1.5)
    scale = global_norm_clip_scale(sum(sum_of_squares(g) for g in grads), 1.5)
    for t, g in zip(tensors, grads):
        np.testing.assert_allclose(g * scale, t.grad.numpy(), rtol=1e-12)


def test_sum_of_squares_from_shards_equals_whole():
    x = np.random.default_rng(6).normal(size=10_001).astype(np.float16)
    whole = sum_of_squares(x, chunk=1000)
    assert whole == pytest.approx(float(np.sum(x.astype(np.float64) ** 2)), rel=1e-12)
    shards = np.array_split(x, 4)
    assert sum(sum_of_squares(s) for s in shards) == pytest.approx(whole, rel=1e-12)


# ---- the compiled sum of squares (engine.fast.optim_jit) against an exact sum and the NumPy path ----

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
def test_the_compiled_sum_of_squares_is_exact_to_float64_rounding(dtype):
    """float32 and float64 read as they are, 16-bit read as their bits and widened in the loop."""
    pytest.importorskip("numba", reason="numba is not installed: only the NumPy sum runs")
    from engine.fast import compiled
    x = np.random.default_rng(4).normal(size=1_000_003).astype(dtype)
    wide = x.astype(np.float64)
    exact = math.fsum((wide * wide).tolist())
    with compiled.disabled():
        numpy_sum = sum_of_squares(x)
    assert sum_of_squares(x) == pytest.approx(exact, rel=1e-14)
    assert numpy_sum == pytest.approx(exact, rel=1e-13)
    assert sum_of_squares(x[:7]) == pytest.approx(float(np.dot(wide[:7], wide[:7])), rel=1e-15)  # < 8 long
    x[500_000] = np.inf  # the loop reassociates its additions, and only that: overflow still shows
    assert sum_of_squares(x) == np.inf
    x[7] = np.nan
    assert np.isnan(sum_of_squares(x))


# ---- the compiled update (engine.fast.optim_jit.adamw) against the NumPy chunks ----------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("decay", ["masked", "everywhere", "none"])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_compiled_update_is_the_numpy_update_bit_for_bit(dtype, decay, threads):
    """Every step's parameters, m and v, at a size that is a multiple of no chunk nor share, on one thread
    and shared among two (the NumPy path in its chunks on one)."""
    pytest.importorskip("numba", reason="numba is not installed: only the NumPy update runs")
    from engine.fast import compiled, thread_pool
    from engine.optim import CHUNK, SHARE_FROM
    n = 2 * SHARE_FROM + CHUNK // 3 + 11
    rng = np.random.default_rng(8)
    start = rng.standard_normal(n).astype(dtype)
    grads = [(rng.standard_normal(n) * 10.0 ** rng.integers(-6, 2, n)).astype(dtype) for _ in range(3)]
    mask = rng.random(n) < 0.6 if decay == "masked" else None

    def run() -> list[np.ndarray]:
        params, g = start.copy(), np.empty_like(start)
        opt = AdamW(params, g, lr=3e-3, betas=(0.9, 0.99), weight_decay=0.0 if decay == "none" else 0.1,
                    decay_mask=mask)
        seen = []
        for t, grad in enumerate(grads):
            g[:] = grad
            opt.step(lr_schedule(t))
            seen += [params.copy(), opt.m.copy(), opt.v.copy()]
        return seen
    with compiled.disabled():
        chunks = run()
    before = thread_pool.threads()
    thread_pool.set_threads(threads)
    try:
        fused = run()
    finally:
        thread_pool.set_threads(before)
    for a, b in zip(fused, chunks):
        np.testing.assert_array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))


@pytest.mark.parametrize("path", ["compiled", "numpy"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unscale_and_clip_in_the_update_are_scaling_the_gradients_first(path, dtype):
    """step(lr, unscale, clip) reads g unscale clip, rounded as two in-place products would round it
    (what the replica did before the update: grad *= 1/scale; grad *= clip), and leaves g as it was."""
    from contextlib import nullcontext

    from engine.fast import compiled
    rng = np.random.default_rng(9)
    n = 3 * 4096 + 5
    start, grad = rng.standard_normal(n).astype(dtype), (rng.standard_normal(n) * 300).astype(dtype)
    with compiled.disabled() if path == "numpy" else nullcontext():
        fused = AdamW(start.copy(), grad.copy(), lr=1e-2, weight_decay=0.1)
        fused.step(unscale=1 / 256, clip=0.37)
        scaled = grad.copy()
        scaled *= 1 / 256
        scaled *= 0.37
        first = AdamW(start.copy(), scaled, lr=1e-2, weight_decay=0.1)
        first.step()
    np.testing.assert_array_equal(fused.grads, grad)
    for a, b in ((fused.params, first.params), (fused.m, first.m), (fused.v, first.v)):
        np.testing.assert_array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))
