//! The native side's logger: `log` records to stderr, filtered by `KOLO_LOG_LEVEL`
//! (trace, debug, info, warning — the default —, error, fatal; Horovod's names, `warn` too).
//! Each line starts with the local time, as Horovod's do, unless `KOLO_LOG_HIDE_TIME` or
//! `HOROVOD_LOG_HIDE_TIME` is true (`kolorun --log-without-timestamp`):
//! `[2026-11-25 08:10:00.123456: kolo WARN pid 42] ...` or `[kolo WARN pid 42] ...`.

use std::io::Write;

use log::{LevelFilter, Log, Metadata, Record};

struct StderrLogger;

/// Whether log lines start with the time, read once.
static SHOW_TIME: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record<'_>) {
        if self.enabled(record.metadata()) {
            let time = if *SHOW_TIME.get_or_init(show_time) {
                format!("{}: ", now())
            } else {
                String::new()
            };
            let _ = writeln!(
                std::io::stderr().lock(),
                "[{time}kolo {} pid {}] {}",
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

/// Horovod's rule (`horovod/common/logging.cc`): the time is shown unless
/// `HOROVOD_LOG_HIDE_TIME` is true; kolo's name wins over Horovod's.
fn show_time() -> bool {
    let hide = std::env::var("KOLO_LOG_HIDE_TIME")
        .or_else(|_| std::env::var("HOROVOD_LOG_HIDE_TIME"))
        .unwrap_or_default();
    !matches!(
        hide.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

/// The local time as Horovod's log lines show it: `2026-11-25 08:10:00.123456`.
fn now() -> String {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let seconds = since_epoch.as_secs() as libc::time_t;
    // SAFETY: localtime_r and strftime write only into the buffers passed; `tm` is plain
    // data, zero is a valid value for it.
    let text = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&seconds, &mut tm).is_null() {
            return String::new();
        }
        let mut buffer = [0u8; 32];
        let written = libc::strftime(
            buffer.as_mut_ptr().cast(),
            buffer.len(),
            c"%Y-%m-%d %H:%M:%S".as_ptr(),
            &tm,
        );
        String::from_utf8_lossy(&buffer[..written]).into_owned()
    };
    format!("{text}.{:06}", since_epoch.subsec_micros())
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
