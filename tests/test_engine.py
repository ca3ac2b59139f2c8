"""The background engine end to end: real ranks under kolorun, real TCP.

Async ops in any wait order, negotiation across ranks, tensor fusion, the response cache,
mismatch errors, a killed rank, process sets, join, barrier, grouped ops, the timeline and the
stall inspector. Each kolorun launch runs several checks (tests/workers/engine_worker.py) and
the tests below judge its ``CHECK``/``DATA`` lines, so one launch serves several tests.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from conftest import REPO, output_tail, run_kolorun, worker, worker_env

WORKER = worker("engine_worker.py")
LINE = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(.*)$")
STEP_TENSORS = 1000


class Job:
    """A finished kolorun launch of the engine worker, parsed per rank."""

    def __init__(
        self, ranks: int, stdout: str, stderr: str, returncode: Optional[int], elapsed: float
    ) -> None:
        self.ranks = ranks
        self.stdout, self.stderr = stdout, stderr
        self.returncode, self.elapsed = returncode, elapsed
        self.checks: dict[int, dict[str, str]] = {r: {} for r in range(ranks)}
        self.data: dict[int, dict[str, list[Any]]] = {r: {} for r in range(ranks)}
        self.rank_stderr: dict[int, str] = {r: "" for r in range(ranks)}
        for stream_text in (stdout, stderr):
            for line in stream_text.splitlines():
                match = LINE.match(line)
                if not match:
                    continue
                rank, stream, text = int(match.group(1)), match.group(2), match.group(3)
                if rank not in self.checks:
                    continue
                if stream == "stderr":
                    self.rank_stderr[rank] += text + "\n"
                    continue
                if text.startswith("CHECK "):
                    _, name, outcome = text.split(" ", 2)
                    self.checks[rank][name] = outcome
                elif text.startswith("DATA "):
                    _, name, payload = text.split(" ", 2)
                    self.data[rank].setdefault(name, []).append(json.loads(payload))

    def tail(self) -> str:
        return (
            f"\n--- kolorun exit {self.returncode} after {self.elapsed:.1f} s"
            f"\n--- stdout (tail):\n{self.stdout[-4000:]}"
            f"\n--- stderr (tail):\n{self.stderr[-6000:]}"
        )

    def require(self, check: str, ranks: Optional[list[int]] = None) -> None:
        """`check` ran and passed on every rank in `ranks` (default: all)."""
        problems = []
        for rank in ranks if ranks is not None else range(self.ranks):
            outcome = self.checks[rank].get(check)
            if outcome is None:
                problems.append(f"rank {rank}: check {check} never reported")
            elif outcome != "ok":
                problems.append(f"rank {rank}: {check} {outcome}")
        assert not problems, "\n".join(problems) + self.tail()

    def one(self, rank: int, name: str) -> Any:
        values = self.data[rank].get(name)
        assert values, f"rank {rank} printed no DATA {name}" + self.tail()
        return values[-1]


def launch(
    ranks: int, args: list[str], env: Optional[dict[str, str]] = None, timeout: float = 150
) -> Job:
    """Runs the engine worker on `ranks` ranks; a launch that outlives `timeout` is a Job with
    returncode None (its partial output kept), so the tests fail instead of the suite hanging."""
    started = time.monotonic()
    extra = {"ENGINE_WORKER_DEADLINE": str(int(timeout - 10))}
    extra.update(env or {})
    try:
        result = run_kolorun(
            ["-np", str(ranks), "python", WORKER, *args], timeout=timeout, env=extra
        )
        stdout, stderr, code = result.stdout, result.stderr, result.returncode
    except subprocess.TimeoutExpired as err:
        stdout = _text(err.stdout) + "\n[kolorun timed out]"
        stderr, code = _text(err.stderr), None
    return Job(ranks, stdout, stderr, code, time.monotonic() - started)


def launch_single(args: list[str], timeout: float = 60) -> Job:
    """Runs the engine worker as one bare process (no launcher: a job of one rank)."""
    started = time.monotonic()
    extra = {"ENGINE_WORKER_DEADLINE": str(int(timeout - 10))}
    try:
        result = subprocess.run(
            [sys.executable, WORKER, *args],
            cwd=REPO,
            env=worker_env(extra),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        stdout, stderr, code = result.stdout, result.stderr, result.returncode
    except subprocess.TimeoutExpired as err:
        stdout = _text(err.stdout) + "\n[timed out]"
        stderr, code = _text(err.stderr), None

    def as_rank_0(text: str, stream: str) -> str:
        return "".join(f"[0]<{stream}>:{line}\n" for line in text.splitlines())

    return Job(
        1,
        as_rank_0(stdout, "stdout"),
        as_rank_0(stderr, "stderr"),
        code,
        time.monotonic() - started,
    )


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def assert_clean_exit(job: Job) -> None:
    assert job.returncode == 0, "the job did not exit 0" + job.tail()


# --- launches (one per environment; shared by the tests that judge them) -----------------------


@pytest.fixture(scope="module")
def main_job() -> Job:
    return launch(2, ["main"])


@pytest.fixture(scope="module")
def unfused_job(tmp_path_factory) -> tuple[Job, Path]:
    timeline = tmp_path_factory.mktemp("api_timeline") / "api.json"
    job = launch(
        2,
        ["unfused", str(timeline)],
        env={"KOLO_FUSION_THRESHOLD": "0", "KOLO_CACHE_CAPACITY": "0"},
    )
    return job, timeline


@pytest.fixture(scope="module")
def sets_job() -> Job:
    return launch(4, ["sets_static"])


# --- 1. async ops complete in any wait order ---------------------------------------------------


def test_async_ops_complete_when_waited_in_reverse_order(main_job: Job) -> None:
    main_job.require("async_reverse_wait")


def test_async_ops_complete_in_random_wait_order_and_poll_turns_true(main_job: Job) -> None:
    main_job.require("async_random_wait")


def test_ranks_submitting_in_different_orders_still_agree(main_job: Job) -> None:
    main_job.require("async_rank_order")


# --- 2./3. fusion and the response cache --------------------------------------------------------


def test_engine_stats_has_every_counter(main_job: Job) -> None:
    main_job.require("engine_stats_keys")


def test_fusion_runs_many_small_tensors_in_few_collectives(main_job: Job) -> None:
    main_job.require("fusion_cache_steps")  # results were correct on every rank
    for rank in range(2):
        steps = main_job.one(rank, "steps")["steps"]
        assert len(steps) == 4, steps
        for index, step in enumerate(steps):
            assert step["tensors"] == STEP_TENSORS, (rank, index, step)
            assert step["collectives"] < STEP_TENSORS / 10, (
                f"rank {rank} step {index}: {step['collectives']} collectives for "
                f"{STEP_TENSORS} tensors; fusion is not batching: {step}"
            )
            assert step["fused_tensors"] >= 0.8 * STEP_TENSORS, (rank, index, step)


def test_response_cache_hits_every_tensor_after_the_first_step(main_job: Job) -> None:
    main_job.require("fusion_cache_steps")
    for rank in range(2):
        steps = main_job.one(rank, "steps")["steps"]
        first, later = steps[0], steps[1:]
        assert first["cache_hits"] == 0, f"new names cannot hit the cache: {first}"
        assert first["cache_misses"] >= STEP_TENSORS, first
        for index, step in enumerate(later, start=1):
            assert step["cache_hits"] >= 0.95 * STEP_TENSORS, (
                f"rank {rank} step {index}: only {step['cache_hits']} cache hits for "
                f"{STEP_TENSORS} repeated names: {step}"
            )


def test_fusion_threshold_zero_and_cache_capacity_zero_turn_them_off(unfused_job) -> None:
    job, _ = unfused_job
    job.require("unfused_steps")  # results correct
    for rank in range(2):
        steps = job.one(rank, "steps")["steps"]
        assert len(steps) == 3, steps
        for index, step in enumerate(steps):
            assert step["tensors"] == STEP_TENSORS, (rank, index, step)
            assert step["fused_tensors"] == 0, f"KOLO_FUSION_THRESHOLD=0 still fused: {step}"
            assert step["collectives"] >= STEP_TENSORS, (rank, index, step)
            assert step["cache_hits"] == 0, f"KOLO_CACHE_CAPACITY=0 still hit: {step}"
            assert step["cache_misses"] >= STEP_TENSORS, (rank, index, step)
    assert_clean_exit(job)


# --- 4. mismatches and duplicate names ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["shape", "dtype", "op", "root", "async"])
def test_mismatch_raises_mismatch_error_on_every_rank_and_job_continues(
    main_job: Job, kind: str
) -> None:
    # The worker requires MismatchError on the rank, then a correct allreduce afterwards.
    main_job.require(f"mismatch_{kind}")
    for rank in range(2):
        assert main_job.one(rank, f"mm.{kind}")["message"], "empty MismatchError message"


def test_duplicate_outstanding_name_raises_typed_error_naming_the_tensor(main_job: Job) -> None:
    main_job.require("duplicate_name")
    for rank in range(2):
        dup = main_job.one(rank, "dup")
        assert dup["error"] in ("InvalidArgumentError", "MismatchError"), dup
        assert f"dup.tensor.{rank}" in dup["message"], dup


# --- 9./10. join, barrier, grouped ops ----------------------------------------------------------


def test_join_zero_contribution_and_last_rank_returned(main_job: Job) -> None:
    main_job.require("join")
    assert [main_job.one(rank, "join")["last"] for rank in range(2)] == [0, 0], (
        "hvd.join() must return the last rank to join (rank 0) on every rank" + main_job.tail()
    )


def test_barrier_waits_for_every_rank(main_job: Job) -> None:
    main_job.require("barrier_blocks")


def test_grouped_allreduce_mixed_shapes_and_dtypes(main_job: Job) -> None:
    main_job.require("grouped_allreduce")


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_waiting_caller_runs_the_cycle_without_waiting_for_the_engine(transport: str) -> None:
    # The engine thread would start a cycle only every 5 s; 24 collectives finish in well
    # under that only because each waiter negotiates and runs its op itself.
    env = {
        "KOLO_CYCLE_TIME": "5000",
        "KOLO_SUBMIT_QUIET_TIME": "5000",
        "KOLO_TRANSPORT": transport,
    }
    result = run_kolorun(["-np", "2", "python", worker("wait_inline_worker.py")], 120, env)
    assert result.returncode == 0, result.stderr[-3000:]
    elapsed = [float(v) for v in re.findall(r"ELAPSED ([0-9.]+)", result.stdout)]
    assert len(elapsed) == 2, result.stdout
    assert max(elapsed) < 4.0, elapsed


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_an_idle_job_runs_no_engine_cycles(transport: str) -> None:
    # With nothing submitted anywhere for half a second, no engine starts a cycle. (Before the
    # fix, the highest rank took its finished acceptor's closed wake-up pipe for a peer
    # starting a cycle: both ranks then ran one every millisecond or two, and on a machine
    # with a core per rank the CPU they took came out of the other rank's training step.)
    env = {"KOLO_TRANSPORT": transport}
    result = run_kolorun(["-np", "2", "python", worker("idle_engine_worker.py")], 120, env)
    assert result.returncode == 0, output_tail(result)
    found = re.findall(r"IDLE cycles=(\d+) engine_cpu_ms=([0-9.]+)", result.stdout)
    assert len(found) == 2, output_tail(result)
    for cycles, cpu_ms in found:
        assert int(cycles) <= 1, f"{cycles} cycles while idle ({cpu_ms} ms engine CPU): {found}"


def test_main_job_exits_cleanly(main_job: Job) -> None:
    assert_clean_exit(main_job)
    assert "rank done: 0 failed checks" in main_job.stdout, main_job.tail()


# --- 5. a rank killed with async ops outstanding ------------------------------------------------


def test_sigkilled_rank_makes_survivor_raise_from_synchronize() -> None:
    # A long abort grace, so the survivor must detect the death itself (kolorun would
    # otherwise terminate it after 3 s and the test could not tell).
    job = launch(2, ["kill"], env={"KOLO_ABORT_GRACE_SECONDS": "20"}, timeout=90)
    assert job.returncode not in (0, None), "kolorun must fail when a rank is killed" + job.tail()
    assert re.search(r"rank 1 .*SIGKILL", job.stderr), job.tail()
    killed = re.search(r"rank 1 SIGKILLs itself at ([\d.]+)", job.stdout)
    assert killed, "rank 1 never reached the kill" + job.tail()
    job.require("kill", ranks=[0])
    report = job.one(0, "kill")
    assert report["errors"], f"no outstanding op failed on rank 0: {report}" + job.tail()
    assert report["completed"] + len(report["errors"]) == 20, report
    assert report["all_internal"], f"not every error is a HorovodInternalError: {report}"
    assert set(report["errors"]) <= {"PeerConnectionError", "JobAbortedError"}, report
    delay = report["raised_at"] - float(killed.group(1))
    assert delay < 10, f"rank 0 raised {delay:.1f} s after the kill"
    assert report["after_error"] is not None, f"an allreduce after the death succeeded: {report}"
    assert report["after_internal"], report
    assert report["after_seconds"] < 10, report


# --- 6. process sets ----------------------------------------------------------------------------


def test_process_sets_init_and_membership(sets_job: Job) -> None:
    sets_job.require("ps_init")
    sets_job.require("ps_info")
    ids = set()
    for rank in range(4):
        info = sets_job.one(rank, "ps_info")
        glob, a, b = info["global"], info["a"], info["b"]
        assert glob["id"] == 0 and glob["size"] == 4 and glob["rank"] == rank, glob
        assert glob["ranks"] == [0, 1, 2, 3] and glob["included"], glob
        assert a["ranks"] == [0, 1] and b["ranks"] == [2, 3], info
        assert a["size"] == 2 and b["size"] == 2, info
        assert a["included"] == (rank in (0, 1)) and b["included"] == (rank in (2, 3)), info
        mine = a if rank in (0, 1) else b
        assert mine["rank"] == rank % 2, info
        ids.add((a["id"], b["id"]))
    assert len(ids) == 1, f"process set ids differ between ranks: {ids}"
    a_id, b_id = ids.pop()
    assert a_id not in (None, 0) and b_id not in (None, 0) and a_id != b_id, (a_id, b_id)


def test_disjoint_process_sets_run_different_collectives_concurrently(sets_job: Job) -> None:
    sets_job.require("ps_concurrent")
    sets_job.require("ps_grouped")
    sets_job.require("ps_global")


def test_process_sets_progress_independently(sets_job: Job) -> None:
    sets_job.require("ps_independent")


def test_barrier_on_a_process_set(sets_job: Job) -> None:
    sets_job.require("ps_barrier")


def test_op_on_a_set_the_rank_is_not_in_raises_typed_error(sets_job: Job) -> None:
    sets_job.require("ps_foreign")


def test_static_process_sets_refuse_add_and_remove(sets_job: Job) -> None:
    sets_job.require("ps_static_refuses")


def test_disjoint_process_sets_may_reuse_a_tensor_name(sets_job: Job) -> None:
    sets_job.require("ps_same_name")
    assert_clean_exit(sets_job)


SET_TIMEOUT = 4


@pytest.fixture(scope="module")
def dynamic_sets_job() -> Job:
    env = {"KOLO_DYNAMIC_PROCESS_SETS": "1", "KOLO_PROCESS_SET_TIMEOUT": str(SET_TIMEOUT)}
    return launch(3, ["sets_dynamic"], env=env, timeout=90)


def test_dynamic_process_sets_add_use_and_remove(dynamic_sets_job: Job) -> None:
    job = dynamic_sets_job
    job.require("dyn_init")
    job.require("dyn_add")
    for rank in range(3):
        info = job.one(rank, "dyn_info")
        even, tail = info["even"], info["tail"]
        assert even["ranks"] == [0, 2] and tail["ranks"] == [1, 2], info
        assert even["included"] == (rank in (0, 2)) and tail["included"] == (rank in (1, 2))
        assert even["size"] == 2 and tail["size"] == 2, info
        if even["included"]:
            assert even["rank"] == [0, 2].index(rank), info
        if tail["included"]:
            assert tail["rank"] == [1, 2].index(rank), info
        assert even["id"] not in (None, 0) and tail["id"] not in (None, 0, even["id"]), info
    job.require("dyn_use")
    job.require("dyn_remove")


def test_adding_the_sets_just_removed_again_and_again_never_hangs(dynamic_sets_job: Job) -> None:
    dynamic_sets_job.require("dyn_churn")


def test_add_process_set_called_by_one_rank_only_times_out(dynamic_sets_job: Job) -> None:
    job = dynamic_sets_job
    job.require("dyn_lone_add")
    assert SET_TIMEOUT <= job.one(2, "dyn_lone_add")["seconds"] < SET_TIMEOUT + 5, job.tail()
    error = job.one(2, "dyn_lone_add_error")
    assert error["error"] == "TimeoutError", error
    assert "add_process_set([0, 1])" in error["message"], error
    assert "KOLO_PROCESS_SET_TIMEOUT" in error["message"], error
    assert_clean_exit(job)


# --- 7. timeline --------------------------------------------------------------------------------


def trace_events(path: Path) -> list[dict[str, Any]]:
    assert path.exists(), f"no timeline at {path}"
    with open(path) as trace:
        loaded = json.load(trace)
    events = loaded["traceEvents"] if isinstance(loaded, dict) else loaded
    assert isinstance(events, list) and events, f"no events in {path}"
    return events


def tensor_phases(events: list[dict[str, Any]], tensor: str) -> set[str]:
    """The event names recorded in the trace process of `tensor`."""
    pids = {
        e.get("pid")
        for e in events
        if e.get("ph") == "M"
        and e.get("name") == "process_name"
        and (e.get("args") or {}).get("name") == tensor
    }
    assert pids, f"no process_name metadata for {tensor}"
    return {e.get("name") for e in events if e.get("pid") in pids and e.get("ph") != "M"}


def assert_allreduce_phases(events: list[dict[str, Any]], tensor: str) -> None:
    phases = tensor_phases(events, tensor)
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"} <= phases, (tensor, sorted(phases))
    # A fused batch on shared memory has no fusion-buffer copies: one SHM_FUSED_ALLREDUCE.
    data_phases = {"MEMCPY_IN_FUSION_BUFFER", "TCP_ALLREDUCE", "SHM_FUSED_ALLREDUCE"}
    assert phases & data_phases, (tensor, sorted(phases))


def assert_spans_balanced(events: list[dict[str, Any]]) -> None:
    """Every span ends, on its own row, after it began; timestamps never go back."""
    open_spans: dict[Any, int] = {}
    last_ts = 0.0
    for e in events:
        if e.get("ph") == "M":
            continue
        assert e["ts"] >= last_ts, f"timestamps go back at {e}"
        last_ts = e["ts"]
        if e["ph"] == "B":
            open_spans[e["pid"]] = open_spans.get(e["pid"], 0) + 1
        elif e["ph"] == "E":
            assert open_spans.get(e["pid"], 0) > 0, f"an end without a begin: {e}"
            open_spans[e["pid"]] -= 1
    assert not any(open_spans.values()), f"spans left open: {open_spans}"


def process_names(events: list[dict[str, Any]]) -> set[str]:
    return {
        (e.get("args") or {}).get("name")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }


def test_timeline_from_environment_with_cycle_marks(tmp_path: Path) -> None:
    path = tmp_path / "tl.json"
    job = launch(
        2,
        ["timeline"],
        env={"KOLO_TIMELINE": str(path), "KOLO_TIMELINE_MARK_CYCLES": "1"},
        timeout=90,
    )
    job.require("timeline_work")
    assert_clean_exit(job)
    events = trace_events(path)
    for k in range(8):
        assert_allreduce_phases(events, f"tl.grad.{k}")
    assert {"NEGOTIATE_BROADCAST", "BROADCAST"} <= tensor_phases(events, "tl.bcast")
    assert {"NEGOTIATE_ALLGATHER", "ALLGATHER"} <= tensor_phases(events, "tl.gather")
    assert any(e.get("name") == "CYCLE_START" for e in events), "no CYCLE_START events"


def test_timeline_start_stop_api(unfused_job) -> None:
    job, path = unfused_job
    job.require("api_timeline")
    events = trace_events(path)
    # 700 ops: more events than one batch of the timeline's writer; every op has its phases.
    for k in range(700):
        assert_allreduce_phases(events, f"api.grad.{k}")
    assert_spans_balanced(events)
    assert {"NEGOTIATE_BROADCAST", "BROADCAST"} <= tensor_phases(events, "api.bcast")
    names = process_names(events)
    assert "api.after" not in names, "an op after stop_timeline() was recorded"
    assert not any(n and n.startswith("steps.") for n in names), "recorded after stop_timeline()"
    assert not any(e.get("name") == "CYCLE_START" for e in events), (
        "start_timeline(mark_cycles=False) marked cycles"
    )


# --- 8. stall inspector -------------------------------------------------------------------------


def test_stall_warning_names_tensor_and_missing_rank_then_job_completes() -> None:
    job = launch(2, ["stall_warn"], env={"KOLO_STALL_CHECK_TIME_SECONDS": "2"}, timeout=90)
    job.require("stall_warn")
    assert_clean_exit(job)
    log = job.rank_stderr[0]
    at = log.find("stall.tensor")
    assert at >= 0, "rank 0 logged no stall warning naming stall.tensor" + job.tail()
    window = log[max(0, at - 800) : at + 300]
    names_rank_1 = re.search(r"missing[\s\S]{0,80}?\b1\b", window, re.IGNORECASE) or re.search(
        r"\brank 1\b", window
    )
    assert names_rank_1, f"the warning does not name rank 1 as missing:\n{window}"
    assert "stall.prompt" not in job.stderr, "a tensor that completed at once was reported"


def test_stall_shutdown_ends_the_job_with_a_typed_error() -> None:
    started = time.monotonic()
    job = launch(
        2,
        ["stall_shutdown"],
        env={"KOLO_STALL_CHECK_TIME_SECONDS": "1", "KOLO_STALL_SHUTDOWN_TIME_SECONDS": "3"},
        timeout=60,
    )
    assert job.returncode is not None, "the stalled job hung" + job.tail()
    assert time.monotonic() - started < 40, job.tail()
    for rank in range(2):
        job.require("stall_shutdown", ranks=[rank])
        report = job.one(rank, "stall_shutdown")
        assert 2.0 <= report["elapsed"] < 13.0, (
            f"rank {rank} raised {report['elapsed']:.1f} s after submitting (shutdown time 3 s)"
        )
        stalled = "stall.never" if rank == 0 else "stall.other"
        assert stalled in report["message"], f"the error does not name {stalled}: {report}"


# --- 11. wake on submit -------------------------------------------------------------------------

LATENCY_CYCLE_MS = 20


@pytest.fixture(scope="module")
def latency_job() -> Job:
    return launch(2, ["latency"], env={"KOLO_CYCLE_TIME": str(LATENCY_CYCLE_MS)}, timeout=120)


def test_a_lone_synchronous_op_does_not_wait_for_the_cycle_time(latency_job: Job) -> None:
    # Without wake-on-submit every op waits for the next cycle: a median of about 20 ms.
    latency_job.require("latency")
    for rank in range(2):
        measured = latency_job.one(rank, "latency")
        assert measured["ops"] == 200, measured
        assert measured["median_ms"] < 5.0, (
            f"rank {rank}: median {measured['median_ms']:.2f} ms for a tiny allreduce with "
            f"KOLO_CYCLE_TIME={LATENCY_CYCLE_MS}; submit does not wake the engine: {measured}"
        )
    assert_clean_exit(latency_job)


def test_a_burst_still_fuses_with_wake_on_submit(latency_job: Job) -> None:
    latency_job.require("burst_steps")
    for rank in range(2):
        steps = latency_job.one(rank, "burst")["steps"]
        assert len(steps) == 3, steps
        for index, step in enumerate(steps):
            assert step["tensors"] == STEP_TENSORS, (rank, index, step)
            assert step["collectives"] < STEP_TENSORS / 10, (
                f"rank {rank} step {index}: {step['collectives']} collectives for "
                f"{STEP_TENSORS} tensors submitted in a burst; waking on submit broke fusion"
            )


# --- 12. init after shutdown --------------------------------------------------------------------

REINIT_CHECKS = ["reinit_first", "reinit_between", "reinit_second", "reinit_third"]


def test_init_after_shutdown_in_a_single_process() -> None:
    job = launch_single(["reinit"])
    for check in REINIT_CHECKS:
        job.require(check)
    assert job.one(0, "reinit")["ranks"] == [[0, 1]] * 3, job.tail()
    assert job.one(0, "reinit_after_shutdown")["error"] == "NotInitializedError", job.tail()
    assert_clean_exit(job)


def test_init_after_shutdown_on_two_ranks() -> None:
    job = launch(2, ["reinit"], timeout=90)
    for check in REINIT_CHECKS:
        job.require(check)
    for rank in range(2):
        assert job.one(rank, "reinit")["ranks"] == [[rank, 2]] * 3, job.tail()
    assert_clean_exit(job)
