"""Ring traffic, read from the engine's per-step Traffic and RankStats events: bytes and GB/s per link and
phase, the bytes a ring must move, NCCL-tests' algbw and busbw, and each rank's step split into compute and
waiting, with the straggler and the slow link picked out. Pure data (no Textual): the traffic pane and the
run comparison both read it.

Definitions (NCCL-tests, PERFORMANCE.md): a collective over a buffer of S bytes that takes t seconds has
algbw = S/t and busbw = algbw × 2(N-1)/N for all-reduce, × (N-1)/N for reduce-scatter and all-gather, × 1
for broadcast. A ring all-reduce (reduce-scatter, then all-gather) makes every rank send 2(N-1)/N · S bytes;
ZeRO-1/2 move the same (gradients reduce-scattered, parameters all-gathered), ZeRO-3 gathers parameters twice
(forward and backward): 3(N-1)/N · S.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from engine.comm.meter import algbw, busbw
from engine.events import RankStats, Traffic

# The order phases happen in a step (and are listed in): the start's broadcast, ZeRO-3's gathers, the gradient
# reduce-scatter, the all-gather that completes an all-reduce (or ZeRO-1/2's parameter gather).
PHASE_ORDER = ("broadcast", "param-gather", "reduce-scatter", "all-gather", "barrier", "p2p", "mpi-native")
COLLECTIVE_OF_PHASE = {"reduce-scatter": "reduce-scatter", "all-gather": "all-gather",
                       "param-gather": "all-gather", "broadcast": "broadcast"}
SYNC_PHASES = ("reduce-scatter", "all-gather", "param-gather")  # what the ring bound counts
STRAGGLER_FACTOR = 1.25  # a rank computing this much longer than the median holds the others up
SLOW_LINK_FACTOR = 0.5  # a link this much slower than the median link is flagged


def phase_rank(phase: str) -> tuple[int, str]:
    return (PHASE_ORDER.index(phase) if phase in PHASE_ORDER else len(PHASE_ORDER), phase)


@dataclass
class Link:
    src: int
    dst: int
    bytes: int = 0
    seconds: float = 0.0
    phases: dict[str, int] = field(default_factory=dict)
    algorithms: dict[tuple[str, str], int] = field(default_factory=dict)  # (group, algorithm) -> bytes

    @property
    def rate(self) -> float:
        """Bytes a second while this link was sending (its sends' own durations)."""
        return self.bytes / self.seconds if self.seconds > 0 else float("inf")


@dataclass
class RankTraffic:
    """One rank's sends in one step."""
    rank: int
    step: int
    links: dict[tuple[int, int], Link]
    phases: dict[str, tuple[int, float]]  # phase -> (bytes, seconds)
    algorithms: dict[tuple[str, str], int] = field(default_factory=dict)  # (group, algorithm) -> bytes
    groups: dict[str, int] = field(default_factory=dict)  # group name -> bytes ("world" in old recordings)

    @property
    def bytes(self) -> int:
        return sum(b for b, _ in self.phases.values())

    @property
    def seconds(self) -> float:
        """Seconds this rank spent sending: communication time, overlapped with compute where it can be."""
        return sum(s for _, s in self.phases.values())

    @property
    def sync_bytes(self) -> int:
        return sum(self.phases.get(p, (0, 0.0))[0] for p in SYNC_PHASES)


def rank_traffic(event: Traffic) -> RankTraffic:
    links: dict[tuple[int, int], Link] = {}
    phases: dict[str, tuple[int, float]] = {}
    algorithms: dict[tuple[str, str], int] = {}
    groups: dict[str, int] = {}
    for row in event.links:
        key = (int(row["src"]), int(row["dst"]))
        link = links.setdefault(key, Link(*key))
        link.bytes += int(row["bytes"])
        link.seconds += float(row["seconds"])
        link.phases[row["phase"]] = link.phases.get(row["phase"], 0) + int(row["bytes"])
        group = str(row.get("group") or "world")  # recordings from before process groups name none
        groups[group] = groups.get(group, 0) + int(row["bytes"])
        b, s = phases.get(row["phase"], (0, 0.0))
        phases[row["phase"]] = (b + int(row["bytes"]), s + float(row["seconds"]))
        if row.get("algorithm"):  # recordings from before process groups carry neither field
            where = (str(row.get("group") or "world"), str(row["algorithm"]))
            link.algorithms[where] = link.algorithms.get(where, 0) + int(row["bytes"])
            algorithms[where] = algorithms.get(where, 0) + int(row["bytes"])
    ordered = dict(sorted(phases.items(), key=lambda item: phase_rank(item[0])))
    return RankTraffic(event.rank, event.step, links, ordered, algorithms, groups)


def bytes_by_group(ranks: list[RankTraffic]) -> dict[str, int]:
    """{group name: bytes all ranks sent in it} in each rank's last reported step: a group's traffic per
    step, under the name the meter booked it ("tp0", "dpcp1", "world", "node0")."""
    out: dict[str, int] = {}
    for t in ranks:
        for group, sent in t.groups.items():
            out[group] = out.get(group, 0) + sent
    return out


def which_ran_where(ranks: list[RankTraffic]) -> dict[str, dict[str, int]]:
    """{group: {algorithm: bytes all ranks sent with it}} in the last step, groups in the order world,
    node*, cross*, others: what `parallel.algorithm` (auto's choice per size included) ran on which
    communicator."""
    out: dict[str, dict[str, int]] = {}
    for t in ranks:
        for (group, algorithm), sent in t.algorithms.items():
            out.setdefault(group, {})
            out[group][algorithm] = out[group].get(algorithm, 0) + sent

    def order(group: str) -> tuple[int, str]:
        kinds = ("world", "node", "cross")
        return next((i for i, k in enumerate(kinds) if group.startswith(k)), len(kinds)), group
    return {g: out[g] for g in sorted(out, key=order)}


def ring_factor(zero_stage: int) -> int:
    """k in the k(N-1)/N · S bytes every rank sends per step."""
    return 3 if zero_stage == 3 else 2


def ring_bound(gradient_bytes: int, world_size: int, zero_stage: int) -> float:
    if world_size < 2:
        return 0.0
    return ring_factor(zero_stage) * (world_size - 1) / world_size * gradient_bytes


@dataclass(frozen=True)
class PhaseBandwidth:
    phase: str
    bytes: int  # this rank sent
    seconds: float
    algbw: float
    busbw: float


def phase_bandwidths(traffic: RankTraffic, world_size: int) -> list[PhaseBandwidth]:
    """Per phase, NCCL-tests' figures. The collective's buffer S is what the measured bytes imply: a ring
    reduce-scatter or all-gather of S bytes sends (N-1)/N · S per rank; a broadcast sends S."""
    out = []
    for phase, (nbytes, seconds) in traffic.phases.items():
        collective = COLLECTIVE_OF_PHASE.get(phase)
        if collective is None or world_size < 2:
            continue
        size = nbytes if collective == "broadcast" else nbytes * world_size / (world_size - 1)
        out.append(PhaseBandwidth(phase, nbytes, seconds, algbw(int(size), seconds),
                                  busbw(collective, int(size), seconds, world_size)))
    return out


def allreduce_bandwidth(traffic: RankTraffic, world_size: int) -> tuple[float, float] | None:
    """(algbw, busbw) of the step's gradient all-reduce (reduce-scatter + all-gather; ZeRO-0 to 2), with S
    the buffer the measured bytes imply (2(N-1)/N · S sent); None without both halves."""
    rs, ag = traffic.phases.get("reduce-scatter"), traffic.phases.get("all-gather")
    if world_size < 2 or rs is None or ag is None:
        return None
    sent, seconds = rs[0] + ag[0], rs[1] + ag[1]
    size = int(sent * world_size / (2 * (world_size - 1)))
    return algbw(size, seconds), busbw("all-reduce", size, seconds, world_size)


@dataclass(frozen=True)
class StepSplit:
    """One rank's step: compute (its own work, communication overlapped with it included), waiting (blocked
    until communication finished), and the communication time itself (its sends, overlapped or not)."""
    rank: int
    step: int
    step_s: float
    wait_s: float
    comm_s: float | None  # None when this rank's traffic was not reported

    @property
    def compute_s(self) -> float:
        return max(0.0, self.step_s - self.wait_s)


def step_splits(stats: dict[int, RankStats], traffic: dict[int, RankTraffic]) -> list[StepSplit]:
    out = []
    for rank, s in sorted(stats.items()):
        t = traffic.get(rank)
        comm = t.seconds if t is not None else None
        out.append(StepSplit(rank, s.step, s.step_time_s, s.comm_wait_s, comm))
    return out


def stragglers(splits: list[StepSplit]) -> set[int]:
    """Ranks whose compute took STRAGGLER_FACTOR × the median of the others or more: the rest wait for
    them."""
    out = set()
    for s in splits:
        others = [o.compute_s for o in splits if o.rank != s.rank]
        if others and s.compute_s > STRAGGLER_FACTOR * statistics.median(others) > 0:
            out.add(s.rank)
    return out


def slow_links(links: list[Link]) -> set[tuple[int, int]]:
    """Links that sent at under SLOW_LINK_FACTOR × the median rate of the others."""
    rates = {(link.src, link.dst): link.rate for link in links if link.bytes and link.seconds > 0}
    out = set()
    for key, rate in rates.items():
        others = [r for k, r in rates.items() if k != key]
        if others and rate < SLOW_LINK_FACTOR * statistics.median(others):
            out.add(key)
    return out
