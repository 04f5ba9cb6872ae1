"""The pipeline executor against what it must equal: a chain of stages whose one-device losses and gradients
are written out with plain NumPy (pp_exec_helpers.chain_reference), for every schedule, p stages and m
micro-batches (fewer micro-batches than stages included); the bytes of its point-to-point exact (one
activation forward, one gradient back, per micro-batch per boundary); a sent output referenced by nobody;
and, in compute emulation, the measured bubble against the published formulas."""

from __future__ import annotations

import numpy as np
import pp_exec_helpers as helpers
import pytest

from engine.comm import run_ranks

ELEMENT_BYTES = helpers.ROWS * helpers.WIDTH * 8
SCHEDULES = {"gpipe": 1, "1f1b": 1, "interleaved": 2, "zb-h1": 1}  # name -> chunks per rank


def cases():
    for p in (1, 2, 3, 4):
        for m in sorted({1, p - 1, p, 2 * p, 3 * p + 1} - {0}):
            for name, v in SCHEDULES.items():
                try:
                    helpers.make_schedule(name, p, m, v)
                except ValueError:  # a shape the schedule refuses, in one line (the checker tests those)
                    continue
                yield name, v, p, m


@pytest.mark.parametrize("name,v,p,m", list(cases()))
def test_losses_and_gradients_equal_one_device(name, v, p, m):
    weight, stages = 1.0 / m, p * v
    results = run_ranks(p, "threads", helpers.run_chain, (name, m, v, weight), timeout_s=30)
    want_losses, want_grads = helpers.chain_reference(stages, m, weight)
    last = results[(stages - 1) % p]
    got_losses = [last["losses"][str(j)] for j in range(m)]
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-12, atol=0)
    assert all(r["losses"] == {} for r in results if r is not last)  # only the last stage knows the losses
    for r, result in enumerate(results):
        assert sorted(map(int, result["grads"])) == list(range(r, stages, p))
        for s, grad in result["grads"].items():
            np.testing.assert_allclose(np.array(grad), want_grads[int(s)], rtol=1e-12, atol=1e-15)
        # per micro-batch and boundary: one activation forward, one gradient back
        sends_act = sum(1 for s in range(r, stages, p) if s < stages - 1 and p > 1)
        sends_grad = sum(1 for s in range(r, stages, p) if s > 0 and p > 1)
        want = {"pp-activation": m * ELEMENT_BYTES * sends_act} if sends_act else {}
        want |= {"pp-gradient": m * ELEMENT_BYTES * sends_grad} if sends_grad else {}
        assert result["sent"] == want
        assert len(result["timeline"]) == len(helpers.make_schedule(name, p, m, v).actions[r])


def test_1f1b_holds_what_the_schedule_says_not_every_micro_batch():
    p = 4
    peaks = {}
    for m in (12, 24):
        results = run_ranks(p, "threads", helpers.run_chain, ("1f1b", m, 1, 1.0), timeout_s=30)
        # stage r keeps at most min(p - r, m) micro-batches' inputs for their backward, whatever m is
        assert [r["in_flight_peak"] for r in results] == [min(p - r, m) for r in range(p)]
        peaks[m] = [r["peak_held"] for r in results]
    # the executor itself: a received array, and the sends of the last two compute actions (a sent output is
    # freed when its batch is waited for, at the latest before the second compute action after its post:
    # waits.py); the same whatever m
    assert peaks[12] == peaks[24] and max(peaks[12]) <= 3, peaks


def test_a_sent_output_is_referenced_by_nobody():
    """Sends do not block the next compute action, and a sent output is freed when its batch is waited for:
    the first stage's outputs are alive until the second compute action after their forward, no longer."""
    import weakref

    from engine.comm.threads import ThreadGroup
    from engine.parallel.pipeline.executor import Executor, uniform_io
    group, refs = ThreadGroup(2, timeout_s=10), []  # refs: (the output, the compute action that made it)

    class Watching(helpers.ChainRunner):
        computed = 0

        def _check(self):
            alive = [made for ref, made in refs if ref() is not None]
            assert all(made >= self.computed - 1 for made in alive), (self.computed, alive)
            self.computed += 1

        def forward(self, stage, micro_batch, inp):
            self._check()
            out = super().forward(stage, micro_batch, inp)
            refs.append((weakref.ref(out), self.computed - 1))
            return out

        def backward(self, stage, micro_batch, grad_output):
            self._check()
            return super().backward(stage, micro_batch, grad_output)

    def rank(r: int) -> None:
        runner = (Watching if r == 0 else helpers.ChainRunner)(2, [r], 6, 1.0)
        schedule = helpers.make_schedule("1f1b", 2, 6)
        Executor(schedule, r, group.communicator(r), uniform_io((3, 5), np.float64), runner).run()

    import threading
    threads = [threading.Thread(target=rank, args=(r,)) for r in (1,)]
    for t in threads:
        t.start()
    rank(0)
    for t in threads:
        t.join()
    assert len(refs) == 6 and all(ref() is None for ref, _ in refs)


