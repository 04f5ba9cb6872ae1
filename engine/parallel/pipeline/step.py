"""The pipeline's share of a training step, as the trainer calls it: `forward_backward(batch, step)` in
place of its micro-batch loop, `eval_loss(x, y)` in place of one forward, `figures(step)` for its events.

One step on a pipeline rank:
  1. the tied weight's second copy (the last stage's lm_head.weight) takes the first stage's values (so
     does an evaluation after an update, or after a restore), so the copy is always the one device's weight;
  2. every pipeline rank reads the same m micro-batches of its data-parallel rank's share of the batch
     (the first stage needs the tokens, the last the targets; under context parallelism its own tokens of
     every sequence, so a stage boundary carries b × s/c × h), and the executor runs the schedule; the
     last stage seeds each backward with the loss scale / m, as one device's accumulation does;
  3. the tied weight's gradient is summed on the first stage and the last stage's copy's dropped (the copy
     is no parameter of the replica's: rank_model.py), so the first stage's update is the one device's;
     the memory ledger counts the copy (parameters) here, and its gradient while it exists;
  4. the data-parallel reduce of this rank's gradients over its data-parallel group, once: each chunk's
     buckets are issued during its last weight-gradient action and reduce while the schedule goes on
     (final_reduce.py); what waited (the tied weight's bucket, and any after it) is issued after the sum
     (replica.reduce_accumulated). The trainer then finishes it and, through PipelineLayout, agrees the
     gradient norm and fp16's overflow over every stage.
The loss: the micro-batches' losses are the last stage's. What this returns is their sum times the
pipeline degree on the last stage and 0 elsewhere, so the trainer's mean over all ranks is the mean over
the data-parallel ranks of their losses, known to rank 0 without another message.
"""

from __future__ import annotations

import numpy as np

from engine import events as ev
from engine.comm.exchange import exchange
from engine.data import rank_slice, slice_bounds
from engine.memory.ledger import rank_ledger
from engine.parallel.context.view import context_of
from engine.parallel.pipeline.executor import Emulation, Executor, uniform_io
from engine.parallel.pipeline.final_reduce import reduce_hooks
from engine.parallel.pipeline.rank_model import PipelineModel
from engine.parallel.pipeline.schedules import build_schedule
from engine.tensor import no_grad


