"""End-to-end checks of the background engine, run as real ranks under kolorun.

Usage: ``kolorun -np N python engine_worker.py SUBCOMMAND [ARGS]``. Every subcommand runs a
list of checks; each check prints one line per rank::

    CHECK <name> ok
    CHECK <name> FAIL <ExceptionType>: <message>

and may print measurements for the test to judge::

    DATA <name> <json>

A check that hangs longer than its watchdog prints ``CHECK <name> FAIL hung ...``, dumps every
thread's stack to stderr and ends the process, so a hang fails the test instead of the suite.
The process exits 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import faulthandler
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, Optional

import torch

import kolo
import kolo.torch as hvd
from kolo.exceptions import (
    HorovodInternalError,
    InvalidArgumentError,
    KoloError,
    MismatchError,
)
from kolo.exceptions import TimeoutError as KoloTimeoutError

failed: list[str] = []
problems: list[str] = []


# --- reporting ----------------------------------------------------------------------------------


def emit(name: str, payload: Any) -> None:
    """A ``DATA`` line the test parses."""
    print(f"DATA {name} {json.dumps(payload)}", flush=True)


def run_check(name: str, fn: Callable[[], None], timeout: float = 30.0) -> None:
    """Runs one check under a watchdog and prints its ``CHECK`` line.

    Result comparisons inside a check are soft (collected in `problems`, reported at the end),
    so a wrong value on one rank does not make it skip collectives its peers still run."""

    def hung() -> None:
        print(f"CHECK {name} FAIL hung for more than {timeout:.0f} s", flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(3)

    watchdog = threading.Timer(timeout, hung)
    watchdog.daemon = True
    watchdog.start()
    problems.clear()
    try:
        fn()
        if problems:
            raise AssertionError("; ".join(problems[:5]) + f" ({len(problems)} problems)")
    except Exception as err:
        failed.append(name)
        message = " ".join(str(err).split())[:1500]
        print(f"CHECK {name} FAIL {type(err).__name__}: {message}", flush=True)
        traceback.print_exc(file=sys.stderr)
    else:
        print(f"CHECK {name} ok", flush=True)
    finally:
        watchdog.cancel()


def hard_deadline(seconds: float) -> None:
    """Ends the process after `seconds` whatever it is doing (no orphaned ranks)."""

    def expire() -> None:
        print(f"worker deadline of {seconds:.0f} s expired", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(4)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


def expect_equal(label: str, actual: Any, expected: torch.Tensor) -> None:
    """Records a problem unless `actual` is a tensor equal to `expected` (dtype and shape too)."""
    if not isinstance(actual, torch.Tensor):
        problems.append(f"{label}: expected a tensor, got {type(actual).__name__}")
    elif actual.dtype != expected.dtype or tuple(actual.shape) != tuple(expected.shape):
        problems.append(
            f"{label}: got {actual.dtype} {tuple(actual.shape)}, "
            f"expected {expected.dtype} {tuple(expected.shape)}"
        )
    elif not torch.equal(actual, expected):
        problems.append(
            f"{label}: got {actual.flatten()[:6].tolist()}, "
            f"expected {expected.flatten()[:6].tolist()}"
        )


def expect(condition: bool, message: str) -> None:
    """Records `message` as a problem unless `condition` holds."""
    if not condition:
        problems.append(message)


def expect_error(label: str, call: Callable[[], Any], *types: type) -> Optional[BaseException]:
    """Runs `call`, which must raise one of `types`; returns the error (None, with a problem
    recorded, when it raised nothing or something else)."""
    try:
        call()
    except types as err:
        return err
    except Exception as err:
        problems.append(
            f"{label}: expected {'/'.join(t.__name__ for t in types)}, got "
            f"{type(err).__name__}: {err}"
        )
        return None
    problems.append(f"{label}: no error raised on rank {hvd.rank()}")
    return None


def report(name: str, err: Optional[BaseException]) -> None:
    """A ``DATA`` line with the type and message of an expected error (when there was one)."""
    if err is not None:
        emit(name, {"error": type(err).__name__, "message": str(err)})


def stats_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {key: int(after[key]) - int(before.get(key, 0)) for key in after}


def check_after(label: str) -> None:
    """A plain collective after an error must still work."""
    total = hvd.allreduce(torch.ones(3), op=hvd.Sum, name=f"{label}.after")
    expect_equal(f"{label}.after", total, torch.full((3,), float(hvd.size())))


# --- async ops ----------------------------------------------------------------------------------


def async_value(rank: int, i: int) -> float:
    return float(rank * 100 + i)


def submit_async(prefix: str, indices: list[int]) -> dict[int, tuple[int, Any, torch.Tensor]]:
    """Submits op `i` for every i in `indices` (in that order); kind cycles allreduce_async_,
    allgather_async, broadcast_async_. Returns i -> (handle, input, expected)."""
    rank, size = hvd.rank(), hvd.size()
    submitted: dict[int, tuple[int, Any, torch.Tensor]] = {}
    for i in indices:
        name = f"{prefix}.{i}"
        kind = i % 3
        if kind == 0:
            tensor = torch.full((3,), async_value(rank, i))
            expected = torch.full((3,), sum(async_value(r, i) for r in range(size)))
            handle = hvd.allreduce_async_(tensor, name=name, op=hvd.Sum)
        elif kind == 1:
            tensor = torch.full((rank + 1, 2), async_value(rank, i))
            expected = torch.cat([torch.full((r + 1, 2), async_value(r, i)) for r in range(size)])
            handle = hvd.allgather_async(tensor, name=name)
        else:
            root = i % size
            tensor = torch.full((4,), async_value(rank, i))
            expected = torch.full((4,), async_value(root, i))
            handle = hvd.broadcast_async_(tensor, root_rank=root, name=name)
        submitted[i] = (handle, tensor, expected)
    return submitted


def verify_async(prefix: str, i: int, entry: tuple[int, Any, torch.Tensor]) -> None:
    handle, tensor, expected = entry
    result = hvd.synchronize(handle)
    expect_equal(f"{prefix}.{i} result", result, expected)
    if i % 3 != 1:  # in-place kinds write into the input
        expect_equal(f"{prefix}.{i} in place", tensor, expected)


def check_async_reverse_wait() -> None:
    count = 50
    submitted = submit_async("async.rev", list(range(count)))
    for i in reversed(range(count)):
        verify_async("async.rev", i, submitted[i])


def check_async_random_wait() -> None:
    rank = hvd.rank()
    # poll() is False while a peer has not submitted yet, then becomes True.
    hvd.barrier()
    if rank == 1:
        time.sleep(0.7)
    pending = hvd.allreduce_async_(torch.ones(2), name="async.pending", op=hvd.Sum)
    if rank == 0:
        early = hvd.poll(pending)
        expect(isinstance(early, bool), f"poll returned {type(early).__name__}, not bool")
        expect(not early, "poll was True before rank 1 had submitted async.pending")
    deadline = time.monotonic() + 15
    while not hvd.poll(pending):
        if time.monotonic() > deadline:
            raise AssertionError("poll(async.pending) never became True")
        time.sleep(0.005)
    expect_equal("async.pending", hvd.synchronize(pending), torch.full((2,), float(hvd.size())))

    count = 50
    submitted = submit_async("async.rnd", list(range(count)))
    deadline = time.monotonic() + 15
    while not all(hvd.poll(handle) for handle, _, _ in submitted.values()):
        if time.monotonic() > deadline:
            done = [i for i, (h, _, _) in submitted.items() if hvd.poll(h)]
            raise AssertionError(f"poll never became True for all ops; done: {done}")
        time.sleep(0.005)
    order = list(range(count))
    random.Random(1000 + rank).shuffle(order)
    for i in order:
        verify_async("async.rnd", i, submitted[i])


def check_async_rank_order() -> None:
    """Ranks submit the same ops in different orders; negotiation must still pair them."""
    rank = hvd.rank()
    count = 50
    order = list(range(count))
    if rank % 2 == 1:
        order.reverse()
    if rank >= 2:
        random.Random(rank).shuffle(order)
    submitted = submit_async("async.ord", order)
    wait = list(range(count))
    random.Random(2000 + rank).shuffle(wait)
    for i in wait:
        verify_async("async.ord", i, submitted[i])


# --- grouped ops and barrier --------------------------------------------------------------------

GROUP_DTYPES = [
    ((3,), torch.float32),
    ((2, 2), torch.float64),
    ((5,), torch.int32),
    ((1,), torch.float16),
    ((2, 3, 1), torch.int64),
]


def group_inputs(rank: int, process_set_ranks: list[int]) -> tuple[list, list]:
    tensors = [
        torch.full(shape, rank + 1 + k, dtype=dtype)
        for k, (shape, dtype) in enumerate(GROUP_DTYPES)
    ]
    expected = [
        torch.full(shape, sum(r + 1 + k for r in process_set_ranks), dtype=dtype)
        for k, (shape, dtype) in enumerate(GROUP_DTYPES)
    ]
    return tensors, expected


def check_grouped_list(label: str, results: Any, expected: list[torch.Tensor]) -> None:
    if not isinstance(results, (list, tuple)) or len(results) != len(expected):
        problems.append(f"{label}: expected a list of {len(expected)}, got {results!r}")
        return
    for k, (actual, want) in enumerate(zip(results, expected)):
        expect_equal(f"{label}[{k}]", actual, want)


def check_grouped_allreduce() -> None:
    rank, size = hvd.rank(), hvd.size()
    everyone = list(range(size))
    tensors, expected = group_inputs(rank, everyone)
    originals = [t.clone() for t in tensors]
    results = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="grouped.sync")
    check_grouped_list("grouped_allreduce", results, expected)
    for k, (t, o) in enumerate(zip(tensors, originals)):
        expect_equal(f"grouped_allreduce input {k} unchanged", t, o)

    tensors, expected = group_inputs(rank, everyone)
    handle = hvd.grouped_allreduce_async_(tensors, op=hvd.Sum, name="grouped.async")
    check_grouped_list("grouped_allreduce_async_", hvd.synchronize(handle), expected)
    check_grouped_list("grouped_allreduce_async_ in place", tensors, expected)

    tensors, _ = group_inputs(rank, everyone)
    handle = hvd.grouped_allreduce_async(tensors, op=hvd.Sum, name="grouped.async.out")
    check_grouped_list("grouped_allreduce_async", hvd.synchronize(handle), expected)

    floats = [torch.full((4,), float(rank)), torch.full((2, 2), float(rank), dtype=torch.float64)]
    hvd.grouped_allreduce_(floats, op=hvd.Average, name="grouped.inplace")
    mean = sum(range(size)) / size
    check_grouped_list(
        "grouped_allreduce_ Average",
        floats,
        [torch.full((4,), mean), torch.full((2, 2), mean, dtype=torch.float64)],
    )


def check_barrier_blocks() -> None:
    hvd.barrier()
    if hvd.rank() == 1:
        time.sleep(1.0)
    started = time.monotonic()
    hvd.barrier()
    waited = time.monotonic() - started
    expect(
        hvd.rank() != 0 or waited >= 0.7,
        f"barrier returned after {waited:.2f} s while rank 1 slept 1 s",
    )


# --- fusion and response cache ------------------------------------------------------------------


def fusion_tensor(rank: int, i: int, step: int) -> torch.Tensor:
    dtype = torch.float64 if i % 10 == 0 else torch.float32
    return torch.full((1 + i % 7,), float(rank * 1000 + i + step), dtype=dtype)


def run_steps(prefix: str, steps: int, count: int) -> None:
    """`steps` steps of `count` small allreduce_async_ (Sum) with the same names every step;
    emits the engine_stats() deltas of every step."""
    rank, size = hvd.rank(), hvd.size()
    deltas = []
    for step in range(steps):
        before = kolo.engine_stats()
        tensors = [fusion_tensor(rank, i, step) for i in range(count)]
        handles = [
            hvd.allreduce_async_(t, name=f"{prefix}.{i}", op=hvd.Sum) for i, t in enumerate(tensors)
        ]
        for i, handle in enumerate(handles):
            hvd.synchronize(handle)
            want = fusion_tensor(0, i, step)
            want.fill_(sum(r * 1000 + i + step for r in range(size)))
            expect_equal(f"{prefix}.{i} step {step}", tensors[i], want)
        time.sleep(0.05)  # let the engine finish its bookkeeping for this step
        deltas.append(stats_delta(before, kolo.engine_stats()))
    emit(prefix, {"count": count, "steps": deltas})


def check_engine_stats_keys() -> None:
    stats = kolo.engine_stats()
    want = {
        "cycles",
        "tensors",
        "collectives",
        "fused_tensors",
        "cache_hits",
        "cache_misses",
        "negotiation_ns",
        "negotiated_tensors",
        "cycles_by_caller",
        "cycles_submitted",
        "cycles_peer_waiting",
        "cycles_peer_grace",
        "cycles_cycle_time",
        "cycles_recheck",
        "cycles_at_start",
        "cycles_undecided",
        "engine_wakeups",
        "engine_wakeups_by_peers",
        "engine_deferrals",
    }
    missing = want - set(stats)
    if missing:
        raise AssertionError(f"engine_stats() lacks {sorted(missing)}: {stats}")
    if not all(isinstance(v, int) for v in stats.values()):
        raise AssertionError(f"engine_stats() values are not all ints: {stats}")


# --- mismatches ---------------------------------------------------------------------------------


def mismatch(label: str, call: Callable[[], Any]) -> None:
    err = expect_error(label, call, MismatchError)
    if err is not None:
        emit(label, {"message": str(err)})
    check_after(label)


def check_mismatch_shape() -> None:
    rank = hvd.rank()
    mismatch("mm.shape", lambda: hvd.allreduce(torch.ones(4 + rank), op=hvd.Sum, name="mm.shape"))


def check_mismatch_dtype() -> None:
    dtype = torch.float32 if hvd.rank() == 0 else torch.float64
    mismatch("mm.dtype", lambda: hvd.allreduce(torch.ones(4, dtype=dtype), name="mm.dtype"))


def check_mismatch_op() -> None:
    op = hvd.Sum if hvd.rank() == 0 else hvd.Average
    mismatch("mm.op", lambda: hvd.allreduce(torch.ones(4), op=op, name="mm.op"))


def check_mismatch_root() -> None:
    rank = hvd.rank()
    mismatch("mm.root", lambda: hvd.broadcast(torch.ones(2), root_rank=rank, name="mm.root"))


def check_mismatch_async() -> None:
    rank = hvd.rank()
    good = hvd.allreduce_async_(torch.ones(2), name="mm.async.good", op=hvd.Sum)
    bad = hvd.allreduce_async_(torch.ones(3 + rank), name="mm.async", op=hvd.Sum)
    mismatch("mm.async", lambda: hvd.synchronize(bad))
    expect_equal("mm.async.good", hvd.synchronize(good), torch.full((2,), float(hvd.size())))


def check_duplicate_name() -> None:
    """A second outstanding op with a name this rank already has in flight is refused on this
    rank, with a typed error naming the tensor; the first op goes on (Horovod's behaviour).

    Each rank's first op has a name of its own, ``dup.tensor.<rank>``, which no other rank
    submits before the barrier, so it is certainly still outstanding when the duplicate comes:
    with one shared name, the last rank to submit it could see it finish before its duplicate,
    which then was a legitimate new op waiting for a partner that never came."""
    rank, size = hvd.rank(), hvd.size()
    mine = f"dup.tensor.{rank}"
    firsts = {rank: hvd.allreduce_async_(torch.ones(3), name=mine, op=hvd.Sum)}
    error: BaseException | None = None
    try:
        hvd.allreduce_async_(torch.ones(3), name=mine, op=hvd.Sum)
    except Exception as err:
        error = err
    if error is None:
        problems.append(f"two outstanding ops named {mine} raised no error")
    else:
        expect(
            isinstance(error, KoloError)
            and isinstance(error, (InvalidArgumentError, MismatchError)),
            f"duplicate name raised {type(error).__name__} (want a KoloError: "
            f"InvalidArgumentError or MismatchError): {error}",
        )
        expect(mine in str(error), f"the error does not name the tensor: {error}")
        emit("dup", {"error": type(error).__name__, "message": str(error)})
    # Every rank has tried its duplicate: now each joins the others' first ops.
    hvd.barrier()
    for other in range(size):
        if other != rank:
            firsts[other] = hvd.allreduce_async_(
                torch.ones(3), name=f"dup.tensor.{other}", op=hvd.Sum
            )
    for other, handle in sorted(firsts.items()):
        result = hvd.synchronize(handle)
        expect_equal(f"dup.tensor.{other}", result, torch.full((3,), float(size)))
    check_after("dup")


# --- join ---------------------------------------------------------------------------------------


def check_join() -> None:
    rank = hvd.rank()
    hvd.barrier()
    if rank == 1:
        last = hvd.join()
    else:
        for k in range(5):
            own = torch.full((3,), 5.0 + k)
            out = hvd.allreduce(own, op=hvd.Sum, name=f"join.sync.{k}")
            expect_equal(f"join.sync.{k}", out, own)
        owns = [torch.full((2,), float(10 + k)) for k in range(10)]
        handles = [
            hvd.allreduce_async_(t.clone(), op=hvd.Sum, name=f"join.async.{k}")
            for k, t in enumerate(owns)
        ]
        for k, handle in enumerate(handles):
            expect_equal(f"join.async.{k}", hvd.synchronize(handle), owns[k])
        time.sleep(0.3)
        last = hvd.join()
    emit("join", {"last": last})
    check_after("join")


def main_checks() -> None:
    run_check("engine_stats_keys", check_engine_stats_keys)
    run_check("async_reverse_wait", check_async_reverse_wait)
    run_check("async_random_wait", check_async_random_wait)
    run_check("async_rank_order", check_async_rank_order)
    run_check("grouped_allreduce", check_grouped_allreduce)
    run_check("barrier_blocks", check_barrier_blocks)
    run_check("fusion_cache_steps", lambda: run_steps("steps", 4, 1000), timeout=60)
    run_check("mismatch_shape", check_mismatch_shape)
    run_check("mismatch_dtype", check_mismatch_dtype)
    run_check("mismatch_op", check_mismatch_op)
    run_check("mismatch_root", check_mismatch_root)
    run_check("mismatch_async", check_mismatch_async)
    run_check("duplicate_name", check_duplicate_name)
    run_check("join", check_join)


# --- fusion off / cache off, and the timeline API -----------------------------------------------


# Enough ops for more events than the timeline hands its writer in one batch (4096).
API_TIMELINE_OPS = 700


def check_api_timeline(path: str) -> None:
    hvd.start_timeline(path)
    handles = [
        hvd.allreduce_async_(torch.ones(5), name=f"api.grad.{k}", op=hvd.Sum)
        for k in range(API_TIMELINE_OPS)
    ]
    for handle in handles:
        hvd.synchronize(handle)
    hvd.broadcast(torch.ones(3), root_rank=0, name="api.bcast")
    hvd.stop_timeline()
    hvd.allreduce(torch.ones(5), name="api.after", op=hvd.Sum)


def unfused_checks(timeline_path: str) -> None:
    run_check("api_timeline", lambda: check_api_timeline(timeline_path))
    run_check("unfused_steps", lambda: run_steps("steps", 3, 1000), timeout=90)


# --- env timeline -------------------------------------------------------------------------------


def timeline_checks() -> None:
    def work() -> None:
        handles = [
            hvd.allreduce_async_(torch.ones(16), name=f"tl.grad.{k}", op=hvd.Sum) for k in range(8)
        ]
        for handle in handles:
            hvd.synchronize(handle)
        hvd.broadcast(torch.ones(4), root_rank=0, name="tl.bcast")
        hvd.allgather(torch.ones(2, 2), name="tl.gather")
        time.sleep(0.1)  # a few more cycles for CYCLE_START marks

    run_check("timeline_work", work)


# --- stall inspector ----------------------------------------------------------------------------


def stall_warn_checks() -> None:
    def work() -> None:
        rank, size = hvd.rank(), hvd.size()
        hvd.allreduce(torch.ones(2), name="stall.prompt", op=hvd.Sum)
        if rank == 1:
            time.sleep(5.0)
        started = time.monotonic()
        out = hvd.allreduce(torch.full((2,), float(rank)), name="stall.tensor", op=hvd.Sum)
        waited = time.monotonic() - started
        expect_equal("stall.tensor", out, torch.full((2,), float(sum(range(size)))))
        expect(rank != 0 or waited >= 4.0, f"stall.tensor completed after {waited:.1f} s")
        check_after("stall")

    run_check("stall_warn", work, timeout=30)


def stall_shutdown_checks() -> None:
    def work() -> None:
        rank = hvd.rank()
        name = "stall.never" if rank == 0 else "stall.other"
        started = time.monotonic()
        try:
            hvd.allreduce(torch.ones(2), name=name, op=hvd.Sum)
        except KoloError as err:
            emit(
                "stall_shutdown",
                {
                    "error": type(err).__name__,
                    "message": str(err),
                    "elapsed": time.monotonic() - started,
                },
            )
            return
        raise AssertionError(f"{name} completed although no other rank submitted it")

    run_check("stall_shutdown", work, timeout=40)


# --- a rank killed with async ops outstanding ---------------------------------------------------


def kill_checks() -> None:
    def work() -> None:
        rank, size = hvd.rank(), hvd.size()
        for step in range(3):
            handles = [
                hvd.allreduce_async_(torch.full((1000,), float(rank)), name=f"kill.{k}", op=hvd.Sum)
                for k in range(20)
            ]
            for handle in handles:
                expect_equal(
                    f"kill step {step}",
                    hvd.synchronize(handle),
                    torch.full((1000,), float(sum(range(size)))),
                )
        if rank == 1:
            for k in range(10):
                hvd.allreduce_async_(torch.ones(1000), name=f"kill.{k}", op=hvd.Sum)
            time.sleep(0.5)
            print(f"rank 1 SIGKILLs itself at {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)
        handles = [
            hvd.allreduce_async_(torch.ones(1000), name=f"kill.{k}", op=hvd.Sum) for k in range(20)
        ]
        print(f"rank {rank}: 20 ops outstanding at {time.time():.3f}", flush=True)
        completed, errors, first_error_at = 0, [], None
        for handle in handles:
            try:
                hvd.synchronize(handle)
                completed += 1
            except Exception as err:
                if first_error_at is None:
                    first_error_at = time.time()
                errors.append(err)
        after_error = None
        started = time.monotonic()
        try:
            hvd.allreduce(torch.ones(2), name="kill.after", op=hvd.Sum)
        except Exception as err:
            after_error = err
        emit(
            "kill",
            {
                "completed": completed,
                "errors": [type(e).__name__ for e in errors],
                "all_internal": all(isinstance(e, HorovodInternalError) for e in errors),
                "first_message": str(errors[0]) if errors else None,
                "raised_at": first_error_at,
                "after_error": type(after_error).__name__ if after_error else None,
                "after_internal": isinstance(after_error, KoloError),
                "after_seconds": time.monotonic() - started,
            },
        )

    run_check("kill", work, timeout=40)


# --- latency of a lone op ----------------------------------------------------------------------

LATENCY_OPS = 200


def latency_checks() -> None:
    """`LATENCY_OPS` sequential tiny synchronous allreduces, each timed alone (run with a long
    KOLO_CYCLE_TIME: without wake-on-submit each one waits for the next cycle)."""

    def work() -> None:
        size = hvd.size()
        hvd.barrier()
        for _ in range(5):  # warm up
            hvd.allreduce(torch.ones(1), op=hvd.Sum)
        took = []
        for k in range(LATENCY_OPS):
            started = time.perf_counter()
            out = hvd.allreduce(torch.ones(1), op=hvd.Sum)
            took.append(time.perf_counter() - started)
            expect_equal(f"latency op {k}", out, torch.full((1,), float(size)))
        took.sort()
        emit(
            "latency",
            {
                "ops": len(took),
                "median_ms": 1000 * took[len(took) // 2],
                "p90_ms": 1000 * took[int(len(took) * 0.9)],
                "max_ms": 1000 * took[-1],
            },
        )

    run_check("latency", work, timeout=60)
    # Bursts still fuse: a whole step's ops go into a few cycles, not one cycle each.
    run_check("burst_steps", lambda: run_steps("burst", 3, 1000), timeout=60)


# --- init after shutdown ------------------------------------------------------------------------


def reinit_checks() -> None:
    """init -> allreduce -> shutdown, twice in one process (Horovod allows init after shutdown:
    a fresh engine and mesh, the same rank)."""
    ranks: list[tuple[int, int]] = []
    # The same set object is registered again by every init (shutdown forgets its id). A job
    # of one rank has no set besides the global one.
    solo = kolo.ProcessSet([0])
    sets = [solo] if int(os.environ.get("KOLO_NUM_TASKS", "1")) > 1 else []

    def round_trip(label: str) -> None:
        hvd.init(process_sets=sets)
        rank, size = hvd.rank(), hvd.size()
        ranks.append((rank, size))
        expect(0 <= rank < size, f"{label}: rank {rank} of {size}")
        expect(hvd.is_initialized(), f"{label}: is_initialized() is False after init()")
        if sets:
            expect(solo.process_set_id not in (None, 0), f"{label}: {solo!r} not registered")
        out = hvd.allreduce(torch.full((3,), float(rank + 1)), op=hvd.Sum)
        expect_equal(f"{label} allreduce", out, torch.full((3,), float(sum(range(1, size + 1)))))
        handle = hvd.allreduce_async_(torch.ones(2), op=hvd.Sum, name="reinit.async")
        expect_equal(f"{label} async", hvd.synchronize(handle), torch.full((2,), float(size)))
        if sets and solo.included():
            out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="reinit.solo", process_set=solo)
            expect_equal(f"{label} solo", out, torch.ones(2))
        hvd.barrier()  # no rank shuts down while another still runs collectives
        hvd.shutdown()
        expect(not hvd.is_initialized(), f"{label}: is_initialized() is True after shutdown()")
        expect(solo.process_set_id is None, f"{label}: {solo!r} still registered after shutdown")

    def after_shutdown() -> None:
        err = expect_error(
            "allreduce after shutdown",
            lambda: hvd.allreduce(torch.ones(1)),
            KoloError,
        )
        report("reinit_after_shutdown", err)

    run_check("reinit_first", lambda: round_trip("first"))
    run_check("reinit_between", after_shutdown)
    run_check("reinit_second", lambda: round_trip("second"))
    run_check("reinit_third", lambda: round_trip("third"))
    emit("reinit", {"ranks": ranks})


# --- process sets -------------------------------------------------------------------------------


def describe(ps: Any) -> dict[str, Any]:
    info: dict[str, Any] = {
        "id": ps.process_set_id,
        "ranks": list(ps.ranks),
        "included": ps.included(),
        "size": ps.size(),
    }
    if info["included"]:
        info["rank"] = ps.rank()
    return info


def sets_static_checks() -> None:
    set_a, set_b = kolo.ProcessSet([0, 1]), kolo.ProcessSet([2, 3])
    run_check("ps_init", lambda: hvd.init(process_sets=[set_a, set_b]))
    if failed:
        return
    rank = hvd.rank()
    mine, other = (set_a, set_b) if rank in (0, 1) else (set_b, set_a)

    def info() -> None:
        emit(
            "ps_info",
            {
                "global": describe(kolo.global_process_set),
                "a": describe(set_a),
                "b": describe(set_b),
            },
        )

    def concurrent() -> None:
        hvd.barrier()
        if mine is set_a:
            handles = [
                hvd.allreduce_async_(
                    torch.full((5,), float(rank + i)),
                    name=f"ps.a.{i}",
                    op=hvd.Sum,
                    process_set=set_a,
                )
                for i in range(20)
            ]
            for i, handle in enumerate(handles):
                expect_equal(
                    f"ps.a.{i}", hvd.synchronize(handle), torch.full((5,), float(0 + 1 + 2 * i))
                )
        else:
            gathers = [
                hvd.allgather_async(
                    torch.full((rank - 1, 2), float(rank * 10 + i)),
                    name=f"ps.b.g.{i}",
                    process_set=set_b,
                )
                for i in range(10)
            ]
            casts = [
                hvd.broadcast_async_(
                    torch.full((3,), float(rank * 10 + i)),
                    root_rank=3,
                    name=f"ps.b.c.{i}",
                    process_set=set_b,
                )
                for i in range(10)
            ]
            for i, handle in enumerate(gathers):
                want = torch.cat([torch.full((1, 2), 20.0 + i), torch.full((2, 2), 30.0 + i)])
                expect_equal(f"ps.b.g.{i}", hvd.synchronize(handle), want)
            for i, handle in enumerate(casts):
                expect_equal(f"ps.b.c.{i}", hvd.synchronize(handle), torch.full((3,), 30.0 + i))

    def grouped() -> None:
        tensors, expected = group_inputs(rank, list(mine.ranks))
        results = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="ps.grouped", process_set=mine)
        check_grouped_list("ps.grouped", results, expected)

    def same_name() -> None:
        out = hvd.allreduce(
            torch.full((2,), float(rank)), name="ps.shared", op=hvd.Sum, process_set=mine
        )
        expect_equal("ps.shared", out, torch.full((2,), float(sum(mine.ranks))))

    def independent() -> None:
        hvd.barrier()
        if mine is set_b:
            time.sleep(2.0)
        started = time.monotonic()
        out = hvd.allreduce(
            torch.full((2,), float(rank)), name="ps.indep", op=hvd.Sum, process_set=mine
        )
        took = time.monotonic() - started
        expect_equal("ps.indep", out, torch.full((2,), float(sum(mine.ranks))))
        expect(
            mine is not set_a or took <= 1.5,
            f"set A's allreduce took {took:.1f} s while set B slept 2 s: sets not independent",
        )

    def barrier() -> None:
        hvd.barrier()
        if rank == 3:
            time.sleep(2.0)
        started = time.monotonic()
        hvd.barrier(process_set=mine)
        took = time.monotonic() - started
        emit("ps_barrier", {"took": took})
        expect(
            mine is not set_a or took <= 1.5,
            f"set A's barrier took {took:.1f} s while rank 3 slept",
        )
        expect(
            rank != 2 or took >= 1.0,
            f"set B's barrier returned after {took:.2f} s; rank 3 slept 2 s",
        )

    def foreign() -> None:
        err = expect_error(
            "op on a foreign set",
            lambda: hvd.allreduce(torch.ones(2), name="ps.foreign", op=hvd.Sum, process_set=other),
            KoloError,
        )
        report("ps_foreign", err)
        check_after("ps.foreign")

    def static_refuses() -> None:
        err = expect_error(
            "remove_process_set without dynamic sets",
            lambda: hvd.remove_process_set(set_a),
            KoloError,
        )
        report("ps_remove_refused", err)
        err = expect_error(
            "add_process_set without dynamic sets", lambda: hvd.add_process_set([0, 3]), KoloError
        )
        report("ps_add_refused", err)
        out = hvd.allreduce(torch.ones(2), name="ps.after.refused", op=hvd.Sum, process_set=mine)
        expect_equal("set still usable", out, torch.full((2,), 2.0))

    def global_sum() -> None:
        out = hvd.allreduce(torch.full((2,), float(rank)), name="ps.global", op=hvd.Sum)
        expect_equal("ps.global", out, torch.full((2,), float(sum(range(hvd.size())))))

    run_check("ps_info", info)
    run_check("ps_concurrent", concurrent)
    run_check("ps_grouped", grouped)
    run_check("ps_barrier", barrier)
    run_check("ps_independent", independent)
    run_check("ps_foreign", foreign)
    run_check("ps_static_refuses", static_refuses)
    run_check("ps_global", global_sum)
    run_check("ps_same_name", same_name)


CHURN_ROUNDS = 150
CHURN_TIMEOUT = 20.0


def sets_dynamic_checks() -> None:
    run_check("dyn_init", hvd.init)
    if failed:
        return
    rank = hvd.rank()
    state: dict[str, Any] = {}

    def add() -> None:
        state["even"] = hvd.add_process_set([0, 2])
        state["tail"] = hvd.add_process_set(kolo.ProcessSet([1, 2]))
        emit("dyn_info", {"even": describe(state["even"]), "tail": describe(state["tail"])})

    def use() -> None:
        even, tail = state["even"], state["tail"]
        if even.included():
            out = hvd.allreduce(
                torch.full((3,), float(rank)), name="dyn.even", op=hvd.Sum, process_set=even
            )
            expect_equal("dyn.even", out, torch.full((3,), 2.0))
        if tail.included():
            out = hvd.allgather(torch.full((1,), float(rank)), name="dyn.tail", process_set=tail)
            expect_equal("dyn.tail", out, torch.tensor([1.0, 2.0]))

    def remove() -> None:
        even, tail = state["even"], state["tail"]
        hvd.remove_process_set(even)
        if rank in (0, 2):
            err = expect_error(
                "op on a removed set",
                lambda: hvd.allreduce(
                    torch.ones(2), name="dyn.removed", op=hvd.Sum, process_set=even
                ),
                KoloError,
            )
            report("dyn_removed", err)
        if tail.included():
            out = hvd.allreduce(torch.ones(2), name="dyn.tail.after", op=hvd.Sum, process_set=tail)
            expect_equal("dyn.tail.after", out, torch.full((2,), 2.0))
        check_after("dyn")

    def churn() -> None:
        # Horovod's suite adds and removes the same sets test after test: a removal must be
        # done on this rank once remove_process_set returns, whichever thread ran its cycle,
        # or the next add of those ranks fails here while the other ranks wait for it.
        jitter = random.Random(rank)
        for i in range(CHURN_ROUNDS):
            even, odd = hvd.add_process_set([0, 2]), hvd.add_process_set([1])
            mine = even if rank in (0, 2) else odd
            out = hvd.allreduce(torch.ones(2), name=f"dyn.churn.{i}", op=hvd.Sum, process_set=mine)
            expect_equal(f"dyn.churn.{i}", out, torch.full((2,), float(mine.size())))
            if jitter.random() < 0.5:
                time.sleep(jitter.random() * 0.002)
            hvd.remove_process_set(odd)
            hvd.remove_process_set(even)
        check_after("dyn.churn")

    run_check("dyn_add", add)
    run_check("dyn_use", use)
    run_check("dyn_remove", remove)

    def lone_add() -> None:
        # Only rank 2 adds a set: it raises after KOLO_PROCESS_SET_TIMEOUT instead of hanging,
        # and the job's collectives go on.
        if rank == 2:
            started = time.monotonic()
            err = expect_error("lone add", lambda: hvd.add_process_set([0, 1]), KoloTimeoutError)
            emit("dyn_lone_add", {"seconds": time.monotonic() - started})
            report("dyn_lone_add_error", err)
        check_after("dyn.lone")

    run_check("dyn_churn", churn, timeout=CHURN_TIMEOUT)
    run_check("dyn_lone_add", lone_add)


SUBCOMMANDS: dict[str, Callable[..., None]] = {
    "main": main_checks,
    "unfused": unfused_checks,
    "timeline": timeline_checks,
    "stall_warn": stall_warn_checks,
    "stall_shutdown": stall_shutdown_checks,
    "kill": kill_checks,
    "sets_static": sets_static_checks,
    "sets_dynamic": sets_dynamic_checks,
    "latency": latency_checks,
    "reinit": reinit_checks,
}

SELF_INIT = {"sets_static", "sets_dynamic", "reinit"}


def main() -> int:
    command, args = sys.argv[1], sys.argv[2:]
    hard_deadline(float(os.environ.get("ENGINE_WORKER_DEADLINE", "150")))
    if command not in SELF_INIT:
        hvd.init()
    SUBCOMMANDS[command](*args)
    if command not in ("kill", "stall_shutdown") and hvd.is_initialized():
        # No rank may shut down while another still runs collectives (shutdown ends the job's
        # collectives everywhere, as in Horovod).
        run_check("final_barrier", hvd.barrier)
    try:
        hvd.shutdown()
    except KoloError as err:
        if command not in ("kill", "stall_shutdown"):
            raise
        print(f"shutdown after the failure raised {type(err).__name__}: {err}", file=sys.stderr)
    print(f"rank done: {len(failed)} failed checks", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
