"""What communication running beside compute costs it, against hand examples: the collectives' CPU time
fitted from the calibration's per-thread CPU clocks, κ and the CPU ratio turned into the projection's
factor, the timeline charging κ × the hidden CPU seconds, a 2-rank step's interference worked out bucket by
bucket, and one real (slow) measurement of κ on two processes."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from projection_helpers import ALPHA, BETA, GAMMA, VOCAB, fixture_calibration, small_config

from engine.comm.launch import run_ranks
from engine.projection import transport_calibration
from engine.projection.calibrate import Calibration
from engine.projection.clusters import load_cluster
from engine.projection.interference import kappa, measure_interference
from engine.projection.project import predict
from engine.projection.timeline import Timeline
from engine.projection.transport_calibration import measure_ring

CPU_ALPHA, CPU_BETA, CPU_GAMMA = 40e-6, 1 / 5e9, 1 / 10e9  # below the wall figures: one thread


def with_cpu(calibration: Calibration, kappa_: float | None = None, cpu_each: float = 0.0,
             nbytes: int = 0) -> Calibration:
    data = json.loads(json.dumps(calibration.data))
    data["transport"]["cpu"] = {"alpha": CPU_ALPHA, "beta": CPU_BETA, "gamma": CPU_GAMMA,
                                "gamma_by_dtype": {"fp32": CPU_GAMMA}}
    if kappa_ is not None:
        for by_dtype in data["models"].values():
            for levels in by_dtype.values():
                levels["2"].update(interference=kappa_, interference_cpu_s=cpu_each,
                                   interference_bytes=nbytes)
    return Calibration(data)


def test_the_cpu_figures_are_fitted_from_each_rank_cpu_clock(monkeypatch):
    """The ring's wall-clock times (the slowest rank) and CPU times (the mean rank) give two sets of α, β, γ:
    all-gather (p−1)(α + n/p·β), reduce-scatter adds (p−1)/p·n·γ, with p = 2."""
    sizes = [1 << 12, 1 << 16, 1 << 20, 1 << 22]

    def ring(a, b, g, n, reduce):
        return a + n / 2 * b + (n / 2 * g if reduce else 0.0)

    def fake_ranks(ranks, backend, fn, args, timeout_s):
        out = []
        for skew in (0.9, 1.1):  # the ranks' CPU times differ: the fit follows their mean
            out.append({"gather": [ring(ALPHA, BETA, 0, n, False) for n in sizes],
                        "scatter fp32": [ring(ALPHA, BETA, GAMMA, n, True) for n in sizes],
                        "cpu gather": [skew * ring(CPU_ALPHA, CPU_BETA, 0, n, False) for n in sizes],
                        "cpu scatter fp32": [skew * ring(CPU_ALPHA, CPU_BETA, CPU_GAMMA, n, True)
                                             for n in sizes]})
        return out
    monkeypatch.setattr(transport_calibration, "run_ranks", fake_ranks)
    fitted = measure_ring(sizes, ["fp32"])
    wall = (fitted["alpha"], fitted["beta"], fitted["gamma"])
    assert wall == pytest.approx((ALPHA, BETA, GAMMA), rel=1e-6)
    cpu = fitted["cpu"]
    expected = (CPU_ALPHA, CPU_BETA, CPU_GAMMA)
    assert (cpu["alpha"], cpu["beta"], cpu["gamma"]) == pytest.approx(expected, rel=1e-6)
    assert Calibration({"transport": fitted}).cpu("fp32") == pytest.approx((CPU_ALPHA, CPU_BETA, CPU_GAMMA),
                                                                           rel=1e-6)


def test_a_file_without_cpu_figures_charges_the_copying_alone(tmp_path):
    calibration = fixture_calibration(tmp_path / "c.json")
    assert calibration.cpu("fp32") == (0.0, BETA, GAMMA)


def test_kappa_is_compute_lost_per_cpu_second():
    assert kappa(0.100, 0.103, 0.002) == pytest.approx(1.5)
    assert kappa(0.100, 0.099, 0.002) == 0.0  # faster beside communication: noise, nothing lost
    assert kappa(0.100, 0.150, 0.0) == 1.0  # nothing ran beside it: nothing to tell


def test_the_timeline_charges_kappa_times_the_hidden_cpu():
    tl = Timeline(shares_cores=True, kappa=1.5)
    tl.compute(0.001)
    tl.submit(0.004, cpu=0.002)  # runs from 1 to 5 ms, while compute goes on until 3 ms: half hidden
    tl.compute(0.002)
    tl.wait_all()
    assert tl.interference_s == pytest.approx(1.5 * 0.002 * 2 / 4)
    assert tl.step_s == pytest.approx(0.005 + tl.interference_s)


def test_the_interference_factor_is_kappa_times_the_cpu_ratio(tmp_path):
    """κ per CPU second measured beside compute, times that all-reduce's CPU over its fitted CPU time:
    2α + (n/2)(2β + γ) for the calibration's 2-rank ring."""
    n, each = 1 << 20, 1.2e-3
    calibration = with_cpu(fixture_calibration(tmp_path / "c.json"), kappa_=1.4, cpu_each=each, nbytes=n)
    cfg = small_config(parallel={"world_size": 2})
    _, _, machine = predict(cfg, load_cluster("this-machine"), calibration, VOCAB)
    fitted = 2 * CPU_ALPHA + n / 2 * (2 * CPU_BETA + CPU_GAMMA)
    assert machine.compute.interference("fp32", 2) == pytest.approx(1.4 * each / fitted, rel=1e-12)
    plain = fixture_calibration(tmp_path / "d.json")
    _, _, machine = predict(cfg, load_cluster("this-machine"), plain, VOCAB)
    assert machine.compute.interference("fp32", 2) == 1.0  # not measured: a CPU second costs a second


