"""Expert parallelism: a mixture of experts' experts split over the ranks of an EP group, tokens sent to
their experts and back by all-to-all, the experts' gradients reduced over the expert-data-parallel group.
The EP and edp groups are the mesh's (engine.parallel.mesh: EP is carved out of the data x context ranks).

    file                  what
    by_hand_exchange.py   the readable start: two ranks, one expert each, the exchange written out
    exchange.py           the all-to-all as a differentiable op (dispatch forward, combine backward)
    layer.py              one MoE layer's experts split over the group: counts, dispatch, experts, combine
    plan.py               the plan: swap every MoE layer's experts for this rank's share
    replica.py            the gradient side: experts reduced over edp, everything else over dp
"""
