"""One step of a mixture of experts as the expert pane draws it, from the ExpertLoad events of its ranks
(engine.events): per MoE layer, the tokens each expert kept (summed over the ranks), which rank of an EP
group holds it, the load each rank's experts ran (the rows the group sent it), max/mean over the experts
(1.0 is perfect balance), the drops, the router's entropy against its ceiling ln E, and the load-balancing
loss (averaged over the ranks). Pure text: the widget only shows it."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from rich.text import Text

from engine.events import ExpertLoad


@dataclass(frozen=True)
class LayerLoad:
    """One MoE layer in one step, over every rank that reported it."""
    tokens: list[int]  # per expert
    received: dict[int, int]  # per rank
    dropped: int
    entropy: float
    aux_loss: float
    block: int | None = None  # the block it sits in (None: a recording without it)

    @property
    def imbalance(self) -> float:
        """The busiest expert's tokens over the mean (1.0: every expert equally loaded)."""
        mean = sum(self.tokens) / len(self.tokens)
        return max(self.tokens) / mean if mean else 0.0


def layer_loads(events: Iterable[ExpertLoad]) -> list[LayerLoad]:
    """Each layer's figures summed (tokens, rows, drops) or averaged (entropy, aux loss) over the ranks that
    report it (every rank, or under pipeline parallelism the ranks of its stage), in block order. A
    recording without blocks: the i-th entry of every rank is one layer."""
    by_layer: dict[tuple[int, int], list[tuple[ExpertLoad, int]]] = {}  # (block or -1, entry) -> reports
    for e in sorted(events, key=lambda e: e.rank):
        for i in range(len(e.received)):
            key = (e.blocks[i], 0) if e.blocks else (-1, i)
            by_layer.setdefault(key, []).append((e, i))
    out = []
    for key in sorted(by_layer):
        reports = by_layer[key]
        tokens = [sum(col) for col in zip(*(e.tokens_per_expert[i] for e, i in reports))]
        out.append(LayerLoad(tokens, {e.rank: e.received[i] for e, i in reports},
                             sum(e.dropped[i] for e, i in reports),
                             sum(e.entropy[i] for e, i in reports) / len(reports),
                             sum(e.aux_loss[i] for e, i in reports) / len(reports),
                             key[0] if key[0] >= 0 else None))
    return out


def render(step: int, loads: list[LayerLoad], ep: int, every: int, width: int, block: str, track: str
           ) -> Text:
    """The step's layers, one after the other, bars fitted to `width`."""
    out = Text()
    experts = len(loads[0].tokens)
    per_rank = experts // ep
    out.append(f"step {step} · {len(loads)} MoE layers · {experts} experts", style="bold")
    out.append(f", {per_rank} per rank of each EP group of {ep}\n" if ep > 1 else ", all on every rank\n",
               style="bold")
    top = max(max(max(load.tokens) for load in loads), 1)
    busiest = max(max(load.received.values()) for load in loads)
    bar = max(8, width - 24)
    for i, load in enumerate(loads):
        at = load.block if load.block is not None else i * every
        out.append(f"\nlayer {i + 1} (block {at})\n", style="bold")
        for e, n in enumerate(load.tokens):
            holder = f" ep{e // per_rank}" if ep > 1 else ""
            out.append(f"  e{e:<3}")
            out.append_text(_bar(n, top, bar, block, track))
            out.append(f" {n:>6}{holder}\n")
        out.append("  rows each rank's experts ran on\n", style="dim")
        for rank, n in sorted(load.received.items()):
            out.append(f"  r{rank:<3}")
            out.append_text(_bar(n, max(busiest, 1), bar, block, track, style="#d9822b"))
            out.append(f" {n:>6}\n")
        ceiling = math.log(experts)
        out.append(f"  max/mean load {load.imbalance:.2f} · dropped {load.dropped} · router entropy "
                   f"{load.entropy:.3f} of ln {experts} = {ceiling:.3f} nats · aux loss "
                   f"{load.aux_loss:.4g}\n")
    return out


def _bar(n: int, top: int, width: int, block: str, track: str, style: str = "#3b6fd4") -> Text:
    filled = round(width * n / top)
    text = Text(block * filled, style=style)
    text.append(track * (width - filled), style="dim")
    return text