def test_a_two_rank_step_pays_for_every_hidden_bucket(tmp_path):
    """Small buckets on 2 ranks: every bucket but the last all-reduces while backward goes on. Worked out
    without the timeline: a bucket that runs wholly beside compute costs κ' × its CPU time, 2α_c + (n/2)
    (2β_c + γ_c); so the step's interference lies between the hidden buckets' and all buckets' CPU time."""
    from engine.config.build import param_shapes
    from engine.parallel.data.flat import FlatLayout
    cfg = small_config(parallel={"world_size": 2, "bucket_cap_mb": 0.02})
    factor_inputs = dict(kappa_=1.5, cpu_each=2 * CPU_ALPHA + (1 << 16) / 2 * (2 * CPU_BETA + CPU_GAMMA),
                         nbytes=1 << 16)  # the CPU measured equals the fitted: κ' = κ = 1.5
    calibration = with_cpu(fixture_calibration(tmp_path / "c.json"), **factor_inputs)
    step, _, machine = predict(cfg, load_cluster("this-machine"), calibration, VOCAB)
    layout = FlatLayout([(name, shape) for name, shape, _ in param_shapes(cfg, VOCAB)], "fp32")
    sizes = [(b - a) * 4 for a, b, _ in layout.bucket_plan(int(0.02 * 2**20))]
    cpu = [2 * CPU_ALPHA + n / 2 * (2 * CPU_BETA + CPU_GAMMA) for n in sizes]
    assert len(sizes) > 3
    assert machine.compute.interference("fp32", 2) == pytest.approx(1.5)
    assert 1.5 * sum(cpu[:-1]) * 0.5 < step.interference_s <= 1.5 * sum(cpu) * (1 + 1e-9)
    once = with_cpu(fixture_calibration(tmp_path / "d.json"), **{**factor_inputs, "kappa_": 1.0})
    step_once, _, _ = predict(cfg, load_cluster("this-machine"), once, VOCAB)
    assert step.interference_s == pytest.approx(1.5 * step_once.interference_s, rel=1e-9)


@pytest.mark.slow
def test_kappa_measured_on_two_processes_is_a_slowdown():
    """Two real ranks: NumPy and Python work on the main thread, our all-reduces beside it. What comes back
    is a κ (compute lost per CPU second) and the CPU one all-reduce took, both real figures."""
    results = run_ranks(2, "processes", _kappa_rank, (), timeout_s=60.0)
    for r in results:
        assert r["interference_bytes"] == 1 << 18
        # a slowdown, and a plausible one: other load on a busy machine lands in it too, so the bound is
        # loose; a hundred compute seconds lost per CPU second of communication would be a broken measurement
        assert math.isfinite(r["interference"]) and 0.0 <= r["interference"] < 100.0
        assert r["interference_cpu_s"] > 0.0


def _kappa_rank(comm, emit) -> dict:
    a = np.ones((200, 200), np.float32)

    def step() -> None:
        for _ in range(20):
            a @ a
            [v + 1 for v in range(200)]
    return measure_interference(comm, step, 1 << 18)
