"""Loss scaling: the dynamic state machine (GradScaler exactly, plus DeepSpeed's hysteresis and floor), its
events, overflow skipping across sharded ranks without changing any state, and why fp16 needs a scale."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from extras import needs

from engine import ops
from engine.comm.launch import run_ranks
from engine.config import from_dict
from engine.config.build import build_dataset, build_model
from engine.data import rank_slice
from engine.loss_scale import DynamicScaler, LossScaleError, StaticScaler, all_finite, find_overflow
from engine.parallel.data.flat import FlatBuffer
from engine.trainer import Trainer
from tests.parallel_helpers import tiny_gpt

CLEAN, INF, NAN = None, ("inf", "w"), ("nan", "w")


def drive(scaler, pattern) -> list[tuple]:
    """Feed a pattern of overflow results; (scale, growth tracker, event) after each step."""
    out = []
    for step, found in enumerate(pattern):
        event = scaler.update(step, found)
        out.append((scaler.scale, getattr(scaler, "growth_tracker", None), event))
    return out


PATTERN = [CLEAN, INF, CLEAN, CLEAN, CLEAN, NAN, NAN, CLEAN, CLEAN, CLEAN, CLEAN, CLEAN, CLEAN, INF, CLEAN,
           CLEAN, CLEAN, CLEAN]


@pytest.mark.parametrize("init, growth, backoff, interval", [(65536.0, 2.0, 0.5, 3), (1000.0, 3.0, 0.3, 2),
                                                             (2.0**127, 2.0, 0.5, 1)])
def test_dynamic_scaler_matches_torch_grad_scaler(init, growth, backoff, interval):
    torch = needs("torch", "torch", "torch.amp.GradScaler is the reference")
    ours = drive(DynamicScaler(init, growth, backoff, interval), PATTERN)
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.0)
    theirs = torch.amp.GradScaler("cpu", init_scale=init, growth_factor=growth, backoff_factor=backoff,
                                  growth_interval=interval)
    for (scale, tracker, _), found in zip(ours, PATTERN):
        theirs.scale(torch.ones(()))  # creates the scale tensor on first use
        bad = {CLEAN: 1.0, INF: float("inf"), NAN: float("nan")}[found]
        p.grad = torch.tensor([1.0, bad])
        theirs.step(opt)
        theirs.update()
        assert (scale, tracker) == (theirs.get_scale(), theirs._growth_tracker.item())


def test_every_scale_change_is_an_event_with_step_kind_scales_and_parameter():
    events = [e for _, _, e in drive(DynamicScaler(1024.0, growth_interval=2), [CLEAN, CLEAN, INF, NAN])]
    fields = [e and (e.step, e.reason, e.old_scale, e.new_scale, e.first_param) for e in events]
    assert fields == [None, (1, "growth", 1024, 2048, None), (2, "inf", 2048, 1024, "w"),
                      (3, "nan", 1024, 512, "w")]


def test_hysteresis_tolerates_overflows_until_the_scale_grows_again():
    """DeepSpeed (consecutive_hysteresis off): `hysteresis` overflows in a row are needed to back off the
    first time; afterwards one is enough, until a growth restores the allowance."""
    pattern = [INF, INF, INF, CLEAN, CLEAN, INF, INF]
    steps = drive(DynamicScaler(64.0, growth_interval=2, hysteresis=2), pattern)
    assert [s for s, _, _ in steps] == [64, 32, 16, 16, 32, 32, 16]
    assert [e.reason if e else None for _, _, e in steps] == ["hysteresis", "inf", "inf", None, "growth",
                                                              "hysteresis", "inf"]


def test_min_scale_is_a_floor_and_an_overflow_there_aborts_with_a_clear_message():
    scaler = DynamicScaler(8.0, min_scale=3.0)
    assert [s for s, _, _ in drive(scaler, [INF, INF])] == [4.0, 3.0]
    with pytest.raises(LossScaleError, match=r"min_scale=3 .*step 2 still overflowed \(nan in w\)"):
        scaler.update(2, NAN)


def test_static_scaler_skips_and_reports_but_never_changes():
    scaler = StaticScaler(128.0)
    steps = drive(scaler, [CLEAN, INF, CLEAN])
    assert [s for s, _, _ in steps] == [128.0] * 3
    assert steps[1][2].reason == "inf" and steps[1][2].new_scale == 128.0


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_the_overflow_check_on_16_bit_bits_is_isfinite(dtype):
    """16-bit gradients are checked on their bits, a chunk at a time: every special, either sign, in any
    chunk, against NumPy's isfinite; the largest finite values and subnormals are finite."""
    info = ml_dtypes.finfo(dtype)
    x = np.random.default_rng(3).standard_normal(2_500_003).astype(dtype)
    x[:4] = [info.max, -info.max, info.smallest_subnormal, -0.0]
    assert all_finite(x) and np.isfinite(x).all()
    for where in (0, 1_048_575, 1_048_576, x.size - 1):
        for bad in (np.inf, -np.inf, np.nan):
            y = x.copy()
            y[where] = bad
            assert not all_finite(y), (where, bad)
    assert not all_finite(y[::2][-3:]) and all_finite(x[::2])  # strided: NumPy's isfinite


