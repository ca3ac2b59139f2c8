//! `prepare_data` end to end on a local store: sources written with the parquet crate (and as
//! CSV), output read back file by file.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    ArrayRef, AsArray, BooleanArray, Float32Array, Float64Array, Int64Array, ListArray, StringArray,
};
use arrow::datatypes::{DataType, Field, Float32Type, Int64Type, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use kolo_estimator::prepare::{prepare_data, PrepareOptions, PreparedData, Source, Validation};
use kolo_estimator::Error;
use kolo_store::{Store, StoreOptions};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;

const ROWS: i64 = 1000;

fn schema() -> SchemaRef {
    let item = Arc::new(Field::new("item", DataType::Float32, true));
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("x", DataType::Float32, true),
        Field::new("v", DataType::List(item), true),
        Field::new("y", DataType::Int64, true),
        Field::new("w", DataType::Float64, true),
        Field::new("is_val", DataType::Boolean, true),
        Field::new("s", DataType::Utf8, true),
    ]))
}

/// Rows `start..end`: id, x = id/2, v = [id, id+1, id+2], y = id % 3, w = 1, every 4th row
/// marked for validation.
fn batch(start: i64, end: i64) -> RecordBatch {
    let ids: Vec<i64> = (start..end).collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids.clone())),
        Arc::new(Float32Array::from_iter_values(
            ids.iter().map(|&i| i as f32 / 2.0),
        )),
        Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(
            ids.iter()
                .map(|&i| Some((0..3).map(move |k| Some((i + k) as f32)))),
        )),
        Arc::new(Int64Array::from_iter_values(ids.iter().map(|i| i % 3))),
        Arc::new(Float64Array::from_iter_values(ids.iter().map(|_| 1.0))),
        Arc::new(BooleanArray::from_iter(
            ids.iter().map(|i| Some(i % 4 == 0)),
        )),
        Arc::new(StringArray::from_iter_values(
            ids.iter().map(|i| format!("r{i}")),
        )),
    ];
    RecordBatch::try_new(schema(), columns).unwrap()
}

fn write_parquet(path: &Path, batches: &[RecordBatch]) {
    let mut writer = ArrowWriter::try_new(File::create(path).unwrap(), schema(), None).unwrap();
    for b in batches {
        writer.write(b).unwrap();
    }
    writer.close().unwrap();
}

fn local_store(dir: &Path) -> Store {
    Store::open(dir.to_str().unwrap(), &StoreOptions::default()).unwrap()
}

fn paths(paths: &[&Path]) -> Source {
    Source::Paths {
        paths: paths
            .iter()
            .map(|p| p.to_str().unwrap().to_owned())
            .collect(),
        options: StoreOptions::default(),
    }
}

fn options(validation: Option<Validation>) -> PrepareOptions {
    let mut o = PrepareOptions::new(vec!["id".into(), "x".into(), "v".into()], vec!["y".into()]);
    o.sample_weight_col = Some("w".into());
    o.validation = validation;
    o.num_processes = 2;
    o.partitions_per_process = 3;
    o
}

fn run(store: &Store, source: Source, options: &PrepareOptions) -> Result<PreparedData, Error> {
    kolo_runtime::block_on(prepare_data(store, source, options)).unwrap()
}

fn local_dir(url: &str) -> PathBuf {
    PathBuf::from(url.strip_prefix("file://").unwrap())
}

/// The data files of an output directory, in name order, with their ids.
fn read_ids(dir: &Path) -> Vec<(String, Vec<i64>, SchemaRef)> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".parquet"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let file = File::open(dir.join(&name)).unwrap();
            let builder = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
            let schema = builder.schema().clone();
            let reader = builder.build().unwrap();
            let mut ids = Vec::new();
            for b in reader {
                let b = b.unwrap();
                ids.extend(
                    b.column(0)
                        .as_primitive::<Int64Type>()
                        .values()
                        .iter()
                        .copied(),
                );
            }
            (name, ids, schema)
        })
        .collect()
}

