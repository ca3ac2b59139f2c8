//! Throughput of the reduction kernels (`cargo bench -p kolo-collective --bench reduce`).
//!
//! Prints GB/s of `reduce_into` (bytes of one buffer per second) per dtype and op at an
//! in-cache size and at memory-bound sizes, and, for the large sizes, the same with two
//! concurrent reductions (as when both ranks of a 2-rank ring reduce at once) run on one
//! thread each or split in two halves each. Each single-reduction figure is given for every
//! instruction-set tier this CPU supports (baseline, AVX2, AVX-512). `KOLO_REDUCE_BENCH_QUICK=1` shortens it.

use std::time::{Duration, Instant};

use kolo_collective::reduce::{reduce_into, reduce_into_with, scale_with, Isa};
use kolo_collective::{DType, ReduceOp};

fn buffers(dtype: DType, bytes: usize) -> (Vec<u8>, Vec<u8>) {
    // Small values that stay finite under every op, encoded per dtype.
    let n = bytes / dtype.size();
    let mut a = Vec::with_capacity(bytes);
    let mut b = Vec::with_capacity(bytes);
    for i in 0..n {
        let (x, y) = ((i % 3) as f32 + 1.0, ((i + 1) % 2) as f32 + 1.0);
        for (out, v) in [(&mut a, x), (&mut b, y)] {
            match dtype {
                DType::U8 | DType::I8 | DType::Bool => out.push(v as u8 & 1),
                DType::I16 => out.extend((v as i16).to_ne_bytes()),
                DType::I32 => out.extend((v as i32).to_ne_bytes()),
                DType::I64 => out.extend((v as i64).to_ne_bytes()),
                DType::F16 => out.extend(half::f16::from_f32(v).to_ne_bytes()),
                DType::BF16 => out.extend(half::bf16::from_f32(v).to_ne_bytes()),
                DType::F32 => out.extend(v.to_ne_bytes()),
                DType::F64 => out.extend(f64::from(v).to_ne_bytes()),
            }
        }
    }
    (a, b)
}

/// Seconds per call of `f`: the best of several timed batches, each at least `budget` long.
fn seconds_per_call(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let start = Instant::now();
        let mut calls = 0u32;
        while start.elapsed() < budget {
            f();
            calls += 1;
        }
        best = best.min(start.elapsed().as_secs_f64() / f64::from(calls));
    }
    best
}

fn human(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

fn main() {
    let quick = std::env::var_os("KOLO_REDUCE_BENCH_QUICK").is_some();
    let budget = Duration::from_millis(if quick { 60 } else { 250 });
    let sizes: &[usize] = if quick {
        &[64 << 10, 16 << 20]
    } else {
        &[64 << 10, 1 << 20, 16 << 20, 64 << 20]
    };
    for dtype in DType::ALL {
        let ops: &[ReduceOp] = if matches!(dtype, DType::F32 | DType::BF16) {
            &[ReduceOp::Sum, ReduceOp::Max, ReduceOp::Product]
        } else {
            &[ReduceOp::Sum]
        };
        for &op in ops {
            for &bytes in sizes {
                let (mut a, b) = buffers(dtype, bytes);
                let figures: Vec<String> = Isa::available()
                    .into_iter()
                    .map(|isa| {
                        let t = seconds_per_call(budget, || {
                            reduce_into_with(isa, dtype, op, &mut a, &b).unwrap()
                        });
                        format!("{isa:?} {:7.2} GB/s", bytes as f64 / t / 1e9)
                    })
                    .collect();
                println!(
                    "reduce {op:<7} {dtype:<8} {:>7}: {}",
                    human(bytes),
                    figures.join(" | ")
                );
            }
        }
        if dtype != DType::Bool {
            let bytes = 16 << 20;
            let mut a = buffers(dtype, bytes).0;
            let figures: Vec<String> = Isa::available()
                .into_iter()
                .map(|isa| {
                    let t = seconds_per_call(budget, || {
                        scale_with(isa, dtype, &mut a, 1.0 / 3.0).unwrap()
                    });
                    format!("{isa:?} {:7.2} GB/s", bytes as f64 / t / 1e9)
                })
                .collect();
            println!(
                "scale          {dtype:<8} {:>7}: {}",
                human(bytes),
                figures.join(" | ")
            );
        }
    }
    // Two concurrent reductions (both ranks of a ring reduce at once): each on one thread, or
    // each split in halves on two threads (four threads on two cores).
    for dtype in [DType::F32, DType::BF16] {
        for &bytes in &sizes[1..] {
            for split in [1usize, 2] {
                let mut pairs: Vec<_> = (0..2).map(|_| buffers(dtype, bytes)).collect();
                let t = seconds_per_call(budget, || {
                    std::thread::scope(|s| {
                        for (a, b) in &mut pairs {
                            let half = (bytes / 2 / dtype.size()) * dtype.size();
                            let chunk = if split == 1 { bytes } else { half };
                            for (ca, cb) in a.chunks_mut(chunk).zip(b.chunks(chunk)) {
                                s.spawn(move || reduce_into(dtype, ReduceOp::Sum, ca, cb).unwrap());
                            }
                        }
                    });
                });
                println!(
                    "concurrent 2x reduce Sum {dtype:<8} {:>7}, {split} thread(s) each: {:7.2} GB/s each",
                    human(bytes),
                    bytes as f64 / t / 1e9
                );
            }
        }
        // One reduction alone, split in two or not (the other core idle).
        let bytes = *sizes.last().unwrap();
        for split in [1usize, 2] {
            let (mut a, b) = buffers(dtype, bytes);
            let t = seconds_per_call(budget, || {
                std::thread::scope(|s| {
                    let chunk = (bytes / split / dtype.size()) * dtype.size();
                    for (ca, cb) in a.chunks_mut(chunk).zip(b.chunks(chunk)) {
                        s.spawn(move || reduce_into(dtype, ReduceOp::Sum, ca, cb).unwrap());
                    }
                });
            });
            println!(
                "alone 1x reduce Sum {dtype:<8} {:>7}, {split} thread(s): {:7.2} GB/s",
                human(bytes),
                bytes as f64 / t / 1e9
            );
        }
    }
}
