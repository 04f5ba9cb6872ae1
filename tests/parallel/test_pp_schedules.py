"""The four pipeline schedules over a grid of shapes (p = 1..8 ranks, m in {1, p-1, p, 2p, 3p+1, ...},
v in {1, 2, 3}): valid and deadlock-free by the checker, with the counts their papers publish: 1F1B's
warm-up of min(p - r - 1, m) forwards, in flight GPipe m, 1F1B min(p - r, m), interleaved Megatron's
(p - r - 1) * 2 + (v - 1) * p + 1 (micro-batch, chunk) pairs (and, when p does not divide m, the real
micro-batches among as many entries of Megatron's table for m rounded up), ZB-H1 no more than 1F1B; one
activation forward and one gradient backward per micro-batch per stage boundary. Interleaved over every m
from 1 to 3p + 1: tests/parallel/test_pp_interleaved_any_m.py."""
from __future__ import annotations

import pytest

from engine.config.vocabulary import PIPELINE_SCHEDULES
from engine.parallel.pipeline import counts
from engine.parallel.pipeline.check import check
from engine.parallel.pipeline.ir import Op
from engine.parallel.pipeline.schedules import ShapeError, build_schedule
from tests.pp_helpers import NAMES, grid, interleaved_runs, micro_batch_counts

RUNS = [(n, p, m, v) for n, p, m, v in grid() if n != "interleaved" or interleaved_runs(p, m, v)]
REFUSED = [(n, p, m, v) for n, p, m, v in grid() if n == "interleaved" and not interleaved_runs(p, m, v)]
SHAPES = [(p, m) for p in range(1, 9) for m in micro_batch_counts(p)]


def test_every_schedule_the_vocabulary_names_is_built():
    assert set(NAMES) == set(PIPELINE_SCHEDULES)


@pytest.mark.parametrize("name,p,m,v", RUNS)
def test_valid_and_deadlock_free(name, p, m, v):
    schedule = build_schedule(name, p, m, v)
    assert (schedule.name, schedule.ranks, schedule.micro_batches, schedule.chunks) == (name, p, m, v)
    assert check(schedule) == []


@pytest.mark.parametrize("name,p,m,v", RUNS)
def test_one_activation_forward_and_one_gradient_backward_per_micro_batch_per_boundary(name, p, m, v):
    schedule = build_schedule(name, p, m, v)
    boundaries = p * v - 1 if p > 1 else 0  # one rank: every hand-off stays on it, no message
    assert counts.messages(schedule) == {"activation": m * boundaries, "gradient": m * boundaries}
    sent = {op: sorted((a.micro_batch, a.stage) for acts in schedule.actions for a in acts if a.op == op)
            for op in (Op.SEND_ACT, Op.SEND_GRAD)}
    if p > 1:
        assert sent[Op.SEND_ACT] == [(mb, s) for mb in range(m) for s in range(p * v - 1)]
        assert sent[Op.SEND_GRAD] == [(mb, s) for mb in range(m) for s in range(1, p * v)]


@pytest.mark.parametrize("name", NAMES)
def test_one_rank_has_no_messages(name):
    schedule = build_schedule(name, 1, 3, 2 if name == "interleaved" else 1)
    assert all(a.op.is_compute for a in schedule.actions[0])
    assert check(schedule) == []


@pytest.mark.parametrize("p,m", SHAPES)
def test_1f1b_warms_up_with_min_p_minus_r_minus_1_m_forwards(p, m):
    # The published warm-up is min(p - r - 1, m) forwards; when micro-batches remain, the steady state's
    # first forward runs before the first backward as well.
    warmups = [min(p - r - 1, m) for r in range(p)]
    expected = tuple(w + 1 if m > w else w for w in warmups)
    assert counts.forwards_before_first_backward(build_schedule("1f1b", p, m)) == expected


