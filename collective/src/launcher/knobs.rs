//! horovodrun's tuning flags (parameters, autotune, timeline, stall check, library and logging
//! groups): each sets the variables Horovod's `set_env_from_args` sets
//! (`horovod/runner/common/util/config_parser.py`), plus kolo's `KOLO_*` name where kolo's
//! engine reads one, so a flag also wins over a `KOLO_*` value inherited from the environment.

use crate::error::{Error, Result};

/// `KOLO_FUSION_THRESHOLD` (bytes), set by `--fusion-threshold-mb`.
pub const FUSION_THRESHOLD: &str = "KOLO_FUSION_THRESHOLD";
/// `KOLO_CYCLE_TIME` (milliseconds), set by `--cycle-time-ms`.
pub const CYCLE_TIME: &str = "KOLO_CYCLE_TIME";
/// `KOLO_CACHE_CAPACITY`, set by `--cache-capacity`.
pub const CACHE_CAPACITY: &str = "KOLO_CACHE_CAPACITY";
/// `KOLO_TIMELINE` (an absolute path), set by `--timeline-filename`.
pub const TIMELINE: &str = "KOLO_TIMELINE";
/// `KOLO_TIMELINE_MARK_CYCLES`, set by `--timeline-mark-cycles` / `--no-timeline-mark-cycles`.
pub const TIMELINE_MARK_CYCLES: &str = "KOLO_TIMELINE_MARK_CYCLES";
/// `KOLO_STALL_CHECK_DISABLE`, set by `--no-stall-check` / `--stall-check`.
pub const STALL_CHECK_DISABLE: &str = "KOLO_STALL_CHECK_DISABLE";
/// `KOLO_STALL_CHECK_TIME_SECONDS`, set by `--stall-check-warning-time-seconds`.
pub const STALL_CHECK_TIME_SECONDS: &str = "KOLO_STALL_CHECK_TIME_SECONDS";
/// `KOLO_STALL_SHUTDOWN_TIME_SECONDS`, set by `--stall-check-shutdown-time-seconds`.
pub const STALL_SHUTDOWN_TIME_SECONDS: &str = "KOLO_STALL_SHUTDOWN_TIME_SECONDS";
/// `KOLO_LOG_LEVEL`, set by `--log-level`.
pub const LOG_LEVEL: &str = "KOLO_LOG_LEVEL";
/// Set by `--[no-]hierarchical-allreduce`: read by the collectives (`collectives/hier.rs`).
pub const HIERARCHICAL_ALLREDUCE: [&str; 2] = [
    "KOLO_HIERARCHICAL_ALLREDUCE",
    "HOROVOD_HIERARCHICAL_ALLREDUCE",
];
/// Set by `--[no-]hierarchical-allgather`.
pub const HIERARCHICAL_ALLGATHER: [&str; 2] = [
    "KOLO_HIERARCHICAL_ALLGATHER",
    "HOROVOD_HIERARCHICAL_ALLGATHER",
];
/// `KOLO_LOG_HIDE_TIME`, set by `--log-without-timestamp` / `--log-with-timestamp`.
pub const LOG_HIDE_TIME: &str = "KOLO_LOG_HIDE_TIME";
/// `KOLO_THREAD_AFFINITY` (cores of the engine thread, one per local rank), set by
/// `--thread-affinity`.
pub const THREAD_AFFINITY: &str = "KOLO_THREAD_AFFINITY";
/// `KOLO_COLLECTIVE_TIMEOUT_SECONDS`, set by `--gloo-timeout-seconds`.
pub const COLLECTIVE_TIMEOUT: &str = crate::worker::COLLECTIVE_TIMEOUT;

/// The levels `--log-level` accepts (Horovod's names, any case).
pub(crate) const LOG_LEVELS: [&str; 6] = ["trace", "debug", "info", "warning", "error", "fatal"];
/// The largest `--fusion-threshold-mb` (1 TiB): anything above is a typo.
const MAX_FUSION_MB: f64 = 1024.0 * 1024.0;

/// The autotune flags whose variables Horovod sets only when autotuning is on.
pub(crate) const AUTOTUNE_SETTINGS: [&str; 5] = [
    "--autotune-log-file",
    "--autotune-warmup-samples",
    "--autotune-steps-per-sample",
    "--autotune-bayes-opt-max-samples",
    "--autotune-gaussian-process-noise",
];

/// Whether `flag` is a switch (no value) among the knob flags.
pub(crate) fn is_knob_switch(flag: &str) -> bool {
    switch_vars(flag).is_some()
}

