"""Communication runtime: transports, collectives written once, process groups, the traffic meter, the
launcher.

  base.py         Communicator interface and its rules; RankFailure, PeerTimeout, StopRequested
  group.py        process groups (a view over a parent communicator); NodeGrid, the nodes × ranks grid
  threads.py      threads backend (in-process mailboxes)
  tcp.py          socket transport with the shared-memory fast path (processes, tcp backends)
  tcp_link.py     one of its links, and the send and receive state machines of a message over it
  wire.py auth.py shm.py rendezvous.py   its frame header, handshake, segments, rendezvous
  mpi.py          mpi backend (mpi4py), and MPI's native Allreduce as algorithm "mpi-native"
  collectives.py  the collectives' entry points and ALGORITHMS; the algorithms, one file per family:
  ring.py halving.py tree.py hierarchical.py   ring, recursive halving-doubling, binomial tree, two-level
  auto.py         algorithm "auto": measured crossovers by message size, the tuning file
  reduction.py    sum / avg / max, segments, the pairwise exchange
  alltoall.py     all-to-all, even and uneven (counts first), over the batched exchange (exchange.py)
  meter.py        per-rank traffic meter (link = src, dst, phase, group, algorithm); algbw / busbw
  launch.py       run_ranks for every backend; procs.py spawns and supervises rank processes
  progress.py     starved or hung: a waiter's timeout restarts while the rank it waits on makes progress
  codec.py        JSON (with numpy arrays) between the launcher and its rank processes; never pickle

The all-reduce benchmark against torch gloo is engine/bench/allreduce.py, the all-to-all one
engine/bench/alltoall.py.
"""

from engine.comm.base import Communicator, PeerTimeout, ProtocolError, RankFailure, Signals, StopRequested
from engine.comm.collectives import all_gather, all_reduce, broadcast, reduce_scatter, shard_bounds
from engine.comm.launch import BACKENDS, run_ranks, under_mpi
from engine.comm.meter import TrafficMeter, algbw, busbw

__all__ = [
    "BACKENDS", "Communicator", "PeerTimeout", "ProtocolError", "RankFailure", "Signals", "StopRequested",
    "TrafficMeter", "algbw", "all_gather", "all_reduce", "broadcast", "busbw", "reduce_scatter",
    "run_ranks", "shard_bounds", "under_mpi",
]