class PipelineStep:
    def __init__(self, cfg, model: PipelineModel, replica, group, dp_rank: int, dp_size: int, rank: int,
                 tokens_per_row: int, dtype):
        p, t = cfg.parallel, cfg.train
        self.model, self.runner, self.replica, self.group = model, model.runner, replica, group
        self.dp_rank, self.dp_size, self.rank, self.m = dp_rank, dp_size, rank, t.micro_batches
        self.schedule = build_schedule(p.schedule, p.pipeline, t.micro_batches, p.chunks)
        self.me = group.rank
        self.last = self.schedule.stages - 1
        self.holds_last = self.schedule.rank_of(self.last) == self.me
        rows = t.global_batch // (dp_size * t.micro_batches)
        self.sequence_split = model.tensor_parallel.degree if p.sequence_parallel else 1
        self.context = context_of(model)  # the rank's tokens of every sequence (all of them at CP 1)
        seq = tokens_per_row // (self.context.degree * self.sequence_split)
        self.width, self.dtype = cfg.model.n_embd, dtype
        io = uniform_io((rows, seq, self.width), dtype)  # b × s × h, s/c under CP, s/t more under SP
        seconds = p.pipeline_emulate_ms / 1000
        self.emulation = Emulation(seconds, seconds, seconds) if seconds else None
        self.executor = Executor(self.schedule, self.me, group, io, self.runner, self.emulation)
        self._reduce_hooks = reduce_hooks(self.schedule, self.me, self.runner, replica)
        self.timeline: list[list] = []
        self.clock_s = 0.0  # the last step's start on the wall clock
        self._tied_fresh = False  # the copies hold the first stage's current values (false after any update)
        # the replica holds no tied copy, so the ledger hears of it here (after the replica's holds)
        self.ledger, self._tied_grad_bytes = rank_ledger(), 0
        for tie in self.runner.tied_parameters():
            if tie.params[1] is not None:
                self.ledger.add("parameters", tie.params[1].data.nbytes)
                tie.params[1].register_grad_ready_hook(self._tied_grad_ready)

    def _tied_grad_ready(self, p) -> None:
        """The copy's gradient exists from its first write (the last stage's first weight gradient) to
        _sum_tied_grads."""
        if not self._tied_grad_bytes and p.grad is not None:
            self._tied_grad_bytes = p.grad.nbytes
            self.ledger.add("gradients", self._tied_grad_bytes)

    # ---- training -----------------------------------------------------------------------------------

    def forward_backward(self, batch, step: int) -> float:
        """Steps 1-4 above; returns the micro-batches' loss sum, weighted as the module says."""
        rows = len(batch[0])
        micro = [tuple(map(self.context.local, rank_slice(batch, self.dp_rank, self.dp_size, j, self.m)))
                 for j in range(self.m)]
        first_rows = [slice_bounds(rows, self.dp_rank, self.dp_size, j, self.m)[0] for j in range(self.m)]
        self._copy_tied_weights()
        self._tied_fresh = False  # the optimizer's step comes next
        self.replica.begin_micro(sync=False)
        self.runner.begin_step(micro, self.replica.loss_scale / self.m, step, first_rows)
        # the timeline's zero: after the tied copy, where the schedule starts
        result = self.executor.run(before=self._reduce_hooks)
        self.timeline, self.clock_s = result.timeline, result.clock_s
        with self.ledger.in_phase("backward"):  # what follows the backwards: the gradients' work
            if self.emulation is None:  # emulated, no backward ran: there is no gradient to move
                self._sum_tied_grads()
            self.replica.reduce_accumulated()
        return self._weighted(sum(result.losses[j] for j in range(self.m)) if self.holds_last else 0.0)

    def _weighted(self, loss: float) -> float:
        return loss * self.schedule.ranks if self.holds_last else 0.0

    def _peer(self, stage: int) -> int:
        return self.schedule.rank_of(stage)

    def _copy_tied_weights(self) -> None:
        if self._tied_fresh:
            return
        self._tied_fresh = True
        for tie in self.runner.tied_parameters():
            first, last = tie.params
            if first is not None and last is not None:
                last.data[...] = first.data
            elif first is not None:
                exchange(self.group, [(self._peer(tie.stages[1]), first.data)], [], ["pp-tied-weight"])
            elif last is not None:
                exchange(self.group, [], [(self._peer(tie.stages[0]), last.data)])

    def _sum_tied_grads(self) -> None:
        for tie in self.runner.tied_parameters():
            first, last = tie.params
            if last is not None:  # the copy's gradient goes to the first stage, and the copy keeps none
                grad, last.grad = _grad(last), None
                self.ledger.sub("gradients", self._tied_grad_bytes)
                self._tied_grad_bytes = 0
                if first is not None:
                    _grad(first)[...] += grad
                else:
                    exchange(self.group, [(self._peer(tie.stages[0]), grad)], [], ["pp-tied-grad"])
            elif first is not None:
                incoming = np.empty_like(_grad(first))
                exchange(self.group, [], [(self._peer(tie.stages[1]), incoming)])
                _grad(first)[...] += incoming

    # ---- evaluation ---------------------------------------------------------------------------------

    def eval_loss(self, x, y) -> float:
        """One forward of (x, y) through every stage in order (no tape), weighted as a step's loss."""
        self._copy_tied_weights()  # a restored run evaluates before its first step
        x, y = self.context.local(x), self.context.local(y)
        self.runner.begin_step([(x, y)], 1.0)
        hidden: np.ndarray | None = None
        loss = 0.0
        with no_grad():
            for stage in self.schedule.stages_of(self.me):
                if stage > 0:  # stage 0 reads the tokens itself
                    rows, tokens = np.shape(x)[:2]
                    hidden = np.empty((rows, tokens // self.sequence_split, self.width), self.dtype)
                    exchange(self.group, [], [(self._peer(stage - 1), hidden)])
                out = self.runner.forward(stage, 0, hidden)
                if stage == self.last:
                    loss = float(out)
                else:
                    exchange(self.group, [(self._peer(stage + 1), np.asarray(out))], [])
        self.runner.begin_step([], 1.0)  # drop what the forwards kept
        return self._weighted(loss)

    # ---- events -------------------------------------------------------------------------------------

    def figures(self, step: int) -> list:
        """This rank's PipelineTimeline of the last step."""
        s = self.schedule
        return [ev.PipelineTimeline(step=step, rank=self.rank, stage_rank=self.me, schedule=s.name,
                                    micro_batches=s.micro_batches, chunks=s.chunks, actions=self.timeline,
                                    emulated=self.emulation is not None, clock_s=self.clock_s)]


def _grad(p) -> np.ndarray:
    if p.grad is None:
        raise RuntimeError(f"{p.name} has no gradient after the pipeline's backwards")
    return p.grad
