//! The native side's logger: `log` records to stderr, filtered by `KOLO_LOG_LEVEL`
//! (error, warn — the default —, info, debug, trace).

use std::io::Write;

use log::{LevelFilter, Log, Metadata, Record};

struct StderrLogger;

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record<'_>) {
        if self.enabled(record.metadata()) {
            let _ = writeln!(
                std::io::stderr().lock(),
                "[kolo {} pid {}] {}",
                record.level(),
                std::process::id(),
                record.args()
            );
        }
    }

    fn flush(&self) {}
}

static LOGGER: StderrLogger = StderrLogger;

/// Installs the logger once; the level comes from `KOLO_LOG_LEVEL` (or `HOROVOD_LOG_LEVEL`).
pub fn init() {
    let level = std::env::var("KOLO_LOG_LEVEL")
        .or_else(|_| std::env::var("HOROVOD_LOG_LEVEL"))
        .ok()
        .and_then(|text| text.parse::<LevelFilter>().ok())
        .unwrap_or(LevelFilter::Warn);
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}
