//! Output batches: the layout of their buffers, shuffle windows over decoded chunks, and the
//! gather loops that copy window rows into batch buffers.
//!
//! Scalar columns of one dtype share one buffer shaped `[columns, rows]` (each column a
//! contiguous row of it), so a batch of a hundred feature columns is a handful of allocations
//! and Python views; every array column has its own `[rows, len]` buffer.

use std::sync::{Arc, Mutex};

use crate::loader::columns::DType;
use crate::loader::decode::{Chunk, ColumnSpec};

/// One output buffer of every batch: its columns, dtype and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// Names of its columns (one for an array column).
    pub names: Vec<String>,
    /// Indices of its columns in the selection.
    pub columns: Vec<usize>,
    /// Element dtype.
    pub dtype: DType,
    /// `Some(len)` for an array column (`[rows, len]`), `None` for stacked scalars
    /// (`[columns, rows]`).
    pub array_len: Option<usize>,
}

/// Groups the selected columns into output buffers: scalars by dtype (first appearance
/// order), then every array column alone, keeping the selection order within a kind.
pub fn layout(specs: &[ColumnSpec]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for (index, spec) in specs.iter().enumerate() {
        if spec.array {
            groups.push(Group {
                names: vec![spec.name.clone()],
                columns: vec![index],
                dtype: spec.dtype,
                array_len: Some(spec.len),
            });
            continue;
        }
        match groups
            .iter_mut()
            .find(|g| g.array_len.is_none() && g.dtype == spec.dtype)
        {
            Some(group) => {
                group.names.push(spec.name.clone());
                group.columns.push(index);
            }
            None => groups.push(Group {
                names: vec![spec.name.clone()],
                columns: vec![index],
                dtype: spec.dtype,
                array_len: None,
            }),
        }
    }
    groups
}

/// Typed storage of a batch buffer (typed so it is aligned for its dtype).
#[derive(Debug)]
enum Storage {
    W1(Vec<u8>),
    W2(Vec<u16>),
    W4(Vec<u32>),
    W8(Vec<u64>),
}

impl Storage {
    fn new(width: usize, n: usize) -> Self {
        match width {
            1 => Storage::W1(vec![0; n]),
            2 => Storage::W2(vec![0; n]),
            4 => Storage::W4(vec![0; n]),
            _ => Storage::W8(vec![0; n]),
        }
    }

    fn shape(&self) -> (usize, usize) {
        match self {
            Storage::W1(v) => (1, v.len()),
            Storage::W2(v) => (2, v.len()),
            Storage::W4(v) => (4, v.len()),
            Storage::W8(v) => (8, v.len()),
        }
    }
}

/// Batch buffers given back (dropped) by their users, reused for later batches: no page
/// faults and no zeroing for fresh memory in the steady state.
#[derive(Debug, Default)]
pub struct BufferPool {
    free: Mutex<Vec<Storage>>,
}

/// Most buffers a pool keeps, in all and of one shape.
const POOL_LIMIT: usize = 64;
const POOL_LIMIT_PER_SHAPE: usize = 8;

impl BufferPool {
    fn take(&self, width: usize, n: usize) -> Storage {
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            let found = free.iter().position(|s| s.shape() == (width, n));
            found.map(|i| free.swap_remove(i))
        };
        reused.unwrap_or_else(|| Storage::new(width, n))
    }

    fn give(&self, storage: Storage) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let shape = storage.shape();
        let same = free.iter().filter(|s| s.shape() == shape).count();
        if free.len() < POOL_LIMIT && same < POOL_LIMIT_PER_SHAPE {
            free.push(storage);
        }
    }
}

/// One buffer of a batch: C-contiguous, shaped `[columns, rows]` or `[rows, len]`. Dropping
/// it gives its memory back to its loader's pool.
#[derive(Debug)]
pub struct BatchBuffer {
    storage: Storage,
    pool: Option<Arc<BufferPool>>,
    /// Element dtype.
    pub dtype: DType,
    /// Shape (row-major).
    pub shape: [usize; 2],
}

impl Drop for BatchBuffer {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give(std::mem::replace(
                &mut self.storage,
                Storage::W1(Vec::new()),
            ));
        }
    }
}

