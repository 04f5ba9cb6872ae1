"""`nanodist-tui memory` under pipeline parallelism: every pipeline rank's figures side by side, estimated
(engine.memory.pipeline) and, with --measure, measured by the ledger (the largest over the rank's
data- and tensor-parallel peers), in bytes, so the stages' imbalance and each schedule's activations in
flight read off one table, to the byte."""

from __future__ import annotations

from engine.memory.ledger import CATEGORIES

LABELS = (("parameters", "parameters"), ("gradients", "gradients"), ("master (fp32)", "master"),
          ("adam m", "adam_m"), ("adam v", "adam_v"), ("activations", "activations"),
          ("comm buffers", "comm_buffers"), ("temporaries", "temporaries"))
WIDTH = 14


def stages_report(cfg, measured_ranks: list[dict] | None) -> list[dict] | None:
    """Per pipeline rank: its stages, its estimate and (given measure_rank's results of every rank) what its
    ledgers measured; None without a pipeline."""
    if cfg.parallel.pipeline == 1:
        return None
    from engine.memory.pipeline import estimate_ranks
    from engine.parallel.mesh import Mesh
    mesh, rows = Mesh.of(cfg.parallel), []
    for e in estimate_ranks(cfg):
        phase, cats = e.peak()
        row = {"pipeline_rank": e.pipeline_rank, "stages": list(e.stages),
               "estimate": {"states": e.states, "category_peaks": e.category_peaks(),
                            "peak_total": sum(cats.values()), "peak_phase": phase},
               "measured": None}
        mine = [r for r in measured_ranks or [] if mesh.coords(r["rank"]).pp == e.pipeline_rank]
        if mine:
            peaks = {c: max(m[c] for r in mine for m in r["maxima"].values()) for c in CATEGORIES}
            row["measured"] = {"category_peaks": peaks,
                               "peak_total": max(sum(p.values()) for r in mine for p in r["peaks"].values())}
        rows.append(row)
    return rows


def print_stages(rows: list[dict], schedule: str, micro_batches: int) -> None:
    measured = rows[0]["measured"] is not None
    print(f"\nper pipeline rank, bytes (each category at its own peak; {schedule}, {micro_batches} "
          "micro-batches)")
    print(f"  {'pipeline rank':24}" + "".join(f"{r['pipeline_rank']:>{WIDTH}}" for r in rows))
    print(f"  {'stages':24}" + "".join(f"{','.join(map(str, r['stages'])):>{WIDTH}}" for r in rows))
    kinds = ("estimate", "measured") if measured else ("estimate",)
    for label, key in (*LABELS, ("peak total", None)):
        for kind in kinds:
            tag = ("est" if kind == "estimate" else "meas") if measured else ""
            name = f"{label if kind == 'estimate' else '':15}{tag:9}"
            cells = [r[kind]["peak_total"] if key is None else r[kind]["category_peaks"][key] for r in rows]
            print(f"  {name}" + "".join(f"{c:>{WIDTH},}" for c in cells))
