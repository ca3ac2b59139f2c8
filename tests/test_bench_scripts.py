"""The benchmark scripts under bench/ still run: a tiny synthetic benchmark on 2 ranks."""

from __future__ import annotations

import json
import re

from conftest import REPO, run_kolorun


def test_synthetic_benchmark_prints_horovod_style_figures(tmp_path) -> None:
    out = tmp_path / "synthetic.json"
    result = run_kolorun(
        [
            "-np",
            "2",
            "python",
            str(REPO / "bench" / "synthetic_benchmark.py"),
            "--batch-size",
            "4",
            "--num-warmup-batches",
            "1",
            "--num-batches-per-iter",
            "2",
            "--num-iters",
            "2",
            "--fp16-allreduce",
            "--json",
            str(out),
        ],
        timeout=60,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rank0 = [
        line.partition("<stdout>:")[2]
        for line in result.stdout.splitlines()
        if line.startswith("[0]<stdout>:")
    ]
    for expected in ("Model: smallcnn", "Batch size: 4", "Number of CPUs: 2"):
        assert expected in rank0, result.stdout
    assert sum(bool(re.fullmatch(r"Iter #\d: [\d.]+ img/sec per CPU", x)) for x in rank0) == 2
    assert any(re.fullmatch(r"Img/sec per CPU: [\d.]+ \+-[\d.]+", x) for x in rank0), rank0
    assert any(re.fullmatch(r"Total img/sec on 2 CPU\(s\): [\d.]+ \+-[\d.]+", x) for x in rank0)
    assert not any(
        "img/sec" in line for line in result.stdout.splitlines() if line.startswith("[1]")
    )
    figures = json.loads(out.read_text())
    assert figures["ranks"] == 2 and len(figures["img_sec_per_rank"]) == 2


def test_synthetic_benchmark_rejects_adasum() -> None:
    result = run_kolorun(
        ["-np", "2", "python", str(REPO / "bench" / "synthetic_benchmark.py"), "--use-adasum"],
        timeout=60,
    )
    assert result.returncode != 0
    assert "kolo does not support Adasum" in result.stderr, result.stderr[-3000:]
