"""kolo's Spark estimators from a Spark Connect client (a session with no ``SparkContext``):
``TorchModel.transform``, typed errors for bad input at the ``fit`` call site (the same as on
a classic session), one small ``KerasEstimator`` and Lightning fit, and the main job's example
with ``--connect`` (``TorchEstimator`` fit → transform to the classic run's accuracy bar).

The Connect client runs in a subprocess (tests/workers/spark_connect_estimator_worker.py)
against the shared ``connect_server`` fixture: PySpark switches a whole process to Connect
mode once it holds a Connect session, which the suite's classic ``spark`` session cannot
share."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")


from kolo.exceptions import DataError, StoreError

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "workers" / "spark_connect_estimator_worker.py"


def client(url: str, scenarios: str, store_dir: Path, timeout: float = 500) -> dict:
    """Runs scenarios of the Connect client worker in one process; ``{scenario: result}``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOLO_")}
    env.pop("SPARK_REMOTE", None)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = subprocess.run(
        [sys.executable, str(WORKER), url, str(store_dir), scenarios],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    tail = result.stdout[-3000:] + result.stderr[-6000:]
    assert result.returncode == 0, tail
    found = re.search(r"^RESULT (.*)$", result.stdout, re.MULTILINE)
    assert found, tail
    return json.loads(found.group(1))


@pytest.fixture(scope="module")
def torch_client(connect_server, tmp_path_factory) -> dict:
    """One Connect client process for the PyTorch and Lightning scenarios (one session, one
    import of torch, the digits built once)."""
    store_dir = tmp_path_factory.mktemp("connect-store")
    return client(connect_server, "transform,bad_input,lightning", store_dir)


def scenario(results: dict, name: str) -> dict:
    result = results[name]
    assert "error" not in result, result.get("error")
    return result


def test_transform_on_connect_predicts_what_the_model_computes(torch_client):
    """No broadcast on Connect: the model reaches the server's Python workers in the UDF's
    closure and predicts exactly what it predicts in this process."""
    result = scenario(torch_client, "transform")
    assert result["columns"] == ["features", "label", "label__output"]
    assert result["rows"] == 360
    assert result["max_diff"] < 1e-5
    assert result["accuracy"] > 0.85
    # A model over the server's message limit: a typed error at the call, naming the setting.
    kind, message = result["too_big"]
    assert kind == "ConfigError", result["too_big"]
    assert re.search(r"the model is \d+\.\d MiB", message) and "up to 32.0 MiB" in message, message
    assert "spark.connect.grpc.maxInboundMessageSize" in message, message


def _classic_errors(spark, tmp_path) -> dict:
    """The same bad fits as the worker's ``bad_input`` scenario, on the classic session."""
    import torch

    from kolo.spark.torch import TorchEstimator
    from kolo.store import Store

    small = spark.createDataFrame(
        [([float(i), 1.0], float(i), f"n{i}") for i in range(40)], ["x", "y", "name"]
    )
    store_dir = tmp_path / "classic"
    store_dir.mkdir()
    blocker = store_dir / "a_file"
    blocker.write_text("not a directory")
    cases = {
        "missing_column": (small, dict(feature_cols=["nope"])),
        "string_feature": (small, dict(feature_cols=["x", "name"])),
        "empty": (small.filter("y > 100"), {}),
        "store_not_writable": (small, dict(store=Store.create(str(blocker / "store")))),
    }
    errors = {}
    for name, (df, overrides) in cases.items():
        model = torch.nn.Linear(2, 1)
        params = dict(
            num_proc=2,
            store=Store.create(str(store_dir)),
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            loss=torch.nn.functional.mse_loss,
            feature_cols=["x"],
            label_cols=["y"],
            batch_size=32,
            epochs=1,
        )
        params.update(overrides)
        with pytest.raises(Exception) as caught:
            TorchEstimator(**params).fit(df)
        errors[name] = [type(caught.value).__module__ + "." + type(caught.value).__name__]
        errors[name].append(str(caught.value))
    return errors


def test_bad_input_on_connect_raises_the_classic_typed_errors(torch_client, spark, tmp_path):
    connect = scenario(torch_client, "bad_input")["errors"]
    classic = _classic_errors(spark, tmp_path)
    expected = {
        "missing_column": (DataError, r"feature column 'nope' is not in the DataFrame.*x, y, name"),
        "string_feature": (DataError, r"feature column 'name' has type string.*StringIndexer"),
        "empty": (DataError, "the DataFrame has no rows"),
        "store_not_writable": (StoreError, "not writable"),
    }
    for case, (error, message) in expected.items():
        name = f"{error.__module__}.{error.__name__}"
        assert connect[case][0] == name, (case, connect[case])
        assert re.search(message, connect[case][1]), (case, connect[case])
        assert classic[case][0] == connect[case][0], (case, classic[case], connect[case])
        # the messages differ only by the temporary store paths
        assert re.sub(r"/\S+", "<path>", classic[case][1]) == re.sub(
            r"/\S+", "<path>", connect[case][1]
        ), case


def test_keras_fit_on_connect(connect_server, tmp_path):
    result = scenario(client(connect_server, "keras", tmp_path), "keras")
    assert len(result["history"]["loss"]) == 1 and result["history"]["loss"][0] > 0
    assert result["rows"] == 360
    assert result["columns"] == ["features", "label", "label__output"]


def test_lightning_fit_on_connect(torch_client):
    result = scenario(torch_client, "lightning")
    assert result["num_proc"] == 2  # the server's spark.default.parallelism, without a SparkContext
    assert len(result["history"]["train_loss"]) == 1
    assert result["rows"] == 360
    assert result["columns"] == ["features", "label", "label__output"]


@pytest.mark.slow
def test_main_job_example_through_connect_reaches_90_percent(connect_server):
    """examples/spark_torch_estimator.py --connect URL: the same bar as the classic run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOLO_")}
    result = subprocess.run(
        [sys.executable, "examples/spark_torch_estimator.py", "--connect", connect_server],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    found = re.search(r"test accuracy: ([\d.]+)", result.stdout)
    assert found, result.stdout[-2000:]
    assert float(found.group(1)) >= 0.90, result.stdout
    assert "Spark Connect" in result.stdout
