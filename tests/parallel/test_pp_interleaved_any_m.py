"""Interleaved 1F1B runs every number of micro-batches m >= 1, not only multiples of the p ranks: over
p = 2..8, m = 1..3p+1 and v = 2..4 chunks the checker finds the schedule valid and deadlock-free under the
batched messages, and its simulated step (F and B of equal time, or B twice F) is the one its docstring
states: (F + B)(v m' + p - 1 - d) with m' = m rounded up to a multiple of p and d = m' - m, a bubble of
(p - 1 + (v - 1) d) / (v m + p - 1 + (v - 1) d), the published (p - 1) / (v m + p - 1) when p divides m.
Both are held against a lower bound any order must obey, worked out here from the dependencies alone."""
from __future__ import annotations

import pytest

from engine.parallel.pipeline.check import check
from engine.parallel.pipeline.schedules import build_schedule, formula_bubble
from engine.parallel.pipeline.simulate import Durations, simulate

GRID = [(p, m, v) for p in range(2, 9) for m in range(1, 3 * p + 2) for v in (2, 3, 4)]
TIMES = [(1.0, 1.0), (1.0, 2.0)]  # (F, B) of one chunk


def lower_bound_step(p: int, m: int, v: int, f: float, b: float) -> float:
    """No order does better. Rank p - 1 cannot start before p - 1 forwards have passed it, computes
    v m (f + b), and after its last chunk-0 backward that gradient still crosses p - 1 ranks: (f + b)
    (v m + p - 1). And the micro-batch rank 0 starts last waits m - 1 forwards, then crosses all v p
    stages forward and back: (m - 1) f + v p (f + b); the same counted from the first backward to
    reach stage 0, with m - 1 backwards after it."""
    return max((f + b) * (v * m + p - 1), v * p * (f + b) + (m - 1) * max(f, b))


@pytest.mark.parametrize("p", range(2, 9))
def test_valid_and_deadlock_free_for_every_m_and_v(p):
    for m in range(1, 3 * p + 2):
        for v in (2, 3, 4):
            assert check(build_schedule("interleaved", p, m, v)) == [], (p, m, v)


@pytest.mark.parametrize("p", range(2, 9))
@pytest.mark.parametrize("f,b", TIMES)
def test_simulated_step_and_bubble_are_the_stated_ones(p, f, b):
    for m in range(1, 3 * p + 2):
        for v in (2, 3, 4):
            timeline = simulate(build_schedule("interleaved", p, m, v), Durations(forward=f, backward=b))
            d = -m % p
            assert timeline.makespan == pytest.approx((f + b) * (v * (m + d) + p - 1 - d), rel=1e-12)
            if d == 0:
                assert timeline.bubble == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-12)
            else:
                stated = (p - 1 + (v - 1) * d) / (v * m + p - 1 + (v - 1) * d)
                assert timeline.bubble == pytest.approx(stated, rel=1e-12)
            assert timeline.makespan >= lower_bound_step(p, m, v, f, b) - 1e-9
            # with a full last group the step is the bound: nothing idles that need not
            assert (timeline.makespan == pytest.approx(lower_bound_step(p, m, v, f, b))) == (d == 0 or m == 1)


def test_fewer_micro_batches_than_ranks():
    # p = 4, m = 3, v = 2: one group short of one micro-batch; (v (p - m) + m - 1) / (v p + m - 1) = 4/10
    timeline = simulate(build_schedule("interleaved", 4, 3, 2), Durations(forward=1.0, backward=1.0))
    assert timeline.bubble == pytest.approx(0.4, rel=1e-12)
    assert timeline.makespan == pytest.approx(2 * (2 * 4 + 3 - 1), rel=1e-12)


def test_the_formula_shown_says_which_one_applies():
    assert formula_bubble("interleaved", 4, 8, 2) == ("(p-1)/(v*m+p-1)", pytest.approx(3 / 19, rel=1e-12))
    text, value = formula_bubble("interleaved", 4, 7, 2)  # d = 1: (3 + 1) / (14 + 3 + 1)
    assert text == "(p-1+(v-1)d)/(v*m+p-1+(v-1)d), d=p-m%p"
    assert value == pytest.approx(4 / 18, rel=1e-12)
