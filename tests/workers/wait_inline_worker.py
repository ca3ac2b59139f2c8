"""Times synchronous and async-then-synchronize allreduces under an engine whose own cycles
come only every 5 s (KOLO_CYCLE_TIME and KOLO_SUBMIT_QUIET_TIME set by the test): they finish
in milliseconds only if a waiting caller runs the cycle itself. Prints ``ELAPSED <s>``."""

import time

import torch

import kolo.torch as hvd

hvd.init()
x = torch.arange(1024, dtype=torch.float32)
start = time.monotonic()
for _ in range(20):
    y = hvd.allreduce(x, name="sync", op=hvd.Sum)
    assert torch.equal(y, x * hvd.size()), y
handles = [hvd.allreduce_async(x, name=f"async.{i}", op=hvd.Sum) for i in range(4)]
for handle in reversed(handles):
    assert torch.equal(hvd.synchronize(handle), x * hvd.size())
print(f"ELAPSED {time.monotonic() - start:.3f}", flush=True)
hvd.shutdown()
