"""'Will it fit?': the estimator's per-rank bytes by category for a config (before anything runs), each
rank's row, and the total against the memory this machine has (for the ranks the backend starts here)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from engine.memory.capacity import available_memory
from engine.memory.estimator import estimate
from nanodist_tui.widgets.memory_pane import ordered, style_of
from nanodist_tui.widgets.units import format_bytes

LOCAL_BACKENDS = ("threads", "processes")  # every rank on this machine


def fit_report(cfg, available: int | None) -> Text:
    e = estimate(cfg)
    phase, at_peak = e.peak()
    peaks = e.category_peaks()
    world, per_rank = cfg.parallel.world_size, sum(at_peak.values())
    out = Text()
    out.append(f"{e.n_params:,} parameters · {world} rank(s) on {cfg.parallel.backend} · "
               f"ZeRO-{e.zero_stage} · {e.dtype} · checkpointing {e.checkpointing} · "
               f"micro-batch {e.micro_batch} row(s)\n", style="bold")
    cats = [k for k, _ in ordered(peaks)]
    out.append(f"{'estimated, per rank':<20}" + "".join(f"{style_of(k)[0][:12]:>13}" for k in cats)
               + f"{'peak total':>13}\n", style="bold")
    for rank in range(min(world, 8)):
        out.append(f"{'rank ' + str(rank):<20}" + "".join(format_bytes(peaks[k], 13) for k in cats)
                   + format_bytes(per_rank, 13) + "\n")
    if world > 8:
        out.append(f"... and {world - 8} more ranks, the same\n", style="dim")
    out.append(f"each category at its own peak; the total is the highest simultaneous sum ({phase})\n",
               style="dim")
    local = cfg.parallel.backend in LOCAL_BACKENDS
    need = per_rank * world if local else per_rank
    where = f"all {world} ranks on this machine" if local else "one rank per process"
    if available is None:
        out.append(f"needs {format_bytes(need)} ({where}); this machine's memory is unknown", style="yellow")
    elif need <= 0.8 * available:
        out.append(f"fits: {format_bytes(need)} ({where}) of {format_bytes(available)} available",
                   style="bold green")
    elif need <= available:
        out.append(f"tight: {format_bytes(need)} ({where}) of {format_bytes(available)} available",
                   style="bold yellow")
    else:
        out.append(f"does not fit: {format_bytes(need)} ({where}) but {format_bytes(available)} available; "
                   "try more ZeRO, fp16/bf16 or checkpointing", style="bold red")
    return out


class FitTable(Static):
    def show(self, cfg) -> None:
        self.update(fit_report(cfg, available_memory()))
