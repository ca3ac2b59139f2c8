"""Rank 0 of a torch or Lightning estimator writes its TensorBoard event files without
importing TensorFlow.

``torch.utils.tensorboard`` imports TensorFlow when it is installed (seconds before rank 0's
first step, and TensorFlow beside torch's Triton can abort a process); the trainers make
TensorBoard use its own stub instead (for Lightning, in the default ``TensorBoardLogger``).
Checked in a fresh process (a single bare rank: the real ``kolo.torch`` runtime, a real local
store), as a rank process would be.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

RANK0 = textwrap.dedent(
    """
    import json, os, sys, types

    import kolo.torch as hvd
    from kolo.estimator.torch_trainer import TorchTrainer
    from kolo.store import Store

    hvd.init()
    store = Store.create(sys.argv[1])
    if sys.argv[2] == "torch":
        trainer = TorchTrainer.__new__(TorchTrainer)
        trainer.spec = types.SimpleNamespace(store=store, run_id="tb_run")
        writer, local_dir, sync = trainer._tensorboard(hvd)
        writer.add_scalar("loss", 0.5, 0)
        writer.close()
    else:
        import cloudpickle
        from kolo.estimator.lightning_trainer import LightningTrainer

        trainer = LightningTrainer.__new__(LightningTrainer)
        trainer.spec = types.SimpleNamespace(
            store=store, run_id="tb_run", logger_bytes=cloudpickle.dumps(None)
        )
        local_dir = sys.argv[1] + "-rank0"
        logger = trainer._logger(local_dir)
        logger.log_metrics({"loss": 0.5}, step=0)
        logger.finalize("success")
    files = [name for _, _, names in os.walk(local_dir) for name in names]
    print(json.dumps({"tensorflow": "tensorflow" in sys.modules, "files": files}))
    hvd.shutdown()
    """
)


@pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None
    or importlib.util.find_spec("tensorboard") is None,
    reason="needs TensorFlow and TensorBoard installed (what makes TensorBoard import TF)",
)
@pytest.mark.parametrize("trainer", ["torch", "lightning"])
def test_rank0_tensorboard_writer_does_not_import_tensorflow(tmp_path, trainer):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KOLO_", "HOROVOD_"))}
    done = subprocess.run(
        [sys.executable, "-c", RANK0, str(tmp_path / "store"), trainer],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert any(name.startswith("events.out.tfevents") for name in result["files"]), result
    assert result["tensorflow"] is False, "TensorBoard imported TensorFlow in rank 0"
