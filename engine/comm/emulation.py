"""Network emulation for the socket transport: per-link latency and a bandwidth cap, and virtual nodes
with a slower link between them, so a communication-bound run can be measured on one machine.

A link's shape is Hockney's point-to-point model: a message of n bytes takes latency + n / bandwidth.
The sender holds its bytes until the emulated wire would have delivered them (a `Pacer` per link):
piece by piece, a piece ending at byte offset e of a message is released at

    start + latency + e / bandwidth,    start = max(now, when the link finished the previous message)

so back-to-back messages queue on the link as on a real wire, and the receiver sees the last byte
latency + n / bandwidth after the message was sent (plus the transport's own time for the last piece,
which is small beside an emulated link). Waiting is sleeping (select with a timeout), never spinning, so
an emulated link costs no CPU, like a real network.

Virtual nodes: with `ranks_per_node` = G > 0, ranks r and q sit on one node when r // G == q // G; links
between nodes take the `inter_*` shape. A value of 0 turns that part off: latency 0 adds none, bandwidth 0
caps nothing, and an `inter_*` value of 0 means "the same as within a node".

Every emulated link counts what it held (messages, bytes, the emulated wire seconds), so a run can say
exactly what the emulation added; `describe()` is the line a run record carries ("emulated network: ...").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

EMULATION_KEYS = ("latency_us", "bandwidth_gbps", "inter_latency_us", "inter_bandwidth_gbps")


@dataclass(frozen=True)
class LinkShape:
    """One emulated link: seconds added to every message, bytes per second it carries (0 = uncapped)."""

    latency_s: float
    bytes_per_s: float

    def seconds(self, nbytes: int) -> float:
        """Hockney: latency + n / bandwidth."""
        return self.latency_s + (nbytes / self.bytes_per_s if self.bytes_per_s else 0.0)


@dataclass(frozen=True)
class NetworkEmulation:
    """What the `[emulate]` section asks for, with the node grid (`parallel.ranks_per_node`)."""

    latency_us: float = 0.0
    bandwidth_gbps: float = 0.0  # Gbit/s, 10^9 bits per second, as networks are quoted
    inter_latency_us: float = 0.0
    inter_bandwidth_gbps: float = 0.0
    ranks_per_node: int = 0  # 0 = every rank on one node

    @property
    def active(self) -> bool:
        return any(getattr(self, key) for key in EMULATION_KEYS)

    def shape(self, me: int, peer: int) -> LinkShape | None:
        """The shape of the link me -> peer, or None when it is not emulated."""
        same_node = not self.ranks_per_node or me // self.ranks_per_node == peer // self.ranks_per_node
        latency, gbps = self.latency_us, self.bandwidth_gbps
        if not same_node:
            latency = self.inter_latency_us or latency
            gbps = self.inter_bandwidth_gbps or gbps
        if not (latency or gbps):
            return None
        return LinkShape(latency / 1e6, gbps * 1e9 / 8)

    def describe(self) -> str:
        """One line for run records and summaries; "" when nothing is emulated."""
        if not self.active:
            return ""

        def part(latency: float, gbps: float) -> str:
            if not (latency or gbps):
                return "real links"
            return f"{latency:g} us latency, " + (f"{gbps:g} Gbit/s" if gbps else "uncapped bandwidth")

        inner = part(self.latency_us, self.bandwidth_gbps)
        if not (self.ranks_per_node and (self.inter_latency_us or self.inter_bandwidth_gbps)):
            return f"emulated network: {inner} per link"
        outer = part(self.inter_latency_us or self.latency_us,
                     self.inter_bandwidth_gbps or self.bandwidth_gbps)
        return f"emulated network: {inner} within nodes of {self.ranks_per_node} ranks; {outer} between nodes"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> NetworkEmulation | None:
        """The inverse of to_dict (what crosses into a spawned rank); None for None or an inactive one."""
        if not d:
            return None
        emulation = cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})
        return emulation if emulation.active else None


class Pacer:
    """Release times for one link's outgoing messages, and what the link held (messages, bytes, seconds).
    Used by one thread at a time: the one driving the communicator."""

    def __init__(self, shape: LinkShape):
        self.shape = shape
        self.wire_free = 0.0  # when the link finishes carrying what it was last given
        self.messages = 0
        self.bytes = 0
        self.wire_s = 0.0  # emulated seconds on the wire, summed over messages

    def begin(self, nbytes: int, now: float) -> float:
        """Put a message of nbytes on the link at time `now`; returns the time its transfer starts."""
        start = max(now, self.wire_free)
        seconds = self.shape.seconds(nbytes) - self.shape.latency_s
        self.wire_free = start + seconds
        self.messages += 1
        self.bytes += nbytes
        self.wire_s += seconds + self.shape.latency_s
        return start

    def release_at(self, start: float, end_byte: int) -> float:
        """When the bytes of a message up to offset `end_byte` have crossed the emulated wire."""
        bandwidth = self.shape.bytes_per_s
        return start + self.shape.latency_s + (end_byte / bandwidth if bandwidth else 0.0)

    def report(self) -> dict:
        return {"messages": self.messages, "bytes": self.bytes, "wire_s": self.wire_s}
