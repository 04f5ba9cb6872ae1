"""The data-parallel reduce of a pipeline rank's gradients starts during each chunk's last weight-gradient
action and runs while the rest of the schedule does (engine.parallel.pipeline.final_reduce): which action
that is, by hand, for each schedule; the executor's hooks run just before the actions they name; on thread
ranks (DP 2 × PP 2) every bucket is issued once, inside its chunk's final weight action, before the
executor returns — except the tied weight's, issued after the sum of its two gradients; and what trains is
one device's (float64, within 1e-12) for every schedule with DDP and ZeRO-1."""

from __future__ import annotations

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from engine.comm.threads import ThreadGroup
from engine.parallel.pipeline.executor import Executor, uniform_io
from engine.parallel.pipeline.final_reduce import final_weight_actions
from engine.parallel.pipeline.schedules import build_schedule
from tests import pp_exec_helpers as chain
from tests.pp_overlap_helpers import final_weight_rows, timed_step_rank
from tests.pp_train_helpers import assert_trains_like, pp_config, train_rank

# read off the lists `nanodist-tui schedule` prints: rank -> {index of the action: its stage}
BY_HAND = {
    ("1f1b", 2, 3, 1): {0: {11: 0}, 1: {10: 1}},  # B2s0 is rank 0's last action; rank 1 sends after B2s1
    ("zb-h1", 2, 2, 1): {0: {9: 0}, 1: {9: 1}},  # W1s0 and W1s1, not the I before them
    ("interleaved", 2, 2, 2): {0: {14: 2, 19: 0}, 1: {12: 3, 18: 1}},  # B1s2 well before B1s0
}


@pytest.mark.parametrize("key", list(BY_HAND), ids=[k[0] for k in BY_HAND])
def test_each_chunks_final_weight_action(key):
    schedule = build_schedule(*key)
    for rank, want in BY_HAND[key].items():
        assert final_weight_actions(schedule, rank) == want


def test_the_executor_calls_a_hook_just_before_its_action():
    schedule = build_schedule("zb-h1", 1, 3, 1)
    log: list = []

    class Logging(chain.ChainRunner):
        def forward(self, stage, micro_batch, inp):
            log.append(("F", micro_batch))
            return super().forward(stage, micro_batch, inp)

        def backward_input(self, stage, micro_batch, grad_output):
            log.append(("I", micro_batch))
            return super().backward_input(stage, micro_batch, grad_output)

        def backward_weight(self, stage, micro_batch):
            log.append(("W", micro_batch))
            return super().backward_weight(stage, micro_batch)

    executor = Executor(schedule, 0, ThreadGroup(1).communicator(0), uniform_io((3, 5), np.float64),
                        Logging(1, [0], 3, 1.0))
    actions = schedule.actions[0]
    executor.run(before={i: (lambda i=i: log.append(("hook", i))) for i in range(len(actions))})
    want = [entry for i, a in enumerate(actions) for entry in (("hook", i), (a.op.value, a.micro_batch))]
    assert log == want
    two = build_schedule("1f1b", 2, 2, 1)
    send = next(i for i, a in enumerate(two.actions[0]) if not a.op.is_compute)
    with pytest.raises(ValueError, match="a hook before a communication action"):
        Executor(two, 0, ThreadGroup(2).communicator(0), uniform_io((3, 5), np.float64),
                 chain.ChainRunner(2, [0], 2, 1.0)).run(before={send: print})


OVERLAP = [("1f1b", 1, 3, 0), ("1f1b", 1, 3, 1), ("interleaved", 2, 2, 0), ("zb-h1", 1, 3, 1)]


@pytest.mark.parametrize("name, v, m, zero", OVERLAP, ids=[f"{n}-zero{z}" for n, _, _, z in OVERLAP])
def test_buckets_reduce_during_each_chunks_final_weight_action(name, v, m, zero):
    """Ranks 0, 1 hold the first stage(s), 2, 3 the last; bucket_cap_mb = 0.002 makes several buckets per
    stage. Without the overlap every bucket would be issued after the executor returned."""
    cfg = pp_config(4, 2, m, name, v, zero=zero)
    for r in run_ranks(4, "threads", timed_step_rank, args=(cfg,), timeout_s=60):
        t0, returned, timeline = r["run"]
        final = {s: (t0 + a, t0 + b) for s, (a, b) in final_weight_rows(timeline).items()}
        issued = dict(r["launches"])
        assert sorted(b for b, _ in r["launches"]) == list(range(r["n_buckets"]))  # each once
        assert bool(r["tied"]) == (0 in final)  # the first stage's ranks hold wte.weight
        for b, at in issued.items():
            if b in r["tied"] or any(t in r["tied"] for t in range(b)):  # waits for the tied sum
                assert at > returned, f"bucket {b} of the tied weight issued before its gradients were summed"
                continue
            start, end = max(final[s] for s in r["stages"][b])  # the stage whose gradients were last final
            assert start <= at <= end < returned, f"bucket {b} (stages {r['stages'][b]}) issued at {at}, " \
                                                  f"not during its final weight action {start}-{end}"
        early = [b for b in issued if b not in r["tied"]]
        assert early, "no bucket issued before the executor returned"
        if v > 1:  # the later chunk's buckets went out before the earlier chunk's last backward began
            later = [b for b in early if min(r["stages"][b]) == max(final)]
            assert later and all(issued[b] < final[min(final)][0] for b in later)


DP_CASES = [("gpipe", 1, 3, 0), ("interleaved", 2, 4, 0), ("interleaved", 2, 2, 1), ("zb-h1", 1, 3, 0),
            ("zb-h1", 1, 2, 1)]


@pytest.mark.parametrize("name, v, m, zero", DP_CASES, ids=[f"{n}-m{m}-zero{z}" for n, _, m, z in DP_CASES])
def test_pipeline_times_data_parallel_trains_one_devices_model(name, v, m, zero):
    """DP 2 × PP 2 (1F1B: tests/parallel/test_pp_train.py): each chunk's buckets reduced early, the tied
    weight's after its sum — the gradients, norms, losses and parameters of one device."""
    cfg = pp_config(4, 2, m, name, v, zero=zero)
    ranks = run_ranks(4, "threads", train_rank, args=(cfg, 3), timeout_s=120)
    one = run_ranks(1, "threads", train_rank, args=(pp_config(1, 1, m, rows=4), 3), timeout_s=60)[0]
    assert_trains_like(ranks, one, grads=zero == 0)