/// Whether `flag` is a knob flag that takes a value.
pub(crate) fn is_knob_setting(flag: &str) -> bool {
    matches!(
        flag,
        "--fusion-threshold-mb"
            | "--cycle-time-ms"
            | "--cache-capacity"
            | "--timeline-filename"
            | "--stall-check-warning-time-seconds"
            | "--stall-check-shutdown-time-seconds"
            | "--num-nccl-streams"
            | "--thread-affinity"
            | "--gloo-timeout-seconds"
            | "--log-level"
    ) || AUTOTUNE_SETTINGS.contains(&flag)
}

/// The variables a knob switch sets, e.g. `--no-stall-check` →
/// `[("KOLO_STALL_CHECK_DISABLE", "1"), ("HOROVOD_STALL_CHECK_DISABLE", "1")]`.
pub(crate) fn switch_vars(flag: &str) -> Option<Vec<(&'static str, String)>> {
    let one = |names: &[&'static str], on: bool| {
        let value = if on { "1" } else { "0" };
        names.iter().map(|name| (*name, value.to_owned())).collect()
    };
    Some(match flag {
        "--hierarchical-allreduce" => one(&HIERARCHICAL_ALLREDUCE, true),
        "--no-hierarchical-allreduce" => one(&HIERARCHICAL_ALLREDUCE, false),
        "--hierarchical-allgather" => one(&HIERARCHICAL_ALLGATHER, true),
        "--no-hierarchical-allgather" => one(&HIERARCHICAL_ALLGATHER, false),
        "--torus-allreduce" => one(&["HOROVOD_TORUS_ALLREDUCE"], true),
        "--no-torus-allreduce" => one(&["HOROVOD_TORUS_ALLREDUCE"], false),
        "--autotune" => one(&["KOLO_AUTOTUNE", "HOROVOD_AUTOTUNE"], true),
        // Horovod sets no variable when autotuning is off.
        "--no-autotune" => Vec::new(),
        "--timeline-mark-cycles" => one(
            &[TIMELINE_MARK_CYCLES, "HOROVOD_TIMELINE_MARK_CYCLES"],
            true,
        ),
        "--no-timeline-mark-cycles" => one(
            &[TIMELINE_MARK_CYCLES, "HOROVOD_TIMELINE_MARK_CYCLES"],
            false,
        ),
        "--no-stall-check" => one(&[STALL_CHECK_DISABLE, "HOROVOD_STALL_CHECK_DISABLE"], true),
        "--stall-check" => one(&[STALL_CHECK_DISABLE, "HOROVOD_STALL_CHECK_DISABLE"], false),
        "--mpi-threads-disable" => one(&["HOROVOD_MPI_THREADS_DISABLE"], true),
        "--no-mpi-threads-disable" => one(&["HOROVOD_MPI_THREADS_DISABLE"], false),
        "--tcp" => one(&["NCCL_IB_DISABLE"], true),
        "--log-with-timestamp" | "--no-log-hide-timestamp" => {
            one(&[LOG_HIDE_TIME, "HOROVOD_LOG_HIDE_TIME"], false)
        }
        "--log-without-timestamp" | "--log-hide-timestamp" => {
            one(&[LOG_HIDE_TIME, "HOROVOD_LOG_HIDE_TIME"], true)
        }
        _ => return None,
    })
}

