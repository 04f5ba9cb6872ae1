"""The step model against hand examples: a shipped cluster (8x A100) worked out from the published forms and
the cluster file's figures, and this machine from a calibration fixture (no timing anywhere): compute from
the curves, contention beyond the cores, the transport's α β γ in the ring form, an emulated latency on top.
Also the calibration's bookkeeping (merge, reuse, one-line errors) with the measurements faked."""

from __future__ import annotations

import json
import math

import pytest
from projection_helpers import (
    ALPHA,
    BETA,
    FORWARD_PER_TOKEN,
    GAMMA,
    IMBALANCE,
    OPTIMIZER_PER_ELEMENT,
    OTHER_S,
    VOCAB,
    fixture_calibration,
    small_config,
)

from engine.config.build import param_shapes
from engine.memory.estimator import estimate
from engine.projection import calibrate as calibrate_module
from engine.projection.calibrate import Calibration, CalibrationError, calibrate
from engine.projection.clusters import load_cluster
from engine.projection.compute import Curve
from engine.projection.compute_calibration import imbalance_share
from engine.projection.flops import model_signature
from engine.projection.project import at_world_size, predict, project


def n_params(cfg) -> int:
    return sum(math.prod(s) for _, s, _ in param_shapes(cfg, VOCAB))


def hand_training_flops(cfg, rows: int) -> float:
    """PaLM's 6·N·tokens + 12·L·T·C·tokens, N the parameters the matmuls use (blocks and the tied head)."""
    m = cfg.model
    c, t, v, layers = m.n_embd, m.block_size, VOCAB, m.n_layer
    per_block = 12 * c * c + 13 * c
    tokens = rows * t
    return 6 * (layers * per_block + v * c) * tokens + 12 * layers * t * c * tokens


