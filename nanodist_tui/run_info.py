"""What the workbench knows about a run once it starts: its shape (backend, ranks, mesh, ZeRO stage,
precision, checkpointing, length), read from the RunStarted event, so the layout can fit the run; and the
run's memory estimate, which the memory pane holds its measurements against."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.config import Config
from engine.dtypes import itemsize
from engine.events import RunStarted
from engine.parallel.mesh import Mesh

_DEFAULTS = Config()


@dataclass(frozen=True)
class RunInfo:
    run_id: str = ""
    preset: str = ""
    backend: str = _DEFAULTS.parallel.backend
    world_size: int = 1
    zero_stage: int = 0
    dtype: str = "fp32"
    checkpointing: str = "none"
    total_steps: int = 0
    first_step: int = 0
    n_params: int = 0
    run_dir: str = ""
    replay: bool = False
    sweep: bool = False  # a trial of a sweep (the session runs many)
    threads_per_rank: int = 0  # each rank's BLAS/OpenMP threads; 0 = not reported
    network: str = ""  # "emulated network: ..." when the links are emulated; "" for a real network
    algorithm: str = _DEFAULTS.parallel.algorithm  # parallel.algorithm (auto's choices are in Traffic)
    ranks_per_node: int = 0
    hybrid: bool = False
    # the device mesh's degrees and axis order ([parallel]; data parallelism is what remains of the world)
    tensor: int = 1
    pipeline: int = 1
    context: int = 1
    expert: int = 1
    order: str = _DEFAULTS.parallel.order
    sequence_parallel: bool = False
    # phase -> category -> bytes per rank, as the estimator predicts (RunStarted.memory_estimate); None when
    # the run did not report one. A dict: left out of the hash, so a RunInfo stays hashable.
    memory_estimate: dict[str, dict[str, int]] | None = field(default=None, hash=False)
    # under pipeline parallelism each rank's own (RunStarted.memory_estimate_per_rank[rank]: stages differ)
    memory_estimate_per_rank: list | None = field(default=None, hash=False)
    chunks: int = 1  # parallel.chunks: virtual stages per pipeline rank (interleaved)
    n_experts: int = 0  # model.n_experts (0: dense) and which blocks are MoE (model.moe_every)
    moe_every: int = 1

    @classmethod
    def from_started(cls, event: RunStarted, replay: bool = False, sweep: bool = False) -> RunInfo:
        config = event.config or {}

        def setting(section: str, key: str):
            return config.get(section, {}).get(key, getattr(getattr(_DEFAULTS, section), key))

        return cls(run_id=event.run_id, preset=event.preset, backend=setting("parallel", "backend"),
                   world_size=event.world_size, zero_stage=int(setting("parallel", "zero_stage")),
                   dtype=setting("precision", "dtype"), checkpointing=setting("memory", "checkpointing"),
                   total_steps=event.total_steps, first_step=event.first_step, n_params=event.n_params,
                   run_dir=event.run_dir, replay=replay, sweep=sweep, threads_per_rank=event.threads_per_rank,
                   network=event.network, algorithm=setting("parallel", "algorithm"),
                   ranks_per_node=int(setting("parallel", "ranks_per_node")),
                   hybrid=bool(setting("parallel", "hybrid")), memory_estimate=event.memory_estimate,
                   memory_estimate_per_rank=event.memory_estimate_per_rank,
                   chunks=int(setting("parallel", "chunks")),
                   n_experts=int(setting("model", "n_experts")), moe_every=int(setting("model", "moe_every")),
                   tensor=int(setting("parallel", "tensor")), pipeline=int(setting("parallel", "pipeline")),
                   context=int(setting("parallel", "context")), expert=int(setting("parallel", "expert")),
                   order=str(setting("parallel", "order")),
                   sequence_parallel=bool(setting("parallel", "sequence_parallel")))

    @classmethod
    def from_config(cls, config: dict, preset: str = "", sweep: bool = False) -> RunInfo:
        """The shape a run of this config (a plain dict, config.to_dict) will have: enough to lay out its
        panes before its RunStarted arrives (seconds later), so the layout is there from the first frame."""
        parallel, train = config.get("parallel", {}), config.get("train", {})
        started = RunStarted(run_id="", preset=preset or config.get("name", ""), config=config, n_params=0,
                             world_size=int(parallel.get("world_size", 1)),
                             total_steps=int(train.get("steps", 0)))
        return cls.from_started(started, sweep=sweep)

    @property
    def scales_loss(self) -> bool:
        """Only fp16 scales its loss (engine.loss_scale); every other precision has nothing to show there."""
        return self.dtype == "fp16"

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def mesh(self) -> Mesh:
        """The run's device mesh; ValueError (one line) for a layout that cannot be, which only a damaged
        recording holds (a run's config was checked before it started)."""
        return Mesh(self.world_size, self.tensor, self.pipeline, self.context, self.expert, self.order)

    @property
    def gradient_bytes(self) -> int:
        """S, the bytes of one full gradient (Ψ elements of the training dtype): what a ring all-reduce
        moves 2(N-1)/N of, per rank and step."""
        return self.n_params * itemsize(self.dtype)
