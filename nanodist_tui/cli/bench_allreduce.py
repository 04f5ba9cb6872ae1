"""`nanodist-tui bench allreduce`: our all-reduce algorithms against each other and gloo, on any backend and
process-group grid, over real or emulated links; `--calibrate` measures the crossovers algorithm "auto"
uses. The measuring is engine.bench.allreduce's; this module parses and prints."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from nanodist_tui.cli.errors import UsageError, fail, user_errors
from nanodist_tui.cli.options import JsonOpt, node_grid


def parse_size(text: str) -> int:
    units = {"k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30, "b": 1, "": 1}
    t = text.strip().lower()
    digits = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(digits):]
    try:
        size = float(digits) * units[unit]
    except (ValueError, KeyError):
        raise ValueError(f'size "{text}" is not a number with an optional unit; write e.g. 16MiB, 4KiB, '
                         '1024') from None
    if size <= 0 or size % 4:  # the buffers are float32: whole elements only, or algbw would lie
        raise ValueError(f'size "{text}" must be a positive whole number of float32 elements (a multiple '
                         'of 4 bytes)')
    return int(size)


def fmt_size(n: int) -> str:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= factor:
            return f"{n / factor:g} {unit}"
    return f"{n} B"


def check_bench_options(backend: str, world_size: int, sizes: str | None, default) -> list[int]:
    """The message sizes, once every option is known to work here; UsageError/LaunchError otherwise."""
    import importlib.util

    from engine.comm.launch import check_environment
    from engine.config.rules import RULES
    from engine.memory.capacity import available_memory
    if backend not in ("threads", "processes", "mpi"):
        raise UsageError(f'--backend: unknown backend "{backend}"; use threads, processes or mpi')
    if problem := RULES["parallel.world_size"](world_size):
        raise UsageError(f"--world-size: {problem[0]}; {problem[1]}")
    if backend == "mpi":  # first where the ranks come from (mpiexec), as `run` says it, then the library
        check_environment("mpi", world_size)
        if importlib.util.find_spec("mpi4py") is None:
            raise UsageError("--backend mpi needs mpi4py: pip install -e '.[mpi]' (mpi4py and MPICH wheels)")
    try:
        size_list = ([parse_size(s) for s in sizes.split(",") if s.strip()] if sizes is not None
                     else list(default))
    except ValueError as e:
        raise UsageError(f"--sizes: {e}") from None
    if not size_list:
        raise UsageError("--sizes: no size given; write e.g. --sizes 1MiB,16MiB")
    available = available_memory()
    # each rank holds its input, the result and the ring's scratch for the largest message
    if available is not None and 3 * world_size * max(size_list) > available:
        raise UsageError(f"--sizes: {fmt_size(max(size_list))} on {world_size} ranks needs about "
                         f"{fmt_size(3 * world_size * max(size_list))} of memory, this machine has "
                         f"{fmt_size(available)} available; use smaller sizes or fewer ranks")
    return size_list


def allreduce(
    backend: Annotated[str, typer.Option("--backend", "-b", help="threads | processes | mpi")] = "processes",
    world_size: Annotated[int, typer.Option("--world-size", "-n", min=1, help="ranks")] = 2,
    sizes: Annotated[str | None, typer.Option(help="comma-separated message sizes, e.g. 1MiB,16MiB,64MiB "
                                              "[default: 1MiB,16MiB,64MiB; with --calibrate 1KiB..16MiB]")]
    = None,
    iters: Annotated[int, typer.Option(min=1, help="timed iterations per size (median reported)")] = 20,
    warmup: Annotated[int, typer.Option(min=0, help="untimed iterations per size")] = 3,
    algorithm: Annotated[str, typer.Option(help="one or more of ring, rhd, tree, hierarchical, auto, "
                                           "mpi-native (mpi only), comma-separated, or all; several take "
                                           "turns in one run")] = "ring",
    ranks_per_node: Annotated[int, typer.Option(min=0, help="the node grid (parallel.ranks_per_node): "
                                                "hierarchical's nodes, emulation's virtual nodes; 0 = one "
                                                "node")] = 0,
    calibrate: Annotated[bool, typer.Option(
        "--calibrate", help='time every candidate, fit the crossovers algorithm "auto" uses and save them in '
        "the tuning file")] = False,
    tuning_file: Annotated[str, typer.Option(help="tuning file for auto and --calibrate "
                                             "(parallel.tuning_file) [default: ~/.cache/nanodist/"
                                             "allreduce-tuning.json]")] = "",
    vs_gloo: Annotated[bool, typer.Option("--vs-gloo", help="also time torch.distributed gloo, same run")]
    = False,
    latency_us: Annotated[float, typer.Option(min=0, help="emulated latency per message and link, us "
                                              "(emulate.latency_us; processes backend)")] = 0.0,
    bandwidth_gbps: Annotated[float, typer.Option(min=0, help="emulated bandwidth cap per link, Gbit/s "
                                                  "(emulate.bandwidth_gbps)")] = 0.0,
    inter_latency_us: Annotated[float, typer.Option(min=0, help="emulated latency between virtual nodes, us")]
    = 0.0,
    inter_bandwidth_gbps: Annotated[float, typer.Option(min=0, help="emulated bandwidth between virtual "
                                                        "nodes, Gbit/s")] = 0.0,
    as_json: JsonOpt = False,
) -> None:
    """All-reduce bandwidth in the NCCL-tests manner (algbw = S/t, busbw = algbw·2(N-1)/N), per algorithm."""
    from engine.bench.allreduce import bench_allreduce, bench_gloo
    from engine.bench.calibrate import LADDER
    from engine.comm import auto
    from engine.comm.emulation import EMULATION_KEYS, NetworkEmulation
    if ranks_per_node and world_size % ranks_per_node:
        fail(f"--ranks-per-node {ranks_per_node} does not divide --world-size {world_size}")
    network = NetworkEmulation(latency_us, bandwidth_gbps, inter_latency_us, inter_bandwidth_gbps,
                               ranks_per_node)
    if network.active and backend != "processes":
        fail(f"--latency-us/--bandwidth-gbps: network emulation needs --backend processes, not {backend}")
    if (inter_latency_us or inter_bandwidth_gbps) and not 0 < ranks_per_node < world_size:
        fail("--inter-latency-us/--inter-bandwidth-gbps need --ranks-per-node below --world-size (more than "
             "one virtual node)")
    emulated = network if network.active else None
    network_key = auto.network_key({k: getattr(network, k) for k in EMULATION_KEYS})
    two_level = 1 < ranks_per_node < world_size
    with user_errors():
        default_sizes = LADDER if calibrate else (2**20, 2**24, 2**26)
        size_list = check_bench_options(backend, world_size, sizes, default_sizes)
        algorithms = _algorithms(algorithm, backend, ranks_per_node, two_level)
    path = auto.tuning_path(tuning_file)
    if calibrate:
        _calibrate(backend, world_size, ranks_per_node, size_list, iters, warmup, path, as_json, emulated,
                   network_key)
        return
    crossovers = None
    if "auto" in algorithms:
        try:
            crossovers = auto.lookup(path, auto.key(backend, world_size, ranks_per_node, network_key),
                                     world_size, two_level)
        except auto.TuningError as e:
            fail(str(e))
    ours = bench_allreduce(backend, world_size, size_list, iters, warmup, algorithm=algorithms,
                           ranks_per_node=ranks_per_node, crossovers=crossovers, network=emulated)
    gloo = bench_gloo(world_size, size_list, iters, warmup) if vs_gloo else None
    report = {"backend": backend, "world_size": world_size, "ranks_per_node": ranks_per_node,
              "algorithm": ",".join(algorithms), "network": network.describe(), "ours": ours, "gloo": gloo,
              "crossovers": None if crossovers is None else _rules(crossovers)}
    if as_json:
        print(json.dumps(report, indent=2))
        return
    print(f"all-reduce, {backend} backend, {world_size} ranks{node_grid(world_size, ranks_per_node)}, "
          f"float32, median of {iters} iterations (algbw = S/t, busbw = algbw*2(N-1)/N, GB/s = 1e9 B/s)")
    if network.active:
        print(network.describe())
    if len(algorithms) > 1:
        _print_comparison(ours, algorithms, crossovers)
    else:
        _print_rows(ours, gloo)
    if vs_gloo and gloo is None:
        print("PyTorch not installed: no gloo figures (pip install torch==2.13.0)")


def _algorithms(spec: str, backend: str, ranks_per_node: int, two_level: bool) -> tuple[str, ...]:
    """--algorithm as a tuple of names; "all" = every algorithm that can run here."""
    from engine.comm.collectives import ALGORITHMS
    if spec.strip() == "all":
        return tuple(a for a in ALGORITHMS if (a != "hierarchical" or two_level)
                     and (a != "mpi-native" or backend == "mpi"))
    names = tuple(a.strip() for a in spec.split(",") if a.strip())
    unknown = [a for a in names if a not in ALGORITHMS]
    if unknown or not names:
        raise UsageError(f'--algorithm: unknown algorithm "{",".join(unknown)}"; use '
                         f'{", ".join(ALGORITHMS)} or all')
    if "hierarchical" in names and not ranks_per_node:
        raise UsageError("--algorithm hierarchical needs a node grid: give --ranks-per-node (ranks on each "
                         "node)")
    if "mpi-native" in names and backend != "mpi":
        raise UsageError(f"--algorithm mpi-native needs --backend mpi (under mpiexec), not {backend}")
    return names


def _calibrate(backend, world_size, ranks_per_node, size_list, iters, warmup, path, as_json, network,
               network_key) -> None:
    from engine.bench.calibrate import calibrate
    from engine.comm.auto import TuningError
    try:
        result = calibrate(backend, world_size, ranks_per_node, size_list, iters, warmup, path, network,
                           network_key)
    except (TuningError, OSError) as e:
        fail(f"--tuning-file: {e}")
    if not result["rows"]:
        return  # an MPI rank other than 0
    if as_json:
        print(json.dumps({**result, "crossovers": _rules(result["crossovers"])}, indent=2))
        return
    algorithms = tuple(dict.fromkeys(row["algorithm"] for row in result["rows"]))
    print(f"calibrating auto: {backend} backend, {world_size} ranks{node_grid(world_size, ranks_per_node)}, "
          f"median of {iters} iterations per size and algorithm, taking turns")
    if network is not None:
        print(network.describe())
    _print_comparison(result["rows"], algorithms, None)
    print(f"auto: {_describe(result['crossovers'])}")
    print(f"saved as {result['key']} in {result['path']}")


def _describe(crossovers) -> str:
    return ", ".join(f"{a} below {fmt_size(int(b))}" if b != float("inf") else f"{a} above"
                     for b, a in crossovers.rules)


def _rules(crossovers) -> list:
    return [[None if b == float("inf") else b, a] for b, a in crossovers.rules]


def _print_rows(ours: list[dict], gloo: list[dict] | None) -> None:
    head = f"{'size':>10} {'time ms':>9} {'algbw':>7} {'busbw':>7} {'ok':>3}"
    if gloo:
        head += f"   {'gloo ms':>9} {'busbw':>7}  {'ours/gloo':>9}"
    print(head)
    for i, row in enumerate(ours):
        line = (f"{fmt_size(row['size']):>10} {row['time_s'] * 1e3:9.2f} {row['algbw'] / 1e9:7.2f} "
                f"{row['busbw'] / 1e9:7.2f} {'yes' if row['correct'] else 'NO':>3}")
        if gloo:
            g = gloo[i]
            line += f"   {g['time_s'] * 1e3:9.2f} {g['busbw'] / 1e9:7.2f}  {row['busbw'] / g['busbw']:9.2f}x"
        print(line)


def _print_comparison(rows: list[dict], algorithms: tuple[str, ...], crossovers) -> None:
    """One line per size: each algorithm's median time, the fastest fixed one, auto against it — as
    measured, and as its pick measured alone (auto runs exactly its pick, so the two differ by noise)."""
    fixed = [a for a in algorithms if a != "auto"]
    head = f"{'size':>10} " + " ".join(f"{a + ' ms':>15}" for a in algorithms) + f" {'fastest':>13}"
    if "auto" in algorithms and fixed:
        head += f" {'auto/fastest':>13} {'pick/fastest':>13}"
    print(head)
    for size in dict.fromkeys(row["size"] for row in rows):
        at = {row["algorithm"]: row for row in rows if row["size"] == size}
        cells = []
        for a in algorithms:
            mark = "" if at[a]["correct"] else " WRONG"
            chosen = f" ({at[a]['chosen']})" if a == "auto" else ""
            cells.append(f"{at[a]['time_s'] * 1e3:.3f}{chosen}{mark}".rjust(15))
        line = f"{fmt_size(size):>10} " + " ".join(cells)
        if fixed:
            best = min(fixed, key=lambda a: at[a]["time_s"])
            line += f" {best:>13}"
            if "auto" in algorithms:
                pick = at.get(at["auto"]["chosen"])
                line += f" {at['auto']['time_s'] / at[best]['time_s']:12.2f}x"
                line += f" {pick['time_s'] / at[best]['time_s']:12.2f}x" if pick else f" {'-':>13}"
        print(line)
    if crossovers is not None:
        print(f"auto used the {crossovers.source} crossovers: {_describe(crossovers)}")
