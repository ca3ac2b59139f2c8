"""Grouped and async ops beyond allreduce, on 2 ranks: prints one OK line per rank."""

import time

import torch

import kolo.torch as hvd
from kolo import _core

hvd.init()
r, n = hvd.rank(), hvd.size()
assert n == 2

# grouped_allgather: rank r contributes r + 1 rows of value r, and a second tensor of 2 rows.
a, b = hvd.grouped_allgather([torch.full((r + 1, 3), float(r)), torch.full((2,), r)])
assert a.tolist() == [[0.0] * 3, [1.0] * 3, [1.0] * 3], a
assert b.tolist() == [0, 0, 1, 1], b

# grouped_reducescatter: 3 rows summed over 2 ranks; rank 0 gets 2 rows, rank 1 gets 1.
x, y = hvd.grouped_reducescatter(
    [torch.arange(6.0).reshape(3, 2) * (r + 1), torch.ones(4, dtype=torch.int64)], op=hvd.Sum
)
want = (torch.arange(6.0).reshape(3, 2) * 3)[[0, 1]] if r == 0 else (torch.arange(6.0) * 3)[4:]
assert torch.equal(x, want.reshape(-1, 2)), (x, want)
assert y.tolist() == [2, 2], y

# reducescatter_async and alltoall_async, waited in reverse order.
h1 = hvd.reducescatter_async(torch.full((4, 1), float(r)), op=hvd.Average)
h2 = hvd.alltoall_async(torch.arange(3) + 10 * r, splits=[1, 2] if r == 0 else [2, 1])
out, received = hvd.synchronize(h2)
part = hvd.synchronize(h1)
assert part.tolist() == [[0.5], [0.5]], part
if r == 0:
    assert out.tolist() == [0, 10, 11] and received.tolist() == [1, 2], (out, received)
else:
    assert out.tolist() == [1, 2, 12] and received.tolist() == [2, 1], (out, received)


# A group is one fused collective on every rank, even with the engine set to start a cycle the
# moment anything is submitted (the test runs it with a 10 µs cycle time and no quiet time): the
# group's tensors are handed to the engine at once, so no cycle can start between two of them.
def collectives() -> int:
    return hvd.engine_stats()["collectives"]


for step in range(30):
    grads = [torch.full((16,), float(r + i)) for i in range(5)]
    before = collectives()
    hvd.grouped_allreduce_(grads, op=hvd.Sum)
    took = collectives() - before
    assert took == 1, f"step {step}: a group of 5 took {took} collectives"
    assert [g[0].item() for g in grads] == [2.0 * i + 1 for i in range(5)], grads

# What a thread submits inside submitted_together() is held until the block ends: nothing runs
# while the block sleeps, and the op runs once it is handed over.
before = collectives()
with _core.submitted_together():
    held = hvd.allreduce_async(torch.ones(3), name="held", op=hvd.Sum)
    time.sleep(0.2)
    assert collectives() == before and not hvd.poll(held), "an op ran before its group ended"
assert hvd.synchronize(held).tolist() == [2.0] * 3

# A block that raises submits none of its ops and forgets their names: the name goes again.
try:
    with _core.submitted_together():
        hvd.allreduce_async(torch.ones(2), name="again", op=hvd.Sum)
        raise KeyError("the caller failed")
except KeyError:
    pass
time.sleep(0.1)
assert collectives() == before + 1, "an op of a block that raised ran"
assert hvd.allreduce(torch.ones(2), name="again", op=hvd.Sum).tolist() == [2.0] * 2
print(f"OK rank {r}")
hvd.shutdown()
