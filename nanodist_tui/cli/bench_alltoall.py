"""`nanodist-tui bench alltoall`: our all-to-all schedules against each other and gloo's all_to_all_single,
taking turns in the same ranks, on any backend. The measuring is engine.bench.alltoall's; this module parses
and prints."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from nanodist_tui.cli.bench_allreduce import check_bench_options, fmt_size
from nanodist_tui.cli.errors import UsageError, fail, user_errors
from nanodist_tui.cli.options import JsonOpt


def alltoall(
    backend: Annotated[str, typer.Option("--backend", "-b", help="threads | processes | mpi")] = "processes",
    world_size: Annotated[int, typer.Option("--world-size", "-n", min=1, help="ranks")] = 2,
    sizes: Annotated[str | None, typer.Option(help="comma-separated bytes each rank sends in all, e.g. "
                                              "1MiB,16MiB [default: 1MiB,16MiB,64MiB]")] = None,
    iters: Annotated[int, typer.Option(min=1, help="timed iterations per size (median reported)")] = 20,
    warmup: Annotated[int, typer.Option(min=0, help="untimed iterations per size")] = 3,
    algorithm: Annotated[str, typer.Option(help="one or more of pairwise, all-at-once, mpi-native (mpi "
                                           "only), comma-separated, or all; several take turns in one run")]
    = "pairwise",
    uneven: Annotated[bool, typer.Option("--uneven", help="also time each schedule through the uneven form "
                                         "(its row counts travel first), as expert parallelism calls it")]
    = False,
    vs_gloo: Annotated[bool, typer.Option("--vs-gloo", help="also time torch.distributed gloo's "
                                          "all_to_all_single, taking turns in the same ranks (processes "
                                          "backend)")] = False,
    as_json: JsonOpt = False,
) -> None:
    """All-to-all bandwidth in the NCCL-tests manner (S = bytes each rank sends in all, algbw = S/t,
    busbw = algbw·(N-1)/N), per schedule, and gloo's in the same run."""
    from engine.bench.alltoall import GLOO, UNEVEN, bench_alltoall
    with user_errors():
        size_list = check_bench_options(backend, world_size, sizes, (2**20, 2**24, 2**26))
        uneven_sizes = [s for s in size_list if s % (4 * world_size)]
        if uneven_sizes:
            raise UsageError(f"--sizes: {uneven_sizes[0]} bytes do not cut into {world_size} equal blocks of "
                             f"float32; use a multiple of {4 * world_size} bytes")
        algorithms = _algorithms(algorithm, backend)
    if vs_gloo and backend != "processes":
        fail(f"--vs-gloo: gloo runs in the ranks of --backend processes, not {backend}")
    torch_missing = vs_gloo and not _has_torch()
    contestants = algorithms + tuple(a + UNEVEN for a in algorithms if uneven and a != "mpi-native")
    contestants += (GLOO,) if vs_gloo and not torch_missing else ()
    rows = bench_alltoall(backend, world_size, size_list, iters, warmup, contestants)
    if not rows:
        return  # an MPI rank other than 0
    if as_json:
        print(json.dumps({"backend": backend, "world_size": world_size, "rows": rows}, indent=2))
        return
    print(f"all-to-all, {backend} backend, {world_size} ranks, float32, median of {iters} iterations "
          "(S = bytes each rank sends, algbw = S/t, busbw = algbw*(N-1)/N, GB/s = 1e9 B/s)")
    _print_rows(rows, GLOO in contestants)
    if torch_missing:
        print("PyTorch not installed: no gloo figures (pip install torch==2.13.0)")


def _algorithms(spec: str, backend: str) -> tuple[str, ...]:
    """--algorithm as a tuple of names; "all" = every schedule that can run here."""
    from engine.comm.alltoall import ALGORITHMS
    if spec.strip() == "all":
        return tuple(a for a in ALGORITHMS if a != "mpi-native" or backend == "mpi")
    names = tuple(a.strip() for a in spec.split(",") if a.strip())
    unknown = [a for a in names if a not in ALGORITHMS]
    if unknown or not names:
        raise UsageError(f'--algorithm: unknown all-to-all algorithm "{",".join(unknown)}"; use '
                         f'{", ".join(ALGORITHMS)} or all')
    if "mpi-native" in names and backend != "mpi":
        raise UsageError(f"--algorithm mpi-native needs --backend mpi (under mpiexec), not {backend}")
    return names


def _has_torch() -> bool:
    import importlib.util
    return importlib.util.find_spec("torch") is not None


def _print_rows(rows: list[dict], gloo: bool) -> None:
    """One line per size and contestant; with gloo, each one's busbw over gloo's at that size."""
    print(f"{'size':>10} {'contestant':>20} {'time ms':>9} {'algbw':>7} {'busbw':>7} {'ok':>3}"
          + (f" {'vs gloo':>8}" if gloo else ""))
    for row in rows:
        line = (f"{fmt_size(row['size']):>10} {row['contestant']:>20} {row['time_s'] * 1e3:9.2f} "
                f"{row['algbw'] / 1e9:7.2f} {row['busbw'] / 1e9:7.2f} {'yes' if row['correct'] else 'NO':>3}")
        if gloo:
            base = next(r for r in rows if r["size"] == row["size"] and r["contestant"] == "gloo")
            line += f" {row['busbw'] / base['busbw']:7.2f}x"
        print(line)
