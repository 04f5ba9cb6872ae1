"""When the executor waits (engine.parallel.pipeline.waits), for every schedule over a grid of (p, m): each
compute action that reads a received array waits for the batch receiving it, and for no batch posted after
it; a batch is waited for before the second compute action after its post (so a sent array lives through
one compute action at most); no receive is waited for before the compute action that reads it needs it (the
rule that frees sends never forces an early wait on a receive); and the waits are a subset of a blocking
executor's (each batch before the next compute action)."""

from __future__ import annotations

import pytest

from engine.parallel.pipeline.ir import Op
from engine.parallel.pipeline.schedules import build_schedule
from engine.parallel.pipeline.waits import RECEIVE_OF, wait_plan

GRID = [(name, v, p, m) for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1))
        for p in (2, 3, 4) for m in sorted({1, p - 1, p, 2 * p, 3 * p + 1})]


@pytest.mark.parametrize("name, v, p, m", GRID, ids=[f"{n}-p{p}-m{m}" for n, _, p, m in GRID])
def test_waits_for_what_it_reads_and_frees_sends_one_compute_action_later(name, v, p, m):
    try:
        schedule = build_schedule(name, p, m, v)
    except ValueError:  # a shape the schedule refuses in one line
        pytest.skip("refused")
    for actions in schedule.actions:
        plan = wait_plan(actions)
        batch_of = {i: k for k, batch in enumerate(plan.batches) for i in batch}
        receives = {(actions[i].op, actions[i].stage, actions[i].micro_batch): batch_of[i] for i in batch_of
                    if actions[i].op in (Op.RECV_ACT, Op.RECV_GRAD)}
        first_reader = {}
        for j, i in enumerate(plan.computes):
            a = actions[i]
            needed = receives.get((RECEIVE_OF.get(a.op), a.stage, a.micro_batch))
            if needed is not None:
                first_reader.setdefault(needed, j)
                assert needed < plan.done[j]  # its input is there when it runs
            assert plan.done[j] <= plan.posted[j]  # only what was posted
            assert j < 1 or plan.done[j] >= plan.posted[j - 1]  # one compute action to complete in
            assert j < 1 or plan.done[j] >= plan.done[j - 1]  # in list order
        for j in range(len(plan.computes)):
            early = range(plan.done[j - 1] if j else 0, plan.done[j])
            # a batch waited for here that receives is read here, not later: no receive waited for early
            assert all(first_reader.get(k, j) == j for k in early), (j, early, first_reader)