def ring(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    """The published ring all-reduce: 2(p−1)α + 2(p−1)/p·nβ + (p−1)/p·nγ."""
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta + (p - 1) / p * n * gamma


def loss_ring(p: int, alpha: float, beta: float, gamma: float) -> float:
    """The all-reduce of the loss and the stop and pause votes: 3 fp64 values. On 2 ranks the published
    ring of 24 bytes. On 4, one shard is empty and sends nothing: each of the 6 steps moves one whole value
    (α + 8β), and each of the reduce-scatter's 3 adds one value's reduction on the rank that finishes last
    (engine.projection.sparse_ring, worked out step by step in tests/projection/test_sparse_ring.py)."""
    if p == 2:
        return ring(2, 24, alpha, beta, gamma)
    assert p == 4
    return 6 * (alpha + 8 * beta) + 3 * 8 * gamma


# ----------------------------------------------------------------------------- a shipped cluster, by hand

def test_a100_cluster_reproduces_the_hand_example():
    """16 ranks (2 nodes) of the a100-hdr cluster, bf16 DDP, 8 rows of 32 tokens per rank, one gradient
    bucket (the whole 0.2 MB gradient fits the 25 MiB cap): the step is compute, then the bucket's
    all-reduce (nothing left to overlap it with), the update, and the 24-byte all-reduce of the loss and
    the stop and pause votes (three fp64 values)."""
    cfg = small_config(precision={"dtype": "bf16"}, train={"global_batch": 8})
    a100 = load_cluster("a100-hdr")
    (row,) = project(cfg, a100, world_sizes=[16])["rows"]
    psi = n_params(cfg)
    # compute: peak 312 TFLOP/s × 0.52 · x / (x + 8192), x = 256 tokens per micro-batch
    x = 8 * 32
    rate = 312e12 * 0.52 * x / (x + 8192)
    compute = hand_training_flops(cfg, 8) / rate + psi * 40 / 2039e9  # + AdamW, mixed precision, memory-bound

    # links: NVLink 230 GB/s and 15 us; HDR 23 GB/s and 90 us per NIC, a NIC per GPU (8 rings)
    a_in, b_in, a_out, b_out = 15e-6, 1 / 230e9, 90e-6, 1 / 23e9
    p, g, m = 16, 8, 2

    def fastest(n: float) -> float:
        lg = math.log2(p)
        flat_alpha, flat_beta, tree_beta = max(a_in, a_out), max(b_in, b_out / 8), max(b_in, b_out)
        return min(2 * (p - 1) * flat_alpha + 2 * (p - 1) / p * n * flat_beta,          # ring, one per NIC
                   2 * lg * (flat_alpha + n * tree_beta),                                # binary tree
                   lg * (flat_alpha + n * tree_beta),                                    # recursive doubling
                   2 * lg * flat_alpha + 2 * (p - 1) / p * n * flat_beta,               # Rabenseifner
                   2 * (g - 1) * a_in + 2 * (g - 1) / g * n * b_in                       # hierarchical
                   + 2 * (m - 1) * a_out + 2 * (m - 1) / m * (n / g) * b_out)

    comm = fastest(2 * psi) + fastest(24)
    assert row.step.step_s == pytest.approx(compute + comm, rel=1e-9)
    assert row.step.exposed_s == pytest.approx(comm, rel=1e-9)
    assert row.step.overlapped_s == pytest.approx(0.0, abs=1e-12)
    assert row.tokens_per_s == pytest.approx(16 * x / (compute + comm), rel=1e-9)
    per_token = hand_training_flops(cfg, 8) / x
    assert row.mfu == pytest.approx(row.tokens_per_s * per_token / (16 * 312e12), rel=1e-9)
    # memory: mixed-precision DDP holds 2Ψ + 2Ψ + 12Ψ = 16Ψ of model states (no padding at stage 0)
    assert sum(row.states.values()) == 16 * psi
    assert row.fits is True


# ----------------------------------------------------------------------------- this machine, from a fixture

@pytest.fixture
def calibration(tmp_path):
    return fixture_calibration(tmp_path / "calibration.json")


HERE = "this-machine"


def test_two_ranks_from_the_calibration(calibration):
    cfg = small_config(parallel={"world_size": 2})
    step, _, _ = predict(cfg, load_cluster(HERE), calibration, VOCAB)
    psi, tokens = n_params(cfg), 16 * 32
    compute = OTHER_S["2"] + 3 * FORWARD_PER_TOKEN["2"] * tokens + OPTIMIZER_PER_ELEMENT["2"] * psi
    comm = ring(2, 4 * psi, ALPHA, BETA, GAMMA) + loss_ring(2, ALPHA, BETA, GAMMA)
    waits = IMBALANCE["2"] * compute  # for the slower of the two, as calibrated
    assert step.compute_s == pytest.approx(compute, rel=1e-9)
    assert step.imbalance_s == pytest.approx(waits, rel=1e-9)
    assert step.exposed_s == pytest.approx(comm + waits, rel=1e-9)
    assert step.interference_s == 0.0  # the one bucket runs while the training thread waits for it
    assert step.step_s == pytest.approx(compute + comm + waits, rel=1e-9)


def test_more_ranks_than_cores_time_slice(calibration):
    """4 ranks on 2 cores: one BLAS thread each, twice the CPU the 2-rank calibration had: compute and the
    real transport's α, β, γ take twice as long."""
    cfg = small_config(parallel={"world_size": 4})
    step, _, _ = predict(cfg, load_cluster(HERE), calibration, VOCAB)
    psi, tokens = n_params(cfg), 8 * 32
    compute = 2 * (OTHER_S["2"] + 3 * FORWARD_PER_TOKEN["2"] * tokens + OPTIMIZER_PER_ELEMENT["2"] * psi)
    comm = ring(4, 4 * psi, 2 * ALPHA, 2 * BETA, 2 * GAMMA) + loss_ring(4, 2 * ALPHA, 2 * BETA, 2 * GAMMA)
    # the slowest of 4 is further from the mean than the slower of 2: E[max of 4 normals] / E[max of 2]
    waits = IMBALANCE["2"] * compute * 1.0293754 / 0.5641896
    assert step.compute_s == pytest.approx(compute, rel=1e-9)
    assert step.step_s == pytest.approx(compute + comm + waits, rel=1e-9)


def test_time_sliced_ranks_meet_late(calibration):
    """4 ranks on 2 cores (2 per core: slicing 2, the measured lag L once): the last rank falls behind by
    half the compute, at most L. Small L: the bucket's wait after backward outlasts it (the late rank
    catches up), and the loss's all-reduce after the update waits L. Large L: the bucket's wait leaves
    half of forward and backward less that wait, the loss's all-reduce half the update. 2 ranks on 2
    cores do not time-slice and wait nothing more."""
    cfg4 = small_config(parallel={"world_size": 4})
    plain = {n: predict(small_config(parallel={"world_size": n}), load_cluster(HERE), calibration, VOCAB)[0]
             for n in (2, 4)}
    t_opt = 2 * OPTIMIZER_PER_ELEMENT["2"] * n_params(cfg4)
    loss = loss_ring(4, 2 * ALPHA, 2 * BETA, 2 * GAMMA)
    bucket_wait = plain[4].exposed_s - loss - plain[4].imbalance_s
    for lag, extra in ((1e-4, 1e-4), (1.0, (plain[4].compute_s - t_opt) / 2 - bucket_wait + t_opt / 2)):
        calibration.data["meeting_lag_s"] = lag
        late = {n: predict(small_config(parallel={"world_size": n}), load_cluster(HERE), calibration,
                           VOCAB)[0] for n in (2, 4)}
        assert late[2].step_s == pytest.approx(plain[2].step_s, rel=1e-12)
        assert late[4].step_s == pytest.approx(plain[4].step_s + extra, rel=1e-9)
        assert late[4].exposed_s == pytest.approx(plain[4].exposed_s + extra, rel=1e-9)
        assert late[4].compute_s == pytest.approx(plain[4].compute_s, rel=1e-12)


def test_time_slicing_costs_its_measured_overhead(calibration):
    """The overhead measured at 2 ranks per core (slicing_overhead) stretches compute where ranks
    time-slice: all of it at 4 ranks on 2 cores, half of it at 3 (1.5 ranks per core's worth), none at 2.
    How late the ranks meet still follows the ranks per core alone (the lag's slicing)."""
    def computes() -> dict:
        return {n: predict(small_config(parallel={"world_size": n}, train={"global_batch": 24}),
                           load_cluster(HERE), calibration, VOCAB)[0] for n in (2, 3, 4)}
    before = computes()
    for by_dtype in calibration.data["models"].values():
        for levels in by_dtype.values():
            levels["2"]["slicing_overhead"] = 1.1
    after = computes()
    assert after[2].compute_s == pytest.approx(before[2].compute_s, rel=1e-12)
    assert after[3].compute_s == pytest.approx(before[3].compute_s * 1.05, rel=1e-9)
    assert after[4].compute_s == pytest.approx(before[4].compute_s * 1.1, rel=1e-9)
    _, _, machine = predict(small_config(parallel={"world_size": 4}), load_cluster(HERE), calibration, VOCAB)
    assert machine.compute.slicing("fp32", 4) == 2.0


def test_one_rank_uses_the_one_rank_curve(calibration):
    cfg = small_config()
    step, _, _ = predict(cfg, load_cluster(HERE), calibration, VOCAB)
    compute = OTHER_S["1"] + 3 * FORWARD_PER_TOKEN["1"] * 32 * 32 + OPTIMIZER_PER_ELEMENT["1"] * n_params(cfg)
    assert step.step_s == pytest.approx(compute, rel=1e-9) and step.comm_s == 0.0


def test_an_emulated_latency_rides_on_the_real_link(calibration):
    cfg = small_config(parallel={"world_size": 2, "backend": "processes"}, emulate={"latency_us": 2000.0})
    step, _, _ = predict(cfg, load_cluster(HERE), calibration, VOCAB)
    psi = n_params(cfg)
    comm = ring(2, 4 * psi, ALPHA + 2e-3, BETA, GAMMA) + loss_ring(2, ALPHA + 2e-3, BETA, GAMMA)
    assert step.exposed_s - step.imbalance_s == pytest.approx(comm, rel=1e-9)


def test_checkpointing_adds_one_forward_of_every_block(calibration):
    plain = small_config(parallel={"world_size": 2})
    ckpt = small_config(parallel={"world_size": 2}, memory={"checkpointing": "blocks"})
    here = load_cluster(HERE)
    a, _, _ = predict(plain, here, calibration, VOCAB)
    b, _, _ = predict(ckpt, here, calibration, VOCAB)
    m, tokens = plain.model, 16 * 32
    forward = FORWARD_PER_TOKEN["2"] * tokens
    block_share = (2 * (12 * m.n_embd**2 + 13 * m.n_embd) + 4 * m.block_size * m.n_embd) / (
        hand_training_flops(plain, 1) / 3 / m.block_size)  # one block's forward over the model's, per token
    assert b.recompute_s == pytest.approx(m.n_layer * block_share * forward, rel=1e-9)
    assert b.step_s - a.step_s == pytest.approx(b.recompute_s * (1 + IMBALANCE["2"]), rel=1e-6)


def test_small_buckets_overlap_backward_and_overlap_off_hides_nothing(calibration):
    here = load_cluster(HERE)
    base = {"world_size": 2, "bucket_cap_mb": 0.05}
    many, _, _ = predict(small_config(parallel=base), here, calibration, VOCAB)
    off, _, _ = predict(small_config(parallel={**base, "overlap": False}), here, calibration, VOCAB)
    one, _, _ = predict(small_config(parallel={"world_size": 2}), here, calibration, VOCAB)
    assert many.overlapped_s > 0 and off.overlapped_s == pytest.approx(0.0, abs=1e-12)
    assert many.exposed_s < off.exposed_s
    # on a host whose cores are busy, hiding the transport's copying does not make it free
    assert many.interference_s > 0
    assert many.comm_s > one.comm_s  # more buckets, more messages: each pays α


def test_zero3_gathers_are_hidden_by_prefetch(calibration):
    here = load_cluster(HERE)
    zero3 = {"world_size": 2, "zero_stage": 3}
    with_prefetch, _, _ = predict(small_config(parallel=zero3), here, calibration, VOCAB)
    without, _, _ = predict(small_config(parallel={**zero3, "prefetch": False}), here, calibration, VOCAB)
    assert with_prefetch.comm_s == pytest.approx(without.comm_s, rel=1e-9)  # the same gathers
    assert with_prefetch.exposed_s < without.exposed_s


def test_curve_interpolates_in_log_log():
    curve = Curve((1.0, 4.0), (1.0, 2.0))
    assert curve(2.0) == pytest.approx(math.sqrt(2.0))  # half-way in log x: half-way in log t
    assert curve(16.0) == pytest.approx(4.0)  # beyond the last size: along the last segment
    assert curve(0.25) == pytest.approx(0.5)  # below the first: along it too


def test_imbalance_is_the_lower_quartile_of_the_calmer_stretch():
    # waits and compute seconds of 8 steps: the first stretch has one rank slowed throughout (the other
    # waits ~15% of its step), the second is calm; one step of each hit by a burst of load
    computes = [0.100, 0.101, 0.099, 0.100, 0.102, 0.100, 0.300, 0.101]
    skewed = [0.015, 0.016, 0.014, 0.015, 0.015, 0.016, 0.200, 0.015]
    calm = [0.001, 0.002, 0.001, 0.002, 0.001, 0.002, 0.200, 0.001]
    q = sorted(computes)[2]  # the lower quartile of 8: the third smallest
    assert imbalance_share((skewed, computes), (calm, computes)) == pytest.approx(sorted(calm)[2] / q)
    assert imbalance_share((calm, computes), (skewed, computes)) == pytest.approx(sorted(calm)[2] / q)
    assert imbalance_share((skewed, computes), ([], [])) == pytest.approx(sorted(skewed)[2] / q)
    assert imbalance_share(([], [])) == 0.0


def test_scaling_and_world_sizes_left_out(calibration):
    cfg = small_config()
    weak = at_world_size(cfg, 8, "weak")
    assert weak.train.global_batch == 256 and weak.parallel.world_size == 8
    assert at_world_size(cfg, 64, "strong") is None  # 32 rows do not split over 64 ranks
    report = project(cfg, load_cluster(HERE), [1, 2, 16], calibration, scaling="strong")
    assert [r.world_size for r in report["rows"]] == [1, 2]
    assert report["skipped"] == [{"world_size": 16, "why": "the cluster has 8 ranks"}]
    rows = report["rows"]
    assert rows[0].scaling_efficiency == 1.0
    assert rows[1].scaling_efficiency == pytest.approx(rows[1].tokens_per_s / 2 / rows[0].tokens_per_s)


def test_memory_is_the_estimators(calibration):
    cfg = small_config(parallel={"zero_stage": 2}, precision={"dtype": "bf16"})
    report = project(cfg, load_cluster("h100-ndr"), [8, 4096])
    for row in report["rows"]:
        expected = estimate(at_world_size(cfg, row.world_size), VOCAB)
        assert row.states == expected.states and row.memory == expected.category_peaks()


def test_a_calibrated_cluster_without_calibration_is_one_line():
    with pytest.raises(CalibrationError, match="project --calibrate"):
        predict(small_config(), load_cluster(HERE), None, VOCAB)


# ----------------------------------------------------------------------------- calibration bookkeeping

@pytest.fixture
def fake_measurements(monkeypatch):
    """Replace the timed measurements by counters returning fixed figures."""
    calls = {"ring": 0, "compute": [], "peak": 0, "slicing": []}

    def ring_(sizes, dtypes):
        calls["ring"] += 1
        return {"alpha": ALPHA, "beta": BETA, "gamma": GAMMA, "ranks": 2, "sizes": sizes, "gather_s": [],
                "scatter_s": []}

    def compute_(cfg, dtypes, rows, cores, steps, warmup, levels, context_degrees):
        calls["compute"].append(list(dtypes))
        from projection_helpers import level
        return {d: {"1": level("1"), "2": level("2")} for d in dtypes}, {"1": 5e9, "2": 4e9}

    def peak_():
        calls["peak"] += 1
        return 1e11

    def slicing_(cfg, dtypes, rows, cores, steps, warmup):
        calls["slicing"].append(list(dtypes))
        return {d: 1.25 for d in dtypes}

    monkeypatch.setattr(calibrate_module, "measure_ring", ring_)
    monkeypatch.setattr(calibrate_module, "measure_compute", compute_)
    monkeypatch.setattr(calibrate_module, "peak_matmul_flops", peak_)
    monkeypatch.setattr(calibrate_module, "measure_slicing_overhead", slicing_)
    return calls


@pytest.mark.slow  # times real steps for several seconds
def test_calibration_is_saved_merged_and_reused(tmp_path, fake_measurements):
    path = tmp_path / "cache" / "calibration.json"
    cfg = small_config()
    first = calibrate(cfg, VOCAB, ["fp32"], path=path)
    assert fake_measurements == {"ring": 1, "compute": [["fp32"]], "peak": 1, "slicing": [["fp32"]]}
    assert first.model(model_signature(cfg, VOCAB))["fp32"]["2"]["slicing_overhead"] == 1.25
    assert Calibration.load(path).data == first.data
    calibrate(cfg, VOCAB, ["fp32"], path=path)  # nothing missing: nothing measured
    assert fake_measurements["compute"] == [["fp32"]] and fake_measurements["ring"] == 1
    calibrate(cfg, VOCAB, ["fp32", "bf16"], path=path, slicing=False)  # only the new precision
    assert fake_measurements["compute"] == [["fp32"], ["bf16"]] and fake_measurements["ring"] == 1
    assert fake_measurements["slicing"] == [["fp32"]]  # not asked for this time
    assert "slicing_overhead" not in Calibration.load(path).model(model_signature(cfg, VOCAB))["bf16"]["2"]
    other = small_config(model={"n_layer": 1})
    calibrate(other, VOCAB, ["fp32"], path=path)  # another model joins the same file
    assert len(Calibration.load(path).data["models"]) == 2
    calibrate(cfg, VOCAB, ["fp32"], path=path, fresh=True)  # this model again; the other one is kept
    assert fake_measurements["ring"] == 2 and fake_measurements["compute"][-1] == ["fp32"]
    assert len(Calibration.load(path).data["models"]) == 2
    assert not list(path.parent.glob(".*.tmp"))  # written atomically: no temporary left behind


@pytest.mark.parametrize("text, words", [("{not json", "not a readable calibration"),
                                          (json.dumps({"version": 0}), "not a calibration of this nanoDist")])
def test_an_unusable_calibration_is_one_line(tmp_path, text, words):
    path = tmp_path / "calibration.json"
    path.write_text(text)
    with pytest.raises(CalibrationError) as err:
        Calibration.load(path)
    assert words in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)
    assert Calibration.load(tmp_path / "none.json") is None


