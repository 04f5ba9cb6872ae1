"""A mixture-of-experts run as the workbench receives it, written out by hand: 4 ranks, 8 experts, top-2,
expert parallelism 4, two MoE layers (every other of 4 blocks), ExpertLoad events whose every figure is
chosen here, so the tests know each bar and each line without running a model."""

from __future__ import annotations

from engine.events import ExpertLoad, RunFinished, RunStarted, StepEnd

WORLD, EXPERTS, EP, EVERY = 4, 8, 4, 2
# step -> layer -> per rank, the choices of its tokens each expert kept (64 tokens x top-2 = 128 a rank)
TOKENS = {
    1: [[[16] * 8, [16] * 8, [16] * 8, [16] * 8],                                    # balanced
        [[40, 24, 16, 16, 8, 8, 8, 8], [40, 24, 16, 16, 8, 8, 8, 8],
         [40, 24, 16, 16, 8, 8, 8, 8], [40, 24, 16, 16, 8, 8, 8, 8]]],               # experts 0-1 busy
    2: [[[16] * 8, [16] * 8, [16] * 8, [16] * 8],
        [[64, 32, 16, 0, 0, 8, 0, 0], [64, 32, 16, 0, 0, 8, 0, 0],
         [64, 32, 16, 0, 0, 8, 0, 0], [64, 32, 16, 0, 0, 8, 0, 0]]],                 # ep3 receives nothing
}
DROPPED = {1: [0, 0], 2: [0, 8]}


def received(step: int, layer: int) -> list[int]:
    """Rows each EP rank's experts ran on: every rank's choices of that rank's two experts."""
    per_expert = [sum(col) for col in zip(*TOKENS[step][layer])]
    return [per_expert[2 * r] + per_expert[2 * r + 1] for r in range(EP)]


def moe_run(steps: int = 2) -> list:
    config = {"model": {"n_layer": 4, "n_experts": EXPERTS, "top_k": 2, "moe_every": EVERY},
              "parallel": {"backend": "threads", "world_size": WORLD, "expert": EP},
              "precision": {"dtype": "fp32"}, "memory": {"checkpointing": "none"}}
    events: list = [RunStarted(run_id="r1", preset="moe", config=config, n_params=500_000, world_size=WORLD,
                               total_steps=steps)]
    for step in range(1, steps + 1):
        for rank in range(WORLD):
            events.append(ExpertLoad(step=step, rank=rank,
                                     tokens_per_expert=[TOKENS[step][layer][rank] for layer in range(2)],
                                     received=[received(step, layer)[rank] for layer in range(2)],
                                     dropped=[d // WORLD for d in DROPPED[step]],
                                     entropy=[2.0, 1.25 + 0.25 * rank / WORLD], aux_loss=[0.01, 0.0125]))
        events.append(StepEnd(step=step, loss=3.0, lr=1e-3, tokens=4096, step_time_s=0.05,
                              tokens_per_s=80_000.0, grad_norm=1.0))
    events.append(RunFinished(steps=steps, initial_val_loss=None, final_val_loss=None, tokens_per_s=80_000.0,
                              wall_s=0.1, run_dir=""))
    return events
