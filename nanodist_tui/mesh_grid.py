"""The device mesh (engine.parallel.mesh) as the workbench writes it: the grid of ranks, each rank's
coordinates in short, the layout in a few words. Pure data (no Textual): the mesh pane, the rank table and
the headless summary read it; mesh_groups.py has the groups.

The grid's rows are pipeline stage x data replica and its columns context x tensor rank, outer axis first: a
row is the ranks that hold one copy of one stage's weights, and with the default order (tp innermost) a
row's tensor partners are adjacent ranks. Only axes of degree > 1 get a place; a grid of one column (a pure
data-parallel run: one axis) is drawn on its side, one row of replicas.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from engine.parallel.mesh import DENSE_AXES, Mesh

ROW_AXES = ("pp", "dp")  # outer first
COLUMN_AXES = ("cp", "tp")
WRITTEN_ORDER = ("dp", "pp", "cp", "tp", "ep")  # the order coordinates are written in: "dp1 tp0"
GAP = 2  # spaces between grid columns


@dataclass(frozen=True)
class Grid:
    """The ranks laid out: `cells[i][j]` is the rank on row i and column j; each row and column is named by
    its coordinates on the axes of degree > 1 (none: the one row, or the one column)."""
    row_axes: tuple[str, ...]
    column_axes: tuple[str, ...]
    rows: list[dict[str, int]]
    columns: list[dict[str, int]]
    cells: list[list[int]]


def _places(mesh: Mesh, axes: tuple[str, ...]) -> list[dict[str, int]]:
    """Every combination of coordinates on `axes`, the first axis varying slowest."""
    combinations = itertools.product(*(range(mesh.degree(a)) for a in axes))
    return [dict(zip(axes, c, strict=True)) for c in combinations]


def grid_of(mesh: Mesh) -> Grid:
    row_axes = tuple(a for a in ROW_AXES if mesh.degree(a) > 1)
    column_axes = tuple(a for a in COLUMN_AXES if mesh.degree(a) > 1)
    rows, columns = _places(mesh, row_axes), _places(mesh, column_axes)
    cells = [[mesh.rank_of(**r, **c) for c in columns] for r in rows]
    return Grid(row_axes, column_axes, rows, columns, cells)


def coords_text(coords: dict[str, int]) -> str:
    """{"pp": 0, "dp": 1} -> "pp0 dp1"."""
    return " ".join(f"{axis}{c}" for axis, c in coords.items())


def shown_axes(mesh: Mesh) -> tuple[str, ...]:
    """The axes of degree > 1, in the order coordinates are written."""
    return tuple(a for a in WRITTEN_ORDER if mesh.degree(a) > 1)


def rank_coords(mesh: Mesh, rank: int) -> dict[str, int]:
    """`rank`'s coordinates on the axes of degree > 1: {"dp": 1, "tp": 0}."""
    coords = mesh.coords(rank)._asdict()
    return {a: coords[a] for a in shown_axes(mesh)}


def layout_text(degrees: dict[str, int], sequence_parallel: bool = False) -> str:
    """The layout in a few words: "dp 2 x pp 2 x tp 2", "dp 4" for pure data parallelism, "dp 1" for one
    rank; expert parallelism (carved out of dp x cp, not a factor) and sequence parallelism after a comma."""
    dense = [f"{a} {degrees[a]}" for a in WRITTEN_ORDER if a in DENSE_AXES and degrees.get(a, 1) > 1]
    text = " x ".join(dense or [f"dp {degrees.get('dp', 1)}"])
    if degrees.get("ep", 1) > 1:
        text += f", ep {degrees['ep']}"
    return text + (", sequence parallel" if sequence_parallel else "")


def rank_formula(mesh: Mesh) -> str:
    """How a rank follows from its coordinates: "rank = tp + 2*dp + 4*pp" (the innermost axis first)."""
    terms = [(mesh.strides[a], a) for a in mesh.axes if a in DENSE_AXES and mesh.degree(a) > 1]
    return "rank = " + (" + ".join(a if s == 1 else f"{s}*{a}" for s, a in sorted(terms)) or "0")


def grid_lines(mesh: Mesh, width: int) -> list[str]:
    """The grid as lines of text, each row named by its coordinates and each column headed by its own; a
    grid of one column (one axis, pure data parallelism) is laid on its side, one row of ranks. A grid wider
    than `width` is cut into bands of whole columns, one below the other: no rank is cut off."""
    grid = grid_of(mesh)
    ep = mesh.degree("ep") > 1
    ranks = [[f"{r}" + (f" ep{mesh.coords(r).ep}" if ep else "") for r in row] for row in grid.cells]
    rows, heads = [coords_text(r) for r in grid.rows], [coords_text(c) for c in grid.columns]
    if len(heads) == 1 and len(rows) > 1:
        ranks, heads, rows = [[row[0] for row in ranks]], rows, [""]
    rows = [r or "rank" for r in rows]  # the one row of a grid with no row axis
    label = max(len(r) for r in rows)
    cell = max(len(t) for t in [*heads, *(c for row in ranks for c in row)])
    per_band = max(1, (width - label) // (cell + GAP))
    lines: list[str] = []
    for start in range(0, len(heads), per_band):
        band = range(start, min(start + per_band, len(heads)))
        if start:
            lines.append("")
        lines.append((" " * label + "".join(" " * GAP + heads[j].rjust(cell) for j in band)).rstrip())
        lines += [rows[i].ljust(label) + "".join(" " * GAP + ranks[i][j].rjust(cell) for j in band)
                  for i in range(len(rows))]
    return lines
