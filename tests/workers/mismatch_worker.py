"""Each rank makes a deliberately different call; every rank must get MismatchError, and the
job must stay usable afterwards."""

from __future__ import annotations

import sys

import torch

import kolo.torch as hvd
from kolo.exceptions import MismatchError


def expect_mismatch(label: str, call) -> str:
    try:
        call()
    except MismatchError as err:
        return f"{label}: MismatchError: {err}"
    raise AssertionError(f"{label}: no MismatchError on rank {hvd.rank()}")


def main() -> int:
    hvd.init()
    rank = hvd.rank()
    lines = [
        expect_mismatch(
            "shape", lambda: hvd.allreduce(torch.ones(4 + rank), op=hvd.Sum, name="shape")
        ),
        expect_mismatch(
            "dtype",
            lambda: hvd.allreduce(
                torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64), name="dtype"
            ),
        ),
        expect_mismatch(
            "op",
            lambda: hvd.allreduce(torch.ones(4), op=hvd.Sum if rank == 0 else hvd.Max, name="op"),
        ),
        expect_mismatch("root", lambda: hvd.broadcast(torch.ones(2), root_rank=rank, name="root")),
        expect_mismatch(
            "kind",
            lambda: (
                hvd.allreduce(torch.ones(2), name="kind")
                if rank == 0
                else hvd.allgather(torch.ones(2), name="kind")
            ),
        ),
        expect_mismatch(
            "allgather-trailing-dims",
            lambda: hvd.allgather(torch.ones(2, 3 + rank), name="trailing"),
        ),
    ]
    for line in lines:
        print(line)
    total = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after")
    assert torch.equal(total, torch.full((3,), float(hvd.size()))), total
    print(f"rank {rank}: {len(lines)} mismatches raised MismatchError; job still usable")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
