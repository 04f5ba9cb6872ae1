"""Cluster projection: predict a run on a cluster you do not have, calibrated here, validated against
runs measured here.

    file            what
    clusters.py     cluster descriptions: commented TOML files (presets/clusters/), found like presets
    collectives.py  the alpha-beta-gamma cost of ring, tree, recursive doubling, Rabenseifner and
                    hierarchical collectives; the choice per message size (NCCL's rule)
    flops.py        training FLOPs of a model (6·Ψ·tokens + attention, recompute) and when in backward
                    each gradient is final
    compute.py      how fast a rank computes: peak × efficiency by size, or this machine's measured curves
    machine.py      a cluster made concrete for one run: compute plus links (emulated networks included)
    timeline.py     the training thread and the communication thread of one step, replayed
    step.py         the step model: compute, bucket collectives overlapped with backward, ZeRO's gathers
    project.py      a run over world sizes: step split, tokens/s, scaling efficiency, MFU, memory and fit
    calibrate.py    the live measurements on this machine, saved as JSON and reused
    compute_calibration.py  its compute part: phases by size, imbalance, κ, copies, with 1 and 2 ranks busy
    transport_calibration.py  alpha, beta, gamma of our ring, wall-clock and CPU, with cold caches
    interference.py what a CPU second of communication beside compute costs it (kappa)
    quantile.py     the lower quartile every timed figure takes
    fit.py          least-squares alpha, beta, gamma; nccl-tests output
    validate.py     predicted against measured runs here: error, bias, comm share, memory, ranking

Memory comes from engine.memory.estimator (the prediction the ledger tests hold exact); buckets and shards
from engine.parallel.data.flat and engine.parallel.data.buckets, so the buckets predicted are the ones the
engine sends.
"""
