"""nanoDist engine: a from-scratch NumPy training engine, distributed over N ranks.

The top level is the lesson, in reading order; every other concern has a folder named for it.

    tensor.py ops.py nn.py optim.py   the spine: reverse-mode autograd, ops, models, AdamW
    reference.py                      plain whole-array NumPy versions of every fused or compiled op
    recompute.py loss_scale.py        activation checkpointing; fp16 loss scalers
    data.py dropout_rng.py            datasets and batching; dropout masks keyed by the global row
    trainer.py                        the per-rank training loop (the one top-level module that uses
                                      the folders below)
    dtypes.py events.py paths.py      the dtype policy; the one event stream; what a user's path may be

    fast/        speed only, never changes a result (compiled kernels, 16-bit conversions, threads)
    comm/        transports and the collectives written once over send/recv
    parallel/    one folder per parallelism (data/: DDP and ZeRO 1-3)
    memory/      the ledger (measured), the estimator (predicted), capacity (will it fit)
    config/      presets, settings and their rules
    checkpoint/  sharded save and restore, resume, export, sample
    run/         a job: launch, record, control
    projection/  step time on clusters we do not have
    sweep/ sinks/ bench/   Optuna sweeps, telemetry sinks, benchmarks against PyTorch

The engine never imports textual, typer or rich; the workbench in `nanodist_tui` drives it.
"""

from engine.fast.blas_idle import sleep_when_idle

sleep_when_idle()  # before any engine module imports NumPy (engine/fast/blas_idle.py says why)
