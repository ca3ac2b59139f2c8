"""The oldest Lightning the Spark Lightning estimator supports (Horovod's ``MIN_PL_VERSION``)
and the check ``TorchEstimator`` runs at construction, as Horovod's does."""

from __future__ import annotations

from typing import Optional

from kolo.exceptions import FrameworkVersionError

#: The oldest ``lightning`` kolo's Lightning estimator runs with (kolo uses Lightning 2.x, the
#: ``lightning`` package; Horovod's value, for ``pytorch_lightning``, is ``"1.3.8"``).
MIN_PL_VERSION = "2.0.0"


def check_lightning_version(installed: Optional[str] = None) -> None:
    """Raises :class:`~kolo.exceptions.FrameworkVersionError` (a ``ConfigError`` and, as
    Horovod's check raises, a ``RuntimeError``) when the installed ``lightning`` (or
    ``installed``) is older than :data:`MIN_PL_VERSION`."""
    from packaging import version

    if installed is None:
        import lightning.pytorch as pl

        installed = pl.__version__
    if version.parse(installed) < version.parse(MIN_PL_VERSION):
        raise FrameworkVersionError(
            f"kolo's Lightning estimator needs lightning>={MIN_PL_VERSION}, found "
            f"lightning=={installed}: upgrade it (pip install 'lightning>={MIN_PL_VERSION}')"
        )