@pytest.mark.parametrize("p,m", SHAPES)
def test_gpipe_warms_up_with_all_m_and_zb_h1_as_1f1b(p, m):
    # GPipe runs every forward first; ZB-H1 warms up as 1F1B (min(p - r - 1, m)), its first I where 1F1B's
    # first B is
    assert counts.forwards_before_first_backward(build_schedule("gpipe", p, m)) == (m,) * p
    warmups = [min(p - r - 1, m) for r in range(p)]
    expected = tuple(w + 1 if m > w else w for w in warmups)
    assert counts.forwards_before_first_backward(build_schedule("zb-h1", p, m)) == expected


@pytest.mark.parametrize("p,m", SHAPES)
def test_in_flight_gpipe_m_and_1f1b_min_p_minus_r_m(p, m):
    assert counts.peak_in_flight(build_schedule("gpipe", p, m)) == (m,) * p
    assert counts.peak_in_flight(build_schedule("1f1b", p, m)) == tuple(min(p - r, m) for r in range(p))


@pytest.mark.parametrize("p,m", SHAPES)
def test_zb_h1_holds_no_more_activations_than_1f1b(p, m):
    zb, one_f_one_b = build_schedule("zb-h1", p, m), build_schedule("1f1b", p, m)
    pairs = zip(counts.peak_in_flight(zb), counts.peak_in_flight(one_f_one_b), strict=True)
    assert all(z <= o for z, o in pairs)
    # What W still needs stays longer, but never past 1F1B's peak, rank 0's min(p, m).
    assert max(counts.peak_held(zb)) <= max(counts.peak_in_flight(one_f_one_b)) == min(p, m)


@pytest.mark.parametrize("p", range(1, 9))
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_in_flight_as_megatron_states(p, v):
    for m in (p, 2 * p, 3 * p):
        schedule = build_schedule("interleaved", p, m, v)
        warmup = [min((p - r - 1) * 2 + (v - 1) * p, m * v) for r in range(p)]
        assert counts.peak_in_flight(schedule) == tuple(min(w + 1, m * v) for w in warmup)
        assert counts.forwards_before_first_backward(schedule) == tuple(min(w + 1, m * v) for w in warmup)


@pytest.mark.parametrize("p", range(1, 9))
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_warm_up_for_any_m_is_megatrons_over_m_rounded_up(p, v):
    # Megatron's table for m' = p * ceil(m / p): entry i is micro-batch (i // (v p)) p + i % p; rank r's
    # warm-up is its first (p - r - 1) * 2 + (v - 1) * p entries, plus the steady state's first forward,
    # and micro-batches m .. m' - 1 (the last group's missing ones) are not run.
    def real(entries: int, m: int) -> int:
        return sum((i // (v * p)) * p + i % p < m for i in range(entries))

    for m in range(1, 3 * p + 2):
        padded = -(-m // p) * p
        expected = tuple(real(min((p - r - 1) * 2 + (v - 1) * p + 1, v * padded), m) for r in range(p))
        schedule = build_schedule("interleaved", p, m, v)
        assert counts.forwards_before_first_backward(schedule) == expected, m
        assert counts.peak_in_flight(schedule) == expected, m


@pytest.mark.parametrize("name,p,m,v", REFUSED)
def test_interleaved_refuses_one_chunk_in_one_line(name, p, m, v):
    with pytest.raises(ShapeError) as e:
        build_schedule(name, p, m, v)
    message = str(e.value)
    assert "\n" not in message
    assert v == 1 and e.value.parameter == "chunks" and "2 or more" in message


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1"])
def test_chunks_belong_to_interleaved_only(name):
    with pytest.raises(ShapeError, match="only the interleaved schedule"):
        build_schedule(name, 4, 8, 2)


@pytest.mark.parametrize("p,m,problem", [(0, 4, "ranks"), (4, 0, "micro_batches")])
def test_no_ranks_or_no_micro_batches_is_refused(p, m, problem):
    with pytest.raises(ShapeError) as e:
        build_schedule("1f1b", p, m)
    assert e.value.parameter == problem


def test_an_unknown_schedule_names_the_known_ones():
    with pytest.raises(ValueError, match="gpipe, 1f1b, interleaved, zb-h1"):
        build_schedule("pipedream", 4, 8)