impl BatchBuffer {
    fn from_pool(pool: &Arc<BufferPool>, dtype: DType, shape: [usize; 2]) -> Self {
        Self {
            storage: pool.take(dtype.width(), shape[0] * shape[1]),
            pool: Some(Arc::clone(pool)),
            dtype,
            shape,
        }
    }

    /// Address of the first element (valid while the buffer lives; never null).
    pub fn as_ptr(&self) -> *const u8 {
        match &self.storage {
            Storage::W1(v) => v.as_ptr(),
            Storage::W2(v) => v.as_ptr().cast(),
            Storage::W4(v) => v.as_ptr().cast(),
            Storage::W8(v) => v.as_ptr().cast(),
        }
    }

    /// Mutable address of the first element, for handing the buffer to another owner
    /// (numpy) that may write to it.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        match &mut self.storage {
            Storage::W1(v) => v.as_mut_ptr(),
            Storage::W2(v) => v.as_mut_ptr().cast(),
            Storage::W4(v) => v.as_mut_ptr().cast(),
            Storage::W8(v) => v.as_mut_ptr().cast(),
        }
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> usize {
        self.shape[0] * self.shape[1] * self.dtype.width()
    }

    /// The elements as little-endian bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        match &self.storage {
            Storage::W1(v) => v.clone(),
            Storage::W2(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Storage::W4(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Storage::W8(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    /// The elements of an 8-byte dtype as raw `u64` bits (tests and checks).
    pub fn as_u64(&self) -> Option<&[u64]> {
        match &self.storage {
            Storage::W8(v) => Some(v),
            _ => None,
        }
    }
}

/// One batch handed out: a buffer per [`Group`], in layout order.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The epoch it belongs to.
    pub epoch: u64,
    /// Rows in the batch.
    pub rows: usize,
    /// Rows of the epoch handed out once this batch is (the position to resume after it).
    pub end_offset: u64,
    /// Whether it is the epoch's last batch.
    pub last: bool,
    /// One buffer per group.
    pub buffers: Vec<Arc<BatchBuffer>>,
}

/// Rows of a decoded chunk that belong to a window.
#[derive(Debug, Clone)]
pub struct Segment {
    /// The chunk.
    pub chunk: Arc<Chunk>,
    /// First row of the chunk used.
    pub start: usize,
    /// Rows used.
    pub len: usize,
}

/// A shuffle window, materialized in output order: one buffer per group (`[columns, rows]` or
/// `[rows, len]`), so batches are contiguous copies out of it. Gathering a whole window one
/// column at a time keeps the column's source rows in cache, whatever the batch size.
#[derive(Debug)]
pub struct Window {
    buffers: Vec<BatchBuffer>,
    rows: usize,
}

impl Window {
    /// The window over `segments` (which hold exactly `permutation.len()` rows) whose output
    /// position `i` takes row `permutation[i]`.
    /// Columns are gathered on up to `threads` threads for windows of 1 MiB and more.
    pub fn new(
        segments: &[Segment],
        permutation: &[u32],
        groups: &[Group],
        pool: &Arc<BufferPool>,
        threads: usize,
    ) -> Self {
        let mut starts = Vec::with_capacity(segments.len());
        let mut total = 0u32;
        for segment in segments {
            starts.push(total);
            total += segment.len as u32;
        }
        let mut segment_of = Vec::with_capacity(permutation.len());
        let mut row_of = Vec::with_capacity(permutation.len());
        for &p in permutation {
            let s = starts.partition_point(|&start| start <= p) - 1;
            segment_of.push(s as u32);
            row_of.push((segments[s].start as u32) + (p - starts[s]));
        }
        let rows = permutation.len();
        let mut buffers = allocate(groups, rows, pool);
        let bytes: usize = buffers.iter().map(BatchBuffer::byte_len).sum();
        let mut tasks = Vec::new();
        for (group, buffer) in groups.iter().zip(buffers.iter_mut()) {
            let len = group.array_len.unwrap_or(1);
            let per_column = (rows * len).max(1);
            let columns = group.columns.iter().copied();
            match &mut buffer.storage {
                Storage::W1(v) => tasks.extend(
                    v.chunks_mut(per_column)
                        .zip(columns)
                        .map(|(dst, column)| (Target::W1(dst), column, len)),
                ),
                Storage::W2(v) => tasks.extend(
                    v.chunks_mut(per_column)
                        .zip(columns)
                        .map(|(dst, column)| (Target::W2(dst), column, len)),
                ),
                Storage::W4(v) => tasks.extend(
                    v.chunks_mut(per_column)
                        .zip(columns)
                        .map(|(dst, column)| (Target::W4(dst), column, len)),
                ),
                Storage::W8(v) => tasks.extend(
                    v.chunks_mut(per_column)
                        .zip(columns)
                        .map(|(dst, column)| (Target::W8(dst), column, len)),
                ),
            }
        }
        let threads = if bytes >= PARALLEL_WINDOW_BYTES {
            threads.clamp(1, tasks.len().max(1))
        } else {
            1
        };
        let run = |part: Vec<(Target<'_>, usize, usize)>| {
            for (target, column, len) in part {
                let sources = segments.iter().map(|s| &s.chunk.columns[column]);
                target.gather(len, sources, &segment_of, &row_of);
            }
        };
        if threads == 1 {
            run(tasks);
        } else {
            let mut parts: Vec<Vec<_>> = (0..threads).map(|_| Vec::new()).collect();
            for (i, task) in tasks.into_iter().enumerate() {
                parts[i % threads].push(task);
            }
            std::thread::scope(|scope| {
                for part in parts {
                    scope.spawn(|| run(part));
                }
            });
        }
        Self { buffers, rows }
    }

    /// Copies window positions `[from, from + n)` into rows `[at, at + n)` of `out` (one
    /// buffer per group of `groups`).
    pub fn copy_out(
        &self,
        groups: &[Group],
        out: &mut [BatchBuffer],
        from: usize,
        n: usize,
        at: usize,
    ) {
        for ((group, window), buffer) in groups.iter().zip(&self.buffers).zip(out.iter_mut()) {
            let layout = Copy {
                columns: group.columns.len(),
                len: group.array_len,
                src_rows: self.rows,
                dst_rows: buffer.shape[if group.array_len.is_some() { 0 } else { 1 }],
                from,
                n,
                at,
            };
            match (&window.storage, &mut buffer.storage) {
                (Storage::W1(src), Storage::W1(dst)) => layout.run(src, dst),
                (Storage::W2(src), Storage::W2(dst)) => layout.run(src, dst),
                (Storage::W4(src), Storage::W4(dst)) => layout.run(src, dst),
                (Storage::W8(src), Storage::W8(dst)) => layout.run(src, dst),
                _ => debug_assert!(
                    false,
                    "window and batch buffers of one group differ in dtype"
                ),
            }
        }
    }
}

/// Windows of at least this many bytes are gathered on several threads.
const PARALLEL_WINDOW_BYTES: usize = 1 << 20;

/// One column's part of a window buffer, typed.
enum Target<'a> {
    W1(&'a mut [u8]),
    W2(&'a mut [u16]),
    W4(&'a mut [u32]),
    W8(&'a mut [u64]),
}

impl Target<'_> {
    fn gather<'b>(
        self,
        len: usize,
        sources: impl Iterator<Item = &'b arrow::buffer::Buffer>,
        segment_of: &[u32],
        row_of: &[u32],
    ) {
        match self {
            Target::W1(dst) => gather_rows(dst, len, sources, segment_of, row_of),
            Target::W2(dst) => gather_rows(dst, len, sources, segment_of, row_of),
            Target::W4(dst) => gather_rows(dst, len, sources, segment_of, row_of),
            Target::W8(dst) => gather_rows(dst, len, sources, segment_of, row_of),
        }
    }
}

/// Rows `[from, from + n)` of a window buffer to rows `[at, at + n)` of a batch buffer.
struct Copy {
    columns: usize,
    len: Option<usize>,
    src_rows: usize,
    dst_rows: usize,
    from: usize,
    n: usize,
    at: usize,
}

impl Copy {
    fn run<T: std::marker::Copy>(&self, src: &[T], dst: &mut [T]) {
        match self.len {
            Some(len) => dst[self.at * len..(self.at + self.n) * len]
                .copy_from_slice(&src[self.from * len..(self.from + self.n) * len]),
            None => {
                for k in 0..self.columns {
                    let d = k * self.dst_rows + self.at;
                    let s = k * self.src_rows + self.from;
                    dst[d..d + self.n].copy_from_slice(&src[s..s + self.n]);
                }
            }
        }
    }
}

/// The buffers of a batch of `rows` rows (from `pool` when it has some of the right size;
/// their contents are stale until every row is gathered).
pub fn allocate(groups: &[Group], rows: usize, pool: &Arc<BufferPool>) -> Vec<BatchBuffer> {
    groups
        .iter()
        .map(|group| match group.array_len {
            Some(len) => BatchBuffer::from_pool(pool, group.dtype, [rows, len]),
            None => BatchBuffer::from_pool(pool, group.dtype, [group.columns.len(), rows]),
        })
        .collect()
}

/// `dst[i*len .. +len] = source(segment_of[i])[row_of[i]*len .. +len]` for every `i`.
fn gather_rows<'a, T: arrow::datatypes::ArrowNativeType>(
    dst: &mut [T],
    len: usize,
    sources: impl Iterator<Item = &'a arrow::buffer::Buffer>,
    segment_of: &[u32],
    row_of: &[u32],
) {
    let sources: smallvec_like::Sources<'_, T> = smallvec_like::Sources::new(sources);
    let n = row_of.len();
    let dst = &mut dst[..n * len];
    if sources.len() == 1 {
        let src = sources.get(0);
        if len == 1 {
            for (d, &r) in dst.iter_mut().zip(row_of) {
                *d = src[r as usize];
            }
        } else {
            for (d, &r) in dst.chunks_exact_mut(len).zip(row_of) {
                let r = r as usize * len;
                d.copy_from_slice(&src[r..r + len]);
            }
        }
        return;
    }
    if len == 1 {
        for ((d, &s), &r) in dst.iter_mut().zip(segment_of).zip(row_of) {
            *d = sources.get(s as usize)[r as usize];
        }
    } else {
        for ((d, &s), &r) in dst.chunks_exact_mut(len).zip(segment_of).zip(row_of) {
            let r = r as usize * len;
            d.copy_from_slice(&sources.get(s as usize)[r..r + len]);
        }
    }
}

/// The typed source slices of one column across a window's segments, without allocating for
/// the common one- and two-segment windows.
mod smallvec_like {
    use arrow::buffer::Buffer;
    use arrow::datatypes::ArrowNativeType;

    pub struct Sources<'a, T> {
        inline: [&'a [T]; 2],
        count: usize,
        spill: Vec<&'a [T]>,
    }

    impl<'a, T: ArrowNativeType> Sources<'a, T> {
        pub fn new(buffers: impl Iterator<Item = &'a Buffer>) -> Self {
            let mut out = Sources {
                inline: [&[], &[]],
                count: 0,
                spill: Vec::new(),
            };
            for buffer in buffers {
                let slice = buffer.typed_data::<T>();
                if out.count < 2 {
                    out.inline[out.count] = slice;
                } else {
                    if out.count == 2 {
                        out.spill.extend_from_slice(&out.inline);
                    }
                    out.spill.push(slice);
                }
                out.count += 1;
            }
            out
        }

        pub fn len(&self) -> usize {
            self.count
        }

        #[inline]
        pub fn get(&self, i: usize) -> &'a [T] {
            if self.count <= 2 {
                self.inline[i]
            } else {
                self.spill[i]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::buffer::Buffer;

    fn chunk(ids: Vec<i64>, vec_base: f32) -> Arc<Chunk> {
        let rows = ids.len();
        let x: Vec<f32> = ids.iter().map(|&i| i as f32 * 0.5).collect();
        let v: Vec<f32> = (0..rows * 2).map(|i| vec_base + i as f32).collect();
        Arc::new(Chunk {
            rows,
            columns: vec![
                Buffer::from_vec(ids),
                Buffer::from_vec(x),
                Buffer::from_vec(v),
            ],
        })
    }

    #[test]
    fn large_windows_gather_the_same_on_several_threads() {
        let specs = [
            ColumnSpec::for_test("id", DType::Int64, 1),
            ColumnSpec::for_test("x", DType::Float32, 1),
            ColumnSpec::for_test("v", DType::Float32, 2),
        ];
        let groups = layout(&specs);
        let n = 140_000usize;
        let a = chunk((0..n as i64).collect(), 0.0);
        let segments = vec![
            Segment {
                chunk: Arc::clone(&a),
                start: 0,
                len: n / 2,
            },
            Segment {
                chunk: a,
                start: n / 2,
                len: n / 2,
            },
        ];
        // A permutation: i -> i * 7919 mod n (7919 is prime and does not divide n).
        let permutation: Vec<u32> = (0..n).map(|i| ((i * 7919) % n) as u32).collect();
        let pool = Arc::new(BufferPool::default());
        let one = Window::new(&segments, &permutation, &groups, &pool, 1);
        let four = Window::new(&segments, &permutation, &groups, &pool, 4);
        let mut out_one = allocate(&groups, n, &pool);
        let mut out_four = allocate(&groups, n, &pool);
        one.copy_out(&groups, &mut out_one, 0, n, 0);
        four.copy_out(&groups, &mut out_four, 0, n, 0);
        for (x, y) in out_one.iter().zip(&out_four) {
            assert_eq!(x.to_bytes(), y.to_bytes());
        }
        let ids = out_one[0].as_u64().unwrap();
        assert!(ids
            .iter()
            .zip(&permutation)
            .all(|(&id, &p)| id == u64::from(p)));
    }

    #[test]
    fn layout_stacks_scalars_by_dtype() {
        let specs = [
            ColumnSpec::for_test("a", DType::Float32, 1),
            ColumnSpec::for_test("v", DType::Float32, 4),
            ColumnSpec::for_test("b", DType::Int64, 1),
            ColumnSpec::for_test("c", DType::Float32, 1),
        ];
        let groups = layout(&specs);
        assert_eq!(groups.len(), 3);
        assert_eq!(groups[0].names, ["a", "c"]);
        assert_eq!(groups[1].array_len, Some(4));
        assert_eq!(groups[2].names, ["b"]);
    }

    #[test]
    fn gather_follows_the_permutation_across_segments() {
        let specs = [
            ColumnSpec::for_test("id", DType::Int64, 1),
            ColumnSpec::for_test("x", DType::Float32, 1),
            ColumnSpec::for_test("v", DType::Float32, 2),
        ];
        let groups = layout(&specs);
        let a = chunk(vec![10, 11, 12], 0.0);
        let b = chunk(vec![20, 21], 100.0);
        let segments = vec![
            Segment {
                chunk: a,
                start: 1,
                len: 2,
            },
            Segment {
                chunk: b,
                start: 0,
                len: 2,
            },
        ];
        // Window rows: 11, 12, 20, 21.
        let pool = Arc::new(BufferPool::default());
        let window = Window::new(&segments, &[3, 0, 2, 1], &groups, &pool, 2);
        let mut out = allocate(&groups, 3, &pool);
        window.copy_out(&groups, &mut out, 1, 3, 0);
        let ids: Vec<i64> = out
            .iter()
            .find(|b| b.dtype == DType::Int64)
            .unwrap()
            .as_u64()
            .unwrap()
            .iter()
            .map(|&x| x as i64)
            .collect();
        assert_eq!(ids, vec![11, 20, 12]);
        let floats: Vec<f32> = out[1]
            .to_bytes()
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(floats, vec![5.5, 10.0, 6.0]);
        let v: Vec<f32> = out[2]
            .to_bytes()
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(v, vec![2.0, 3.0, 100.0, 101.0, 4.0, 5.0]);
        // Dropped buffers come back from the pool.
        let address = out[0].as_ptr();
        drop(window);
        drop(out);
        let again = allocate(&groups, 3, &pool);
        assert!(again.iter().any(|b| b.as_ptr() == address));
    }
}
