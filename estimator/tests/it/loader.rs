//! The loader and the metadata over Parquet files written with the parquet crate: several
//! files, uneven row groups, with and without offset indexes.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{
    ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, Int16Array, Int64Array, ListArray,
    RecordBatch, StringArray,
};
use arrow::datatypes::{DataType, Field, Float32Type, Schema};
use kolo_estimator::loader::{Batch, DType, Loader, LoaderOptions, Next};
use kolo_estimator::metadata::{ColumnProblem, Dataset, METADATA_FILE};
use kolo_estimator::Error;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

const ROWS: i64 = 301;

fn batch_of(ids: std::ops::Range<i64>) -> RecordBatch {
    let id: Vec<i64> = ids.clone().collect();
    let x: Vec<f32> = id.iter().map(|&i| i as f32 * 0.5).collect();
    let flag: Vec<bool> = id.iter().map(|&i| i % 3 == 0).collect();
    let v = ListArray::from_iter_primitive::<Float32Type, _, _>(id.iter().map(|&i| {
        Some(vec![
            Some(i as f32),
            Some(i as f32 + 0.25),
            Some(i as f32 + 0.5),
        ])
    }));
    let fixed_values: Vec<i16> = id
        .iter()
        .flat_map(|&i| [(i % 100) as i16, -((i % 100) as i16)])
        .collect();
    let fixed = FixedSizeListArray::new(
        Arc::new(Field::new("item", DataType::Int16, false)),
        2,
        Arc::new(Int16Array::from(fixed_values)),
        None,
    );
    let name = StringArray::from_iter_values(id.iter().map(|i| format!("row{i}")));
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("id", Arc::new(Int64Array::from(id))),
        ("x", Arc::new(Float32Array::from(x))),
        ("flag", Arc::new(BooleanArray::from(flag))),
        ("v", Arc::new(v)),
        ("fixed", Arc::new(fixed)),
        ("name", Arc::new(name)),
    ];
    let schema = Schema::new(
        columns
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), false))
            .collect::<Vec<_>>(),
    );
    RecordBatch::try_new(
        Arc::new(schema),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .unwrap()
}

fn write(path: &Path, batch: &RecordBatch, row_group: usize, offset_index: bool) {
    write_with(path, batch, row_group, offset_index, true);
}

/// Writes `batch` in row groups of `row_group` rows and pages of 7; `dictionary: false`
/// writes PLAIN pages (the loader's no-copy path).
fn write_with(
    path: &Path,
    batch: &RecordBatch,
    row_group: usize,
    offset_index: bool,
    dictionary: bool,
) {
    let props = WriterProperties::builder()
        .set_dictionary_enabled(dictionary)
        .set_max_row_group_row_count(Some(row_group))
        .set_data_page_row_count_limit(7)
        .set_write_batch_size(7)
        .set_offset_index_disabled(!offset_index)
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
    writer.write(batch).unwrap();
    writer.close().unwrap();
}

/// Three files (137, 163 and 1 rows; row groups of 50, 64 and 1 rows; the second without an
/// offset index) plus Spark's marker files.
fn dataset_dir() -> tempfile::TempDir {
    dataset_dir_with(true)
}

fn dataset_dir_with(dictionary: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        (0..137, 50, true),
        (137..300, 64, false),
        (300..ROWS, 1, true),
    ];
    for (i, (ids, row_group, offset_index)) in files.into_iter().enumerate() {
        let path = dir.path().join(format!("part-0000{i}.parquet"));
        write_with(&path, &batch_of(ids), row_group, offset_index, dictionary);
    }
    std::fs::write(dir.path().join("_SUCCESS"), b"").unwrap();
    std::fs::write(dir.path().join(".part-00000.parquet.crc"), b"crc").unwrap();
    dir
}

fn open(dir: &Path) -> Dataset {
    Dataset::open(dir.to_str().unwrap(), &Default::default()).unwrap()
}

