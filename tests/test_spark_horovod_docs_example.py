"""examples/spark_horovod_docs_style.py — a Horovod Spark estimator script written as Horovod's
docs write it (``SparkBackend``, ``Store.create``, sparse libsvm ``features``, ``input_shapes``,
a lambda loss) — trains and transforms on the session's local Spark with only its imports
changed from ``horovod`` to ``kolo``."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import cloudpickle
import pytest

pytestmark = pytest.mark.spark

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "spark_horovod_docs_style.py"


def load_example():
    spec = importlib.util.spec_from_file_location("spark_horovod_docs_style", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    # The ranks and the Python workers cannot import the example by name: ship it by value.
    cloudpickle.register_pickle_by_value(module)
    return module


def test_example_imports_only_differ_from_horovods():
    """The example's imports are Horovod's with ``horovod`` -> ``kolo`` and nothing else."""
    source = EXAMPLE.read_text()
    kolo_imports = re.findall(r"^(?:import|from) kolo\S*.*$", source, flags=re.M)
    assert sorted(kolo_imports) == [
        "from kolo.spark.common.backend import SparkBackend",
        "from kolo.spark.common.store import Store",
        "import kolo.spark.torch as hvd",
    ]


def test_docs_style_estimator_trains_and_transforms(spark, tmp_path, capsys):
    example = load_example()
    accuracy = example.train_and_evaluate(spark, str(tmp_path), num_proc=2, epochs=8)
    assert accuracy >= 0.9, accuracy
    # SparkBackend(stdout=..., prefix_output_with_timestamp=True) reached kolo.spark.run.
    assert (tmp_path / "runs").is_dir()
