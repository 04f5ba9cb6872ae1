"""The per-rank training loop.

Every rank runs `train_rank` with its own communicator. The loop knows nothing about how
gradients are synchronised or where optimizer state lives: that is the replica's job
(`engine.parallel.data.make_replica`: DDP for stage 0, ZeRO for 1-3, over the rank's data-parallel group).
Nor does it know whether the model is split: on a mesh with parallel.tensor > 1 the model is this rank's
tensor-parallel shard, and its layout (engine.parallel.tensor.model_layout; a stand-in for a whole model)
gives the loss. Loss scaling, checkpointing, tensor parallelism and the meters are objects that do nothing
when disabled, so there is no `if amp:` forest here.

Events are emitted as JSON dicts (`events.to_json`) so they can cross a process boundary.
Rank 0 reports the run (RunStarted, StepEnd, Eval); every rank reports its own figures of each step
(RankStats, MemorySnapshot, Traffic) — on tcp through rank 0, where the run's recorder and workbench are.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from engine import events as ev
from engine.checkpoint.sharded import Checkpointer, NoCheckpoints, find_checkpoint, restore
from engine.comm.base import RankFailure, StopRequested
from engine.comm.collectives import all_reduce
from engine.comm.launch import process_rank
from engine.comm.meter import TrafficMeter
from engine.comm.objects import all_gather_json, broadcast_json
from engine.config import Config, from_dict, to_dict
from engine.config.build import (
    build_model,
    count_params,
    data_parallel_comm,
    load_dataset,
    mesh_groups,
    shard_model,
)
from engine.data import rank_slice, slice_bounds
from engine.dtypes import resolve_dtype
from engine.memory import ledger
from engine.moe import add_aux_losses
from engine.moe_stats import expert_load
from engine.optim import global_norm_clip_scale, lr_at
from engine.parallel.context.plan import parallelize_context
from engine.parallel.context.view import context_of
from engine.parallel.context.work import context_work
from engine.parallel.data import make_replica
from engine.parallel.expert.context import count_over_context
from engine.parallel.expert.plan import split_experts
from engine.parallel.expert.replica import with_experts
from engine.parallel.pipeline.rank_model import PipelineModel, pipeline_model
from engine.parallel.pipeline.step import PipelineStep
from engine.parallel.tensor import model_layout
from engine.recompute import apply_checkpointing
from engine.run import error_log
from engine.tensor import Tensor, no_grad, set_tape_observer

PAUSE_POLL_S = 0.1  # how often paused ranks check, together, whether to go on


class Trainer:
    """One rank's model, data, replica and loop state."""

    def __init__(self, cfg: Config, comm, emit=lambda d: None, should_stop=lambda: False,
                 replica_factory=make_replica, should_pause=lambda: False):
        self.cfg, self.comm = cfg, comm
        self.rank, self.world = comm.rank, comm.world_size
        if comm.meter is None:
            comm.meter = TrafficMeter(comm.rank)
        self._emit, self.should_stop, self.should_pause = emit, should_stop, should_pause
        # Unchecked: the launcher checks the config against this data before any rank starts
        # (engine.run.job), so a data mistake is one line at launch, not the same failure on every rank.
        self.dataset = load_dataset(cfg)
        # The rank's place on the device mesh: the data it reads and the gradients it averages are its
        # data-parallel group's; its tensor-parallel group (if any) splits the model's layers.
        self.groups = mesh_groups(cfg, comm)
        self.dp_comm = data_parallel_comm(self.groups, comm)
        self.dp_rank, self.dp_size = self.dp_comm.rank, self.dp_comm.world_size
        dense = build_model(cfg, self.dataset)
        self.n_params = count_params(dense)  # the whole model's, before any split
        # Under pipeline parallelism the model is this rank's stages of it (engine.parallel.pipeline).
        shard = shard_model(dense, cfg, self.groups)
        # Under expert parallelism each MoE layer keeps this rank's experts (engine.parallel.expert).
        shard = split_experts(shard, self.groups.ep)
        # Under context parallelism each rank of the CP group holds a slice of every sequence of its rows
        # (engine.parallel.context); the ranks hold the same weights, so gradients are averaged over the
        # data x context group, while the rows a rank reads stay its data-parallel group's.
        shard = parallelize_context(shard, self.groups.cp, cfg.parallel.context_layout)
        shard = count_over_context(shard, self.groups.cp)  # MoE: the load-balancing shares over the slices
        self.context = context_of(shard)
        self.grad_comm = self.dp_comm if self.context.degree == 1 else (
            comm if self.groups.dpcp.world_size == comm.world_size else self.groups.dpcp)
        self.model = pipeline_model(shard, cfg, self.groups, comm, self.dataset)
        self.layout = model_layout(self.model)
        self.dtype = resolve_dtype(cfg.precision.dtype)
        apply_checkpointing(self.model, cfg.memory.checkpointing)
        # The rank's memory ledger: replicas report model states to it, the tape its activations.
        self.ledger = ledger.Ledger()
        ledger.set_current(self.ledger)
        set_tape_observer(self.ledger)
        self.replica = with_experts(replica_factory(cfg, self.model, self.grad_comm), cfg, self.model,
                                    self.groups)
        # A step's forwards and backwards: the micro-batch loop below, or the pipeline's schedule.
        self.pipeline: PipelineStep | None = None
        if isinstance(self.model, PipelineModel):
            self.pipeline = PipelineStep(cfg, self.model, self.replica, self.groups.pp, self.dp_rank,
                                         self.dp_size, self.rank, self.dataset.tokens_per_row, self.dtype)
        self.step = 0
        self.tokens_seen = 0
        self.train_time = 0.0  # seconds spent in train_step, for throughput
        self.stop_agreed = False  # set when any rank was asked to stop (see _agree)
        self.pause_agreed = False  # set when any rank was asked to hold after this step
        self.gather_figures = cfg.parallel.backend == "tcp" and self.world > 1  # see _rank_figures
        self.traffic = StepTraffic()  # this rank's bytes per group and phase, summed over training steps
        self.layer_collectives: dict[str, float] = {}  # the last step's collectives per block, by phase
        # train_rank installs a Checkpointer when the run has a folder
        self.checkpoints: NoCheckpoints | Checkpointer = NoCheckpoints()

    def emit(self, event) -> None:
        self._emit(ev.to_json(event))

    # ------------------------------------------------------------------ one step

    def _loss(self, x, y) -> Tensor:
        x, y = self.context.local(x), self.context.local(y)  # this rank's tokens (all of them at CP 1)
        inputs = Tensor(x.astype(self.dtype)) if x.dtype.kind == "f" else x
        return self.layout.loss(self.model(inputs), y)

    def train_step(self) -> dict:
        """One optimizer step over this rank's slice of the global batch; returns step figures."""
        cfg, n_micro = self.cfg, self.cfg.train.micro_batches
        t0 = time.perf_counter()
        if self.comm.meter is not None:
            self.comm.meter.begin_step(self.step)
        lr = lr_at(self.step, cfg.optim.schedule, cfg.optim.lr, cfg.optim.min_lr,
                   cfg.optim.warmup_steps, cfg.train.steps)
        batch = self.dataset.global_batch(self.step, "train")
        self.model.train()
        self.replica.zero_grad()
        ledger = self.ledger
        ledger.begin_step(self.step)
        self.layout.tally.clear()
        if self.pipeline is None:
            loss_sum = self._accumulate(batch)
        else:
            # the schedule interleaves forwards and backwards: the executor books each action in its phase
            loss_sum = self.pipeline.forward_backward(batch, self.step)
        with ledger.in_phase("backward"):
            self.replica.finish_backward()
        self.layer_collectives = self.layout.collectives_per_layer(n_micro)
        with ledger.in_phase("optimizer"):
            grad_norm = self.replica.grad_norm()
            clip = global_norm_clip_scale(grad_norm**2, cfg.optim.grad_clip)
            stepped = self.replica.step(lr, clip, self.step)
        if stepped:
            self.step += 1
        step_time = time.perf_counter() - t0
        tokens = cfg.train.global_batch * self.dataset.tokens_per_row
        self.tokens_seen += tokens
        self.train_time += step_time
        mean_loss, self.stop_agreed, self.pause_agreed = self._agree(loss_sum / n_micro)
        self.traffic.add(self.comm.meter.snapshot())
        return {"loss": mean_loss, "lr": lr, "grad_norm": grad_norm, "step_time_s": step_time,
                "tokens": tokens, "skipped": not stepped}

    def _accumulate(self, batch) -> float:
        """Forward and backward of each of the step's micro-batches in turn; the sum of their losses."""
        n_micro, loss_sum = self.cfg.train.micro_batches, 0.0
        for micro in range(n_micro):
            x, y = rank_slice(batch, self.dp_rank, self.dp_size, micro, n_micro)
            self._key_dropout(len(batch[0]), micro, n_micro)
            self.replica.begin_micro(sync=micro == n_micro - 1)
            with self.ledger.in_phase("forward"):
                loss = self._loss(x, y)
            loss_sum += float(loss.data)
            with self.ledger.in_phase("backward"):
                self.replica.backward(add_aux_losses(self.model, loss), 1.0 / n_micro)
        return loss_sum

    def _key_dropout(self, rows: int, micro: int, n_micro: int) -> None:
        """Dropout masks follow the global row and the step, not the rank: N ranks draw what one
        process draws for the same rows (engine.dropout_rng; a tensor-parallel rank its part of them)."""
        rng = getattr(self.model, "rng", None)
        if rng is not None:
            rng.begin(self.step, slice_bounds(rows, self.dp_rank, self.dp_size, micro, n_micro)[0])

    def _agree(self, loss: float) -> tuple[float, bool, bool]:
        """The step's loss averaged over ranks, and whether ANY rank was asked to stop, or to pause:
        ranks notice a request at different moments (and on tcp or mpi only one process hears it), and
        must leave or hold the loop after the same step, or one would start evaluating while another
        still sends gradients."""
        mean_loss, stop_share, pause_share = self._mean_over_ranks(
            loss, float(self.should_stop()), float(self.should_pause()))
        return mean_loss, stop_share > 0, pause_share > 0

    def _hold(self) -> None:
        """Paused: every rank waits here, after the same step, until no rank asks to pause any more or one
        asks to stop; the ranks poll the two flags together, so they also go on after the same poll."""
        if self.rank == 0:
            self.emit(ev.RunPaused(step=self.step, paused=True))
        while True:
            time.sleep(PAUSE_POLL_S)
            pause_share, stop_share = self._mean_over_ranks(float(self.should_pause()),
                                                            float(self.should_stop()))
            if stop_share > 0:
                self.stop_agreed = True
                break
            if pause_share == 0:
                break
        self.pause_agreed = False
        if self.rank == 0:
            self.emit(ev.RunPaused(step=self.step, paused=False))

    def _mean_over_ranks(self, *values: float) -> list[float]:
        """Each value averaged over the ranks, in one small fp64 all-reduce."""
        if self.world == 1:
            return list(values)
        buf = np.array(values, dtype=np.float64)
        all_reduce(self.comm, buf, op="avg")
        return buf.tolist()

    def evaluate(self) -> float:
        """Mean validation loss over cfg.train.eval_batches global batches, every rank its slice."""
        self.model.eval()
        total = 0.0
        with no_grad():
            for i in range(self.cfg.train.eval_batches):
                x, y = rank_slice(self.dataset.global_batch(i, "val"), self.dp_rank, self.dp_size)
                total += float(self._loss(x, y).data) if self.pipeline is None else \
                    self.pipeline.eval_loss(x, y)
        return self._mean_over_ranks(total / self.cfg.train.eval_batches)[0]

    # ------------------------------------------------------------------ the loop

    def fit(self, run_id: str = "", preset: str = "", run_dir: str = "") -> dict:
        cfg = self.cfg
        if self.rank == 0:
            self.emit(ev.RunStarted(run_id=run_id, preset=preset or cfg.name, config=to_dict(cfg),
                                    n_params=self.n_params, world_size=self.world,
                                    total_steps=cfg.train.steps, threads_per_rank=self.comm.threads_per_rank,
                                    first_step=self.step, run_dir=run_dir,
                                    network=self.network_report()["network"]))
            self.emit(ev.Phase("compiling kernels"))  # the first forward pass compiles them (numba)
        val, evaluated_at = self.evaluate(), self.step
        first_val = val
        self._report_eval(val)
        t_start, tokens_start, train_start = time.perf_counter(), self.tokens_seen, self.train_time
        if self.rank == 0 and self.step < cfg.train.steps:
            self.emit(ev.Phase("first step"))  # the backward pass's kernels compile in it
        while self.step < cfg.train.steps and not self.stop_agreed:
            s = self.train_step()
            self._report_step(s)
            self.checkpoints.after_step(self, stepped=not s["skipped"])
            if cfg.train.eval_every and self.step % cfg.train.eval_every == 0 and not s["skipped"]:
                val, evaluated_at = self.evaluate(), self.step
                self._report_eval(val)
            if self.pause_agreed and not self.stop_agreed:
                self._hold()
        if evaluated_at != self.step:  # the run ends with an evaluation of its final parameters
            val = self.evaluate()
            self._report_eval(val)
        wall = time.perf_counter() - t_start
        # Stop means keep: a stopped run checkpoints at the step it reached (every rank, the same step,
        # as they agreed), so `resume` continues it exactly where it stopped.
        self.checkpoints.at_end(self)
        # Throughput over the time spent in training steps (evaluations and checkpoints excluded),
        # the same figure StepEnd.tokens_per_s reports step by step.
        return {"steps": self.step, "initial_val_loss": first_val, "final_val_loss": val,
                "tokens_per_s": (self.tokens_seen - tokens_start) / max(self.train_time - train_start, 1e-9),
                "wall_s": wall, "threads_per_rank": self.comm.threads_per_rank, **self.network_report(),
                "traffic": self.traffic.per_step(), "collectives_per_layer": self.layer_collectives}

    def network_report(self) -> dict:
        """{"network": "emulated network: ..." or "" for a real one, "links": what the emulation held on
        this rank's links ([{peer, messages, bytes, wire_s}])} — from the transport itself, so an
        emulated run can never pass for a real one."""
        report = getattr(self.comm, "network_report", None)
        return report() if report is not None else {"network": "", "links": []}

    def _report_step(self, s: dict) -> None:
        for event in self._rank_figures(s):
            self.emit(event)
        if self.rank == 0:
            self.emit(ev.StepEnd(step=self.step, loss=s["loss"], lr=s["lr"], tokens=s["tokens"],
                                 step_time_s=s["step_time_s"],
                                 tokens_per_s=s["tokens"] / max(s["step_time_s"], 1e-9),
                                 grad_norm=s["grad_norm"], loss_scale=self._loss_scale(),
                                 skipped=s["skipped"]))
        for change in self.replica.drain_events():
            if self.rank == 0:
                self.emit(change)

    def _rank_figures(self, s: dict) -> list:
        """This rank's figures of the step: RankStats, a MemorySnapshot per phase, Traffic (and a pipeline
        rank's PipelineTimeline, an MoE model's ExpertLoad, ring attention's ContextWork). On a tcp launch,
        where only rank 0's events reach the run's recorder and workbench, every rank's, gathered to all (as
        JSON) and reported by rank 0."""
        mine = [ev.RankStats(step=self.step, rank=self.rank, step_time_s=s["step_time_s"],
                             comm_wait_s=self.replica.comm_wait_s, bytes_sent=self.replica.bytes_sent),
                *self.ledger.snapshots(self.step, self.rank),
                *(self.pipeline.figures(self.step) if self.pipeline is not None else []),
                # a tensor-parallel group routes the same tokens: its first rank reports them
                *[e for e in expert_load(self.model, self.step, self.rank) if self.groups.tp.rank == 0],
                *context_work(self.model, self.step, self.rank)]
        if self.world > 1:
            mine.append(ev.Traffic(step=self.step, rank=self.rank, links=self.comm.meter.snapshot()))
        if not self.gather_figures:
            return mine
        everyone = all_gather_json(self.comm, [ev.to_json(e) for e in mine])
        return [ev.from_json(d) for rank in everyone for d in rank] if self.rank == 0 else []

    def _loss_scale(self) -> float | None:
        """The current loss scale, or None when this run does not scale (anything but fp16)."""
        return self.replica.loss_scale if self.cfg.precision.dtype == "fp16" else None

    def _report_eval(self, val: float) -> None:
        if self.rank == 0:
            self.emit(ev.Eval(step=self.step, val_loss=val))


