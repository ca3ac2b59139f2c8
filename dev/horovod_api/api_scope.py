"""Which of Horovod's modules are public API, and which issue owns each part (the rules are
explained in ``dev/horovod_api/README.md``).

Example::

    module_scope("horovod.torch.elastic")   # {'owner': 'issue 21 (elastic)', 'reason': ...}
    module_scope("horovod.torch")           # {'owner': 'issue19'}
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

IN_SCOPE = "issue19"
TENSORFLOW = "issue 22 (TensorFlow)"
ELASTIC = "issue 21 (elastic)"
NOT_PLANNED = "not planned"
#: Flags whose effect needs what this project cannot run (NVIDIA GPUs, IBM LSF's jsrun):
#: accepted with a notice (issue 19's decision), so outside the effect target.
NO_HARDWARE = "needs NVIDIA GPUs or IBM LSF (accepted with a notice)"
#: horovodrun flags whose effect is :data:`NO_HARDWARE`'s (by argparse ``dest``).
NO_HARDWARE_FLAGS = ("use_jsrun", "torus_allreduce", "num_nccl_streams")
INTERNAL = "internal"

#: Modules whose every public name is API: those Horovod's API reference (docs/api.rst)
#: documents or its docs and examples import, plus the modules that define what
#: ``horovod.torch`` re-exports (user code imports them by those paths too), the estimator
#: parameter classes, the process-set and exception modules, and ``horovod.data``.
PUBLIC_MODULES: List[str] = [
    "horovod",
    "horovod.torch",
    "horovod.torch.mpi_ops",
    "horovod.torch.functions",
    "horovod.torch.compression",
    "horovod.torch.optimizer",
    "horovod.torch.sync_batch_norm",
    "horovod.torch.elastic",
    "horovod.torch.elastic.sampler",
    "horovod.torch.elastic.state",
    "horovod.common.exceptions",
    "horovod.common.process_sets",
    "horovod.common.elastic",
    "horovod.data",
    "horovod.data.data_loader_base",
    "horovod.spark",
    "horovod.spark.common.backend",
    "horovod.spark.common.store",
    "horovod.spark.common.estimator",
    "horovod.spark.common.params",
    "horovod.spark.torch",
    "horovod.spark.keras",
    "horovod.spark.lightning",
    "horovod.ray",
    "horovod.ray.elastic",
    "horovod.keras",
    "horovod.keras.callbacks",
    "horovod.keras.elastic",
    "horovod.tensorflow",
    "horovod.tensorflow.elastic",
    "horovod.tensorflow.keras",
    "horovod.tensorflow.keras.callbacks",
    "horovod.tensorflow.keras.elastic",
    "horovod.mxnet",
]

#: Names that Horovod's docs or examples import from modules of its implementation (launchers,
#: Spark/Ray plumbing): ``(module, name, owner)``; only these names of those modules are API.
#: (``horovod.runner.common.util.env``, imported by a TensorFlow example only, is left out.)
EXAMPLE_IMPORTS: List[Tuple[str, str, str]] = [
    ("horovod.spark.task", "get_available_devices", IN_SCOPE),
    ("horovod.spark.lightning.estimator", "MIN_PL_VERSION", IN_SCOPE),
    ("horovod.spark.keras.datamodule", "NVTabularDataModule", IN_SCOPE),
    ("horovod.ray", "ray_logger", ELASTIC),
]

#: Names a public module binds that are not API: ``{module: [names]}`` (``process_sets``
#: binds a stand-in ``MPI`` class when mpi4py is missing and ``HorovodBasics`` for typing).
NOT_API: Dict[str, List[str]] = {"horovod.common.process_sets": ["MPI", "HorovodBasics"]}

#: The Spark estimators and models whose constructor parameters and accessors are compared.
ESTIMATOR_CLASSES: List[str] = [
    "horovod.spark.torch.TorchEstimator",
    "horovod.spark.torch.TorchModel",
    "horovod.spark.lightning.TorchEstimator",
    "horovod.spark.lightning.TorchModel",
    "horovod.spark.keras.KerasEstimator",
    "horovod.spark.keras.KerasModel",
]

#: The store classes whose methods are compared.
STORE_MODULE = "horovod.spark.common.store"

_OUT_OF_SCOPE = [
    # (test on the dotted module name, owner, reason)
    (
        lambda m: m.startswith("horovod.mxnet"),
        NOT_PLANNED,
        "kolo has no MXNet adapter (MXNet is retired by Apache)",
    ),
]


def module_scope(module: str) -> Dict[str, str]:
    """``{"owner": IN_SCOPE}`` or ``{"owner": <issue or category>, "reason": ...}``."""
    for test, owner, reason in _OUT_OF_SCOPE:
        if test(module):
            return {"owner": owner, "reason": reason}
    return {"owner": IN_SCOPE}


def name_scope(module: str, name: str) -> Dict[str, str]:
    """The scope of ``module.name``: its module's, or elastic for an elastic name
    (``run_elastic``, ``ElasticRayExecutor``, ``elastic`` submodules)."""
    return module_scope(module)


def internal_reason(module: str) -> Optional[str]:
    """Why a module that is not in :data:`PUBLIC_MODULES` is not API (None: it is API)."""
    if module in PUBLIC_MODULES:
        return None
    for prefix, reason in _INTERNAL_REASONS:
        if module == prefix or module.startswith(prefix + "."):
            return reason
    return "implementation module: not documented, not imported by Horovod's docs or examples"


_INTERNAL_REASONS = [
    (
        "horovod.runner",
        "horovodrun's implementation (its flags and horovod.run are compared instead)",
    ),
    ("horovod.spark.driver", "Spark job plumbing"),
    ("horovod.spark.task", "Spark job plumbing"),
    ("horovod.spark.gloo_run", "Spark job plumbing"),
    ("horovod.spark.mpi_run", "Spark job plumbing"),
    ("horovod.spark.runner", "defines horovod.spark.run (compared under horovod.spark)"),
    ("horovod.spark.conf", "Spark job plumbing"),
    ("horovod.spark.data_loaders", "petastorm-based loaders used inside the estimators"),
    ("horovod.common.util", "native-library glue"),
    ("horovod.common.basics", "native-library glue (its functions are compared where exported)"),
]
