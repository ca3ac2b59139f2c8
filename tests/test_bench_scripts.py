"""The benchmark scripts under bench/ still run: a tiny synthetic benchmark on 2 ranks."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from conftest import REPO, run_kolorun, worker_env


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


def test_loader_benchmark_compares_kolo_with_pyarrow(tmp_path) -> None:
    out = tmp_path / "loader.json"
    args = ["--data-dir", str(tmp_path / "data"), "--rows", "20000", "--columns", "8"]
    args += ["--files", "2", "--row-group-rows", "5000", "--variants", "uncompressed,array"]
    args += ["--batch-sizes", "256", "--peers", "kolo,pyarrow", "--repeats", "1"]
    args += ["--memcpy-bytes", str(32 << 20), "--json", str(out)]
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "loader.py"), *args],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [x for x in result.stdout.splitlines() if x.startswith("loader ")]
    assert len(lines) == 2, result.stdout
    for line, variant in zip(lines, ("uncompressed", "array")):
        assert re.match(rf"loader {variant} b=256: kolo [\d.]+M rows/s \(", line), line
        assert re.search(r"\| pyarrow [\d.]+M rows/s .* \| kolo/pyarrow [\d.]+x$", line), line
    assert re.search(
        r"^memcpy share uncompressed b=256: kolo [\d.]+ GB/s = \d+% ", result.stdout, re.M
    )
    figures = json.loads(out.read_text())
    assert figures["bench"] == "loader" and figures["memcpy_GBps"] > 0
    for entry in figures["results"]:
        for name in ("kolo", "pyarrow"):
            run = entry["loaders"][name]
            assert run["rows"] == 19968 and run["complete_epoch"], run
            assert run["rows_per_s"] > 0 and run["cpu_s_per_GB"] > 0 and run["peak_rss_bytes"] > 0
            assert 0 < run["first_batch_s"] < 60
        for key in ("shapes", "dtypes"):
            assert entry["loaders"]["kolo"][key] == entry["loaders"]["pyarrow"][key], entry
        assert entry["ratios_rows_per_s"]["pyarrow"] > 0