fn options(columns: &[&str], batch: u64, rank: u32, size: u32, drop_last: bool) -> LoaderOptions {
    LoaderOptions {
        rank,
        size,
        drop_last,
        seed: 5,
        shuffle_buffer_size: Some(40),
        num_threads: Some(2),
        ..LoaderOptions::new(columns.iter().map(|c| c.to_string()).collect(), batch)
    }
}

fn next(loader: &mut Loader) -> Next {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match loader.next(Duration::from_millis(100)).unwrap() {
            Next::Pending => assert!(Instant::now() < deadline, "no batch within 30 s"),
            other => return other,
        }
    }
}

/// The values of scalar column `name` in `batch`, as i64 bits (8-byte dtypes).
fn column_u64(loader: &Loader, batch: &Batch, name: &str) -> Vec<u64> {
    let (g, group) = loader
        .groups()
        .iter()
        .enumerate()
        .find(|(_, g)| g.names.iter().any(|n| n == name))
        .unwrap();
    let k = group.names.iter().position(|n| n == name).unwrap();
    let values = batch.buffers[g].to_u64().unwrap();
    values[k * batch.rows..(k + 1) * batch.rows].to_vec()
}

/// The ids of the rest of the current epoch, batch by batch.
fn epoch_ids(loader: &mut Loader) -> Vec<Vec<i64>> {
    let mut batches = Vec::new();
    loop {
        match next(loader) {
            Next::Batch(batch) => batches.push(
                column_u64(loader, &batch, "id")
                    .iter()
                    .map(|&x| x as i64)
                    .collect(),
            ),
            Next::EndOfEpoch(_) | Next::Finished => return batches,
            Next::Pending => unreachable!(),
        }
    }
}

fn counts(ids: impl IntoIterator<Item = i64>) -> BTreeMap<i64, usize> {
    let mut map = BTreeMap::new();
    for id in ids {
        *map.entry(id).or_default() += 1;
    }
    map
}

#[test]
fn metadata_reads_footers_checks_arrays_and_caches() {
    let dir = dataset_dir();
    let dataset = open(dir.path());
    let rels: Vec<&str> = dataset.files().iter().map(|f| f.rel.as_str()).collect();
    assert_eq!(
        rels,
        [
            "part-00000.parquet",
            "part-00001.parquet",
            "part-00002.parquet"
        ]
    );
    let metadata = dataset.metadata().unwrap();
    assert_eq!(metadata.rows, ROWS as u64);
    assert_eq!(metadata.files[0].row_groups, vec![50, 50, 37]);
    assert_eq!(metadata.files[1].row_groups, vec![64, 64, 35]);
    let v = metadata.column("v").unwrap();
    assert_eq!(
        (v.dtype.as_deref(), v.shape.as_deref()),
        (Some("float32"), Some(&[3][..]))
    );
    let fixed = metadata.column("fixed").unwrap();
    assert_eq!(fixed.shape.as_deref(), Some(&[2][..]));
    assert_eq!(
        metadata.column("flag").unwrap().dtype.as_deref(),
        Some("bool")
    );
    assert!(matches!(
        metadata.column("name").unwrap().problem,
        Some(ColumnProblem::Unsupported { .. })
    ));
    assert!(dir.path().join(METADATA_FILE).exists());
    // The cache answers the second time; a changed dataset is described afresh.
    assert_eq!(open(dir.path()).metadata().unwrap(), metadata);
    write(
        &dir.path().join("part-00003.parquet"),
        &batch_of(ROWS..ROWS + 10),
        10,
        true,
    );
    let changed = open(dir.path());
    assert_ne!(changed.fingerprint(), dataset.fingerprint());
    assert_eq!(changed.metadata().unwrap().rows, ROWS as u64 + 10);
    // A single file is a dataset too.
    let single = open(&dir.path().join("part-00002.parquet"));
    assert_eq!(single.metadata().unwrap().rows, 1);
}

