"""Horovod's ``horovod.common.util`` helpers that scripts and test suites import
(``from horovod.common.util import gloo_built, mpi_built, env``), on kolo.

The ``*_built`` functions give the same answers as ``kolo.torch``'s (see :mod:`kolo._core`);
``verbose`` is accepted as in Horovod. :func:`env` sets environment variables for a ``with``
block and restores them afterwards.

Example::

    from kolo.common.util import env, gloo_built

    with env(HOROVOD_CYCLE_TIME="2"):
        run_training()
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional

from kolo import _core


def mpi_built(verbose: bool = False) -> bool:
    """Whether MPI collectives are built in: ``kolo.torch.mpi_built()``'s answer.

    Example::

        if mpi_built():
            ...
    """
    return _core.mpi_built()


def gloo_built(verbose: bool = False) -> bool:
    """Whether Gloo collectives are built in: ``kolo.torch.gloo_built()``'s answer.

    Example::

        if gloo_built():
            ...
    """
    return _core.gloo_built()


def nccl_built(verbose: bool = False) -> bool:
    """Whether NCCL collectives can run: ``kolo.torch.nccl_built()``'s answer.

    Example::

        if nccl_built():
            ...
    """
    return _core.nccl_built()


def ddl_built(verbose: bool = False) -> bool:
    """False: kolo has no IBM DDL support (``kolo.torch.ddl_built()``).

    Example::

        assert not ddl_built()
    """
    return _core.ddl_built()


def ccl_built(verbose: bool = False) -> bool:
    """False: kolo has no oneCCL support (``kolo.torch.ccl_built()``).

    Example::

        assert not ccl_built()
    """
    return _core.ccl_built()


@contextmanager
def env(**variables: Optional[str]) -> Iterator[None]:
    """Sets the environment variables given (``None`` values are ignored) for the ``with``
    block, then restores what was there before (removing those that were unset).

    Example::

        with env(KOLO_TIMELINE="/tmp/timeline.json", UNUSED=None):
            hvd.init()
    """
    wanted = {k: v for k, v in variables.items() if v is not None}
    saved = {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


__all__ = ["ccl_built", "ddl_built", "env", "gloo_built", "mpi_built", "nccl_built"]
