"""Settings read from the environment by the Python side of kolo."""

from __future__ import annotations

import os

from kolo.exceptions import ConfigError


def seconds_from_env(name: str, default: float) -> float:
    """The positive number of seconds in the variable ``name`` (``default`` when unset or
    empty); anything else is a ConfigError naming the variable."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < 1e9:
        raise ConfigError(f"{name}={text!r} must be a positive number of seconds")
    return seconds


#: Set by every elastic job driver in its workers' environment (``LaunchDriver.worker_env``).
ELASTIC_TIMEOUT_ENV = "KOLO_ELASTIC_TIMEOUT"

#: Set to ``1`` by an elastic launcher for a worker it adds to a running job (an added task).
ELASTIC_JOINING_ENV = "KOLO_ELASTIC_JOINING"


def elastic_joining() -> bool:
    """True when this worker was started to join a running elastic job (its launcher set
    ``KOLO_ELASTIC_JOINING=1``): the running ranks wait for it from its first registration on.

    Example::

        if elastic_joining():
            import torch._dynamo  # loaded now, not while the others wait
    """
    return os.environ.get(ELASTIC_JOINING_ENV, "").strip() == "1"


def elastic_launch() -> bool:
    """True when an elastic launcher started this worker: ``KOLO_ELASTIC_TIMEOUT`` is set (every
    elastic kolo driver passes it), or ``KOLO_ELASTIC=1`` / ``HOROVOD_ELASTIC=1`` (horovodrun's
    flag).

    Code that may skip work on a one-rank job (e.g. the gradient hooks of a
    ``DistributedOptimizer``) must not skip it in an elastic one: ranks may join later.

    Example::

        if hvd.size() > 1 or elastic_launch():
            register_gradient_hooks()
    """
    if os.environ.get(ELASTIC_TIMEOUT_ENV, "").strip():
        return True
    return any(
        os.environ.get(name, "").strip() == "1" for name in ("KOLO_ELASTIC", "HOROVOD_ELASTIC")
    )