/// Issue 24: a cold start (no metadata cache) read every footer twice, once for the metadata
/// and once more in the loader. The dataset's readers are now shared: one footer read and one
/// open (mapping) per file, through the metadata scan and two epochs of a loader.
#[test]
fn a_cold_start_reads_each_footer_and_opens_each_file_once() {
    for dictionary in [false, true] {
        let dir = dataset_dir_with(dictionary);
        let dataset = open(dir.path());
        assert!(!dir.path().join(METADATA_FILE).exists(), "a cold start");
        let mut loader =
            Loader::open(&dataset, options(&["id", "x", "v"], 10, 0, 1, true)).unwrap();
        assert!(
            dir.path().join(METADATA_FILE).exists(),
            "the metadata was computed"
        );
        for _ in 0..2 {
            let ids: Vec<i64> = epoch_ids(&mut loader).concat();
            assert_eq!(ids.len(), 300);
        }
        // Every reader that touched the files: the dataset's, and the loader's if it has
        // others.
        let mut sets = vec![dataset.readers()];
        if !Arc::ptr_eq(loader.readers(), dataset.readers()) {
            sets.push(loader.readers());
        }
        assert_eq!(dataset.readers().len(), 3);
        for (i, file) in dataset.files().iter().enumerate() {
            let reads: usize = sets.iter().map(|s| s[i].footer_reads()).sum();
            let opens: usize = sets.iter().map(|s| s[i].opens()).sum();
            assert_eq!(reads, 1, "footer reads of {}", file.rel);
            assert_eq!(opens, 1, "opens of {}", file.rel);
        }
    }
}

#[test]
fn every_rank_gets_equal_batches_and_every_row_appears() {
    let dir = dataset_dir();
    let dataset = open(dir.path());
    for size in 1..=3u32 {
        for drop_last in [false, true] {
            let mut all = Vec::new();
            let mut batch_counts = Vec::new();
            for rank in 0..size {
                let mut loader =
                    Loader::open(&dataset, options(&["id", "x"], 16, rank, size, drop_last))
                        .unwrap();
                let batches = epoch_ids(&mut loader);
                assert_eq!(batches.len() as u64, loader.batches_per_epoch());
                batch_counts.push(batches.len());
                let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
                if drop_last {
                    assert!(sizes.iter().all(|&n| n == 16), "{sizes:?}");
                }
                all.extend(batches.into_iter().flatten());
            }
            assert!(
                batch_counts.iter().all(|&n| n == batch_counts[0]),
                "{batch_counts:?}"
            );
            let seen = counts(all.iter().copied());
            let per_rank = if drop_last {
                ROWS as usize / size as usize / 16 * 16
            } else {
                (ROWS as usize).div_ceil(size as usize)
            };
            assert_eq!(all.len(), per_rank * size as usize);
            if drop_last {
                assert!(seen.values().all(|&c| c == 1));
            } else {
                assert_eq!(seen.len(), ROWS as usize, "size {size}: a row is missing");
            }
        }
    }
}

#[test]
fn values_arrive_with_their_dtypes_and_shapes() {
    let dir = dataset_dir();
    let dataset = open(dir.path());
    let columns = ["id", "x", "flag", "v", "fixed"];
    let mut loader = Loader::open(&dataset, options(&columns, 32, 0, 1, false)).unwrap();
    let dtypes: Vec<(DType, Option<usize>)> = loader
        .groups()
        .iter()
        .map(|g| (g.dtype, g.array_len))
        .collect();
    assert_eq!(
        dtypes,
        vec![
            (DType::Int64, None),
            (DType::Float32, None),
            (DType::Bool, None),
            (DType::Float32, Some(3)),
            (DType::Int16, Some(2)),
        ]
    );
    let mut rows = 0;
    while let Next::Batch(batch) = next(&mut loader) {
        let ids: Vec<i64> = column_u64(&loader, &batch, "id")
            .iter()
            .map(|&x| x as i64)
            .collect();
        let x: Vec<f32> = le_f32(&batch.buffers[1].to_bytes());
        let flag = batch.buffers[2].to_bytes();
        let v = le_f32(&batch.buffers[3].to_bytes());
        let fixed: Vec<i16> = batch.buffers[4]
            .to_bytes()
            .chunks(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(batch.buffers[3].shape(), [batch.rows, 3]);
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(x[i], id as f32 * 0.5);
            assert_eq!(flag[i], u8::from(id % 3 == 0));
            assert_eq!(
                &v[i * 3..i * 3 + 3],
                &[id as f32, id as f32 + 0.25, id as f32 + 0.5]
            );
            assert_eq!(
                &fixed[i * 2..i * 2 + 2],
                &[(id % 100) as i16, -((id % 100) as i16)]
            );
        }
        rows += batch.rows;
    }
    assert_eq!(rows, ROWS as usize);
}

