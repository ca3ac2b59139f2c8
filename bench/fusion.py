"""Tensor fusion on ResNet-50's gradients: sweep KOLO_FUSION_THRESHOLD and KOLO_CYCLE_TIME.

    kolorun -np 2 python bench/fusion.py [--quick] [--thresholds-mib 0,1,4,25,64,128]
        [--cycle-times-ms 0,1,5] [--caches 1] [--steps 5] [--scale 1]
        [--retime-rounds 15] [--autotune] [--json PATH]

A "step" submits an allreduce (Average) of each of ResNet-50's 161 gradient tensors (their
shapes are built below, in backward order: fc first, conv1 last; 25.6 M float32 parameters,
97.5 MiB) asynchronously and waits for all, like ``hvd.DistributedOptimizer`` at the end of a
backward pass. The knobs are read at ``hvd.init()``, so each (threshold, cycle time) setting
re-initializes kolo (``hvd.shutdown()``, set the env, ``hvd.init()``). Interleaved with each
setting, gloo allreduces the same bytes as one flat buffer (perfect fusion for free: the peer's
floor). One line per setting: step time, how many collectives a step took, and the ratios to
the default (128 MiB, 1 ms), to no fusion, to gloo's flat allreduce and to the memcpy floor: both
ranks copying the step's bytes at the same time (two concurrent memcpys, timed interleaved with
every setting; the physical limit of a shared-memory allreduce of those bytes). A line
states the issue-24 targets for the default setting: no slower than no fusion, and at most 1.3x
the memcpy floor. The grid times each setting once, and this host's cores change speed for
seconds at a time, so the default and no fusion are then re-timed in turns for
``--retime-rounds`` rounds, each round followed by the memcpy floor: the verdicts are the
medians of the per-round paired ratios with their 96 % intervals ("met", "missed" or
"unresolved", as for the autotuner below). ``--scale k`` divides
every tensor's element count by k (for smoke tests). ``KOLO_CYCLE_TIME`` must be more than
0, so cycle time 0 runs as 0.01 ms.

``--autotune`` then runs kolo's autotuner from the default setting (``KOLO_AUTOTUNE=1``,
Horovod's defaults for the rest, or what ``kolorun --autotune-*`` flags set; the CSV log goes
to ``--autotune-log-file`` or bench/results/) until it keeps a setting, times that setting, and
prints it against the grid's best point (target: within 5 %) and the steps it took against the
steps Horovod's defaults take at the least: (3 warm-up + 21 Bayesian samples) x 5 scores x 10
steps = 1200 steps, before its categorical switches. The grid's minimum is biased low by
noise (the luckiest of many noisy points), so the kept setting, the grid's 3 best points and the
default are then re-timed interleaved for ``--retime-rounds`` rounds (15): the verdict is the
median of the per-round ratios of the kept setting to the re-timed best grid point, with its
96 % interval ("met" when the whole interval is within 5 %, "missed" when it is all above,
else "unresolved"), and the load average (``common.autotune_against_grid``, shared with
bench/training.py). ``--caches 0,1`` adds the response cache (the switch the tuner tries on one
host) to the grid.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from common import (
    DEFAULT_SETTING,
    RETIME_ROUNDS,
    Setting,
    autotune_against_grid,
    csv_floats,
    grid_settings,
    human,
    init_gloo,
    paired_verdict,
    pin_one_core_per_rank,
    reinit,
    retime_interleaved,
    seconds_per_step,
    take_autotune_environment,
    warm_up,
    write_results,
)

import kolo
import kolo.torch as hvd

# Issue 24: the default setting's step at most this many times the two-memcpy floor.
FLOOR_TARGET = 1.30


def resnet50_gradient_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """ResNet-50 (torchvision layout) parameter names and shapes, in backward order."""
    shapes: list[tuple[str, tuple[int, ...]]] = [("conv1.weight", (64, 3, 7, 7))]
    shapes += [("bn1.weight", (64,)), ("bn1.bias", (64,))]
    in_ch = 64
    for layer, (width, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3)), start=1):
        out_ch = width * 4
        for block in range(blocks):
            prefix = f"layer{layer}.{block}"
            shapes += [
                (f"{prefix}.conv1.weight", (width, in_ch, 1, 1)),
                (f"{prefix}.bn1.weight", (width,)),
                (f"{prefix}.bn1.bias", (width,)),
                (f"{prefix}.conv2.weight", (width, width, 3, 3)),
                (f"{prefix}.bn2.weight", (width,)),
                (f"{prefix}.bn2.bias", (width,)),
                (f"{prefix}.conv3.weight", (out_ch, width, 1, 1)),
                (f"{prefix}.bn3.weight", (out_ch,)),
                (f"{prefix}.bn3.bias", (out_ch,)),
            ]
            if block == 0:
                shapes += [
                    (f"{prefix}.downsample.0.weight", (out_ch, in_ch, 1, 1)),
                    (f"{prefix}.downsample.1.weight", (out_ch,)),
                    (f"{prefix}.downsample.1.bias", (out_ch,)),
                ]
            in_ch = out_ch
    shapes += [("fc.weight", (1000, 2048)), ("fc.bias", (1000,))]
    return shapes[::-1]


def retime_fusion_target(
    kolo_step: Callable[[], None],
    memcpy_step: Callable[[], None],
    steps: int,
    rounds: int,
    cycle_ms: float,
) -> dict[str, Any]:
    """The issue-24 fusion targets, re-timed: the default setting and no fusion (at the
    default's cycle time) take turns for `rounds` rounds (`retime_interleaved`), each round
    followed by the two-memcpy floor; the verdicts are the medians of the per-round paired
    ratios with their intervals (`paired_verdict`). One grid pass times each setting once, a
    few seconds apart, and this host's two cores change speed for seconds to minutes at a time
    (bench/core_round_trip.c), so a single pair can land on either side of the target."""
    unfused = DEFAULT_SETTING._replace(threshold_bytes=0, cycle_ms=cycle_ms)
    memcpy_s: list[float] = []
    default_s, unfused_s = retime_interleaved(
        [DEFAULT_SETTING, unfused],
        lambda: kolo_step,
        steps,
        rounds,
        after_round=lambda: memcpy_s.append(seconds_per_step(memcpy_step, steps)),
    )
    vs_unfused = paired_verdict(default_s, unfused_s, target=1.0)
    vs_memcpy = paired_verdict(default_s, memcpy_s, target=FLOOR_TARGET)
    figures = {
        "rounds": rounds,
        "default_step_s": default_s,
        "no_fusion_step_s": unfused_s,
        "memcpy2_step_s": memcpy_s,
        "default_over_no_fusion": vs_unfused,
        "default_over_memcpy2": vs_memcpy,
        "load_average": os.getloadavg(),
    }
    if hvd.rank() == 0:
        print(
            f"targets re-timed interleaved ({rounds} rounds, paired): default "
            f"{statistics.median(default_s) * 1e3:.2f} ms, no fusion "
            f"{statistics.median(unfused_s) * 1e3:.2f} ms, 2 memcpys "
            f"{statistics.median(memcpy_s) * 1e3:.2f} ms | default/no-fusion "
            + _verdict_text(vs_unfused, 1.0)
            + " | default/2memcpy "
            + _verdict_text(vs_memcpy, FLOOR_TARGET)
            + " | load average "
            + " ".join(f"{x:.1f}" for x in figures["load_average"]),
            flush=True,
        )
    return figures


def _verdict_text(verdict: dict[str, Any], target: float) -> str:
    return (
        f"{verdict['median']:.3f}x [{verdict['low']:.3f}, {verdict['high']:.3f}] "
        f"({verdict['coverage'] * 100:.0f} % interval; target <= {target:.2f}x: "
        f"{verdict['verdict']})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="3 steps per setting")
    parser.add_argument("--thresholds-mib", type=csv_floats, default=[0, 1, 4, 25, 64, 128])
    parser.add_argument("--cycle-times-ms", type=csv_floats, default=[0, 1, 5])
    parser.add_argument(
        "--caches", type=csv_floats, default=[1], help="response cache off (0) / on (1)"
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps (5; quick 3)")
    parser.add_argument("--scale", type=int, default=1, help="divide tensor sizes by this")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--autotune", action="store_true", help="also run the autotuner; compare with the grid"
    )
    parser.add_argument(
        "--retime-rounds",
        type=int,
        default=RETIME_ROUNDS,
        help="rounds of the paired re-timings (default against no fusion; --autotune's); 0: none",
    )
    args = parser.parse_args()
    steps = args.steps or (3 if args.quick else 5)

    shapes = resnet50_gradient_shapes()
    numels = [max(1, torch.Size(shape).numel() // args.scale) for _, shape in shapes]
    total_bytes = 4 * sum(numels)

    autotune_env = take_autotune_environment()
    settings = grid_settings(args.thresholds_mib, args.cycle_times_ms, args.caches)
    reinit(settings[0])
    rank, size = hvd.rank(), hvd.size()
    pin_one_core_per_rank()
    init_gloo()
    grads = [torch.ones(n) for n in numels]
    names = [f"grad.{name}" for name, _ in shapes]
    flat = torch.ones(sum(numels))
    copy_src = torch.ones(total_bytes, dtype=torch.uint8)
    copy_dst = torch.empty_like(copy_src)

    def kolo_step() -> None:
        handles = [hvd.allreduce_async_(g, op=hvd.Average, name=n) for g, n in zip(grads, names)]
        for h in handles:
            hvd.synchronize(h)

    def gloo_step() -> None:
        dist.all_reduce(flat)

    def memcpy_step() -> None:
        copy_dst.copy_(copy_src)

    def timed(step) -> float:
        return seconds_per_step(step, steps)

    results: list[dict[str, Any]] = []
    for setting in settings:
        reinit(setting)
        warm_up(kolo_step)
        before = kolo.engine_stats()
        kolo_s = timed(kolo_step)
        after = kolo.engine_stats()
        gloo_s = timed(gloo_step)
        memcpy_s = timed(memcpy_step)
        results.append(
            {
                "threshold_bytes": setting.threshold_bytes,
                "cycle_time_ms": setting.cycle_ms,
                "cache_enabled": setting.cache,
                "kolo_step_s": kolo_s,
                "gloo_flat_step_s": gloo_s,
                "memcpy2_step_s": memcpy_s,
                "collectives_per_step": (after["collectives"] - before["collectives"]) / steps,
                "cycles_per_step": (after["cycles"] - before["cycles"]) / steps,
            }
        )

    def find(threshold: float, cycle: float, cache: bool = True) -> dict[str, Any] | None:
        for r in results:
            if (r["threshold_bytes"], r["cycle_time_ms"], r["cache_enabled"]) == (
                int(threshold * (1 << 20)),
                cycle,
                cache,
            ):
                return r
        return None

    default = (
        find(DEFAULT_SETTING.threshold_bytes / (1 << 20), DEFAULT_SETTING.cycle_ms) or results[-1]
    )
    for r in results:
        no_fusion = find(0, r["cycle_time_ms"], r["cache_enabled"])
        r["ratio_time_over_default"] = r["kolo_step_s"] / default["kolo_step_s"]
        r["ratio_time_over_no_fusion"] = (
            r["kolo_step_s"] / no_fusion["kolo_step_s"] if no_fusion else None
        )
        r["ratio_time_over_gloo_flat"] = r["kolo_step_s"] / r["gloo_flat_step_s"]
        r["ratio_time_over_memcpy2"] = r["kolo_step_s"] / r["memcpy2_step_s"]
        if rank == 0:
            no_fusion_text = (
                f"{r['ratio_time_over_no_fusion']:5.2f}x no-fusion"
                if no_fusion
                else "no-fusion n/a"
            )
            cache = "" if r["cache_enabled"] else " cache off"
            print(
                f"fusion {human(r['threshold_bytes']):>9} cycle {r['cycle_time_ms']:g} ms{cache}: "
                f"kolo {r['kolo_step_s'] * 1e3:8.2f} ms/step "
                f"({r['collectives_per_step']:5.1f} collectives) | "
                f"{r['ratio_time_over_default']:5.2f}x default | {no_fusion_text} | "
                f"gloo flat {r['gloo_flat_step_s'] * 1e3:8.2f} ms, kolo/gloo time "
                f"{r['ratio_time_over_gloo_flat']:5.2f}x | 2 memcpys "
                f"{r['memcpy2_step_s'] * 1e3:7.2f} ms, "
                f"kolo/2memcpy {r['ratio_time_over_memcpy2']:5.2f}x",
                flush=True,
            )
    no_fusion_default = find(0, default["cycle_time_ms"])
    if rank == 0 and no_fusion_default is not None and default is not no_fusion_default:
        print(
            f"targets (issue 24): default fusion {default['kolo_step_s'] * 1e3:.2f} ms/step vs "
            f"no fusion {no_fusion_default['kolo_step_s'] * 1e3:.2f} ms: "
            f"{default['ratio_time_over_no_fusion']:.2f}x (target <= 1.00); "
            f"{default['ratio_time_over_memcpy2']:.2f}x the 2-memcpy floor of its "
            f"{human(total_bytes)} (target <= {FLOOR_TARGET:.2f})",
            flush=True,
        )
    fusion_target: dict[str, Any] | None = None
    if args.retime_rounds and no_fusion_default is not None and default is not no_fusion_default:
        fusion_target = retime_fusion_target(
            kolo_step, memcpy_step, steps, args.retime_rounds, default["cycle_time_ms"]
        )
    autotune: dict[str, Any] | None = None
    if args.autotune:
        grid = {
            Setting(r["threshold_bytes"], r["cycle_time_ms"], r["cache_enabled"]): r["kolo_step_s"]
            for r in results
        }
        autotune = autotune_against_grid(
            "fusion", grid, lambda: kolo_step, steps, autotune_env, args.retime_rounds
        )
    if rank == 0:
        write_results(
            "fusion",
            {
                "ranks": size,
                "model": "resnet50",
                "tensors": len(shapes),
                "total_bytes": total_bytes,
                "scale": args.scale,
                "steps": steps,
                "shapes": [list(s) for _, s in shapes],
                "results": results,
                "fusion_target_retimed": fusion_target,
                "autotune": autotune,
            },
            args.json,
        )
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
