"""Under pipeline parallelism the estimator predicts every rank's ledger to the byte, per pipeline rank: its
stages' model states (the last stage's tied copy of wte included), and per phase each category's own
maximum and the total at the peak — activations in flight as the schedule's action list has them, the
executor's buffers, the tied copy's gradient — each pipeline action booked in its own phase (F under forward;
B, I and W under backward), for every schedule, p in {2, 3, 4} and m in {1, p-1, p, 2p},
in float64 and fp32; with data, tensor (and sequence) parallelism and ZeRO-1 beside it, checkpointing and
16-bit training. And, from the ledger alone: 1F1B's peak of activations per stage is the same for every
m >= p, GPipe's grows with m."""

from __future__ import annotations

import pytest

from engine import events as ev
from engine.config import from_dict, to_dict
from engine.memory.estimator import estimate
from tests.pp_memory_helpers import estimate_of_rank, measured, mismatches, pp_memory_config

GRID = [(name, p, m, ("fp64", "fp32")[(p + m + i) % 2]) for i, name in enumerate(("gpipe", "1f1b",
        "interleaved", "zb-h1")) for p in (2, 3, 4) for m in sorted({1, p - 1, p, 2 * p})]


def _held_equal(cfg: dict) -> None:
    predicted = estimate_of_rank(cfg)
    problems = [line for r in measured(cfg) for line in mismatches(r, predicted[r["rank"]])]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name, p, m, dtype", GRID, ids=[f"{n}-p{p}-m{m}-{d}" for n, p, m, d in GRID])
def test_estimate_equals_the_ledger_per_stage(name, p, m, dtype):
    _held_equal(pp_memory_config(p, m, name, dtype))


BESIDE = [  # (schedule, p, m, world, overrides)
    ("1f1b", 2, 4, 4, {"parallel__zero_stage": 1}),  # DP 2 x PP 2, ZeRO-1 over the stage's DP group
    ("zb-h1", 2, 3, 4, {"parallel__zero_stage": 1, "precision__dtype": "fp16"}),
    ("interleaved", 2, 4, 4, {"tensor": 2}),  # PP 2 x TP 2
    ("gpipe", 3, 3, 3, {"memory__checkpointing": "blocks", "precision__dtype": "bf16"}),
    ("1f1b", 4, 8, 4, {"memory__checkpointing": "every:2"}),
    ("interleaved", 2, 4, 2, {"memory__checkpointing": "every:2", "model__tie_weights": False}),
    ("zb-h1", 3, 6, 3, {"memory__checkpointing": "blocks", "precision__dtype": "fp32"}),
    ("zb-h1", 4, 4, 4, {"memory__checkpointing": "every:2", "model__dropout": 0.0}),
    ("zb-h1", 2, 4, 4, {"tensor": 2, "precision__dtype": "bf16", "memory__checkpointing": "blocks"}),
    ("zb-h1", 2, 2, 4, {"tensor": 2, "parallel__sequence_parallel": True}),  # boundaries carry s/t
    ("1f1b", 2, 4, 8, {"tensor": 2, "parallel__sequence_parallel": True, "parallel__zero_stage": 1,
                       "precision__dtype": "fp16"}),  # DP 2 x PP 2 x TP 2 with SP
]


@pytest.mark.parametrize("name, p, m, world, over", BESIDE, ids=[f"{n}-p{p}-m{m}-w{w}-" + "-".join(
    f"{k.rpartition('__')[2]}={v}" for k, v in o.items()) for n, p, m, w, o in BESIDE])
def test_estimate_equals_the_ledger_beside_data_tensor_checkpointing_and_16_bit(name, p, m, world, over):
    over = dict(over)
    _held_equal(pp_memory_config(p, m, name, over.pop("precision__dtype", "fp64"), world, **over))


def _activation_peaks(name: str, p: int, m: int) -> list[int]:
    """Per pipeline rank, the ledger's highest activations of the schedule (its forwards' and backwards')."""
    results = measured(pp_memory_config(p, m, name, model__n_layer=p))  # one block per stage
    return [max(r["maxima"][phase]["activations"] for phase in ("forward", "backward")) for r in results]