/// Every buffer of every batch of two epochs on `rank` of 2, as bytes with its shape.
fn epoch_bytes(dir: &Path, columns: &[&str], rank: u32) -> Vec<Vec<(Vec<u8>, [usize; 2])>> {
    let mut options = options(columns, 16, rank, 2, false);
    options.num_epochs = Some(2);
    let mut loader = Loader::open(&open(dir), options).unwrap();
    let mut batches = Vec::new();
    loop {
        match next(&mut loader) {
            Next::Batch(batch) => batches.push(
                batch
                    .buffers
                    .iter()
                    .map(|b| (b.to_bytes(), b.shape()))
                    .collect(),
            ),
            Next::EndOfEpoch(_) => {}
            Next::Finished => return batches,
            Next::Pending => unreachable!(),
        }
    }
}

#[test]
fn plain_pages_load_the_same_batches_as_decoded_ones() {
    // PLAIN pages are used without decoding (and, uncompressed, without copying); batches
    // inside a shuffle window are views of it, the others (windows of 40, batches of 16) are
    // copied together from two windows. All must match the Arrow reader's batches exactly.
    let plain = dataset_dir_with(false);
    let decoded = dataset_dir_with(true);
    let columns = ["x", "id", "v"];
    for rank in 0..2 {
        let fast = epoch_bytes(plain.path(), &columns, rank);
        let slow = epoch_bytes(decoded.path(), &columns, rank);
        assert_eq!(fast.len(), 20, "301 rows, 2 ranks, batches of 16, 2 epochs");
        assert_eq!(fast, slow);
    }
}

fn le_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn order_follows_seed_and_epoch_and_can_be_turned_off() {
    let dir = dataset_dir();
    let dataset = open(dir.path());
    let mut a = Loader::open(&dataset, options(&["id"], 10, 0, 1, true)).unwrap();
    let mut b = Loader::open(&dataset, options(&["id"], 10, 0, 1, true)).unwrap();
    let a0 = epoch_ids(&mut a);
    let a1 = epoch_ids(&mut a);
    assert_eq!(a0, epoch_ids(&mut b));
    assert_ne!(a0, a1);
    assert_eq!(a.epoch(), 2);
    let mut plain = options(&["id"], 10, 0, 1, false);
    plain.shuffle = false;
    let mut ordered = Loader::open(&dataset, plain).unwrap();
    let ids: Vec<i64> = epoch_ids(&mut ordered).into_iter().flatten().collect();
    assert_eq!(ids, (0..ROWS).collect::<Vec<_>>());
}

#[test]
fn resuming_continues_exactly_or_spreads_the_rest_over_new_ranks() {
    let dir = dataset_dir();
    let dataset = open(dir.path());
    let mut rest_of_old_ranks = Vec::new();
    let mut state = None;
    for rank in 0..2 {
        let mut loader = Loader::open(&dataset, options(&["id"], 8, rank, 2, false)).unwrap();
        epoch_ids(&mut loader); // epoch 0
        let mut taken = 0;
        while taken < 3 {
            if let Next::Batch(_) = next(&mut loader) {
                taken += 1;
            }
        }
        let saved = loader.state();
        assert_eq!((saved.epoch, saved.offset), (1, 24));
        let rest: Vec<i64> = epoch_ids(&mut loader).into_iter().flatten().collect();
        // Same size: the rest, exactly.
        let mut again = Loader::open(&dataset, options(&["id"], 8, rank, 2, false)).unwrap();
        again.load_state(&saved).unwrap();
        let resumed: Vec<i64> = epoch_ids(&mut again).into_iter().flatten().collect();
        assert_eq!(resumed, rest);
        rest_of_old_ranks.extend(rest);
        state = Some(saved);
    }
    // Three ranks: together the rows the two had left (254 rows: one wraps around).
    let state = state.unwrap();
    let mut resumed = Vec::new();
    let mut batch_counts = Vec::new();
    for rank in 0..3 {
        let mut loader = Loader::open(&dataset, options(&["id"], 8, rank, 3, false)).unwrap();
        loader.load_state(&state).unwrap();
        let batches = epoch_ids(&mut loader);
        batch_counts.push(batches.len());
        resumed.extend(batches.into_iter().flatten());
        assert_eq!(loader.epoch(), 2);
    }
    assert!(batch_counts.iter().all(|&n| n == batch_counts[0]));
    let want = counts(rest_of_old_ranks.iter().copied());
    let got = counts(resumed.iter().copied());
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    if rest_of_old_ranks.len() % 3 == 0 {
        assert_eq!(got, want);
    }
}

