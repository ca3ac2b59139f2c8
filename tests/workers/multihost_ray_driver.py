"""The Ray driver of the multi-host tests: joins the Ray cluster at ``argv[1]``, runs
``multihost_worker.fit`` on one RayExecutor worker per node (the data plane and the driver
service on ``eth0``), and prints ``RESULTS <json>`` (every rank's weights and placement).

The Ray nodes have tests/workers on their PYTHONPATH, so the function pickles by reference.
"""

from __future__ import annotations

import json
import sys

import multihost_worker
import ray

from kolo.ray import RayExecutor


def main(address: str, hosts: int) -> None:
    ray.init(address=address, logging_level="ERROR")
    settings = RayExecutor.create_settings(timeout_s=60, nics=["eth0"])
    executor = RayExecutor(settings, num_hosts=hosts, num_workers_per_host=1, cpus_per_worker=1)
    executor.start()
    try:
        results = executor.run(multihost_worker.fit)
    finally:
        executor.shutdown()
    print("RESULTS " + json.dumps(results), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
