"""What an elastic commit costs (run under ``kolorun -np N``): ``TorchState.commit()`` of a model
of ``--mb`` MB against one memcpy of the same bytes, and ``check_host_updates()`` (the one small
broadcast every commit makes) against a 1-element allreduce. Rank 0 prints one JSON line.

Example::

    kolorun -np 2 python bench/elastic_commit.py --mb 100
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import kolo.torch as hvd


def timed(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs (after one warm-up)."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=float, default=100.0, help="model size in MB (float32)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--checks", type=int, default=200, help="check_host_updates calls")
    args = parser.parse_args()
    hvd.init()

    width = 1024
    layers = max(1, round(args.mb * 1e6 / 4 / (width * width + width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    state = hvd.elastic.TorchState(model)

    # Commit without the host-update check (save only), and the full commit.
    save_s = timed(state.save, args.repeats)
    commit_s = timed(state.commit, args.repeats)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    target = torch.empty_like(flat)
    memcpy_s = timed(lambda: target.copy_(flat), args.repeats)

    check_s = timed(state.check_host_updates, args.checks)
    one = torch.ones(1)
    allreduce_s = timed(lambda: hvd.allreduce(one, name="bench.one"), args.checks)

    if hvd.rank() == 0:
        print(
            json.dumps(
                {
                    "ranks": hvd.size(),
                    "state_mb": round(nbytes / 1e6, 1),
                    "save_s": round(save_s, 4),
                    "commit_s": round(commit_s, 4),
                    "memcpy_s": round(memcpy_s, 4),
                    "commit_over_memcpy": round(commit_s / memcpy_s, 2),
                    "check_host_updates_us": round(check_s * 1e6, 1),
                    "allreduce_1_element_us": round(allreduce_s * 1e6, 1),
                }
            )
        )
    hvd.shutdown()


if __name__ == "__main__":
    main()