#[test]
fn a_changed_dataset_refuses_an_old_state() {
    let dir = dataset_dir();
    let mut loader = Loader::open(&open(dir.path()), options(&["id"], 8, 0, 1, true)).unwrap();
    next(&mut loader);
    let state = loader.state();
    write(
        &dir.path().join("part-00009.parquet"),
        &batch_of(0..5),
        5,
        true,
    );
    let mut other = Loader::open(&open(dir.path()), options(&["id"], 8, 0, 1, true)).unwrap();
    let err = other.load_state(&state).unwrap_err();
    assert!(matches!(err, Error::DatasetChanged { .. }), "{err}");
}

fn open_err(dir: &Path, columns: &[&str], batch: u64, size: u32) -> Error {
    match Dataset::open(dir.to_str().unwrap(), &Default::default())
        .and_then(|d| Loader::open(&d, options(columns, batch, 0, size, true)))
    {
        Ok(_) => panic!("opening {} with {columns:?} should fail", dir.display()),
        Err(err) => err,
    }
}

#[test]
fn bad_inputs_are_typed_and_named() {
    let dir = dataset_dir();
    let err = open_err(dir.path(), &["id", "nope"], 8, 1);
    assert!(
        matches!(
            err,
            Error::UnknownColumn { role: "selected", ref column, .. } if column == "nope"
        ),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.starts_with("selected column 'nope' is not in the dataset file://")
            && text.contains("available columns: id, ")
            && text.contains("fixed"),
        "{text}"
    );
    let err = open_err(dir.path(), &["name"], 8, 1);
    assert!(
        matches!(
            err,
            Error::UnsupportedColumn { role: "selected", ref column, .. } if column == "name"
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("selected column 'name' has type Utf8; strings must be encoded"),
        "{err}"
    );
    let err = open_err(dir.path(), &["id"], 200, 2);
    assert!(matches!(err, Error::TooFewRows { .. }), "{err}");
    assert!(err.to_string().contains("drop_last=False"), "{err}");

    let empty = tempfile::tempdir().unwrap();
    std::fs::write(empty.path().join("_SUCCESS"), b"").unwrap();
    let err = open_err(empty.path(), &["id"], 8, 1);
    assert!(matches!(err, Error::EmptyDataset { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.starts_with("the dataset file://")
            && text.contains("is empty (it holds no data files;")
            && text.ends_with("write Parquet files there first"),
        "{text}"
    );
    let err = open_err(&empty.path().join("missing"), &["id"], 8, 1);
    assert!(
        matches!(err, Error::DatasetNotFound { ref location } if location.ends_with("/missing")),
        "{err}"
    );
    assert!(err.to_string().contains("missing does not exist"), "{err}");
    write(
        &empty.path().join("part-0.parquet"),
        &batch_of(0..0),
        10,
        true,
    );
    let err = open_err(empty.path(), &["id"], 8, 1);
    assert!(matches!(err, Error::EmptyDataset { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("is empty (its 1 data file(s) hold no rows); write rows there first"),
        "{err}"
    );

    // Nulls and ragged arrays, named with their file.
    let bad = tempfile::tempdir().unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("y", DataType::Int64, true),
        Field::new(
            "v",
            DataType::List(Arc::new(Field::new("item", DataType::Float32, true))),
            true,
        ),
    ]));
    let good = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(vec![1, 2])),
            Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
                Some(vec![Some(1.0), Some(2.0)]),
                Some(vec![Some(1.0), Some(2.0)]),
            ])),
        ],
    )
    .unwrap();
    let broken = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(vec![Some(1), None])),
            Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
                Some(vec![Some(1.0), Some(2.0)]),
                Some(vec![Some(1.0)]),
            ])),
        ],
    )
    .unwrap();
    write(&bad.path().join("part-0.parquet"), &good, 10, true);
    write(&bad.path().join("part-1.parquet"), &broken, 10, true);
    let err = open_err(bad.path(), &["y"], 1, 1);
    assert!(
        matches!(
            err,
            Error::NullValues { ref column, count: 1, ref location, inside_lists: false }
                if column == "y" && location.ends_with("part-1.parquet")
        ),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.starts_with("column 'y' has 1 null value(s) in file://")
            && text.contains("part-1.parquet; tensors cannot hold missing values"),
        "{text}"
    );
    let err = open_err(bad.path(), &["v"], 1, 1);
    match &err {
        Error::RaggedColumn {
            file,
            expected,
            found,
            ..
        } => {
            assert!(file.contains("part-1"), "{err}");
            assert_eq!((*expected, *found), (2, 1));
        }
        other => panic!("{other}"),
    }
}