/// The variables a knob flag with a value sets, checked, e.g. `--fusion-threshold-mb 0.5` →
/// `[("KOLO_FUSION_THRESHOLD", "524288"), ("HOROVOD_FUSION_THRESHOLD", "524288")]`.
pub(crate) fn setting_vars(flag: &str, text: &str) -> Result<Vec<(&'static str, String)>> {
    let trimmed = text.trim();
    let bad = |accepted: &str| Error::Config(format!("kolorun: {flag} {text:?} {accepted}"));
    let whole = |accepted: &str| trimmed.parse::<u32>().map_err(|_| bad(accepted));
    let both = |kolo: &'static str, horovod: &'static str, value: String| {
        vec![(kolo, value.clone()), (horovod, value)]
    };
    Ok(match flag {
        "--fusion-threshold-mb" => {
            let mb = trimmed
                .parse::<f64>()
                .ok()
                .filter(|mb| mb.is_finite() && (0.0..=MAX_FUSION_MB).contains(mb))
                .ok_or_else(|| {
                    bad(
                        "is not a size in MiB: give a number from 0 (no fusion) to 1048576, \
                         e.g. 64 or 0.5",
                    )
                })?;
            let bytes = (mb * 1024.0 * 1024.0).round() as u64;
            both(
                FUSION_THRESHOLD,
                "HOROVOD_FUSION_THRESHOLD",
                bytes.to_string(),
            )
        }
        "--cycle-time-ms" => {
            let ms = trimmed
                .parse::<f64>()
                .ok()
                .filter(|ms| ms.is_finite() && *ms > 0.0 && *ms <= 60_000.0)
                .ok_or_else(|| {
                    bad("is not a cycle time: give a positive number of milliseconds, e.g. 1 or 2.5")
                })?;
            both(CYCLE_TIME, "HOROVOD_CYCLE_TIME", ms.to_string())
        }
        "--cache-capacity" => {
            let n = whole(
                "is not a cache capacity: give a whole number of entries (0 turns the cache off)",
            )?;
            both(CACHE_CAPACITY, "HOROVOD_CACHE_CAPACITY", n.to_string())
        }
        "--timeline-filename" => {
            if trimmed.is_empty() {
                return Err(bad("is not a file path"));
            }
            let path = std::path::absolute(text)
                .map_err(|err| bad(&format!("cannot be made an absolute path: {err}")))?;
            let path = path
                .into_os_string()
                .into_string()
                .map_err(|_| bad("is not valid UTF-8 once made absolute; choose a UTF-8 path"))?;
            both(TIMELINE, "HOROVOD_TIMELINE", path)
        }
        "--stall-check-warning-time-seconds" => {
            let s = whole("is not a time: give a whole number of seconds, e.g. 60")?;
            both(
                STALL_CHECK_TIME_SECONDS,
                "HOROVOD_STALL_CHECK_TIME_SECONDS",
                s.to_string(),
            )
        }
        "--stall-check-shutdown-time-seconds" => {
            let s = whole("is not a time: give a whole number of seconds, e.g. 600 (0: never)")?;
            both(
                STALL_SHUTDOWN_TIME_SECONDS,
                "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
                s.to_string(),
            )
        }
        "--log-level" => {
            let level = trimmed.to_ascii_lowercase();
            if !LOG_LEVELS.contains(&level.as_str()) {
                return Err(bad(&format!(
                    "is not a log level: give one of {}",
                    LOG_LEVELS.join(", ")
                )));
            }
            vec![
                (LOG_LEVEL, level.clone()),
                ("HOROVOD_LOG_LEVEL", level.to_ascii_uppercase()),
            ]
        }
        "--num-nccl-streams" => {
            let n = whole("is not a number of streams: give a whole number, e.g. 1")?;
            vec![("HOROVOD_NUM_NCCL_STREAMS", n.to_string())]
        }
        "--thread-affinity" => {
            let n = whole("is not a CPU core: give a whole number, e.g. 0")?;
            both(THREAD_AFFINITY, "HOROVOD_THREAD_AFFINITY", n.to_string())
        }
        "--gloo-timeout-seconds" => {
            let s = trimmed
                .parse::<u32>()
                .ok()
                .filter(|s| *s > 0)
                .ok_or_else(|| bad("is not a time: give a positive whole number of seconds"))?;
            both(
                COLLECTIVE_TIMEOUT,
                "HOROVOD_GLOO_TIMEOUT_SECONDS",
                s.to_string(),
            )
        }
        "--autotune-log-file" => {
            if trimmed.is_empty() {
                return Err(bad("is not a file path"));
            }
            vec![
                ("KOLO_AUTOTUNE_LOG", text.to_owned()),
                ("HOROVOD_AUTOTUNE_LOG", text.to_owned()),
            ]
        }
        "--autotune-warmup-samples" => {
            let n = whole("is not a count: give a whole number, e.g. 3")?;
            vec![
                ("KOLO_AUTOTUNE_WARMUP_SAMPLES", n.to_string()),
                ("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", n.to_string()),
            ]
        }
        "--autotune-steps-per-sample" => {
            let n = whole("is not a count: give a whole number, e.g. 10")?;
            if n == 0 {
                return Err(bad("is not a count of at least 1: give e.g. 10"));
            }
            vec![
                ("KOLO_AUTOTUNE_STEPS_PER_SAMPLE", n.to_string()),
                ("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", n.to_string()),
            ]
        }
        "--autotune-bayes-opt-max-samples" => {
            let n = whole("is not a count: give a whole number, e.g. 20")?;
            if n == 0 {
                return Err(bad("is not a count of at least 1: give e.g. 20"));
            }
            vec![
                ("KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", n.to_string()),
                ("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", n.to_string()),
            ]
        }
        "--autotune-gaussian-process-noise" => {
            let noise = trimmed
                .parse::<f64>()
                .ok()
                .filter(|v| (0.0..=1.0).contains(v))
                .ok_or_else(|| bad("is not a noise level: give a number in [0, 1], e.g. 0.8"))?;
            vec![
                ("KOLO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", noise.to_string()),
                ("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", noise.to_string()),
            ]
        }
        _ => {
            return Err(Error::Internal(format!(
                "kolorun: {flag} is not a knob flag (this is a bug)"
            )))
        }
    })
}
