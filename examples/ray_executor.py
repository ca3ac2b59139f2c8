"""The Horovod docs' RayExecutor examples on kolo, runnable offline on one machine.

    .venv/bin/python examples/ray_executor.py

1. ``simple_fn``: every rank initializes and returns its rank.
2. A stateful executable (``MyModel``) kept in each actor across ``execute`` calls.
"""

import ray

from kolo.ray import RayExecutor


def simple_fn():
    import kolo.torch as hvd

    hvd.init()
    print("hvd rank", hvd.rank())
    return hvd.rank()


class MyModel:
    """The stateful executable: built once per actor, after the rank variables are set."""

    def __init__(self, learning_rate):
        import torch

        import kolo.torch as hvd

        hvd.init()
        self.learning_rate = learning_rate
        self.weight = torch.zeros(4)

    def train(self):
        import torch

        import kolo.torch as hvd

        gradient = torch.full((4,), float(hvd.rank() + 1))
        self.weight -= self.learning_rate * hvd.allreduce(gradient, op=hvd.Average)
        return self.weight.tolist()


def main():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    settings = RayExecutor.create_settings(timeout_s=30)

    executor = RayExecutor(settings, num_workers=2, use_gpu=False)
    executor.start()
    print("simple_fn ranks:", executor.run(simple_fn))
    executor.shutdown()

    executor = RayExecutor(settings, num_workers=2, use_gpu=False)
    executor.start(executable_cls=MyModel, executable_args=[0.1])
    for _ in range(3):
        weights = executor.execute(lambda model: model.train())
    print("weights after 3 steps, by rank:", weights)
    print("rank 0's learning rate:", executor.execute_single(lambda model: model.learning_rate))
    executor.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