#[test]
fn a_decode_error_surfaces_on_next_and_dropping_stops_the_threads() {
    let dir = dataset_dir();
    let dataset = open(dir.path());
    let mut loader = Loader::open(&dataset, options(&["id"], 8, 0, 1, true)).unwrap();
    // Corrupt a data file after the metadata was read: the decode thread fails.
    let path = dir.path().join("part-00001.parquet");
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::write(&path, vec![0u8; len as usize]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let err = loop {
        match loader.next(Duration::from_millis(100)) {
            Ok(_) => assert!(Instant::now() < deadline, "the corrupt file was never read"),
            Err(err) => break err,
        }
    };
    assert!(matches!(err, Error::ReadParquet { .. }), "{err}");
    assert!(err.to_string().contains("part-00001"), "{err}");
    let fresh = dataset_dir();
    let mut loader = Loader::open(&open(fresh.path()), options(&["id"], 8, 0, 1, true)).unwrap();
    next(&mut loader);
    let started = Instant::now();
    drop(loader);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// Two files of three float32 columns (`a = id`, `b = 2 id + 0.5`, `c = -id`) and `id`,
/// in uneven row groups.
fn feature_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (i, ids, row_group) in [(0, 0..120i64, 50), (1, 120..301, 64)] {
        let id: Vec<i64> = ids.collect();
        let f = |k: f32, c: f32| -> ArrayRef {
            Arc::new(Float32Array::from(
                id.iter().map(|&i| i as f32 * k + c).collect::<Vec<_>>(),
            ))
        };
        let columns: Vec<(&str, ArrayRef)> = vec![
            ("a", f(1.0, 0.0)),
            ("b", f(2.0, 0.5)),
            ("c", f(-1.0, 0.0)),
            ("id", Arc::new(Int64Array::from(id.clone()))),
        ];
        let schema = Schema::new(
            columns
                .iter()
                .map(|(n, a)| Field::new(*n, a.data_type().clone(), false))
                .collect::<Vec<_>>(),
        );
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            columns.into_iter().map(|(_, a)| a).collect(),
        )
        .unwrap();
        let path = dir.path().join(format!("part-0000{i}.parquet"));
        write(&path, &batch, row_group, i == 0);
    }
    dir
}

