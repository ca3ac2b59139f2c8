//! The autotuner's CSV log, in Horovod's format (`ParameterManager::LogParameters`): one header
//! line, one line per scored sample, and a last line with the best parameters.
//! Booleans are `0`/`1`, the cycle time in milliseconds, the fusion threshold in MiB, the score
//! in bytes per microsecond. Horovod writes a stray space after `torus_allreduce`'s comma; kolo
//! does not (kolo has no torus allreduce: that column is always 0).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::TunedParams;
use crate::error::{Error, Result};

/// Horovod's header line.
pub(crate) const HEADER: &str = "hierarchical_allreduce,hierarchical_allgather,torus_allreduce,\
                                 cache_enabled,cycle_time_ms,tensor_fusion_threshold,score";

/// An open log file.
#[derive(Debug)]
pub(crate) struct CsvLog {
    out: BufWriter<File>,
}

impl CsvLog {
    /// Creates (truncates) `path` and writes the header.
    pub(crate) fn create(path: &Path) -> Result<CsvLog> {
        let file = File::create(path).map_err(|e| {
            Error::Config(format!(
                "cannot write the autotune log {} (HOROVOD_AUTOTUNE_LOG / \
                 --autotune-log-file): {e}; give a path in a writable directory",
                path.display()
            ))
        })?;
        let mut log = CsvLog {
            out: BufWriter::new(file),
        };
        log.write_line(HEADER);
        Ok(log)
    }

    /// Appends the line of `params` scored `score`.
    pub(crate) fn record(&mut self, params: &TunedParams, score: f64) {
        let line = line(params, score);
        self.write_line(&line);
    }

    fn write_line(&mut self, line: &str) {
        let written = writeln!(self.out, "{line}").and_then(|()| self.out.flush());
        if let Err(e) = written {
            log::warn!("could not append to the autotune log: {e}");
        }
    }
}

/// One data line.
pub(crate) fn line(params: &TunedParams, score: f64) -> String {
    let flag = |b: bool| u8::from(b);
    format!(
        "{},{},0,{},{},{},{}",
        flag(params.hierarchical_allreduce),
        flag(params.hierarchical_allgather),
        flag(params.cache_enabled),
        round6(params.cycle_time.as_secs_f64() * 1e3),
        round6(params.fusion_threshold as f64 / (1024.0 * 1024.0)),
        round6(score),
    )
}

/// `value` with at most six significant digits, as C++'s default stream formatting prints it
/// (without its exponent form).
fn round6(value: f64) -> f64 {
    if value == 0.0 || !value.is_finite() {
        return value;
    }
    let digits = 6 - 1 - value.abs().log10().floor() as i32;
    let factor = 10f64.powi(digits);
    (value * factor).round() / factor
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn writes_horovods_header_and_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("autotune.csv");
        let mut log = CsvLog::create(&path).unwrap();
        let params = TunedParams {
            fusion_threshold: 32 << 20,
            cycle_time: Duration::from_micros(2500),
            cache_enabled: true,
            hierarchical_allreduce: false,
            hierarchical_allgather: true,
            active: true,
        };
        log.record(&params, 1_234.567_891);
        log.record(
            &TunedParams {
                fusion_threshold: 3 << 19,
                cache_enabled: false,
                ..params
            },
            0.5,
        );
        drop(log);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,\
                 cycle_time_ms,tensor_fusion_threshold,score",
                "0,1,0,1,2.5,32,1234.57",
                "0,1,0,0,2.5,1.5,0.5",
            ]
        );
        // Every line has the header's seven columns.
        assert!(lines.iter().all(|l| l.split(',').count() == 7));
    }

    #[test]
    fn an_unwritable_path_is_a_config_error() {
        let error = CsvLog::create(Path::new("/nonexistent-dir/x/autotune.csv")).unwrap_err();
        assert!(
            matches!(&error, Error::Config(m) if m.contains("autotune log")),
            "{error:?}"
        );
    }
}
