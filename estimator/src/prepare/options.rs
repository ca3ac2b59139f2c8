//! What to prepare: the columns, the validation split and the output layout.

use parquet::basic::{BrotliLevel, Compression, GzipLevel, ZstdLevel};

use crate::error::{Error, Result};

/// How to pick the validation rows.
#[derive(Debug, Clone, PartialEq)]
pub enum Validation {
    /// About this share of the rows, in [0, 1), chosen from the seed and each row's position
    /// (0 means no validation set).
    Ratio(f64),
    /// Rows where this bool/numeric column is true (non-zero) are validation rows; the column
    /// itself is not written (Horovod's meaning of a column name as `validation`).
    Column(String),
}

/// The options of [`prepare_data`](super::prepare_data).
#[derive(Debug, Clone)]
pub struct PrepareOptions {
    /// Model input columns, written in this order.
    pub feature_columns: Vec<String>,
    /// Target columns, written after the features.
    pub label_columns: Vec<String>,
    /// The per-row sample weight column, written last.
    pub sample_weight_col: Option<String>,
    /// The validation split; `None` writes no validation set.
    pub validation: Option<Validation>,
    /// The training processes that will read the data.
    pub num_processes: usize,
    /// Output files per process (Horovod's `partitions_per_process`).
    pub partitions_per_process: usize,
    /// The dataset index in the store; `None` takes the next free one.
    pub dataset_idx: Option<usize>,
    /// Seed of the validation ratio split.
    pub seed: u64,
    /// Parquet compression codec: `snappy`, `zstd`, `lz4`, `gzip`, `brotli` or `none`.
    pub compression: String,
    /// Replace an existing dataset at `dataset_idx` (else refuse).
    pub overwrite: bool,
}

impl PrepareOptions {
    /// Options with Horovod's defaults: one process, 10 partitions per process, no
    /// validation, snappy, overwrite.
    pub fn new(feature_columns: Vec<String>, label_columns: Vec<String>) -> Self {
        Self {
            feature_columns,
            label_columns,
            sample_weight_col: None,
            validation: None,
            num_processes: 1,
            partitions_per_process: 10,
            dataset_idx: None,
            seed: 0,
            compression: "snappy".to_owned(),
            overwrite: true,
        }
    }

    /// The requested train file count, `num_processes × partitions_per_process`.
    pub fn num_files(&self) -> usize {
        self.num_processes
            .saturating_mul(self.partitions_per_process)
    }

    /// The output columns in order (features, labels, weight), each once.
    pub(crate) fn output_columns(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let all = self
            .feature_columns
            .iter()
            .chain(&self.label_columns)
            .chain(&self.sample_weight_col);
        for column in all {
            if !out.contains(column) {
                out.push(column.clone());
            }
        }
        out
    }

    /// Checks every argument that does not need the data.
    pub(crate) fn check(&self) -> Result<()> {
        let invalid = |message: String| Err(Error::InvalidArgument(message));
        if self.feature_columns.is_empty() {
            return invalid("feature_columns is empty; name at least one feature column".into());
        }
        if self.label_columns.is_empty() {
            return invalid("label_columns is empty; name at least one label column".into());
        }
        if self.num_processes == 0 {
            return invalid("num_processes must be at least 1".into());
        }
        if self.partitions_per_process == 0 {
            return invalid("partitions_per_process must be at least 1".into());
        }
        match &self.validation {
            Some(Validation::Ratio(r)) if !(0.0..1.0).contains(r) => {
                return invalid(format!(
                    "validation ratio {r} is outside [0, 1); pass e.g. validation=0.1 for 10% \
                     of the rows, or the name of a bool column"
                ));
            }
            Some(Validation::Column(c)) if self.output_columns().contains(c) => {
                return invalid(format!(
                    "validation column '{c}' is also a feature, label or sample weight column; \
                     the validation column is dropped from the output, so use a separate one"
                ));
            }
            _ => {}
        }
        self.codec().map(|_| ())
    }

    /// The Parquet codec named by `compression`.
    pub(crate) fn codec(&self) -> Result<Compression> {
        Ok(match self.compression.to_ascii_lowercase().as_str() {
            "snappy" => Compression::SNAPPY,
            "zstd" => Compression::ZSTD(ZstdLevel::default()),
            "lz4" => Compression::LZ4_RAW,
            "gzip" => Compression::GZIP(GzipLevel::default()),
            "brotli" => Compression::BROTLI(BrotliLevel::default()),
            "none" | "uncompressed" => Compression::UNCOMPRESSED,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "compression {other:?} is not supported; use one of snappy, zstd, lz4, \
                     gzip, brotli, none"
                )))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> PrepareOptions {
        PrepareOptions::new(vec!["a".into(), "b".into()], vec!["y".into(), "a".into()])
    }

    #[test]
    fn output_columns_keep_order_once() {
        let mut o = options();
        o.sample_weight_col = Some("w".into());
        assert_eq!(o.output_columns(), vec!["a", "b", "y", "w"]);
        assert_eq!(o.num_files(), 10);
    }

    #[test]
    fn bad_arguments_are_refused() {
        for ratio in [-0.1, 1.0, 1.5, f64::NAN] {
            let mut o = options();
            o.validation = Some(Validation::Ratio(ratio));
            let err = o.check().unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{ratio}: {err}");
        }
        let mut o = options();
        o.validation = Some(Validation::Column("b".into()));
        assert!(matches!(o.check(), Err(Error::InvalidArgument(_))));
        let mut o = options();
        o.compression = "lzo".into();
        assert!(o.check().unwrap_err().to_string().contains("lzo"));
        let mut o = options();
        o.num_processes = 0;
        assert!(o.check().is_err());
        let mut o = options();
        o.feature_columns.clear();
        assert!(o.check().is_err());
        options().check().unwrap();
    }
}
