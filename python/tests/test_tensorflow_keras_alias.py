"""``kolo.tensorflow.keras`` is Horovod's ``horovod.tensorflow.keras`` path to kolo.keras; its
``BestModelCheckpoint`` saves the best weights only when asked (runs one small fit)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PYTHON = Path(__file__).resolve().parents[1]

# In its own process: TensorFlow must not share this one with torch's Triton.
SCRIPT = """
import numpy as np, keras
import kolo.keras, kolo.tensorflow.keras as hvd
from kolo.exceptions import ConfigError
assert hvd.DistributedOptimizer is kolo.keras.DistributedOptimizer
assert hvd.elastic.KerasState is kolo.keras.elastic.KerasState
assert hvd.callbacks.MetricAverageCallback is kolo.keras.callbacks.MetricAverageCallback
hvd.init()
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
x, y = np.ones((8, 3), np.float32), np.ones((8, 1), np.float32)
path = sys.argv[1] + "/best.weights.h5"
best = hvd.callbacks.BestModelCheckpoint(monitor="loss", save_weights_only=True, filepath=path)
model.fit(x, y, epochs=2, verbose=0, callbacks=[best])
restored = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
restored.load_weights(path)
wrong = hvd.callbacks.BestModelCheckpoint(save_weights_only=True, filepath=sys.argv[1] + "/b.keras")
try:
    model.fit(x, y, epochs=1, verbose=0, callbacks=[wrong])
    raise SystemExit("a .keras file for weights only was accepted")
except ConfigError as err:
    assert ".weights.h5" in str(err), err
print("alias ok")
"""


def test_tensorflow_keras_is_kolo_keras_and_saves_best_weights(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import sys\n" + SCRIPT, str(tmp_path)],
        env={"PYTHONPATH": str(PYTHON), "KERAS_BACKEND": "tensorflow", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and "alias ok" in result.stdout, result.stderr[-4000:]
