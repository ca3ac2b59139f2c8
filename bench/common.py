"""Pieces every bench script shares: the results folder, the gloo peer, the small CNN, and
the comparison of kolo's autotuner with an exhaustive grid of its knobs."""

from __future__ import annotations

import copy
import datetime
import json
import math
import os
import platform
import socket
import statistics
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import kolo
import kolo.torch as hvd

RESULTS = Path(__file__).resolve().parent / "results"


def write_results(stem: str, payload: dict[str, Any], out: Optional[Path] = None) -> Path:
    """Writes ``payload`` (plus versions and host) as JSON to ``out`` or
    ``bench/results/<stem>-<time>.json``, prints where, and returns the path."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = out or RESULTS / f"{stem}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "bench": stem,
        "kolo_version": kolo.__version__,
        "torch_version": torch.__version__,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        **payload,
    }
    out.write_text(json.dumps(record, indent=2))
    print(f"wrote {out}", flush=True)
    return out


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_gloo() -> None:
    """Starts torch.distributed (gloo) over the kolo job's ranks, on a port rank 0 picks."""
    port = hvd.broadcast_object(free_port() if hvd.rank() == 0 else None, root_rank=0)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(), world_size=hvd.size()
    )


class SmallCNN(nn.Module):
    """Two 3x3 conv layers with pooling, then two linear layers (about 0.5 M parameters)."""

    def __init__(self, num_classes: int = 10, image_size: int = 32) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * (image_size // 4) ** 2, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, data: torch.Tensor, target: torch.Tensor
) -> Callable[[], None]:
    """One training step of `model` on the fixed batch (`data`, `target`): cross-entropy,
    backward, `optimizer`'s step."""

    def step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    return step


def no_communication_step(
    model: nn.Module, data: torch.Tensor, target: torch.Tensor, lr: float
) -> Callable[[], None]:
    """The no-communication ceiling's step: a copy of `model` trained alone on the same batch
    with SGD (`lr`, momentum 0.9, as the benches' distributed trainers) and no allreduce. A
    data-parallel trainer on the same work can at best match it."""
    alone = copy.deepcopy(model)
    return train_step(alone, torch.optim.SGD(alone.parameters(), lr=lr, momentum=0.9), data, target)


def lockstep_step(step: Callable[[], None]) -> Callable[[], None]:
    """`step` (the no-communication step), then a one-element allreduce: the ranks step
    together, as every synchronous data-parallel trainer's ranks must (each step ends when
    the last rank's gradients arrive), with no gradient moved. Its throughput is the lockstep
    floor: on a machine whose cores share caches and memory, ranks that run the same phase at
    the same moment contend for them, which the no-communication ceiling (each rank on its
    own schedule) does not pay."""
    one = torch.zeros(1)

    def stepped_together() -> None:
        step()
        hvd.allreduce_(one, name="bench.lockstep")

    return stepped_together


def lockstep_floor_line(kolo: float, ceiling: float, lockstep: float) -> str:
    """What a bench prints about the lockstep floor (samples/s, as `kolo` and `ceiling`)."""
    return (
        f"lockstep floor {lockstep:.1f} samples/s ({lockstep / ceiling:.1%} of the "
        f"no-communication ceiling: the ranks stepping together, a 4-byte allreduce per step "
        f"and no gradients): kolo reaches {kolo / lockstep:.1%} of it"
    )


# A trainer should reach this share of the no-communication ceiling (issue 24).
CEILING_SHARE_TARGET = 0.97
# kolo / Horovod on the synthetic benchmark should reach this (issue 24).
HOROVOD_RATIO_TARGET = 1.25