#[test]
fn stack_hands_out_one_row_major_buffer_with_the_columns_values_in_the_same_order() {
    // Batches of 16 in windows of 40: some batches are views of a window, others are copied
    // from two; rank 1 of 2 without drop_last ends on a partial batch wrapping to row 0.
    let dir = feature_dir();
    let dataset = open(dir.path());
    let columns = ["a", "id", "b", "c"];
    let mut base = options(&columns, 16, 1, 2, false);
    base.num_epochs = Some(2);
    let mut stacked_options = base.clone();
    stacked_options.stack = true;
    let mut columnar = Loader::open(&dataset, base).unwrap();
    let mut stacked = Loader::open(&dataset, stacked_options).unwrap();
    assert_eq!(columnar.stack_group(), None);
    assert_eq!(stacked.stack_group(), Some(0));
    assert_eq!(stacked.groups()[0].names, ["a", "b", "c"]);
    let (mut batches, mut partial) = (0, 0);
    loop {
        match (next(&mut columnar), next(&mut stacked)) {
            (Next::Batch(want), Next::Batch(got)) => {
                assert_eq!(want.rows, got.rows);
                let rows = got.rows;
                assert_eq!(got.buffers[0].shape(), [rows, 3]);
                assert_eq!(got.buffers[0].dtype(), DType::Float32);
                assert_eq!(got.buffers[0].strides(), [12, 4], "C-contiguous");
                assert_eq!(want.buffers[0].shape(), [3, rows]);
                let by_column = le_f32(&want.buffers[0].to_bytes());
                let by_row = le_f32(&got.buffers[0].to_bytes());
                let ids = column_u64(&stacked, &got, "id");
                assert_eq!(ids, column_u64(&columnar, &want, "id"), "same order");
                for (r, &id) in ids.iter().enumerate() {
                    let id = id as f32;
                    assert_eq!(&by_row[r * 3..r * 3 + 3], &[id, 2.0 * id + 0.5, -id]);
                    for c in 0..3 {
                        assert_eq!(by_row[r * 3 + c], by_column[c * rows + r]);
                    }
                }
                batches += 1;
                partial += usize::from(rows < 16);
            }
            (Next::EndOfEpoch(a), Next::EndOfEpoch(b)) => assert_eq!(a, b),
            (Next::Finished, Next::Finished) => break,
            (a, b) => panic!("the loaders disagree: {a:?} vs {b:?}"),
        }
    }
    assert_eq!(
        batches, 20,
        "151 rows a rank: 9 batches of 16 and one of 7, twice"
    );
    assert_eq!(partial, 2);
}

/// Issue 24: an epoch started by gathering its first shuffle window on the assembler's thread
/// while the caller waited (a small dataset's epoch start, 2.8-3.2 ms). The next epoch's first
/// windows are now gathered ahead, while the last ones of the epoch before are handed out:
/// one window is gathered in line per start of the threads, not one per epoch, and every
/// epoch still hands out every row once, in the seed's order.
#[test]
fn the_next_epochs_first_windows_are_gathered_ahead() {
    let dir = dataset_dir();
    let dataset = open(dir.path());
    for (batch, window) in [(10, 40), (10, 300), (16, 20)] {
        let run = |epochs: usize| {
            let mut options = options(&["id"], batch, 0, 1, false);
            options.shuffle_buffer_size = Some(window);
            let mut loader = Loader::open(&dataset, options).unwrap();
            let ids: Vec<Vec<i64>> = (0..epochs)
                .map(|_| epoch_ids(&mut loader).concat())
                .collect();
            (loader.windows_gathered_inline(), ids)
        };
        let (inline, ids) = run(3);
        assert_eq!(
            inline, 1,
            "windows gathered in line, batch {batch} window {window}"
        );
        for epoch in &ids {
            let want: BTreeMap<i64, usize> = (0..ROWS).map(|i| (i, 1)).collect();
            assert_eq!(counts(epoch.iter().copied()), want, "every row once");
        }
        assert_ne!(ids[0], ids[1], "epochs are shuffled differently");
        // The same seed gives the same epochs (whatever was gathered ahead).
        assert_eq!(run(3).1, ids);
    }
}

