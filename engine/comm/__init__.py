"""Communication runtime: transports, ring collectives written once, the traffic meter, the launcher.

  base.py         Communicator interface and its rules; RankFailure, PeerTimeout, StopRequested
  threads.py      threads backend (in-process mailboxes)
  tcp.py          socket transport with the shared-memory fast path (processes, tcp backends)
  wire.py auth.py shm.py rendezvous.py   its frame header, handshake, segments, rendezvous
  mpi.py          mpi backend (mpi4py), and MPI's native Allreduce as algorithm "mpi-native"
  collectives.py  ring reduce-scatter / all-gather / all-reduce, pipelined broadcast
  meter.py        per-rank traffic meter; algbw / busbw
  launch.py       run_ranks for every backend; procs.py spawns and supervises rank processes
  codec.py        JSON (with numpy arrays) between the launcher and its rank processes; never pickle

The all-reduce benchmark against torch gloo is engine/bench/allreduce.py.
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
