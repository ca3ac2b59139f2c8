"""The benchmark scripts under bench/ still run: a tiny synthetic benchmark on 2 ranks."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import REPO, output_tail, run_kolorun, worker_env


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
            # Horovod (bench/peers/horovod.sh) is a bench-only peer, never in CI.
            "--horovod",
            "no",
            "--json",
            str(out),
        ],
        timeout=60,
    )
    assert result.returncode == 0, output_tail(result)
    rank0 = [
        line.partition("<stdout>:")[2]
        for line in result.stdout.splitlines()
        if line.startswith("[0]<stdout>:")
    ]
    expected_lines = ("Model: smallcnn", "Batch size: 4", "Number of CPUs: 2")
    for expected in ("synthetic_benchmark: Horovod 0.28.1 skipped (--horovod no)", *expected_lines):
        assert expected in rank0, result.stdout
    assert sum(bool(re.fullmatch(r"Iter #\d: [\d.]+ img/sec per CPU", x)) for x in rank0) == 2
    assert any(re.fullmatch(r"Img/sec per CPU: [\d.]+ \+-[\d.]+", x) for x in rank0), rank0
    assert any(re.fullmatch(r"Total img/sec on 2 CPU\(s\): [\d.]+ \+-[\d.]+", x) for x in rank0)
    assert not any(
        "img/sec" in line for line in result.stdout.splitlines() if line.startswith("[1]")
    )
    # The no-communication ceiling, timed interleaved with kolo's iterations.
    assert any(
        re.fullmatch(
            r"no-communication ceiling [\d.]+ img/sec per CPU: kolo reaches [\d.]+% of it "
            r"\(target >= 97%\)",
            x,
        )
        for x in rank0
    ), rank0
    figures = json.loads(out.read_text())
    assert figures["ranks"] == 2 and len(figures["img_sec_per_rank"]) == 2
    assert figures["horovod"] is None
    assert len(figures["no_communication_img_sec_per_rank"]) == 2
    assert figures["no_communication"]["kolo_share_of_ceiling"] > 0


def test_ceiling_lines_bound_kolo_over_horovod(monkeypatch) -> None:
    # bench/common.py: kolo / Horovod is at most ceiling / Horovod; below the 1.25x target
    # (Horovod above 80 % of the ceiling) the bench says the target is unreachable.
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    from common import ceiling_figures, ceiling_lines

    reachable = ceiling_figures(kolo=97.0, ceiling=100.0, horovod=75.0)
    assert reachable["ratio_bound_ceiling_over_horovod"] == pytest.approx(100 / 75)
    [line] = ceiling_lines(reachable, "img/s")
    assert line == (
        "no-communication ceiling 100.0 img/s: kolo reaches 97.0% of it (target >= 97%), "
        "horovod 75.0% | kolo/horovod 1.29x, at most ceiling/horovod 1.33x"
    )
    unreachable = ceiling_figures(kolo=96.0, ceiling=100.0, horovod=85.0)
    assert not unreachable["ratio_target_reachable"]
    first, verdict = ceiling_lines(unreachable, "img/s")
    assert first.endswith("at most ceiling/horovod 1.18x")
    assert verdict.startswith("kolo/horovod >= 1.25x is physically unreachable on this workload")
    assert ceiling_lines(ceiling_figures(96.0, 100.0, None), "img/s") == [
        "no-communication ceiling 100.0 img/s: kolo reaches 96.0% of it (target >= 97%)"
    ]


def test_synthetic_benchmark_trains_with_adasum() -> None:
    result = run_kolorun(
        [
            "-np",
            "2",
            "python",
            str(REPO / "bench" / "synthetic_benchmark.py"),
            "--use-adasum",
            "--batch-size",
            "4",
            "--num-warmup-batches",
            "1",
            "--num-batches-per-iter",
            "2",
            "--num-iters",
            "1",
            "--horovod",
            "no",
        ],
        timeout=60,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Total img/sec on 2 CPU(s)" in result.stdout, result.stdout[-3000:]


def test_loader_benchmark_compares_kolo_with_pyarrow(tmp_path) -> None:
    out = tmp_path / "loader.json"
    args = ["--data-dir", str(tmp_path / "data"), "--rows", "20000", "--columns", "8"]
    args += ["--files", "2", "--row-group-rows", "5000", "--variants", "uncompressed,array"]
    args += ["--batch-sizes", "256", "--peers", "kolo,pyarrow", "--repeats", "1"]
    args += ["--epochs", "3", "--memcpy-bytes", str(32 << 20), "--json", str(out)]
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "loader.py"), *args],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, output_tail(result)
    lines = [x for x in result.stdout.splitlines() if x.startswith("loader ")]
    assert len(lines) == 2, result.stdout
    for line, variant in zip(lines, ("uncompressed", "array")):
        assert re.match(rf"loader {variant} b=256: kolo [\d.]+M rows/s \(", line), line
        assert re.search(r"\| pyarrow [\d.]+M rows/s .* \| kolo/pyarrow [\d.]+x$", line), line
    later = [x for x in result.stdout.splitlines() if x.startswith("later epochs ")]
    assert len(later) == 2, result.stdout
    for line, variant in zip(later, ("uncompressed", "array")):
        assert re.match(rf"later epochs {variant} b=256: kolo [\d.]+M rows/s \(", line), line
        assert re.search(r"\| kolo/pyarrow [\d.]+x$", line), line
    assert re.search(
        r"^memcpy share uncompressed b=256: kolo [\d.]+ GB/s = \d+% \(first epoch\), "
        r"[\d.]+ GB/s = \d+% \(later epochs\) ",
        result.stdout,
        re.M,
    )
    figures = json.loads(out.read_text())
    assert figures["bench"] == "loader" and figures["memcpy_GBps"] > 0
    for entry in figures["results"]:
        for name in ("kolo", "pyarrow"):
            run = entry["loaders"][name]
            assert run["rows"] == 19968 and run["complete_epoch"], run
            # Two more epochs of whole batches.
            assert run["epochs_done"] == 3 and run["later_rows"] == 2 * 19968, run
            assert run["rows_per_s"] > 0 and run["cpu_s_per_GB"] > 0 and run["peak_rss_bytes"] > 0
            assert 0 < run["first_batch_s"] < 60
        for key in ("shapes", "dtypes"):
            assert entry["loaders"]["kolo"][key] == entry["loaders"]["pyarrow"][key], entry
        assert entry["ratios_rows_per_s"]["pyarrow"] > 0


def test_small_loader_benchmark_compares_stacked_kolo_with_the_row_group_loader(tmp_path) -> None:
    out = tmp_path / "loader-small.json"
    args = ["--data-dir", str(tmp_path / "data"), "--rows", "20000", "--columns", "8"]
    args += ["--row-group-rows", "5000", "--batch-sizes", "256", "--epochs", "3"]
    args += ["--repeats", "1", "--json", str(out)]
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "loader_small.py"), *args],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, output_tail(result)
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("loader-small ")]
    for name in ("kolo", "kolo-stack", "rowgroup"):
        assert re.search(
            rf"\| {name} [\d.]+ us/batch \(CPU [\d.]+ us\), [\d.]+M rows/s, "
            rf"epoch start [\d.]+ ms, cold [\d.]+ ms",
            line,
        ), line
    assert re.search(
        r"speed per batch vs rowgroup: kolo [\d.]+x, kolo-stack [\d.]+x \| "
        r"CPU per batch vs rowgroup: kolo [\d.]+x, kolo-stack [\d.]+x$",
        line,
    ), line
    figures = json.loads(out.read_text())
    (entry,) = figures["results"]
    for name in ("kolo", "kolo-stack"):
        assert entry["median"][name]["batches_per_epoch"] == 20000 // 256
    assert entry["median"]["rowgroup"]["batches_per_epoch"] == 4 * (5000 // 256)


def rank0_lines(stdout: str) -> list[str]:
    return [
        line.partition("<stdout>:")[2]
        for line in stdout.splitlines()
        if line.startswith("[0]<stdout>:")
    ]


def test_calibrate_prints_and_saves_the_physical_limits(tmp_path) -> None:
    out = tmp_path / "calibrate.json"
    args = ["--quick", "--min-bytes", str(64 << 10), "--max-bytes", str(256 << 10)]
    args += ["--budget", "0.01", "--tcp-bytes", str(8 << 20), "--rounds", "50"]
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "calibrate.py"), *args, "--json", str(out)],
        cwd=REPO / "bench",
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, output_tail(result)
    assert (
        len(re.findall(r"^memcpy +\d+ KiB: 1 thread .* total [\d.]+x$", result.stdout, re.M)) == 2
    )
    assert re.search(
        r"^tcp loopback: [\d.]+ GB/s one way \| ping-pong [\d.]+ us", result.stdout, re.M
    )
    assert re.search(r"^shm ping-pong .* tcp/shm latency [\d.]+x$", result.stdout, re.M)
    figures = json.loads(out.read_text())
    assert figures["bench"] == "calibrate"
    assert [row["bytes"] for row in figures["memcpy"]] == [64 << 10, 256 << 10]
    for row in figures["memcpy"]:
        assert row["one_thread_GBps"] > 0 and row["two_threads_GBps_each"] > 0
    assert figures["tcp_loopback"]["bandwidth_GBps"] > 0
    assert figures["tcp_loopback"]["pingpong_one_way_us"] > 0
    assert figures["shm"]["pingpong_one_way_us"] > 0


def test_collectives_benchmark_covers_every_op_dtype_and_transport(tmp_path) -> None:
    out = tmp_path / "collectives.json"
    args = ["--min-bytes", "8", "--max-bytes", "64", "--step", "8", "--rounds", "1"]
    # Horovod (bench/peers/horovod.sh) is a bench-only peer, never in CI.
    args += ["--budget", "0.001", "--horovod", "no", "--json", str(out)]
    result = run_kolorun(
        ["-np", "2", "python", str(REPO / "bench" / "collectives.py"), *args], timeout=90
    )
    assert result.returncode == 0, output_tail(result)
    lines = rank0_lines(result.stdout)
    assert "collectives: Horovod 0.28.1 skipped (--horovod no)" in lines, lines
    ops = ("allreduce", "adasum", "allgather", "broadcast", "alltoall", "reducescatter")
    for op in ops:
        for dtype in ("float32", "bfloat16"):
            for size in ("8 B", "64 B"):
                line = next(x for x in lines if x.startswith(f"{op} {dtype} ") and f" {size}:" in x)
                assert re.search(r"kolo\[auto\] .* [\d.]+x gloo", line), line
                assert re.search(r"kolo\[tcp\] .* [\d.]+x gloo", line), line
                assert ("x 2memcpy" in line) == (op == "allreduce"), line
    figures = json.loads(out.read_text())
    assert figures["bench"] == "collectives" and figures["transports"] == ["auto", "tcp"]
    assert figures["horovod"] is None
    assert "memcpy" in figures["calibration"]
    assert len(figures["results"]) == len(ops) * 2 * 2
    for row in figures["results"]:
        for name in ("kolo_auto", "kolo_tcp", "gloo"):
            assert {"time_us", "algbw_GBps", "busbw_GBps"} <= row[name].keys(), row
        assert row["kolo_tcp"]["ratio_busbw_over_gloo"] > 0
        if row["op"] == "allreduce":
            assert row["kolo_auto"]["ratio_time_over_2_memcpys"] > 0


def test_a_pinned_rank_copies_with_one_torch_thread() -> None:
    # torch's pool on one core turned a 64 KiB copy_ (the benches' memcpy floors) into 8 ms.
    code = (
        "import sys, time, torch; sys.path.insert(0, 'bench'); import common; "
        "common.pin_one_core_per_rank(0); assert torch.get_num_threads() == 1; "
        "src = torch.ones(1 << 16, dtype=torch.uint8); dst = torch.empty_like(src); "
        "dst.copy_(src); t = time.perf_counter(); [dst.copy_(src) for _ in range(100)]; "
        "print((time.perf_counter() - t) / 100)"
    )
    env = worker_env()
    for knob in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(knob, None)  # torch's default pool: one thread per core
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert float(result.stdout.split()[-1]) < 1e-3, result.stdout


def test_fusion_benchmark_sweeps_threshold_and_cycle_time(tmp_path) -> None:
    out = tmp_path / "fusion.json"
    args = ["--thresholds-mib", "0,1", "--cycle-times-ms", "0,1", "--steps", "1"]
    args += ["--scale", "1000", "--retime-rounds", "2", "--json", str(out)]
    result = run_kolorun(
        ["-np", "2", "python", str(REPO / "bench" / "fusion.py"), *args], timeout=60
    )
    assert result.returncode == 0, output_tail(result)
    lines = [x for x in rank0_lines(result.stdout) if x.startswith("fusion ")]
    assert len(lines) == 4, result.stdout
    for line in lines:
        assert re.search(r"ms/step \( *[\d.]+ collectives\) \| +[\d.]+x default", line), line
        assert re.search(
            r"kolo/gloo time +[\d.]+x \| 2 memcpys +[\d.]+ ms, kolo/2memcpy +[\d.]+x$", line
        ), line
    targets = [x for x in rank0_lines(result.stdout) if x.startswith("targets (issue 24)")]
    assert len(targets) == 1 and "2-memcpy floor" in targets[0], result.stdout
    retimed = [x for x in rank0_lines(result.stdout) if x.startswith("targets re-timed")]
    assert len(retimed) == 1, result.stdout
    verdict = (
        r"[\d.]+x \[[\d.]+, [\d.]+\] \(\d+ % interval; target <= {}x: (met|missed|unresolved)\)"
    )
    assert re.search("default/no-fusion " + verdict.format("1.00"), retimed[0]), retimed[0]
    assert re.search("default/2memcpy " + verdict.format("1.30"), retimed[0]), retimed[0]
    figures = json.loads(out.read_text())
    target = figures["fusion_target_retimed"]
    assert len(target["default_step_s"]) == len(target["no_fusion_step_s"]) == 2
    assert all(t > 0 for t in target["memcpy2_step_s"]), target
    assert figures["tensors"] == 161 and len(figures["shapes"]) == 161
    assert sorted((r["threshold_bytes"], r["cycle_time_ms"]) for r in figures["results"]) == [
        (0, 0),
        (0, 1),
        (1 << 20, 0),
        (1 << 20, 1),
    ]
    for row in figures["results"]:
        assert row["kolo_step_s"] > 0 and row["collectives_per_step"] >= 1
        assert row["memcpy2_step_s"] > 0 and row["ratio_time_over_memcpy2"] > 0


def test_shm_stores_benchmark_times_every_way_at_every_size(tmp_path) -> None:
    out = tmp_path / "stores.json"
    args = ["--rounds", "1", "--reps", "2", "--max-bytes", str(256 << 10), "--json", str(out)]
    result = run_kolorun(
        ["-np", "2", "python", str(REPO / "bench" / "shm_stores.py"), *args], timeout=60
    )
    assert result.returncode == 0, output_tail(result)
    lines = [x for x in rank0_lines(result.stdout) if x.startswith("allreduce ")]
    assert [int(x.split()[1]) for x in lines] == [64 << 10, 256 << 10], result.stdout
    for line in lines:
        assert re.search(
            r"ordinary +[\d.]+ us \| streaming +[\d.]+ us \| auto +[\d.]+ us \| "
            r"ordinary/streaming [\d.]+x \| auto/best [\d.]+x$",
            line,
        ), line
    rows = json.loads(out.read_text())["rows"]
    assert [row["bytes"] for row in rows] == [64 << 10, 256 << 10]
    for row in rows:
        assert all(row["seconds"][way] > 0 for way in ("ordinary", "streaming", "auto")), row


def test_training_benchmark_reports_scaling_efficiency(tmp_path) -> None:
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    script = str(REPO / "bench" / "training.py")
    common = ["--batch-size", "4", "--steps", "1", "--warmup-steps", "1", "--rounds", "2"]
    result = run_kolorun(
        ["-np", "1", "python", script, *common, "--horovod", "no", "--json", str(one)], timeout=60
    )
    assert result.returncode == 0, output_tail(result)
    scaled = [*common, "--json", str(two), "--single-rank-json", str(one)]
    # --horovod auto where no peer venv was built (as in CI): Horovod is skipped, and says so.
    no_peer = {"KOLO_BENCH_CACHE": str(tmp_path / "no-bench-cache")}
    result = run_kolorun(["-np", "2", "python", script, *scaled], timeout=60, env=no_peer)
    assert result.returncode == 0, output_tail(result)
    lines = rank0_lines(result.stdout)
    assert any(x.startswith("training: Horovod 0.28.1 skipped: no peer venv at ") for x in lines), (
        lines
    )
    assert not any("horovod 0.28.1" in x for x in lines), lines
    assert any(
        re.match(
            r"training smallcnn batch 4x2: kolo .* ratio [\d.]+x \| no communication +[\d.]+ "
            r"samples/s \(kolo reaches \d+% of it, ddp \d+%\)$",
            x,
        )
        for x in lines
    ), lines
    assert any(
        re.match(r"scaling 1 -> 2 ranks: kolo [\d.]+x \(\d+% efficiency\) .* kolo/ddp [\d.]+x$", x)
        for x in lines
    ), lines
    assert any(
        re.match(
            r"synchronous floor [\d.]+ samples/s \([\d.]+% of the no-communication ceiling: "
            r"the ranks' step-to-step jitter\): kolo reaches [\d.]+% of it$",
            x,
        )
        for x in lines
    ), lines
    assert any(
        re.match(
            r"lockstep floor [\d.]+ samples/s \([\d.]+% of the no-communication ceiling: "
            r"the ranks stepping together, .*\): kolo reaches [\d.]+% of it$",
            x,
        )
        for x in lines
    ), lines
    figures = json.loads(two.read_text())
    assert figures["ranks"] == 2 and figures["horovod"] is None
    assert figures["kolo_share_of_no_comm"] > 0
    lockstep = figures["median_samples_per_sec"]["lockstep"]
    assert figures["kolo_share_of_lockstep_floor"] == figures["median_samples_per_sec"]["kolo"] / (
        lockstep
    )
    # Each step ends with its slowest rank: never faster than the ranks' own totals (the
    # ceiling), up to the timer calls between steps.
    floor = figures["synchronous_floor_samples_per_sec"]
    assert 0 < floor <= 1.01 * figures["median_samples_per_sec"]["no_comm"], figures
    assert (
        figures["kolo_share_of_synchronous_floor"]
        == figures["median_samples_per_sec"]["kolo"] / floor
    )
    assert set(figures["scaling_efficiency"]) == {"kolo", "ddp", "no_comm", "lockstep"}
    assert json.loads(one.read_text())["ranks"] == 1


def test_training_benchmark_autotunes_against_the_grid(tmp_path) -> None:
    out, log = tmp_path / "training.json", tmp_path / "autotune.csv"
    # kolorun's autotune flags steer only the bench's autotune run: the comparison and the
    # grid run untuned.
    flags = "--autotune --autotune-warmup-samples 0 --autotune-steps-per-sample 1 "
    flags += f"--autotune-bayes-opt-max-samples 3 --autotune-log-file {log}"
    args = "--batch-size 4 --steps 1 --warmup-steps 1 --rounds 1 --horovod no --autotune "
    args += f"--thresholds-mib 0,1 --cycle-times-ms 1 --caches 1 --retime-rounds 3 --json {out}"
    script = str(REPO / "bench" / "training.py")
    result = run_kolorun(["-np", "2", *flags.split(), "python", script, *args.split()], timeout=120)
    assert result.returncode == 0, output_tail(result)
    lines = rank0_lines(result.stdout)
    grid = [x for x in lines if x.startswith("grid fusion ")]
    assert grid == [
        x for x in grid if re.fullmatch(r"grid fusion .* cycle 1 ms cache 1: [\d.]+ ms/step", x)
    ]
    assert len(grid) == 2, lines
    kept = next(x for x in lines if x.startswith("autotune: kept "))
    steps = int(re.search(r" after (\d+) steps", kept).group(1))
    assert re.search(r"tuned/grid-best [\d.]+x \(target <= 1.05x\)", kept), kept
    retimed = next(x for x in lines if x.startswith("autotune re-timed interleaved (3 rounds, "))
    assert re.search(
        r"tuned/grid-best \(grid_[12]\) [\d.]+x \[[\d.]+, [\d.]+\] \(75 % interval; target "
        r"<= 1.05x: (met|missed|unresolved)\) .* load average [\d. ]+ -> [\d. ]+$",
        retimed,
    ), retimed
    figures = json.loads(out.read_text())
    tuned = figures["autotune"]
    assert tuned["steps"] == steps < tuned["horovod_default_steps_at_least"] == 1200
    assert len(figures["grid"]) == 2 and tuned["grid_points"] == 2
    # The tuned setting, both grid points and the default, each timed once per round.
    assert set(tuned["retimed_step_s"]) == {"tuned", "grid_1", "grid_2", "default"}, tuned
    assert all(len(v) == 3 for v in tuned["retimed_step_s"].values()), tuned
    low, high = tuned["retimed_ratio_interval"]
    assert low <= tuned["retimed_ratio_tuned_over_grid_best"] <= high, tuned
    # The log kolorun named, in Horovod's format, ending with the kept setting.
    assert tuned["log"] == str(log)
    rows = log.read_text().splitlines()
    assert rows[0] == (
        "hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,"
        "cycle_time_ms,tensor_fusion_threshold,score"
    )
    assert len(rows) > 3 and all(len(row.split(",")) == 7 for row in rows), rows
    last = rows[-1].split(",")
    assert int(last[3]) == tuned["cache_enabled"]
    assert float(last[5]) * (1 << 20) == pytest.approx(tuned["threshold_bytes"], rel=1e-4)


def test_the_retimed_verdict_is_a_median_with_a_distribution_free_interval() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from common import median_interval, paired_verdict
    finally:
        sys.path.remove(str(REPO / "bench"))
    # The order statistics of the binomial tables: (2, 9) of 10 values, (4, 12) of 15.
    assert median_interval([float(x) for x in range(10, 0, -1)]) == (2.0, 9.0, 0.978515625)
    low, high, coverage = median_interval([float(x) for x in range(1, 16)])
    assert (low, high) == (4.0, 12.0) and 0.96 < coverage < 0.97
    # Fewer than 6 values reach no 95 % pair: the range, with its true coverage.
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0, 0.75)
    # Tuned 2 % slower in every round but one noisy one, while the machine drifts 2x: within
    # 5 %, resolved.
    best = [10.0, 20.0, 10.0, 15.0, 10.0, 12.0, 20.0, 11.0, 10.0, 13.0]
    tuned = [b * (1.3 if i == 2 else 1.02) for i, b in enumerate(best)]
    verdict = paired_verdict(tuned, best)
    assert verdict["median"] == pytest.approx(1.02) and verdict["verdict"] == "met", verdict
    # 10 % slower: missed; swinging +-20 % around 1.05: unresolved.
    assert paired_verdict([1.1 * b for b in best], best)["verdict"] == "missed"
    swing = [0.85, 1.25, 0.9, 1.2, 1.05, 1.05, 0.9, 1.2, 1.0, 1.1]
    assert paired_verdict([b * r for b, r in zip(best, swing)], best)["verdict"] == "unresolved"


def test_run_all_knows_its_modes() -> None:
    result = subprocess.run(
        ["bash", str(REPO / "bench" / "run_all.sh"), "--bogus"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "--quick|--full" in result.stderr


def test_lightning_benchmark_compares_kolo_strategy_with_ddp(tmp_path) -> None:
    out = tmp_path / "lightning.json"
    result = run_kolorun(
        [
            "-np",
            "2",
            "python",
            str(REPO / "bench" / "lightning_strategy.py"),
            "--quick",
            "--batch-size",
            "4",
            "--json",
            str(out),
        ],
        timeout=120,
    )
    assert result.returncode == 0, output_tail(result)
    lines = rank0_lines(result.stdout)
    assert any(
        re.match(r"lightning smallcnn batch 4x2: kolo .* ddp\(gloo\) .* ratio [\d.]+x$", x)
        for x in lines
    ), lines
    figures = json.loads(out.read_text())
    assert figures["ranks"] == 2 and set(figures["samples_per_sec"]) == {"kolo", "ddp"}
    assert all(len(v) == 2 and min(v) > 0 for v in figures["rounds_samples_per_sec"].values())


def test_elastic_benchmark_times_each_recovery_phase(tmp_path) -> None:
    out = tmp_path / "elastic.json"
    # Horovod (bench/peers/horovod.sh) is a bench-only peer, never in CI.
    args = ["--quick", "--width", "64", "--commit-mb", "1", "--horovod", "no", "--json", str(out)]
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "elastic.py"), *args],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, output_tail(result)
    lines = result.stdout.splitlines()
    assert any(
        re.fullmatch(
            r"elastic kill 2 ranks: exit seen \d+ ms \| detection \d+ ms \| reset \d+ ms "
            r"\| sync \d+ ms \| first step \d+ ms \| total \d+ ms \| [\d.]+x target 1 s",
            x,
        )
        for x in lines
    ), result.stdout
    assert any(
        re.fullmatch(
            r"elastic add 2 ranks: notice \d+ ms \| process start \d+ ms \| rendezvous \d+ ms "
            r"\| new rank setup \d+ ms \| sync \d+ ms \| first step \d+ ms \| total \d+ ms "
            r"\| survivor pause \d+ ms \| [\d.]+x target 2 s",
            x,
        )
        for x in lines
    ), result.stdout
    assert any(re.match(r"elastic commit [\d.]+ MB: .* commit/memcpy [\d.]+x", x) for x in lines)
    figures = json.loads(out.read_text())
    assert figures["bench"] == "elastic" and figures["params"] == 64 * 64 + 64
    assert [(r["scenario"], r["ranks"]) for r in figures["results"]] == [("kill", 2), ("add", 2)]
    for row in figures["results"]:
        assert 0 < row["total_s"] < 60, row
    assert figures["commit"]["ranks"] == 2 and figures["commit"]["commit_over_memcpy"] > 0


def test_scale_ranks_benchmark_runs_both_designs_interleaved(tmp_path) -> None:
    out = tmp_path / "scale.json"
    args = ["--ranks", "4", "--hosts", "2", "--iterations", "3", "--json", str(out)]
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "scale_ranks.py"), *args],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert [line.split()[:2] for line in lines if re.match(r"\s+4\s+(today|new)\s", line)] == [
        ["4", "today"],
        ["4", "new"],
    ], result.stdout
    assert any(line.startswith("  n=  4: init s ") for line in lines), result.stdout
    figures = json.loads(out.read_text())
    assert figures["designs"]["today"] == {
        "KOLO_NEGOTIATION": "all_to_all",
        "KOLO_CONNECT": "eager",
    }
    for design in ("today", "new"):
        row = figures["results"][f"4/{design}"]
        assert row["problems"] == [] and row["hosts"] == 2, row
        assert 0 < row["init_s"] < 60 and row["allreduce_4B_us"] > 0 and row["train_step_ms"] > 0