def test_find_overflow_names_the_parameter_nearest_the_loss_and_tells_nan_from_inf():
    class P:
        def __init__(self, name, n):
            self.name, self.data, self.grad = name, np.zeros(n, np.float16), None
    flat = FlatBuffer([P("first", 3), P("second", 4)], pad_to=4)
    grad = np.zeros(flat.size, np.float16)
    assert find_overflow(grad, flat) is None
    grad[1], grad[5] = np.inf, np.inf
    assert find_overflow(grad, flat) == ("inf", "second")
    grad[0] = np.nan
    assert find_overflow(grad[:4], flat) == ("nan", "first")
    assert find_overflow(grad[4:], flat, offset=4) == ("inf", "second")


# ---------------------------------------------------------------------------------------- skipped steps

POISONED = "blocks.0.mlp.layers.0.weight"


def _skip(comm, emit, cfg_dict, bad_step):
    trainer = Trainer(from_dict(cfg_dict), comm)
    rep = trainer.replica
    params = dict(trainer.model.named_parameters())

    def poison(p):  # on rank 1 only, before the replica packs this gradient
        if comm.rank == 1 and trainer.step == bad_step and not poisoned:
            p.grad.reshape(-1)[3] = np.inf
            poisoned.append(True)
    poisoned: list = []
    params[POISONED]._grad_ready_hooks.insert(0, poison)
    for _ in range(bad_step):
        assert not trainer.train_step()["skipped"]
    before, step_before = rep.optimizer_state(), trainer.step
    skipped = trainer.train_step()
    after = rep.optimizer_state()
    again = trainer.train_step()
    rep.close()
    return {"skipped": skipped["skipped"], "lr": (skipped["lr"], again["lr"]), "again": again["skipped"],
            "steps": (step_before, trainer.step), "events": rep.drain_events(),
            "same": all(before[k].tobytes() == after[k].tobytes() for k in ("master", "m", "v"))
            and before["step"] == after["step"], "scale": rep.loss_scale}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_an_overflow_on_one_rank_skips_the_step_on_every_rank_and_changes_nothing(stage):
    cfg = tiny_gpt(precision__dtype="fp16")
    cfg["precision"] = dict(cfg["precision"], init_scale=1024.0)
    cfg["parallel"] = dict(cfg["parallel"], world_size=2, zero_stage=stage)
    for r in run_ranks(2, "threads", _skip, args=(cfg, 3), timeout_s=60):
        assert r["skipped"] and not r["again"]
        assert r["same"]  # parameters (master), m, v and the optimizer step, bitwise
        assert r["steps"] == (3, 4) and r["lr"][0] == r["lr"][1]  # the LR schedule did not advance
        assert r["scale"] == 512.0
        (event,) = r["events"]
        assert (event.step, event.reason, event.first_param) == (3, "inf", POISONED)


def _overflowing_steps(comm, emit, cfg_dict):
    trainer = Trainer(from_dict(cfg_dict), comm)
    skipped = [trainer.train_step()["skipped"] for _ in range(2)]
    trainer.replica.close()
    return skipped


