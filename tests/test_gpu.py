"""GPU suite: NCCL collectives of every kind and dtype, two ranks on one GPU, the host-staged
path, DistributedOptimizer on CUDA against the CPU, and the Spark estimator with use_gpu=True.

Runs only where torch sees a CUDA device (``pytest -m gpu tests/test_gpu.py``); elsewhere every
test is skipped with that reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import REPO, run_kolorun, worker

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs an NVIDIA GPU with a driver (torch.cuda.is_available() is False)",
    ),
]

#: Two ranks on one GPU: NCCL must see them as different hosts (else "duplicate GPU"), and
#: talk over loopback sockets.
SHARED_GPU_ENV = {
    "KOLO_TEST_HOSTID_PER_RANK": "1",
    "NCCL_SOCKET_IFNAME": "lo",
    "NCCL_IB_DISABLE": "1",
}


def _run(args: list[str], env: dict[str, str] | None = None, timeout: float = 600):
    result = run_kolorun(args, timeout=timeout, env=env)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def test_nccl_and_the_pack_kernel_are_found() -> None:
    import kolo.torch as hvd
    from kolo.torch import nccl

    found = nccl.probe()
    assert found["cuda"] and hvd.cuda_built(), found
    assert found["nccl"] and hvd.nccl_built(), found
    assert found["pack_kernel"], found
    out = run_kolorun(["--check-build"], timeout=60).stdout
    assert "[X] NCCL\n" in out and "[X] CUDA driver" in out, out


def test_single_rank_every_collective_and_dtype() -> None:
    result = _run(["-np", "1", sys.executable, worker("gpu_worker.py"), "nccl"])
    assert "rank 0: nccl ok" in result.stdout


def test_two_ranks_on_one_gpu_through_nccl() -> None:
    result = _run(["-np", "2", sys.executable, worker("gpu_worker.py"), "nccl"], env=SHARED_GPU_ENV)
    assert "rank 0: nccl ok" in result.stdout and "rank 1: nccl ok" in result.stdout


def test_two_ranks_hvd_ops_through_the_engines_nccl_path() -> None:
    result = _run(["-np", "2", sys.executable, worker("gpu_worker.py"), "hvd"], env=SHARED_GPU_ENV)
    assert "rank 0: hvd ok (nccl)" in result.stdout and "rank 1: hvd ok (nccl)" in result.stdout


def test_two_ranks_hvd_ops_through_the_host_staged_path() -> None:
    env = {**SHARED_GPU_ENV, "KOLO_CUDA_STAGED": "1"}
    result = _run(["-np", "2", sys.executable, worker("gpu_worker.py"), "hvd"], env=env)
    assert "rank 0: hvd ok (staged)" in result.stdout and "rank 1: hvd ok (staged)" in result.stdout


def _trained(where: str, env: dict[str, str] | None = None) -> dict[str, list[float]]:
    args = ["-np", "2", sys.executable, worker("gpu_worker.py"), "train", where]
    result = _run(args, env=env)
    line = next(x for x in result.stdout.splitlines() if "PARAMS " in x)
    return json.loads(line.split("PARAMS ", 1)[1])


@pytest.mark.parametrize("path", ["nccl", "staged"])
def test_distributed_optimizer_on_cuda_matches_the_cpu(path: str) -> None:
    env = dict(SHARED_GPU_ENV)
    if path == "staged":
        env["KOLO_CUDA_STAGED"] = "1"
    cuda, cpu = _trained("cuda", env), _trained("cpu")
    assert cuda.keys() == cpu.keys()
    for key in cpu:
        assert torch.allclose(
            torch.tensor(cuda[key]), torch.tensor(cpu[key]), rtol=1e-9, atol=1e-9
        ), key


SPARK_GPU_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, tempfile
    import numpy as np
    import torch
    sys.path.insert(0, os.path.join({repo!r}, "tests"))
    from support.spark import local_session_builder
    from pyspark.ml.feature import VectorAssembler
    import kolo.spark
    from kolo.spark.torch import TorchEstimator
    from kolo.store import Store

    tmp = tempfile.mkdtemp()
    script = os.path.join(tmp, "gpus.sh")
    with open(script, "w") as f:
        f.write('#!/bin/sh\\necho \\'{{"name": "gpu", "addresses": ["0"]}}\\'\\n')
    os.chmod(script, 0o755)
    spark = (
        local_session_builder("local[2]")
        .config("spark.driver.resource.gpu.amount", "1")
        .config("spark.driver.resource.gpu.discoveryScript", script)
        .config("spark.executor.resource.gpu.amount", "1")
        .config("spark.task.resource.gpu.amount", "0.5")
        .getOrCreate()
    )

    def where():
        import torch
        from kolo.spark.task import get_available_devices
        return get_available_devices(), torch.cuda.is_available()

    print("DEVICES " + json.dumps(kolo.spark.run(where, num_proc=1)), flush=True)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 4))
    y = (x.sum(1) > 0).astype(np.int64)
    rows = [(*map(float, r), int(t)) for r, t in zip(x, y)]
    df = spark.createDataFrame(rows, ["a", "b", "c", "d", "label"])
    df = VectorAssembler(inputCols=["a", "b", "c", "d"], outputCol="features").transform(df)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    est = TorchEstimator(
        num_proc=1,
        store=Store.create(os.path.join(tmp, "store")),
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        loss=torch.nn.functional.cross_entropy,
        feature_cols=["features"],
        label_cols=["label"],
        batch_size=32,
        epochs=5,
        random_seed=1,
        use_gpu=True,
    )
    fitted = est.fit(df.select("features", "label"))
    out = fitted.transform(df).select("label", "label__output").collect()
    acc = float(np.mean([np.argmax(r["label__output"]) == r["label"] for r in out]))
    print(f"ACCURACY {{acc}}", flush=True)
    spark.stop()
    """
)


def test_spark_estimator_with_use_gpu_on_a_gpu_resource(tmp_path) -> None:
    pytest.importorskip("pyspark")
    script = tmp_path / "spark_gpu.py"
    script.write_text(SPARK_GPU_SCRIPT.format(repo=str(REPO)))
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    devices = json.loads(result.stdout.split("DEVICES ", 1)[1].splitlines()[0])
    assert devices == [[["0"], True]], devices
    accuracy = float(result.stdout.split("ACCURACY ", 1)[1].splitlines()[0])
    assert accuracy > 0.8, result.stdout


def test_gpu_benchmark_check_mode(tmp_path) -> None:
    out = tmp_path / "gpu.json"
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu.py"), "--check", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "pack check: pack, unpack and scaled pack are exact" in result.stdout
    figures = json.loads(out.read_text())
    assert figures["pack"]["tensors"] == 161
    for label in ("kolo_pack", "kolo_unpack", "memcpy_dtod", "memcpy_per_tensor", "torch_cat"):
        assert figures["pack"]["results"][label]["gb_per_s"] > 0, label
    assert [r["bytes"] for r in figures["allreduce"]["rows"]] == [4, 4096, 1 << 20]
