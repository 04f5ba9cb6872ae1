"""Cluster projection: predict a run on a cluster you do not have, calibrated here, validated against
runs measured here.

    file            what
    clusters.py     cluster descriptions: commented TOML files (presets/clusters/), found like presets
    collective_times.py  the alpha-beta-gamma cost of ring, tree, recursive doubling, Rabenseifner and
                    hierarchical collectives; the choice per message size (NCCL's rule); a group's placement
    group_comm.py   collective times in one process group (TP, DP): its ranks placed on the nodes by the mesh
    flops.py        training FLOPs of a model (6·Ψ·tokens + attention, recompute) and when in backward
                    each gradient is final
    compute.py      how fast a rank computes: peak × efficiency by size, or this machine's measured curves
    machine.py      a cluster made concrete for one run: compute plus links (emulated networks included)
    timeline.py     the training thread and the communication thread of one step, replayed
    step.py         the step model: compute, bucket collectives overlapped with backward, ZeRO's gathers
    step_parts.py   what it is made of and reports: the groups a stage communicates in, a step's breakdown
    tensor_parallel.py  its tensor/sequence-parallel term: the collectives per layer on the TP group's link
                    (all exposed), compute split t ways but for the regions TP does not split
    project.py      a run over world sizes: step split, tokens/s, scaling efficiency, MFU, memory and fit
    calibrate.py    the live measurements on this machine, saved as JSON and reused
    compute_calibration.py  its compute part: phases by size, imbalance, κ, copies, with 1 and 2 ranks busy
    transport_calibration.py  alpha, beta, gamma of our ring, wall-clock and CPU, with cold caches
    ring_calibration.py  ring attention's blocks timed (diagonal, whole, one device), for context parallelism
    ring_pass_calibration.py  a rank's whole ring pass (hops delivered locally), a hop beside a block
    context.py      the context-parallel term: the ring's hops and what they expose, the busiest rank's blocks
    interference.py what a CPU second of communication beside compute costs it (kappa)
    meeting_lag.py  how late ranks time-sliced on shared cores reach a collective
    slicing_overhead.py  what time-slicing costs the model beyond its share of a core
    sparse_ring.py  the engine's ring on fewer values than ranks, message by message
    quantile.py     the lower quartile every timed figure takes
    fit.py          least-squares alpha, beta, gamma; nccl-tests output
    validate.py     predicted against measured runs here: error, bias, comm share, memory, ranking

Memory comes from engine.memory.estimator (the prediction the ledger tests hold exact); buckets and shards
from engine.parallel.data.flat and engine.parallel.data.buckets over one rank's parameters as the
estimator cuts them under tensor parallelism (engine.memory.tensor_parallel.rank_shapes), so the buckets
predicted are the ones the engine sends.
"""
