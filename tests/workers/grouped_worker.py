"""Grouped and async ops beyond allreduce, on 2 ranks: prints one OK line per rank."""

import torch

import kolo.torch as hvd

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
print(f"OK rank {r}")
hvd.shutdown()