# ----------------------------------------------------------------------------- the engine's own groups

def _groups_of(comm, emit, cfg_dict):
    """The byte sizes of the groups this rank's replica communicates in, as the engine built them."""
    from engine.config import from_dict
    from engine.config.build import build_model
    from engine.dtypes import itemsize
    from engine.parallel.data import make_replica
    cfg = from_dict(cfg_dict)
    replica = make_replica(cfg, build_model(cfg, vocab=VOCAB), comm)
    try:
        s = itemsize(cfg.precision.dtype)
        if cfg.parallel.zero_stage == 0:
            return [(b - a) * s for a, b in replica.buckets]
        return [(b - a) * s for a, b in replica.groups]
    finally:
        replica.close()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_predicted_groups_are_the_engines(stage):
    from engine.comm.launch import run_ranks
    from engine.config import to_dict
    from engine.projection.step_parts import GroupPlan
    cfg = small_config(parallel={"world_size": 2, "zero_stage": stage, "bucket_cap_mb": 0.05},
                       precision={"dtype": "bf16"})
    built = run_ranks(2, "threads", _groups_of, (to_dict(cfg),))
    assert built[0] == built[1] == GroupPlan(cfg, VOCAB, 2).sizes


def test_the_summary_counts_only_pairs_the_measurements_tell_apart():
    from engine.projection.validate import Outcome, summarize

    def case(label, predicted, runs):
        return Outcome(label, predicted, sorted(runs)[len(runs) // 2], 0.1, 0.1, True,
                       [{"step_s": r, "predicted_s": predicted, "predicted_imbalance_share": 0.0,
                         "comm_share": r / 10, "predicted_share": predicted / 10} for r in runs])
    fast, slow = case("fast", 1.0, [1.0, 1.02, 1.01]), case("slow", 2.2, [2.0, 2.1, 2.05])
    wobbly = case("wobbly", 0.9, [1.0, 3.0, 1.05])  # its runs spread over both: ties with each
    report = summarize([fast, slow, wobbly])
    assert report["pairs_told_apart"] == 1 and report["ranking_preserved"] is True
    swapped = summarize([case("fast", 2.5, [1.0, 1.02, 1.01]), slow])
    assert swapped["ranking_preserved"] is False and swapped["discordant"] == [("fast", "slow")]
    errors = [(1.0 - 1.01) / 1.01, (2.2 - 2.05) / 2.05, (0.9 - 1.05) / 1.05]  # against the median runs
    assert report["mape"] == pytest.approx(sum(map(abs, errors)) / 3)
    assert report["bias"] == pytest.approx(sum(errors) / 3)
    assert report["max_error"] == pytest.approx(max(map(abs, errors)))
    slow_case = report["cases"][1]  # every round's figures, in the order the rounds ran
    assert slow_case["runs_s"] == [2.0, 2.1, 2.05]
    assert slow_case["comm_shares"] == pytest.approx([0.2, 0.21, 0.205])
    assert slow_case["predicted_comm_shares"] == pytest.approx([0.22, 0.22, 0.22])


def test_validation_rounds_alternate_their_order():
    """Forward, backward, forward: each pair of cases runs on both sides of a drift that lasts a round."""
    from engine.projection.validate import round_order
    cases = ["a", "b", "c"]
    assert [round_order(cases, r) for r in range(3)] == [["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]