@pytest.mark.parametrize("scale", [1e6, 1e9])
def test_expected_fp16_overflows_raise_no_numpy_warnings(scale):
    """A loss scale far too large overflows the fp16 gradients: inf in the embedding's scatter-add, nan
    where ranks' infs of opposite signs meet in the reduce-scatter (1e6) or inf meets 0 in a product
    (1e9). Results the scaler finds and skips, nothing for NumPy to warn about."""
    cfg = tiny_gpt(precision__dtype="fp16")
    cfg["precision"] = dict(cfg["precision"], loss_scale=scale)
    cfg["parallel"] = dict(cfg["parallel"], world_size=2, zero_stage=2)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        results = run_ranks(2, "threads", _overflowing_steps, args=(cfg,), timeout_s=60)
    assert results == [[True, True]] * 2
    assert [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)] == []


# ---------------------------------------------------------------------------------------- underflow

def _grads(dtype: str, scale: float) -> np.ndarray:
    cfg = from_dict({"name": "underflow", "seed": 1,
                     "model": {"kind": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 64,
                               "bias": False},
                     "data": {"kind": "stdlib", "max_chars": 100000}, "train": {"global_batch": 32},
                     "precision": {"dtype": dtype}})
    dataset = build_dataset(cfg)
    model = build_model(cfg, dataset)
    x, y = rank_slice(dataset.global_batch(0, "train"), 0, 1)
    (ops.cross_entropy(model(x), y) * scale).backward()
    return np.concatenate([p.grad.astype(np.float64).ravel() / scale for p in model.parameters()])


def test_fp16_gradients_underflow_without_scaling_and_not_with_it():
    exact = _grads("fp64", 1.0)
    nonzero = exact != 0
    unscaled = _grads("fp16", 1.0)
    scaled = _grads("fp16", DynamicScaler().scale)  # the dynamic scaler's starting scale, 2^16
    assert np.isfinite(scaled).all()
    flushed = np.count_nonzero((unscaled == 0) & nonzero)
    assert flushed >= 5 and flushed / nonzero.sum() > 1e-4  # true gradients lost to zero
    assert np.count_nonzero((scaled == 0) & nonzero) == 0
    # and many more are only subnormal-precision without scaling
    rel = np.abs(unscaled - exact)[nonzero] / np.abs(exact[nonzero])
    rel_scaled = np.abs(scaled - exact)[nonzero] / np.abs(exact[nonzero])
    assert np.mean(rel > 0.1) > 10 * np.mean(rel_scaled > 0.1)


def test_a_run_that_overflows_every_step_stops_with_a_reason():
    from engine.loss_scale import MAX_SKIPPED_IN_A_ROW, DynamicScaler, LossScaleError, StaticScaler
    for scaler in (StaticScaler(1e6), DynamicScaler()):
        for step in range(MAX_SKIPPED_IN_A_ROW - 1):
            scaler.update(step, ("nan", "wte.weight"))
        scaler.update(MAX_SKIPPED_IN_A_ROW, None)  # one clean step resets the count
        for step in range(MAX_SKIPPED_IN_A_ROW - 1):
            scaler.update(step, ("nan", "wte.weight"))
        with pytest.raises(LossScaleError, match="steps in a row overflowed") as stuck:
            scaler.update(99, ("nan", "wte.weight"))
        # The advice fits the scaler: a static one may go dynamic; a dynamic one already is.
        advice, static = str(stuck.value), type(scaler) is StaticScaler
        assert ('use "dynamic"' in advice) == static and ("lower precision.loss_scale" in advice) == static


def test_static_scale_too_large_fails_the_run_instead_of_spinning(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from nanodist_tui.cli import app
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["--no-ui", "--preset", "quickstart", "--set", 'precision.dtype="fp16"',
                                      "--set", "precision.loss_scale=1e30", "--set", "train.steps=60",
                                      "--set", "model.block_size=16", "--set", "data.max_chars=50000",
                                      "--world-size", "1"])
    assert result.exit_code == 1
    assert "steps in a row overflowed" in result.output