#[test]
fn ratio_split_is_balanced_complete_disjoint_and_seeded() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src.parquet");
    write_parquet(&src, &[batch(0, 300), batch(300, ROWS)]);
    let store = local_store(&tmp.path().join("store"));

    let prepared = run(
        &store,
        paths(&[&src]),
        &options(Some(Validation::Ratio(0.25))),
    )
    .unwrap();
    assert_eq!(prepared.dataset_idx, 0);
    assert_eq!(prepared.train_rows + prepared.val_rows, ROWS as u64);
    assert!(
        (150..350).contains(&prepared.val_rows),
        "{}",
        prepared.val_rows
    );
    assert_eq!(prepared.train_files, 6);
    assert_eq!(prepared.val_files, 2, "max(6 * share, num_processes)");

    let train_dir = local_dir(&prepared.train_url);
    let val_dir = local_dir(prepared.val_url.as_deref().unwrap());
    assert!(train_dir.ends_with("intermediate_train_data.0"));
    assert!(val_dir.ends_with("intermediate_val_data.0"));
    assert!(train_dir.join("_SUCCESS").exists() && val_dir.join("_SUCCESS").exists());
    let train = read_ids(&train_dir);
    let val = read_ids(&val_dir);
    let names: Vec<&str> = train.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(
        names,
        (0..6)
            .map(|i| format!("part-{i:05}.parquet"))
            .collect::<Vec<_>>()
    );
    let sizes: Vec<usize> = train.iter().map(|(_, ids, _)| ids.len()).collect();
    assert!(
        sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1,
        "{sizes:?}"
    );
    let columns: Vec<String> = train[0]
        .2
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(columns, ["id", "x", "v", "y", "w"]);

    let train_ids: BTreeSet<i64> = train.iter().flat_map(|(_, ids, _)| ids.clone()).collect();
    let val_ids: BTreeSet<i64> = val.iter().flat_map(|(_, ids, _)| ids.clone()).collect();
    assert!(train_ids.is_disjoint(&val_ids));
    assert_eq!(train_ids.len() + val_ids.len(), ROWS as usize);
    assert_eq!(val_ids.len() as u64, prepared.val_rows);

    let shapes: Vec<_> = prepared
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.dtype.as_str()))
        .collect();
    assert_eq!(
        shapes,
        [
            ("id", "int64"),
            ("x", "float32"),
            ("v", "float32"),
            ("y", "int64"),
            ("w", "float64")
        ]
    );
    assert_eq!(prepared.columns[2].shape, vec![Some(3)]);

    // Same seed: the same split, file by file. Another seed: another split.
    let again = run(
        &store,
        paths(&[&src]),
        &options(Some(Validation::Ratio(0.25))),
    )
    .unwrap();
    assert_eq!(again.dataset_idx, 1, "None takes the next free index");
    let again_train = read_ids(&local_dir(&again.train_url));
    assert_eq!(
        train.iter().map(|t| &t.1).collect::<Vec<_>>(),
        again_train.iter().map(|t| &t.1).collect::<Vec<_>>()
    );
    let mut reseeded = options(Some(Validation::Ratio(0.25)));
    reseeded.seed = 99;
    reseeded.dataset_idx = Some(7);
    let other = run(&store, paths(&[&src]), &reseeded).unwrap();
    assert_eq!(other.dataset_idx, 7);
    let other_val: BTreeSet<i64> = read_ids(&local_dir(other.val_url.as_deref().unwrap()))
        .into_iter()
        .flat_map(|(_, ids, _)| ids)
        .collect();
    assert_ne!(other_val, val_ids);
}

#[test]
fn column_split_csv_and_in_memory_sources() {
    let tmp = tempfile::tempdir().unwrap();
    let store = local_store(&tmp.path().join("store"));

    // In memory, split by column: every 4th row is validation, the column is dropped.
    let source = Source::Batches {
        schema: schema(),
        batches: vec![batch(0, 500), batch(500, ROWS)],
    };
    let prepared = run(
        &store,
        source,
        &options(Some(Validation::Column("is_val".into()))),
    )
    .unwrap();
    assert_eq!(prepared.val_rows, 250);
    let val = read_ids(&local_dir(prepared.val_url.as_deref().unwrap()));
    assert!(val.iter().all(|(_, ids, _)| ids.iter().all(|i| i % 4 == 0)));
    assert!(val[0].2.field_with_name("is_val").is_err());

    // CSV with a header, no validation.
    let csv = tmp.path().join("src.csv");
    let mut text = String::from("id,x,label\n");
    for i in 0..23 {
        text.push_str(&format!("{i},{}.5,{}\n", i, i % 2));
    }
    std::fs::write(&csv, text).unwrap();
    let mut o = PrepareOptions::new(vec!["id".into(), "x".into()], vec!["label".into()]);
    o.num_processes = 2;
    o.partitions_per_process = 2;
    let prepared = run(&store, paths(&[&csv]), &o).unwrap();
    assert_eq!(
        (prepared.train_rows, prepared.val_rows, prepared.train_files),
        (23, 0, 4)
    );
    assert!(prepared.val_url.is_none());
    let train = read_ids(&local_dir(&prepared.train_url));
    let sizes: Vec<usize> = train.iter().map(|t| t.1.len()).collect();
    assert_eq!(sizes, [6, 6, 6, 5]);
    let all: Vec<i64> = train.into_iter().flat_map(|t| t.1).collect();
    assert_eq!(all, (0..23).collect::<Vec<_>>(), "scan order is kept");

    // Fewer rows than files: one row per file.
    let few = Source::Batches {
        schema: schema(),
        batches: vec![batch(0, 4)],
    };
    let prepared = run(&store, few, &options(None)).unwrap();
    assert_eq!(prepared.train_files, 4);
}

