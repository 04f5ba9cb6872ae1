"""Memory: what a rank holds, measured and predicted, and whether a run fits.

    file            what
    ledger.py       the ledger: live bytes a rank actually holds, by category and phase (measured)
    estimator.py    the analytic estimate of the same bytes, from the config alone (predicted)
    estimate_parts.py  what an estimate is built from, shared by estimator.py and pipeline.py: the estimate,
                    a replica's model states, the step's replayed timeline, a GPT's saved arrays
    tensor_parallel.py  what tensor and sequence parallelism change in it: a rank's own shapes, activations
    pipeline.py     what pipeline parallelism changes in it: per pipeline rank, its stages and its schedule
    capacity.py     will the run fit on this machine? checked before any rank starts

The ledger and the estimator are kept apart on purpose: the tests hold the two equal.
"""
