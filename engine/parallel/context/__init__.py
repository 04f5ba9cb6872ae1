"""Context parallelism: the ranks of a context-parallel group each hold a slice of every sequence, and
attention, the one layer that mixes positions, runs as ring attention over the group.

    file             what
    by_hand_ring.py  the readable start: c ranks as lists in one process, the online-softmax merge and
                     the hops written out, forward and backward
    layout.py        who holds which chunks (contiguous, zigzag), positions, the causal work per rank
    blocks.py        one (query chunk, key chunk) block in NumPy, forward and backward, and the merge
    ring_attention.py  the ring over a real group: K/V hops forward, K/V and dK/dV hops backward
    hops.py          a hop's exchange on a helper thread while the blocks compute (double-buffered)
    dropout.py       each rank's part of the one-device dropout masks: its positions' rows, and each
                     ring block's rectangle of attention's mask
    plan.py          parallelize_context(model, group, layout): a GPT's attention and positions swapped
                     for their ring forms
    view.py          what the plan made, as the trainer and replicas ask it (context_of: ContextParallel,
                     the rank's tokens and targets; a stand-in for a model that holds whole sequences)
    work.py          the ring's blocks and scores of a step, as each rank's ContextWork event

A step on a context-parallel GPT, every rank of the group on the same rows of the batch:

    model = parallelize_context(model, cp_group, "zigzag")
    cp = context_of(model)
    x, y = cp.local(x), cp.local(y)          # this rank's tokens of every sequence
    loss = layout.loss(model(x), y)          # the mean over its tokens; K/V hops inside attention
    loss.backward()                          # dK/dV hops inside attention's backward
    ... gradients averaged over the data x context group (they hold the same weights)
"""
