"""Horovod's ``init(comm=...)`` forms and ``ProcessSet(comm)`` under ``mpirun -np 4``, one after
the other in one process (shutdown between them): a sub-communicator (two independent jobs), a
list of COMM_WORLD ranks, a process set per half of ``COMM_WORLD.Split`` at init, and one per
pair added after init."""

from __future__ import annotations

import torch
from mpi4py import MPI

import kolo.torch as hvd

world = MPI.COMM_WORLD
me = world.Get_rank()


def sum_of_world_ranks(process_set=None) -> int:
    mine = torch.tensor([me])
    return int(hvd.allreduce(mine, op=hvd.Sum, process_set=process_set).item())


# 1. A sub-communicator: evens and odds train independently, numbered as in their halves.
sub = world.Split(color=me % 2, key=me)
hvd.init(comm=sub)
assert (hvd.rank(), hvd.size()) == (sub.Get_rank(), sub.Get_size())
half = [r for r in range(world.Get_size()) if r % 2 == me % 2]
assert sum_of_world_ranks() == sum(half)
print(f"world {me}: sub-communicator rank {hvd.rank()} of {hvd.size()}", flush=True)
hvd.shutdown()
world.Barrier()

# 2. A list of COMM_WORLD ranks, in Horovod's order: rank = position in the list.
listed = [3, 1]
if me in listed:
    hvd.init(comm=listed)
    assert (hvd.rank(), hvd.size()) == (listed.index(me), 2)
    assert sum_of_world_ranks() == 4
    print(f"world {me}: listed rank {hvd.rank()} of {hvd.size()}", flush=True)
    hvd.shutdown()
world.Barrier()

# 3. ProcessSet(comm): each rank passes its half; both halves become process sets.
halves = hvd.ProcessSet(world.Split(color=me % 2, key=me))
hvd.init(comm=world, process_sets=[halves])
assert halves.ranks == half and halves.included() and halves.size() == 2
assert sum_of_world_ranks(halves) == sum(half)
assert sum_of_world_ranks() == sum(range(world.Get_size()))
print(f"world {me}: process set {halves.ranks}, rank {halves.rank()} in it", flush=True)
hvd.shutdown()

# 4. The same, added after init (kolo accepts what Horovod refuses: a communicator there).
hvd.init(comm=world, process_sets="dynamic")
pair = hvd.add_process_set(hvd.ProcessSet(world.Split(color=me // 2, key=me)))
assert pair.ranks == [me - me % 2, me - me % 2 + 1]
assert sum_of_world_ranks(pair) == sum(pair.ranks)
print(f"world {me}: added process set {pair.ranks}", flush=True)
# As in Horovod, one rank's shutdown stops every rank's engine: the other pair may still be in
# its allreduce, so every rank gets here before any shuts down.
world.Barrier()
hvd.shutdown()
