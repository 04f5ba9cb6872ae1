"""The schedule checker can fail: a dropped receive, two actions swapped into a deadlock, a duplicated
forward, a weight gradient before its input gradient, a wrong peer, an action on the wrong rank, a missing
backward; each reported with the rank and the action (its index in the rank's list and its text). The
expected lines are written out here by hand from the edited lists."""
from __future__ import annotations

import pytest

from engine.parallel.pipeline.check import ScheduleError, check, validate
from engine.parallel.pipeline.ir import Action, Op
from engine.parallel.pipeline.schedules import build_schedule
from tests.pp_helpers import edited


def texts(actions) -> list[str]:
    return [str(a) for a in actions]


def test_a_dropped_receive_is_named_and_so_is_the_deadlock_it_causes():
    schedule = build_schedule("1f1b", 2, 2)
    rank1 = list(schedule.actions[1])
    assert texts(rank1) == ["RECV_ACT0s1<-0", "F0s1", "B0s1", "SEND_GRAD0s1->0",
                            "RECV_ACT1s1<-0", "F1s1", "B1s1", "SEND_GRAD1s1->0"]
    del rank1[4]
    assert check(edited(schedule, 1, rank1)) == [
        "rank 1, action 4 (F1s1): needs its input received (RECV_ACT1s1)",
        "rank 0, action 3 (SEND_ACT1s0->1): rank 1 never posts the matching receive",
        # rank 0 sends micro-batch 1's activation in one batch with micro-batch 0's gradient: the batch
        # never completes, so rank 1 waits forever for micro-batch 1's gradient to be taken
        "deadlock: rank 0 blocks: action 3 (SEND_ACT1s0->1) waits for rank 1",
        "deadlock: rank 1 blocks: action 6 (SEND_GRAD1s1->0) waits for rank 0",
    ]


def test_two_actions_swapped_into_a_deadlock():
    schedule = build_schedule("gpipe", 2, 2)
    rank0 = list(schedule.actions[0])
    assert texts(rank0) == ["F0s0", "SEND_ACT0s0->1", "F1s0", "SEND_ACT1s0->1",
                            "RECV_GRAD0s0<-1", "B0s0", "RECV_GRAD1s0<-1", "B1s0"]
    rank0[1], rank0[4] = rank0[4], rank0[1]  # wait for the gradient before sending the activation
    # every action still follows what it needs on its own rank: only playing the ranks out finds this
    assert check(edited(schedule, 0, rank0)) == [
        "deadlock: rank 0 blocks: action 1 (RECV_GRAD0s0<-1) waits for rank 1",
        "deadlock: rank 1 blocks: action 0 (RECV_ACT0s1<-0) waits for rank 0",
    ]


def test_a_duplicated_forward():
    schedule = build_schedule("gpipe", 2, 2)
    rank0 = list(schedule.actions[0])
    rank0.insert(3, Action(Op.FORWARD, 1, 0))
    assert check(edited(schedule, 0, rank0)) == [
        "rank 0, action 3 (F1s0): a second F of micro-batch 1 on stage 0"]


def test_a_weight_gradient_before_its_input_gradient():
    schedule = build_schedule("zb-h1", 2, 2)
    rank1 = list(schedule.actions[1])
    assert texts(rank1) == ["RECV_ACT0s1<-0", "F0s1", "I0s1", "SEND_GRAD0s1->0",
                            "RECV_ACT1s1<-0", "F1s1", "I1s1", "SEND_GRAD1s1->0", "W0s1", "W1s1"]
    rank1.insert(2, rank1.pop(8))  # W0s1 moved before I0s1
    assert check(edited(schedule, 1, rank1)) == [
        "rank 1, action 2 (W0s1): needs its input-gradient half I0s1 first"]


def test_a_message_to_the_wrong_rank():
    schedule = build_schedule("1f1b", 3, 2)
    rank1 = list(schedule.actions[1])
    assert str(rank1[0]) == "RECV_ACT0s1<-0"
    rank1[0] = Action(Op.RECV_ACT, 0, 1, peer=2)
    assert check(edited(schedule, 1, rank1)) == [
        "rank 1, action 0 (RECV_ACT0s1<-2): the neighbouring stage lives on rank 0, not 2"]


def test_an_action_on_the_wrong_rank():
    schedule = build_schedule("1f1b", 2, 2)
    rank0 = [*schedule.actions[0], Action(Op.FORWARD, 0, 1)]
    assert check(edited(schedule, 0, rank0)) == ["rank 0, action 8 (F0s1): stage 1 lives on rank 1"]


def test_a_missing_backward():
    schedule = build_schedule("1f1b", 2, 2)
    rank0 = [a for a in schedule.actions[0] if a != Action(Op.BACKWARD, 1, 0)]
    assert check(edited(schedule, 0, rank0)) == [
        "rank 0: no backward (B, or I and W) of micro-batch 1 on stage 0"]


def test_validate_raises_with_the_problems_and_passes_a_valid_schedule():
    schedule = build_schedule("gpipe", 2, 2)
    validate(schedule)
    rank0 = list(schedule.actions[0])
    rank0[1], rank0[4] = rank0[4], rank0[1]
    with pytest.raises(ScheduleError, match=r"gpipe schedule invalid: deadlock: rank 0 blocks: action 1 "):
        validate(edited(schedule, 0, rank0))