@pytest.mark.slow
def test_on_processes():
    p, m = 3, 5
    results = run_ranks(p, "processes", helpers.run_chain, ("1f1b", m, 1, 1.0 / m), timeout_s=60)
    want_losses, want_grads = helpers.chain_reference(p, m, 1.0 / m)
    np.testing.assert_allclose([results[-1]["losses"][str(j)] for j in range(m)], want_losses, rtol=1e-12)
    for r, result in enumerate(results):
        np.testing.assert_allclose(np.array(result["grads"][str(r)]), want_grads[r], rtol=1e-12, atol=1e-15)


def measured_bubble(timelines: list[list[list]]) -> float:
    """Idle share of the step's wall time over every rank: 1 - compute time / (ranks × wall)."""
    wall = max(row[4] for rows in timelines for row in rows)
    busy = sum(row[4] - row[3] for rows in timelines for row in rows if row[0] in ("F", "B", "I", "W"))
    return 1 - busy / (len(timelines) * wall)


# p = 4, m = 8, equal action times (F = I = W, B = I + W): (p−1)/(m+p−1) for GPipe and 1F1B, (p−1)/(v·m+p−1)
# interleaved (v = 2), (p−1)/(3m+p−1) ZB-H1 — written out here, not read from the schedules' own figures
FORMULAS = {"gpipe": (3 / 11, 1), "1f1b": (3 / 11, 1), "interleaved": (3 / 19, 2), "zb-h1": (3 / 27, 1)}


@pytest.mark.parametrize("name", list(FORMULAS))
def test_emulated_bubble_is_the_formula(name):
    formula, chunks = FORMULAS[name]
    results = run_ranks(4, "threads", helpers.run_emulated, (name, 8, chunks, 0.02), timeout_s=60)
    assert measured_bubble([r["timeline"] for r in results]) == pytest.approx(formula, abs=0.02)


def test_a_list_that_sends_what_it_has_not_computed_is_one_clear_failure():
    from engine.comm import RankFailure
    line = ("rank 0 failed: RuntimeError: pipeline rank 0: schedule 'broken' needs the outputs array of "
            "stage 0, micro-batch 0 before it exists")
    with pytest.raises(RankFailure, match=line):
        run_ranks(2, "threads", helpers.run_broken, timeout_s=10)


def test_the_ranks_timelines_share_one_clock():
    """Rank 1 starts its step 0.3 s after rank 0 (its first forward then finds its input waiting). On its own
    clock that forward starts at once, before rank 0's forward (0.05 s, emulated) has ended: rows counted from
    each rank's own start put an effect before its cause. Shifted by their step starts on the wall clock
    (StepResult.clock_s, which the pane lines ranks up by), rank 1's forward starts after rank 0's has ended,
    0.3 s later."""
    import threading
    import time

    from engine.comm.threads import ThreadGroup
    from engine.parallel.pipeline.executor import Emulation, Executor, uniform_io
    group, results = ThreadGroup(2, timeout_s=10), {}

    def rank(r: int) -> None:
        if r == 1:
            time.sleep(0.3)
        executor = Executor(helpers.make_schedule("1f1b", 2, 2), r, group.communicator(r),
                            uniform_io((3, 5), np.float64), emulation=Emulation(0.05, 0.05, 0.05))
        results[r] = executor.run()

    late = threading.Thread(target=rank, args=(1,))
    late.start()
    rank(0)
    late.join()

    def first_forward(r: int) -> tuple[float, float]:
        start, end = next((row[3], row[4]) for row in results[r].timeline if row[0] == "F")
        return start + results[r].clock_s, end + results[r].clock_s

    own_start = next(row[3] for row in results[1].timeline if row[0] == "F")
    assert own_start < 0.05  # counted from its own start: before rank 0's forward ended
    assert results[1].clock_s - results[0].clock_s == pytest.approx(0.3, abs=0.1)
    assert first_forward(1)[0] >= first_forward(0)[1]
    assert first_forward(1)[0] - first_forward(0)[0] == pytest.approx(0.3, abs=0.1)
