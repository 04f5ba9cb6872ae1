"""A cluster made concrete for one run: how fast its ranks compute and what its links cost, including the
network a config emulates (engine.comm.emulation) when the cluster is this machine.

On this machine (a calibrated cluster) the links are nanoDist's own transport as calibrated (α, β, γ).
An `[emulate]` section rides on top of it, as the socket transport does: an emulated message costs its
latency and bandwidth plus the real link's α and its last piece (one shared-memory slot) at the real β;
virtual nodes of `parallel.ranks_per_node` ranks get the `inter_*` shape between them.

Ranks that share a host's cores (compute.cores > 0) also share them with communication: what a collective
does on the CPU slows compute it overlaps with (`cpu_topology`). On this machine that is the collectives'
CPU time as calibrated (calibrate.py: α, β, γ fitted to the calling thread's CPU seconds — framing, system
calls and the ring's Python per message as well as the copying and reducing per byte); on a cluster file's
CPU ranks, the copying alone (the links' β and the reduction's γ, no latency). More ranks than the
calibrated level time-slice the cores: the real links' figures and their CPU time then stretch by the same
factor as compute does.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.comm.emulation import NetworkEmulation
from engine.comm.rendezvous import SHM_SLOT_BYTES
from engine.config import Config, network_emulation
from engine.projection.calibrate import LEVELS, Calibration, CalibrationError
from engine.projection.clusters import Cluster
from engine.projection.collective_times import Link, Topology
from engine.projection.compute import CalibratedCompute, NominalCompute, demand
from engine.projection.flops import FlopsOf


@dataclass
class Machine:
    """Compute and links of `ranks` ranks of `cluster` training `cfg`."""

    cluster: Cluster
    compute: CalibratedCompute | NominalCompute
    topology: Topology
    cpu_topology: Topology | None  # the CPU part of communication, where ranks share cores
    algorithm: str  # "ring" (nanoDist's) or "auto" (the fastest per size)
    ranks_on_host: int


def make_machine(cluster: Cluster, cfg: Config, ranks: int, calibration: Calibration | None,
                 flops_of: FlopsOf) -> Machine:
    per_node = cluster["ranks_per_node"]
    on_host = min(ranks, per_node)
    compute: CalibratedCompute | NominalCompute
    if cluster["compute.calibrate"]:
        entry = calibration.model(flops_of.signature) if calibration else None
        if entry is None:
            raise CalibrationError(f"{cluster.path}: a calibrated cluster, but {flops_of.signature} has no "
                                   "calibration yet; run `nanodist-tui project --calibrate` with its preset")
        compute = CalibratedCompute(calibration, entry, flops_of, cfg.parallel.threads_per_rank)
    else:
        cluster.require_peak(cfg.precision.dtype)  # a rate of 0 FLOP/s would divide by zero below
        compute = NominalCompute(cluster)
    if cluster["intra.calibrate"]:
        if calibration is None:
            raise CalibrationError(f"{cluster.path}: no calibration of this machine's transport yet; run "
                                   "`nanodist-tui project --calibrate`")
        here, host_cpu = _this_machine(cfg, ranks, on_host, calibration)
        return Machine(cluster, compute, here, host_cpu, "ring", on_host)
    gamma = 1 / (cluster["collectives.reduce_gbs"] * 1e9) if cluster["collectives.reduce_gbs"] else 0.0
    topology = Topology(ranks, per_node, _link(cluster, "intra"), _link(cluster, "inter"), gamma,
                        cluster["inter.nic"])
    cpu: Topology | None = None
    if cluster["compute.cores"]:  # CPU ranks: their transport copies with the cores they compute on
        cpu = Topology(ranks, per_node, Link(0.0, topology.intra.beta), Link(0.0, topology.inter.beta), gamma,
                       cluster["inter.nic"])
    algorithm = "ring" if cluster["collectives.algorithm"] == "engine" and cfg.parallel.algorithm == "ring" \
        else "auto"
    return Machine(cluster, compute, topology, cpu, algorithm, on_host)


def _link(cluster: Cluster, side: str) -> Link:
    gbs = cluster[f"{side}.bandwidth_gbs"]
    return Link(cluster[f"{side}.latency_us"] / 1e6, 1 / (gbs * 1e9) if gbs else 0.0)


def _this_machine(cfg: Config, ranks: int, on_host: int, calibration: Calibration
                  ) -> tuple[Topology, Topology]:
    t = calibration.transport
    level = min(on_host, max(LEVELS), calibration.cores)
    stretch = demand(on_host, calibration.cores, cfg.parallel.threads_per_rank, level)
    real = Link(t["alpha"] * stretch, t["beta"] * stretch)
    gamma = calibration.gamma(cfg.precision.dtype) * stretch
    emulation = network_emulation(cfg) or NetworkEmulation()
    per_node = cfg.parallel.ranks_per_node or ranks
    intra = _emulated(real, emulation.shape(0, 1) if per_node > 1 else None)
    inter = _emulated(real, emulation.shape(0, per_node) if per_node < ranks else None)
    cpu_alpha, cpu_beta, cpu_gamma = calibration.cpu(cfg.precision.dtype)
    cpu_link = Link(cpu_alpha * stretch, cpu_beta * stretch)
    cpu = Topology(ranks, per_node, cpu_link, cpu_link, cpu_gamma * stretch)
    return Topology(ranks, per_node, intra, inter, gamma), cpu


def _emulated(real: Link, shape) -> Link:
    """The real link with an emulated shape on top (see the module docstring), or the real link."""
    if shape is None:
        return real
    beta = 1 / shape.bytes_per_s if shape.bytes_per_s else real.beta
    host = real.beta if shape.bytes_per_s else 0.0
    return Link(real.alpha + shape.latency_s, beta, host_beta=host, piece=SHM_SLOT_BYTES)
