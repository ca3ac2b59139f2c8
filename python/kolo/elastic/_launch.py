"""Whether this worker belongs to an elastic job (its size may change while it runs)."""

from __future__ import annotations

import os

#: Set by every elastic job driver in its workers' environment (``LaunchDriver.worker_env``).
ELASTIC_TIMEOUT_ENV = "KOLO_ELASTIC_TIMEOUT"


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