def ceiling_figures(kolo: float, ceiling: float, horovod: Optional[float]) -> dict[str, Any]:
    """kolo's (and Horovod's) share of the no-communication `ceiling` (all three in the same
    unit: samples/s), and with Horovod the bound that implies: kolo / Horovod can be at most
    ceiling / Horovod."""
    figures: dict[str, Any] = {"ceiling": ceiling, "kolo_share_of_ceiling": kolo / ceiling}
    if horovod is not None:
        figures.update(
            horovod_share_of_ceiling=horovod / ceiling,
            ratio_kolo_over_horovod=kolo / horovod,
            ratio_bound_ceiling_over_horovod=ceiling / horovod,
            ratio_target_reachable=ceiling / horovod >= HOROVOD_RATIO_TARGET,
        )
    return figures


def synchronous_floor(durations: list[float]) -> float:
    """The least time any synchronous data-parallel trainer needs for the steps this rank timed
    as `durations` (seconds each), every rank having timed its own alone after one barrier:
    the sum over steps of the slowest rank's duration of that step. A trainer that
    communicates for free still ends each step only when its slowest rank does, so the
    ranks' step-to-step jitter costs it this much over the no-communication ceiling (which
    takes each rank's total, letting a rank's fast steps make up for its slow ones)."""
    each = hvd.allgather(torch.tensor([durations], dtype=torch.float64), name="bench.durations")
    return float(each.max(dim=0).values.sum())


def synchronous_floor_line(kolo: float, ceiling: float, floor: float) -> str:
    """What a bench prints about the synchronous floor (samples/s, as `kolo` and `ceiling`)."""
    return (
        f"synchronous floor {floor:.1f} samples/s ({floor / ceiling:.1%} of the no-communication "
        f"ceiling: the ranks' step-to-step jitter): kolo reaches {kolo / floor:.1%} of it"
    )


def ceiling_lines(figures: dict[str, Any], unit: str) -> list[str]:
    """What a bench prints about `ceiling_figures`: the ceiling and each trainer's share of
    it, the bound on kolo / Horovod, and one line saying so when the bound is below the
    target (Horovod above 80 % of the ceiling): the target cannot be met on that workload."""
    line = (
        f"no-communication ceiling {figures['ceiling']:.1f} {unit}: kolo reaches "
        f"{figures['kolo_share_of_ceiling']:.1%} of it (target >= {CEILING_SHARE_TARGET:.0%})"
    )
    if "horovod_share_of_ceiling" not in figures:
        return [line]
    bound = figures["ratio_bound_ceiling_over_horovod"]
    line += (
        f", horovod {figures['horovod_share_of_ceiling']:.1%} | kolo/horovod "
        f"{figures['ratio_kolo_over_horovod']:.2f}x, at most ceiling/horovod {bound:.2f}x"
    )
    if figures["ratio_target_reachable"]:
        return [line]
    return [
        line,
        f"kolo/horovod >= {HOROVOD_RATIO_TARGET:.2f}x is physically unreachable on this workload: "
        f"Horovod already reaches {figures['horovod_share_of_ceiling']:.1%} of the "
        f"no-communication ceiling (above {1 / HOROVOD_RATIO_TARGET:.0%}), so even a trainer "
        f"that communicates for free is at most {bound:.2f}x Horovod",
    ]


