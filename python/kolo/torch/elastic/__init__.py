"""Horovod's ``hvd.elastic`` for PyTorch: ``import kolo.torch as hvd`` then ``hvd.elastic.run``,
``hvd.elastic.TorchState``, ``hvd.elastic.ElasticSampler`` (see docs/elastic.md).

Example::

    import torch
    import kolo.torch as hvd

    hvd.init()
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, 5):
            ...
            state.commit()

    train(hvd.elastic.TorchState(model, optimizer, epoch=0))
"""

# Horovod's module has init, shutdown and run_fn too (outside its __all__).
from kolo._lifecycle import init, shutdown  # noqa: F401
from kolo.elastic import ObjectState, State, run, run_fn  # noqa: F401
from kolo.torch.elastic.sampler import ElasticSampler
from kolo.torch.elastic.state import TorchState

__all__ = [
    "ElasticSampler",
    "ObjectState",
    "State",
    "TorchState",
    "run",
]