#[test]
fn stack_without_a_scalar_column_is_a_typed_error() {
    let dir = dataset_dir();
    let mut options = options(&["v", "fixed"], 16, 0, 1, true);
    options.stack = true;
    match Loader::open(&open(dir.path()), options) {
        Err(Error::InvalidArgument(message)) => assert!(message.contains("stack"), "{message}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

/// Issue 24, item 5: bytes the loader writes per epoch. Plain, uncompressed pages of a local
/// file are gathered straight from the mapped file into the shuffle windows, and batches
/// inside a window are views of it: one pass, the logical bytes of the rank's rows exactly. A regression
/// into an extra copy (pages decoded or copied before the gather, batches copied out of the
/// window) shows here as 2x. Dictionary pages (decoded by the Arrow reader, then gathered)
/// and a row-major `stack` group (gathered, then transposed) are counted too: 2 passes.
#[test]
fn plain_uncompressed_files_are_copied_once_per_epoch() {
    let columns = ["id", "x", "v"];
    let row_bytes = 8 + 4 + 3 * 4;
    for (dictionary, stack, passes_over_id, passes_over_rest) in [
        (false, false, 1, 1),
        (true, false, 2, 2),
        (false, true, 2, 1),
    ] {
        let dir = dataset_dir_with(dictionary);
        let dataset = open(dir.path());
        for (batch, window) in [(10, 40), (16, 64), (300, 300)] {
            let mut options = options(&columns, batch, 0, 1, true);
            options.shuffle_buffer_size = Some(window);
            options.num_epochs = Some(3);
            options.stack = stack;
            let mut loader = Loader::open(&dataset, options).unwrap();
            let mut rows = 0u64;
            loop {
                match next(&mut loader) {
                    Next::Batch(batch) => rows += batch.rows as u64,
                    Next::EndOfEpoch(_) => {}
                    Next::Finished => break,
                    Next::Pending => unreachable!("next() waits"),
                }
            }
            assert_eq!(rows, 3 * loader.rows_per_epoch());
            // The rows of the windows the epoch's batches come from: with 300 of the 301 rows
            // handed out (drop_last), all 301 when the 301st shares a window with handed-out
            // rows (it is dropped after the shuffle), else 300.
            let windows = loader.rows_per_epoch().div_ceil(window);
            let gathered = 3 * (windows * window).min(ROWS as u64);
            assert_eq!(
                loader.bytes_copied(),
                gathered * (passes_over_id * 8 + passes_over_rest * (row_bytes - 8)),
                "bytes written over 3 epochs: dictionary {dictionary}, stack {stack}, \
                 batch {batch}, window {window}"
            );
        }
    }
}

/// Issue 24, item 5: every plain read mapped its pages in (`plain::map_in`) on the
/// decode threads, every epoch: in later epochs, with the file's page tables already filled,
/// only a page-table walk (0.03-0.07 CPU-s per GB of the decode threads at batch 4096). Each
/// row range is now mapped in on its first read only, and the epochs after read the same.
#[test]
fn pages_are_mapped_in_on_the_first_epoch_only() {
    let dir = dataset_dir_with(false);
    let dataset = open(dir.path());
    let run = |epochs: u64| {
        let mut options = options(&["id", "x", "v"], 10, 0, 1, true);
        options.shuffle_buffer_size = Some(40);
        options.num_epochs = Some(epochs);
        let mut loader = Loader::open(&dataset, options).unwrap();
        let ids: Vec<Vec<i64>> = (0..epochs)
            .map(|_| epoch_ids(&mut loader).concat())
            .collect();
        let populates: usize = loader.readers().iter().map(|r| r.populates()).sum();
        (populates, ids)
    };
    let (first, one) = run(1);
    assert!(first > 0, "the first epoch maps its pages in");
    let (after, three) = run(3);
    assert_eq!(
        after, first,
        "later epochs and loaders over the dataset do not again"
    );
    assert_eq!(three[0], one[0], "the same rows in the same order");
    for epoch in &three {
        // 300 of the 301 rows (drop_last), each once.
        let seen = counts(epoch.iter().copied());
        assert_eq!(epoch.len(), 300);
        assert!(seen.len() == 300 && seen.keys().all(|&id| (0..ROWS).contains(&id)));
    }
}
