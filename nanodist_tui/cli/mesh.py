"""`nanodist-tui mesh --preset P [-n N] [--set parallel.tensor=2 ...]`: the device mesh a config lays its
ranks on (engine.parallel.mesh): the degrees and the axis order, every rank's coordinates and groups, and
every group's ranks. It only describes, so it takes every degree, trained by this release or not."""

from __future__ import annotations

import json

from nanodist_tui.cli.errors import user_errors
from nanodist_tui.cli.options import JsonOpt, PresetOpt, SetOpt, WorldOpt
from nanodist_tui.cli.running import load_config

COORDS = ("dp", "pp", "cp", "tp", "ep")


def mesh(preset: PresetOpt = "quickstart", sets: SetOpt = None, world_size: WorldOpt = None,
         as_json: JsonOpt = False) -> None:
    """The device mesh: every rank's coordinates (dp, pp, cp, tp, ep) and process groups."""
    from engine.config.rules_layout import describing_layout
    from engine.parallel.mesh import Mesh
    with user_errors(), describing_layout():
        cfg, _, _ = load_config(preset, sets, world_size)
    report = {"preset": cfg.name, "sequence_parallel": cfg.parallel.sequence_parallel,
              **Mesh.of(cfg.parallel).describe()}
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(table(report)))


def table(r: dict) -> list[str]:
    """The report as text: a header line, one row per rank, then every kind's groups."""
    from engine.parallel.mesh import GROUP_KINDS
    d = r["degrees"]
    sp = ", sequence parallel" if r["sequence_parallel"] else ""
    lines = [f"{r['preset']}: {r['world_size']} rank(s) = dp {d['dp']} x pp {d['pp']} x cp {d['cp']} x tp "
             f"{d['tp']}{sp}; ep {d['ep']}, carved out of dp x cp",
             f"order {r['order']}: innermost (adjacent ranks) first", ""]
    widths = {k: max(len(k), *(len(row["groups"][k]) for row in r["ranks"])) for k in GROUP_KINDS}
    coords = "  ".join(f"{c:>2}" for c in COORDS)
    lines.append(f"{'':>4}  {'coordinates':<{len(coords)}}    groups")
    lines.append(f"{'rank':>4}  {coords}    " + "  ".join(f"{k:<{widths[k]}}" for k in GROUP_KINDS).rstrip())
    for row in r["ranks"]:
        lines.append(f"{row['rank']:>4}  " + "  ".join(f"{row['coords'][c]:>2}" for c in COORDS) + "    "
                     + "  ".join(f"{row['groups'][k]:<{widths[k]}}" for k in GROUP_KINDS).rstrip())
    lines += ["", "groups (ranks in group order)"]
    for kind, what in GROUP_KINDS.items():
        groups = r["groups"][kind]
        lines.append(f"  {kind}: {what}")
        if all(len(g) == 1 for g in groups.values()):
            lines.append(f"    {kind}0..{kind}{len(groups) - 1}: one rank each")
            continue
        lines += packed([f"{name} {ranks_text(g)}" for name, g in groups.items()])
    return lines


def ranks_text(ranks: list[int]) -> str:
    """A group's ranks; a long evenly spaced run shortened to its first two and its last."""
    steps = {b - a for a, b in zip(ranks, ranks[1:], strict=False)}
    if len(ranks) > 4 and len(steps) == 1:
        return f"[{ranks[0]}, {ranks[1]}, ..., {ranks[-1]}]"
    return str(ranks)


def packed(cells: list[str], width: int = 100, indent: str = "    ") -> list[str]:
    """Cells side by side, three spaces apart, as many to a line as fit (a cell is never split)."""
    lines: list[str] = []
    for cell in cells:
        if lines and len(lines[-1]) + 3 + len(cell) <= width:
            lines[-1] += "   " + cell
        else:
            lines.append(indent + cell)
    return lines