class StepTraffic:
    """The bytes this rank sent in training steps, by group and phase (the meter's per-step links summed;
    evaluations and checkpoints left out): what the run's summary reports per step, for every group the
    rank belongs to — "tp0" forward and backward, "dp1" or "world" for the gradient reduce, ..."""

    def __init__(self):
        self.steps = 0
        self.bytes: dict[tuple[str, str], int] = {}

    def add(self, links: list[dict]) -> None:
        self.steps += 1
        for row in links:
            key = (row["group"], row["phase"])
            self.bytes[key] = self.bytes.get(key, 0) + row["bytes"]

    def per_step(self) -> list[dict]:
        """[{group, phase, bytes_per_step}], in group then phase order."""
        return [{"group": group, "phase": phase, "bytes_per_step": total / max(self.steps, 1)}
                for (group, phase), total in sorted(self.bytes.items())]


def train_rank(comm, emit, cfg_dict: dict, run_id: str = "", checkpoint_dir: str = "",
               resume_from: str = "") -> dict:
    """Entry point of one rank (any backend): rebuild the config, restore the checkpoint `resume_from`
    (if any), train, checkpoint into `checkpoint_dir` (if any), return the summary."""
    cfg = from_dict(cfg_dict, source="<run config>")
    if process_rank(cfg.parallel.backend) is not None and comm.world_size > 1:
        # Ranks started by mpiexec or by hand: rank 0's process made the run folder; everyone uses it.
        run_id, checkpoint_dir, resume_from = broadcast_json(comm, [run_id, checkpoint_dir, resume_from])
    if comm.rank == 0:
        emit(ev.to_json(ev.Phase("building the model")))
    try:
        trainer = Trainer(cfg, comm, emit, comm.should_stop, should_pause=comm.should_pause)
    except Exception as exc:
        _log_own_failure(exc, comm.rank, checkpoint_dir)
        raise
    try:
        if checkpoint_dir:
            trainer.checkpoints = Checkpointer(checkpoint_dir, cfg.checkpoint.every, cfg.checkpoint.keep,
                                               cfg_dict, run_id)
        if resume_from:
            ckpt = find_checkpoint(resume_from)
            restore(trainer, ckpt)
            if trainer.rank == 0:
                trainer.emit(ev.Log(level="info", message=f"resumed at step {ckpt.step} from {ckpt.path}"))
        return trainer.fit(run_id=run_id, run_dir=str(Path(checkpoint_dir).parent) if checkpoint_dir else "")
    except Exception as exc:
        _log_own_failure(exc, comm.rank, checkpoint_dir)
        raise
    finally:
        trainer.replica.close()


def _log_own_failure(exc: Exception, rank: int, checkpoint_dir: str) -> None:
    """This rank's own error (not one it saw from a peer): its full traceback into the run folder's
    error.log, which the one-line failure message points to."""
    if checkpoint_dir and not isinstance(exc, (RankFailure, StopRequested)):
        error_log.write(Path(checkpoint_dir).parent, f"rank {rank} failed", exc)
