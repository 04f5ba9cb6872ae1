"""A context-parallel run as the workbench receives it, written out by hand: DP 2 x CP 2 (4 ranks), 2 blocks,
ContextWork events whose counts follow from the layout (causal blocks per rank x blocks of the model), so the
tests know each line without running a model. Contiguous: ranks 0 and 2 compute 1 block of 512 x 512 scores
per head and row, ranks 1 and 3 two; rows 4, heads 4."""

from __future__ import annotations

from engine.events import ContextWork, RunFinished, RunStarted, StepEnd

WORLD, C, LAYERS, CHUNK, ROWS_HEADS = 4, 2, 2, 512, 16


def context_run(layout: str = "contiguous", steps: int = 2) -> list:
    config = {"model": {"n_layer": LAYERS, "block_size": C * CHUNK},
              "parallel": {"backend": "threads", "world_size": WORLD, "context": C, "context_layout": layout},
              "precision": {"dtype": "fp32"}, "memory": {"checkpointing": "none"}}
    events: list = [RunStarted(run_id="r1", preset="cp", config=config, n_params=100_000, world_size=WORLD,
                               total_steps=steps)]
    for step in range(1, steps + 1):
        for rank in range(WORLD):
            blocks = (rank % C + 1) * LAYERS
            events.append(ContextWork(step=step, rank=rank, layout=layout, degree=C, blocks=blocks,
                                      scores=blocks * ROWS_HEADS * CHUNK * CHUNK))
        events.append(StepEnd(step=step, loss=3.0, lr=1e-3, tokens=4096, step_time_s=0.05,
                              tokens_per_s=80_000.0, grad_norm=1.0))
    events.append(RunFinished(steps=steps, initial_val_loss=None, final_val_loss=None, tokens_per_s=80_000.0,
                              wall_s=0.1, run_dir=""))
    return events
