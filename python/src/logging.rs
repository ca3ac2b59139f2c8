//! The native side's logger: `log` records to stderr, filtered by `KOLO_LOG_LEVEL`
//! (trace, debug, info, warning — the default —, error, fatal; Horovod's names, `warn` too).

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
        .and_then(|text| parse_level(&text))
        .unwrap_or(LevelFilter::Warn);
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}

/// A level name as Horovod spells it (`warning`, `fatal`) or as `log` does (`warn`, `off`).
fn parse_level(text: &str) -> Option<LevelFilter> {
    match text.trim().to_ascii_lowercase().as_str() {
        "warning" => Some(LevelFilter::Warn),
        "fatal" => Some(LevelFilter::Error),
        other => other.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn horovod_level_names_are_understood() {
        assert_eq!(parse_level("WARNING"), Some(LevelFilter::Warn));
        assert_eq!(parse_level("fatal"), Some(LevelFilter::Error));
        assert_eq!(parse_level("debug"), Some(LevelFilter::Debug));
        assert_eq!(parse_level("loud"), None);
    }
}
