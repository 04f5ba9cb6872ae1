"""The executor: one pipeline rank's list of a Schedule, run for one step.

It walks the rank's actions in order. A compute action calls the stage runner (interface.StageRunner); a
maximal run of communication actions is one batch, posted at once (the IR's semantics: posted together,
complete when every send met its receive), so two neighbours that send to each other in the same batch never
deadlock.

Sends do not block the next compute action (as Megatron's asynchronous point-to-point): each batch is posted
without waiting (engine.comm.exchange.post: on threads the sends are copies in the peer's mailbox at once; on
processes and tcp a shared-memory slot or the socket takes a message of the preset's size at once; on mpi,
Isend and Irecv), and the rank goes on computing while its receives land. It waits only where waits.py says:
before a compute action that reads a received array, for the batch receiving it (a receive posted an action
ahead lands meanwhile); before a compute action, for the batches posted before the one preceding it (a batch
gets one compute action to complete in); at the step's end, for all. Each wait moves every batch posted on
the way, and before each compute action what is posted moves as far as it can without waiting (a receive's
slot handed back, the rest of a large send). Those waits are a subset of a blocking executor's (which waits
for each batch before its next compute action), so no backend can deadlock here where the schedule, checked
with the blocking semantics, does not. Everything stays on the rank's thread (no thread of its own: one that
needs the interpreter's lock while the rank computes costs it milliseconds at each message on a busy
machine). What it holds between actions, keyed by (stage, micro-batch):

  inputs       activations received for a stage's forward          dropped when the forward has read them
  outputs      a stage's output waiting for its SEND_ACT            posted with its batch
  grad_in      output gradients received for a stage's backward     dropped when the backward has read them
  grad_out     a stage's input gradient waiting for its SEND_GRAD   posted with its batch

and the batches posted and not yet waited for: the arrays they send, the buffers they receive into. A sent
array is dropped when its batch is waited for, at most one compute action after its post (so GPipe's first
stage does not keep all m outputs until its first backward): what makes 1F1B's memory bound real, nothing
here keeps it (the runner keeps the tape, not the array). With one pipeline rank (p = 1) successive stages
hand over on the spot. The rank's memory ledger counts every held array as a communication buffer: a
received one from its allocation (at its batch's post: the message lands in it), a sent one until its batch
is waited for, at points of the action list (waits.py), so the estimate (engine.memory.pipeline) replays them
to the byte. The ledger's phase is the action's: a forward's under "forward", a B, I or W under "backward",
each with the waits before it and the batches posted after it (the step's end under the last action's).
The meter books each send under its phase (pp-activation, pp-gradient) when its batch is seen complete, with
the seconds from its post.

Hooks. `run(before={i: f})` calls f just before the rank's compute action i: the step arms the data-parallel
reduce of a chunk's gradients there (final_reduce.py). The executor knows nothing of what a hook does.

Received arrays are allocated per message from `io(stage)`: the (shape, dtype) of stage's input, which is
also its input gradient's (b × s × h in the compute dtype; s/t under sequence parallelism).

Timing. Every action's start and end are measured (time.perf_counter, seconds from the step's start) into
`timeline`: rows [op, micro_batch, stage, start_s, end_s] in the order the rank ran them — the format of
events.PipelineTimeline. A compute action's row is its run; a communication action's is the time the rank
was blocked on it: from when it began waiting for its batch to when it saw the batch complete (no time at
all when the batch had completed before it was needed), so the rows of a batch share their times, only
real waits show, and no two rows of different batches or actions overlap. Compute rows come in list order;
a batch's rows where it was waited for (after the compute action that posted it, before the one it feeds). The
rows' zero is the rank's own step start; `clock_s` is that moment on the wall clock, which the ranks of a
pipeline share (one host) or keep in step (several), so the workbench lines their rows up by it.
Emulation (`Emulation`): each compute action sleeps a fixed time instead of computing and sends zeros of the
right shape, so an 8-stage schedule on 2 cores is timed as if every stage had a core of its own (sleeping
burns none).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from engine.comm.exchange import Posted, post, progress
from engine.memory.ledger import rank_ledger
from engine.parallel.pipeline.interface import StageRunner
from engine.parallel.pipeline.ir import Action, Op, Schedule
from engine.parallel.pipeline.waits import WaitPlan, wait_plan

IO = Callable[[int], tuple[tuple[int, ...], np.dtype]]  # stage -> (shape, dtype) of its input
Hooks = Mapping[int, Callable[[], None]]  # an index into a rank's actions -> what to call just before it
PHASES = {Op.SEND_ACT: "pp-activation", Op.SEND_GRAD: "pp-gradient"}


@dataclass(frozen=True)
class Emulation:
    """Seconds each compute action sleeps instead of computing; B is I and W together."""
    forward_s: float
    backward_input_s: float
    backward_weight_s: float

    def seconds(self, op: Op) -> float:
        return {Op.FORWARD: self.forward_s, Op.BACKWARD_INPUT: self.backward_input_s,
                Op.BACKWARD_WEIGHT: self.backward_weight_s,
                Op.BACKWARD: self.backward_input_s + self.backward_weight_s}[op]


def uniform_io(shape: tuple[int, ...], dtype) -> IO:
    """Every stage boundary carries the same shape (a GPT's hidden state [b, s, h])."""
    spec = (tuple(shape), np.dtype(dtype))
    return lambda stage: spec


@dataclass
class _Posted:
    """A batch posted and not yet waited for."""
    batch: list[Action]
    sends: list[tuple[int, np.ndarray]]  # (peer, array): held here until the batch is waited for
    phases: list[str]  # the meter's phase of each send
    landed: list[tuple[str, tuple[int, int], np.ndarray]]  # (kind, key, buffer) of each receive
    handle: Posted | None = None


@dataclass
class StepResult:
    losses: dict[int, float]  # micro-batch -> its loss (the last stage's rank; empty elsewhere)
    timeline: list[list]  # [op, micro_batch, stage, start_s, end_s] per action, in the order they ran
    peak_held: int  # most arrays the executor held at once (inputs, outputs, gradients)
    clock_s: float = 0.0  # the step's start (the timeline's zero) on the wall clock (time.time())


class Executor:
    """Runs pipeline rank `rank`'s actions of `schedule` over `comm`, the pipeline group."""

    def __init__(self, schedule: Schedule, rank: int, comm, io: IO, runner: StageRunner | None = None,
                 emulation: Emulation | None = None):
        if runner is None and emulation is None:
            raise ValueError("the executor needs a stage runner, or an emulation to stand in for one")
        if comm.world_size != schedule.ranks:
            raise ValueError(f"a {schedule.ranks}-rank schedule over a pipeline group of {comm.world_size}")
        self.schedule, self.rank, self.comm, self.io = schedule, rank, comm, io
        self.runner, self.emulation = runner, emulation
        self.last = schedule.stages - 1
        self.ledger = rank_ledger()

    def run(self, start: float | None = None, before: Hooks | None = None) -> StepResult:
        """One step; `start` (perf_counter) is when the step began (default: now). `before[i]`, if given, is
        called just before the rank's compute action i (an index into its list) runs."""
        t0 = time.perf_counter() if start is None else start
        clock = time.time() - (time.perf_counter() - t0)  # t0 on the clock every rank reads
        self._held: dict[str, dict[tuple[int, int], np.ndarray]] = {
            "inputs": {}, "outputs": {}, "grad_in": {}, "grad_out": {}}
        self._peak, losses = 0, {}
        timeline: list[list] = []
        actions = self.schedule.actions[self.rank]
        before = before or {}
        if any(not actions[i].op.is_compute for i in before):
            raise ValueError(f"pipeline rank {self.rank}: a hook before a communication action")
        plan = wait_plan(actions)
        self._posted: list[_Posted] = []  # batches posted and not yet waited for, in order
        self._next_batch = self._waited = 0  # batches posted, and waited for, so far
        self._t0, self._timeline, self._in_flight = t0, timeline, 0  # in flight: arrays in posted batches
        for j, i in enumerate(plan.computes):
            a = actions[i]
            # the ledger books the action, the waits before it and the batches posted after it in its phase
            with self.ledger.in_phase("forward" if a.op == Op.FORWARD else "backward"):
                self._post(actions, plan, plan.posted[j])  # the batches before the first compute action
                self._wait(plan.done[j])
                if self._posted:  # what is posted moves on while this rank computes (a receive's ACK, a send)
                    progress(self.comm)
                if i in before:
                    before[i]()
                begin = time.perf_counter() - t0
                loss = self._compute(a)
                if loss is not None:
                    losses[a.micro_batch] = loss
                end = time.perf_counter() - t0
                timeline.append([a.op.value, a.micro_batch, a.stage, begin, end])
                following = plan.posted[j + 1] if j + 1 < len(plan.computes) else len(plan.batches)
                self._post(actions, plan, following)
                if j + 1 == len(plan.computes):
                    self._wait(len(plan.batches))
        leftover = {k: sorted(v) for k, v in self._held.items() if v}
        if leftover:
            raise RuntimeError(f"pipeline rank {self.rank}: schedule {self.schedule.name!r} left arrays "
                               f"unused: {leftover}")
        return StepResult(losses, timeline, self._peak, clock)

    # ---- compute ----------------------------------------------------------------------------------------

    def _compute(self, action: Action) -> float | None:
        op, s, mb = action.op, action.stage, action.micro_batch
        key = (s, mb)
        if op == Op.FORWARD:
            inputs = self._take("inputs", key) if s > 0 else None
            out = self._forward(s, mb, inputs)
            del inputs
            if s == self.last:
                return float(out)
            self._hand_on(out, s + 1, ("inputs", (s + 1, mb)), ("outputs", key))
        elif op in (Op.BACKWARD, Op.BACKWARD_INPUT):
            grad = self._take("grad_in", key) if s < self.last else None
            grad_in = self._backward(op, s, mb, grad)
            del grad
            if s > 0:
                self._hand_on(grad_in, s - 1, ("grad_in", (s - 1, mb)), ("grad_out", key))
        elif op == Op.BACKWARD_WEIGHT:
            self._sleep_or(op, lambda: self._runner.backward_weight(s, mb))
        return None

    def _forward(self, s: int, mb: int, inputs: np.ndarray | None):
        if self.emulation is not None:
            time.sleep(self.emulation.seconds(Op.FORWARD))
            return 0.0 if s == self.last else self._zeros(s + 1)
        return self._runner.forward(s, mb, inputs)

    def _backward(self, op: Op, s: int, mb: int, grad: np.ndarray | None):
        if self.emulation is not None:
            time.sleep(self.emulation.seconds(op))
            return self._zeros(s) if s > 0 else None
        run = self._runner.backward if op == Op.BACKWARD else self._runner.backward_input
        return run(s, mb, grad)

    def _sleep_or(self, op: Op, work: Callable[[], None]) -> None:
        if self.emulation is not None:
            time.sleep(self.emulation.seconds(op))
        else:
            work()

    def _hand_on(self, array, to_stage: int, local: tuple[str, tuple[int, int]],
                 remote: tuple[str, tuple[int, int]]) -> None:
        """A result for stage `to_stage`: that stage's input at once when this rank holds it (p = 1), else
        kept for its send."""
        if array is None:
            raise RuntimeError(f"pipeline rank {self.rank}: nothing to hand to stage {to_stage}")
        kind, key = local if self.schedule.rank_of(to_stage) == self.rank else remote
        self._keep(kind, key, np.asarray(array))

    # ---- communication ----------------------------------------------------------------------------------

    def _post(self, actions: Sequence[Action], plan: WaitPlan, until: int) -> None:
        """Post batches up to (not including) `until`: receive buffers allocated (counted from here), the
        arrays to send taken from what the executor holds (counted until their batch is waited for)."""
        while self._next_batch < until:
            batch = [actions[i] for i in plan.batches[self._next_batch]]
            self._next_batch += 1
            posted = _Posted(batch, [], [], [])
            recvs: list[tuple[int, np.ndarray]] = []
            for a in batch:
                key, peer = (a.stage, a.micro_batch), a.peer
                if peer is None:
                    raise ValueError(f"pipeline rank {self.rank}: {a} names no peer")
                if a.op in (Op.SEND_ACT, Op.SEND_GRAD):
                    kind = "outputs" if a.op == Op.SEND_ACT else "grad_out"
                    posted.sends.append((peer, self._pop(kind, key)))
                    posted.phases.append(PHASES[a.op])
                else:
                    shape, dtype = self.io(a.stage if a.op == Op.RECV_ACT else a.stage + 1)
                    out = np.empty(shape, dtype)
                    self.ledger.add("comm_buffers", out.nbytes)
                    posted.landed.append(("inputs" if a.op == Op.RECV_ACT else "grad_in", key, out))
                    recvs.append((peer, out))
            posted.handle = post(self.comm, posted.sends, recvs, posted.phases)
            self._posted.append(posted)
            self._in_flight += len(batch)
            self._note_peak()

    def _wait(self, until: int) -> None:
        """Wait until batches up to (not including) `until` are complete, one after another, then free what
        they sent and keep what they received. Each of their actions gets a timeline row from when the rank
        began waiting for its batch to when it saw the batch complete: the time it was blocked on it, none
        when the batch had completed before it was needed."""
        waiting, self._posted = self._posted[:until - self._waited], self._posted[until - self._waited:]
        self._waited = max(self._waited, until)
        for posted in waiting:
            assert posted.handle is not None  # set by its post
            begin = time.perf_counter()
            blocked = not posted.handle.done()
            posted.handle.wait()  # (moves every batch posted on the way)
            seen = time.perf_counter() if blocked else begin
            for a in posted.batch:
                self._timeline.append([a.op.value, a.micro_batch, a.stage, begin - self._t0, seen - self._t0])
            self._in_flight -= len(posted.batch)
            for _, sent in posted.sends:
                self.ledger.sub("comm_buffers", sent.nbytes)
            for kind, key, out in posted.landed:
                self._keep(kind, key, out, counted=True)
            posted.sends.clear()  # the sent outputs go here: nothing else refers to them

    def _take(self, kind: str, key: tuple[int, int]) -> np.ndarray:
        array = self._pop(kind, key)
        self.ledger.sub("comm_buffers", array.nbytes)
        return array

    def _pop(self, kind: str, key: tuple[int, int]) -> np.ndarray:
        if key not in self._held[kind]:
            raise RuntimeError(f"pipeline rank {self.rank}: schedule {self.schedule.name!r} needs the {kind} "
                               f"array of stage {key[0]}, micro-batch {key[1]} before it exists")
        return self._held[kind].pop(key)

    def _keep(self, kind: str, key: tuple[int, int], array: np.ndarray, counted: bool = False) -> None:
        held = self._held[kind]
        if key in held:
            raise RuntimeError(f"pipeline rank {self.rank}: a second {kind} array for stage {key[0]}, "
                               f"micro-batch {key[1]}")
        held[key] = array
        if not counted:
            self.ledger.add("comm_buffers", array.nbytes)
        self._note_peak()

    def _note_peak(self) -> None:
        self._peak = max(self._peak, self._in_flight + sum(len(v) for v in self._held.values()))

    def _zeros(self, stage: int) -> np.ndarray:
        shape, dtype = self.io(stage)
        return np.zeros(shape, dtype)

    @property
    def _runner(self) -> StageRunner:
        assert self.runner is not None  # only reached without an emulation, which needs a runner
        return self.runner