@pytest.mark.parametrize("name, m", [("gpipe", 4), ("zb-h1", 1)])
def test_forwards_are_booked_under_forward_and_backwards_under_backward(name, m):
    """The ledger books each pipeline action in its own phase (F: forward; B, I, W: backward), and the
    estimate predicts each phase to the byte (the grid above). Told apart here by what only the backwards
    do: the last stage's copy of the tied embedding gets its gradient in its first B (GPipe), or its first W
    (ZB-H1; its I writes no weight gradient), and keeps it to the step's end; no forward of these lists
    comes after that, so the copy is in backward's gradients and never in forward's. The first stage has no
    copy: the same gradients in both."""
    p = 2
    cfg = pp_memory_config(p, m, name)  # float64, vocabulary 13, width 16: the copy is 13 x 16 x 8 bytes
    predicted = estimate_of_rank(cfg)
    for r in measured(cfg):
        at_rest, maxima, peaks = r["at_rest"]["gradients"], r["maxima"], r["peaks"]
        assert maxima["forward"]["gradients"] == at_rest
        copy = 13 * 16 * 8 if r["rank"] == p - 1 else 0
        assert maxima["backward"]["gradients"] == at_rest + copy
        assert maxima["forward"]["activations"] > 0 and maxima["backward"]["activations"] > 0
        assert {phase: sum(peaks[phase].values()) for phase in ("forward", "backward")} == {
            phase: sum(predicted[r["rank"]].by_phase[phase].values()) for phase in ("forward", "backward")}


def test_1f1b_in_flight_activations_do_not_grow_with_m_and_gpipes_do():
    """Measured: the middle stages' peaks are equal for m = p, 2p, 3p; the first and last stage's differ only
    by the token ids and targets, which their micro-batches keep as views of the whole global batch (one
    int64 array each of 2m rows of 8 tokens: 128 bytes per micro-batch), as one device keeps them."""
    p, tokens = 4, 2 * 8 * 8  # per micro-batch: 2 rows of 8 int64 tokens
    one_f_one_b = {m: _activation_peaks("1f1b", p, m) for m in (p, 2 * p, 3 * p)}
    for m in (2 * p, 3 * p):
        batch_views = (m - p) * tokens
        assert one_f_one_b[m] == [one_f_one_b[p][0] + batch_views, *one_f_one_b[p][1:-1],
                                  one_f_one_b[p][-1] + batch_views], one_f_one_b
    gpipe = {m: _activation_peaks("gpipe", p, m) for m in (p, 2 * p)}
    for r in range(p):
        assert gpipe[2 * p][r] > gpipe[p][r] + p * tokens and gpipe[p][r] >= one_f_one_b[p][r]
    # stage r keeps min(p - r, m) micro-batches: the middle stages (one block each) hold 3 and 2
    middle = [one_f_one_b[p][r] for r in (1, 2)]
    assert middle[0] * 2 == middle[1] * 3, middle


def test_the_run_estimate_is_the_heaviest_pipeline_rank():
    cfg = pp_memory_config(4, 8, "1f1b")
    per_rank = estimate_of_rank(cfg)
    totals = [sum(e.peak()[1].values()) for e in per_rank.values()]
    assert len(set(totals)) > 1  # the stages differ
    assert sum(estimate(from_dict(cfg)).peak()[1].values()) == max(totals)


def test_run_started_carries_each_ranks_estimate_and_every_snapshot_equals_it():
    """The launcher estimates once: RunStarted.memory_estimate the heaviest pipeline rank's, and
    memory_estimate_per_rank[r] rank r's own, which each of its MemorySnapshot peaks equals (DP 2 x PP 2)."""
    from engine.run.job import run_training
    cfg = from_dict(pp_memory_config(2, 4, "zb-h1", world=4, parallel__zero_stage=1))
    seen: list = []
    run_training(cfg, on_event=seen.append, record=False)
    started = next(e for e in seen if isinstance(e, ev.RunStarted))
    per_rank = started.memory_estimate_per_rank
    assert per_rank == [e.phases() for e in estimate_of_rank(to_dict(cfg)).values()]
    assert started.memory_estimate == estimate(cfg).phases() and len({repr(e) for e in per_rank}) == 2
    snaps = [e for e in seen if isinstance(e, ev.MemorySnapshot)]
    assert len(snaps) == 2 * 4 * 3  # steps x ranks x phases
    for s in snaps:
        assert s.peak == per_rank[s.rank][s.phase], (s.rank, s.phase)