def human(nbytes: float) -> str:
    """``nbytes`` as ``"64 MiB"``, ``"4 KiB"`` or ``"8 B"``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def pin_one_core_per_rank(local_rank: Optional[int] = None) -> Optional[int]:
    """Pins this rank to core ``local_rank % cpus`` (default: kolo's local rank) with one torch
    thread; returns the core (None where unsupported). torch's default pool has a thread per
    core: on one core its threads take turns, and a 64 KiB ``copy_`` (a parallel region from
    32 KiB) took 8 ms instead of 2 us, which made the benches' memcpy floors wrong."""
    torch.set_num_threads(1)
    try:
        core = (hvd.local_rank() if local_rank is None else local_rank) % (os.cpu_count() or 1)
        os.sched_setaffinity(0, {core})
        return core
    except (AttributeError, OSError):
        return None


def latest_results(stem: str) -> Optional[Path]:
    """The newest ``bench/results/<stem>-*.json``, or None."""
    found = sorted(RESULTS.glob(f"{stem}-*.json"))
    return found[-1] if found else None


def load_calibration() -> dict[str, Any]:
    """The latest calibration (``bench/calibrate.py``), or a quick one run now (memcpy only,
    not saved) when none was saved yet: the physical-limit denominators other results cite."""
    path = latest_results("calibrate")
    if path is not None:
        record = json.loads(path.read_text())
        record["source"] = str(path)
        return record
    import calibrate  # bench/ is on sys.path when a bench script runs

    return {
        "source": "quick calibration run now",
        "memcpy": calibrate.measure_memcpy([1 << 20, 16 << 20, 64 << 20], budget_s=0.05),
    }


# --- Autotune against an exhaustive grid (bench/fusion.py and bench/training.py --autotune) ---

# KOLO_CYCLE_TIME must be more than 0: a requested 0 runs with this (10 us).
MIN_CYCLE_MS = 0.01

# Horovod 0.28.1's autotune at its defaults needs at least this many steps: (3 warm-up + 21
# Bayesian samples) x 5 scores x 10 steps per score, before trying its categorical switches.
HOROVOD_DEFAULT_AUTOTUNE_STEPS = (3 + 21) * 5 * 10

# Rounds of the interleaved re-timing of the tuned setting, the grid's best points and the
# default (`--retime-rounds`): 15 give a 96 % interval for the median paired ratio.
RETIME_ROUNDS = 15

# The grid's best points (by their grid times) re-timed with the tuned setting: on a loaded
# machine several points are within noise of each other, and the grid's minimum is the luckiest.
RETIME_GRID_TOP = 3

# The target: the tuned setting's step time at most this factor of the grid's best.
TARGET_RATIO = 1.05

# The most steps the autotune mode runs before giving up on convergence.
MAX_AUTOTUNE_STEPS = 3000

# What `kolorun --autotune ...` (or the user) set for the autotuner: the grid runs without it,
# the autotune run with it (see `take_autotune_environment`).
_AUTOTUNE_VARIABLES = (
    "AUTOTUNE",
    "AUTOTUNE_LOG",
    "AUTOTUNE_WARMUP_SAMPLES",
    "AUTOTUNE_STEPS_PER_SAMPLE",
    "AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
    "AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
)
# The knobs a grid point sets and the autotune run leaves to the tuner.
_TUNED_KNOBS = ("FUSION_THRESHOLD", "CYCLE_TIME", "CACHE_CAPACITY")


class Setting(NamedTuple):
    """One point of the grid: fusion threshold (bytes), cycle time (ms), response cache on."""

    threshold_bytes: int
    cycle_ms: float
    cache: bool = True

    def describe(self) -> str:
        return (
            f"fusion {human(self.threshold_bytes)} cycle {self.cycle_ms:g} ms "
            f"cache {int(self.cache)}"
        )


# kolo's (and Horovod's) configured setting: 128 MiB (Horovod: 64), 1 ms, cache on.
DEFAULT_SETTING = Setting(128 << 20, 1.0, True)


def grid_settings(
    thresholds_mib: list[float], cycle_times_ms: list[float], caches: list[float]
) -> list[Setting]:
    """Every combination, threshold-major (the order the grid runs in)."""
    return [
        Setting(int(t * (1 << 20)), c, bool(cache))
        for t in thresholds_mib
        for c in cycle_times_ms
        for cache in caches
    ]


def take_autotune_environment() -> dict[str, str]:
    """Removes the autotuner's variables (``KOLO_``/``HOROVOD_AUTOTUNE*``, as ``kolorun
    --autotune ...`` sets them) from this process's environment and returns them: the grid's
    points run untuned, `reinit_autotuned` hands them back to the autotune run."""
    taken = {}
    for prefix in ("KOLO_", "HOROVOD_"):
        for suffix in _AUTOTUNE_VARIABLES:
            value = os.environ.pop(prefix + suffix, None)
            if value is not None:
                taken[prefix + suffix] = value
    return taken


def _clear_knobs() -> None:
    for prefix in ("KOLO_", "HOROVOD_"):
        for name in (*_TUNED_KNOBS, *_AUTOTUNE_VARIABLES):
            os.environ.pop(prefix + name, None)


def reinit(setting: Setting) -> None:
    """(Re-)initializes kolo with `setting`'s knobs (they are read at ``hvd.init()``)."""
    if hvd.is_initialized():
        hvd.shutdown()
    _clear_knobs()
    os.environ["KOLO_FUSION_THRESHOLD"] = str(setting.threshold_bytes)
    os.environ["KOLO_CYCLE_TIME"] = f"{max(setting.cycle_ms, MIN_CYCLE_MS):g}"
    if not setting.cache:
        os.environ["KOLO_CACHE_CAPACITY"] = "0"
    hvd.init()


def reinit_autotuned(autotune_env: dict[str, str], log: Path) -> Path:
    """Re-initializes kolo with the autotuner on, the tuned knobs left free, `autotune_env`
    (what kolorun's autotune flags set) applied, and the CSV log at `log` unless those name
    one; returns the log's path."""
    hvd.shutdown()
    _clear_knobs()
    os.environ.update(autotune_env)
    os.environ["KOLO_AUTOTUNE"] = "1"
    named = autotune_env.get("KOLO_AUTOTUNE_LOG") or autotune_env.get("HOROVOD_AUTOTUNE_LOG")
    if named is None:
        log.parent.mkdir(parents=True, exist_ok=True)
        os.environ["KOLO_AUTOTUNE_LOG"] = str(log)
    hvd.init()
    return Path(named) if named else log


def slowest(seconds: float) -> float:
    """The largest `seconds` over all ranks."""
    return float(hvd.allreduce(torch.tensor([seconds]), op=hvd.Max, name="bench.elapsed").item())


def seconds_per_step(step: Callable[[], None], steps: int) -> float:
    """The slowest rank's time per step over `steps` steps, after a barrier."""
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return slowest(time.perf_counter() - start) / steps


def autotune_until_kept(step: Callable[[], None]) -> int:
    """Runs `step` until every rank's engine keeps a setting; returns the steps taken."""
    for n in range(1, MAX_AUTOTUNE_STEPS + 1):
        step()
        active = kolo.engine_stats()["autotune_active"]
        if hvd.allreduce(torch.tensor([active]), op=hvd.Max, name="bench.active").item() == 0:
            return n
    return MAX_AUTOTUNE_STEPS


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free interval for the median of `values`: the order statistics
    ``x_(k)`` and ``x_(n+1-k)``, for the largest `k` whose coverage ``1 - 2 P(B <= k - 1)``
    (B binomial(n, 1/2)) is at least `confidence` (below 6 values none is: then the range).
    Returns ``(low, high, coverage)``."""
    xs = sorted(values)
    n = len(xs)

    def coverage(k: int) -> float:
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= confidence:
        k += 1
    return xs[k - 1], xs[n - k], coverage(k)


def _effective(setting: Setting) -> Setting:
    """`setting` as `reinit` applies it (cycle time 0 runs as `MIN_CYCLE_MS`)."""
    return setting._replace(cycle_ms=max(setting.cycle_ms, MIN_CYCLE_MS))


# Steps run after each re-initialization before a setting is timed, as a job's warm-up would:
# the first fills the response cache, and on the shared-memory plane the second is a size's
# first trial of the other way of storing (docs/transport.md, "Stores into a half").
WARMUP_STEPS = 3


def warm_up(step: Callable[[], None]) -> None:
    """Runs `WARMUP_STEPS` untimed steps of a freshly initialized setting."""
    for _ in range(WARMUP_STEPS):
        step()


def retime_interleaved(
    settings: list[Setting],
    make_step: Callable[[], Callable[[], None]],
    steps: int,
    rounds: int,
    after_round: Optional[Callable[[], None]] = None,
) -> list[list[float]]:
    """Times each of `settings` (distinct) once per round for `rounds` rounds, `steps` steps
    each after `warm_up`, in an order reversed every round and rotated every other round (no
    setting always runs first or right after another; with two settings each runs first every
    other round), calling `after_round` after each round; returns the seconds per step,
    ``[setting][round]``."""
    times: list[list[float]] = [[] for _ in settings]
    order = list(range(len(settings)))
    for r in range(rounds):
        shift = (r // 2) % len(order)
        rotated = order[shift:] + order[:shift]
        for i in rotated[::-1] if r % 2 else rotated:
            reinit(settings[i])
            step = make_step()
            warm_up(step)
            times[i].append(seconds_per_step(step, steps))
        if after_round is not None:
            after_round()
    return times


def paired_verdict(
    tuned: list[float], best: list[float], target: float = TARGET_RATIO
) -> dict[str, Any]:
    """The per-round ratios of `tuned`'s step times to `best`'s (the same rounds, run close
    together), their median with its interval (`median_interval`) and the verdict on the
    target ratio: "met" when the interval lies at or below `target`, "missed" when above it,
    else "unresolved" (more rounds, or a quieter machine, are needed to tell)."""
    ratios = [t / b for t, b in zip(tuned, best)]
    low, high, coverage = median_interval(ratios)
    verdict = "met" if high <= target else "missed" if low > target else "unresolved"
    return {
        "ratios": ratios,
        "median": statistics.median(ratios),
        "low": low,
        "high": high,
        "coverage": coverage,
        "verdict": verdict,
    }


def autotune_against_grid(
    stem: str,
    grid: dict[Setting, float],
    make_step: Callable[[], Callable[[], None]],
    steps: int,
    autotune_env: dict[str, str],
    rounds: int = RETIME_ROUNDS,
) -> dict[str, Any]:
    """Runs kolo's autotuner from the configured setting until it keeps one, then compares
    the kept setting with the best points of `grid` (setting -> seconds per step, measured by
    the caller). In-search: the kept setting timed right after the search against the grid's
    minimum (biased low: the minimum of many noisy points). Re-timed: the kept setting, the
    grid's `RETIME_GRID_TOP` best points and the default, interleaved for `rounds` rounds
    (`retime_interleaved`); the grid's best is the re-timed point with the lowest median, and
    the verdict is the median of the per-round paired ratios, tuned over that point, with its
    interval (`paired_verdict`). `make_step` builds a step after each re-initialization; each
    timing is `steps` steps. Rank 0 prints two lines; returns the figures."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    log = reinit_autotuned(autotune_env, RESULTS / f"{stem}-autotune-{stamp}.csv")
    step = make_step()
    tune_start = time.perf_counter()
    steps_used = autotune_until_kept(step)
    tune_s = time.perf_counter() - tune_start
    stats = kolo.engine_stats()
    tuned = Setting(
        int(stats["fusion_threshold"]), stats["cycle_time_us"] / 1e3, bool(stats["cache_enabled"])
    )
    tuned_s = seconds_per_step(step, steps)
    ranked = sorted(grid, key=grid.__getitem__)
    grid_best, grid_best_s = ranked[0], grid[ranked[0]]
    default_s = grid.get(DEFAULT_SETTING)
    # Labels of the contenders; the same effective setting is timed once under its first label.
    contenders = {"tuned": tuned}
    contenders.update({f"grid_{i + 1}": s for i, s in enumerate(ranked[:RETIME_GRID_TOP])})
    contenders["default"] = DEFAULT_SETTING
    distinct = list(dict.fromkeys(_effective(s) for s in contenders.values()))
    load_before = os.getloadavg()
    times = retime_interleaved(distinct, make_step, steps, rounds)
    load_after = os.getloadavg()
    retimed = {k: times[distinct.index(_effective(s))] for k, s in contenders.items()}
    medians = {k: statistics.median(v) for k, v in retimed.items()}
    best_key = min((k for k in contenders if k.startswith("grid_")), key=medians.__getitem__)
    verdict = paired_verdict(retimed["tuned"], retimed[best_key])
    figures = {
        "steps": steps_used,
        "seconds": tune_s,
        "horovod_default_steps_at_least": HOROVOD_DEFAULT_AUTOTUNE_STEPS,
        "trials": stats["autotune_trials"],
        "log": str(log),
        "threshold_bytes": tuned.threshold_bytes,
        "cycle_time_ms": tuned.cycle_ms,
        "cache_enabled": tuned.cache,
        "step_s": tuned_s,
        "grid_points": len(grid),
        "grid_best": grid_best._asdict(),
        "grid_best_step_s": grid_best_s,
        "ratio_time_over_grid_best": tuned_s / grid_best_s,
        "ratio_time_over_default": tuned_s / default_s if default_s else None,
        "retime_rounds": rounds,
        "retimed_settings": {k: s._asdict() for k, s in contenders.items()},
        "retimed_step_s": retimed,
        "retimed_median_step_s": medians,
        "retimed_grid_best": best_key,
        "retimed_ratio_tuned_over_grid_best": verdict["median"],
        "retimed_ratio_interval": [verdict["low"], verdict["high"]],
        "retimed_ratio_coverage": verdict["coverage"],
        "retimed_paired_ratios": verdict["ratios"],
        "retimed_verdict": verdict["verdict"],
        "retimed_ratio_tuned_over_default": paired_verdict(retimed["tuned"], retimed["default"])[
            "median"
        ],
        "load_average": load_after,
        "load_average_before_retiming": load_before,
    }
    if hvd.rank() == 0:
        vs_default = (
            f" | tuned/default {figures['ratio_time_over_default']:.3f}x" if default_s else ""
        )
        print(
            f"autotune: kept {tuned.describe()} after {steps_used} steps "
            f"({figures['trials']} trials, {tune_s:.1f} s; Horovod's defaults take >= "
            f"{HOROVOD_DEFAULT_AUTOTUNE_STEPS} steps): {tuned_s * 1e3:.2f} ms/step | grid best "
            f"({len(grid)} points) {grid_best.describe()} {grid_best_s * 1e3:.2f} ms/step | "
            f"tuned/grid-best {figures['ratio_time_over_grid_best']:.3f}x (target <= "
            f"{TARGET_RATIO:.2f}x){vs_default} | log {log}",
            flush=True,
        )
        grid_text = ", ".join(
            f"{k} {contenders[k].describe()} {medians[k] * 1e3:.2f} ms"
            for k in contenders
            if k.startswith("grid_")
        )
        print(
            f"autotune re-timed interleaved ({rounds} rounds, paired): tuned "
            f"{medians['tuned'] * 1e3:.2f} ms | {grid_text} | default "
            f"{medians['default'] * 1e3:.2f} ms | tuned/grid-best ({best_key}) "
            f"{verdict['median']:.3f}x [{verdict['low']:.3f}, {verdict['high']:.3f}] "
            f"({verdict['coverage'] * 100:.0f} % interval; target <= {TARGET_RATIO:.2f}x: "
            f"{verdict['verdict']}) | tuned/default "
            f"{figures['retimed_ratio_tuned_over_default']:.3f}x | load average "
            + " ".join(f"{x:.1f}" for x in load_before)
            + " -> "
            + " ".join(f"{x:.1f}" for x in load_after),
            flush=True,
        )
    return figures


def csv_floats(text: str) -> list[float]:
    """``"0,1,4"`` as ``[0.0, 1.0, 4.0]`` (an argparse type)."""
    return [float(x) for x in text.split(",") if x.strip()]