#[test]
fn directories_of_parquet_are_read_in_name_order() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("dataset");
    std::fs::create_dir(&dir).unwrap();
    write_parquet(&dir.join("part-1.parquet"), &[batch(100, 200)]);
    write_parquet(&dir.join("part-0.parquet"), &[batch(0, 100)]);
    std::fs::write(dir.join("_SUCCESS"), b"").unwrap();
    let store = local_store(&tmp.path().join("store"));
    let mut o = options(None);
    o.num_processes = 1;
    o.partitions_per_process = 1;
    let prepared = run(&store, paths(&[&dir]), &o).unwrap();
    let all: Vec<i64> = read_ids(&local_dir(&prepared.train_url))
        .into_iter()
        .flat_map(|t| t.1)
        .collect();
    assert_eq!(all, (0..200).collect::<Vec<_>>());
}

#[test]
fn bad_inputs_are_refused_with_typed_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src.parquet");
    write_parquet(&src, &[batch(0, 50)]);
    let store = local_store(&tmp.path().join("store"));

    let mut o = options(None);
    o.feature_columns.push("nope".into());
    let err = run(&store, paths(&[&src]), &o).unwrap_err();
    assert!(
        matches!(err, Error::UnknownColumn { role: "feature", ref column, .. } if column == "nope"),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.starts_with("feature column 'nope' is not in the source (")
            && text.contains("src.parquet); available columns: id, x, v, y, w, is_val, s"),
        "{text}"
    );

    let mut o = options(None);
    o.label_columns = vec!["s".into()];
    let err = run(&store, paths(&[&src]), &o).unwrap_err();
    assert!(
        matches!(err, Error::UnsupportedColumn { role: "label", ref column, .. } if column == "s"),
        "{err}"
    );
    // DataFusion reads Parquet strings as Utf8View.
    assert!(
        err.to_string()
            .starts_with("label column 's' has type Utf8View; strings must be encoded"),
        "{err}"
    );

    let err = run(
        &store,
        paths(&[&tmp.path().join("missing.parquet")]),
        &options(None),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DatasetNotFound { ref location } if location.ends_with("missing.parquet")
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("missing.parquet does not exist"),
        "{err}"
    );

    let empty = Source::Batches {
        schema: schema(),
        batches: vec![],
    };
    let err = run(&store, empty, &options(None)).unwrap_err();
    assert!(matches!(err, Error::EmptyDataset { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "the source (the in-memory table) is empty (it has no rows); check the path and that \
         the files hold data"
    );

    let err = run(
        &store,
        paths(&[&src]),
        &options(Some(Validation::Ratio(1.0))),
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");

    // Nulls in a label column.
    let with_nulls = batch(0, 10);
    let mut columns = with_nulls.columns().to_vec();
    columns[3] = Arc::new(Int64Array::from(vec![
        Some(1),
        None,
        Some(2),
        None,
        Some(0),
        Some(1),
        Some(1),
        Some(1),
        Some(1),
        Some(1),
    ]));
    let source = Source::Batches {
        schema: schema(),
        batches: vec![RecordBatch::try_new(schema(), columns).unwrap()],
    };
    let err = run(&store, source, &options(None)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NullValues { ref column, count: 2, inside_lists: false, .. } if column == "y"
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("column 'y' has 2 null value(s) in the in-memory table;"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(tmp.path().join("store"))
            .map(|d| d.count())
            .unwrap_or(0),
        0
    );

    // Overwrite semantics.
    let mut o = options(None);
    o.dataset_idx = Some(3);
    run(&store, paths(&[&src]), &o).unwrap();
    o.overwrite = false;
    let err = run(&store, paths(&[&src]), &o).unwrap_err();
    assert!(matches!(err, Error::OutputExists { .. }), "{err}");
    assert!(
        err.to_string().contains("intermediate_train_data.3"),
        "{err}"
    );
    o.overwrite = true;
    o.partitions_per_process = 1;
    let prepared = run(&store, paths(&[&src]), &o).unwrap();
    assert_eq!(
        read_ids(&local_dir(&prepared.train_url)).len(),
        2,
        "old files are gone"
    );
}

#[test]
fn arrow_c_stream_sources_are_taken_over() {
    use arrow::ffi_stream::FFI_ArrowArrayStream;
    use arrow::record_batch::RecordBatchIterator;

    let reader = RecordBatchIterator::new(vec![Ok(batch(0, 40)), Ok(batch(40, 90))], schema());
    let mut stream = FFI_ArrowArrayStream::new(Box::new(reader));
    // SAFETY: `stream` is a valid, unreleased stream that nothing else uses afterwards.
    let source =
        unsafe { Source::from_arrow_c_stream((&mut stream as *mut FFI_ArrowArrayStream).cast()) }
            .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let store = local_store(tmp.path());
    let prepared = run(&store, source, &options(None)).unwrap();
    assert_eq!(prepared.train_rows, 90);
    let all: BTreeSet<i64> = read_ids(&local_dir(&prepared.train_url))
        .into_iter()
        .flat_map(|t| t.1)
        .collect();
    assert_eq!(all, (0..90).collect());
}
