//! Output batches: the layout of their buffers, shuffle windows over decoded chunks, and the
//! gather loops that copy window rows into batch buffers.
//!
//! Scalar columns of one dtype share one buffer shaped `[columns, rows]` (each column a
//! contiguous row of it), so a batch of a hundred feature columns is a handful of allocations
//! and Python views; every array column has its own `[rows, len]` buffer.

use std::sync::Arc;

use crate::loader::columns::DType;
use crate::loader::decode::{Chunk, ColumnSpec};
use crate::loader::gather::{Column, Gather};
use crate::loader::memory::{BufferPool, Plain, Storage};
use crate::loader::split::{self, Split};

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
    /// (`[columns, rows]`, or `[rows, columns]` when `row_major`).
    pub array_len: Option<usize>,
    /// Stacked scalars gathered row-major, `[rows, columns]` (the `stack` option): windows
    /// hold them that way, so a batch inside one is a view of it, as for an array column.
    pub row_major: bool,
}

impl Group {
    /// Values per row in a row-major buffer (`[rows, len]`): the array length, or the
    /// number of columns of row-major stacked scalars; `None` for `[columns, rows]`.
    fn row_len(&self) -> Option<usize> {
        match self.array_len {
            Some(len) => Some(len),
            None if self.row_major => Some(self.columns.len()),
            None => None,
        }
    }

    /// Whether a window's [`Split`] fills its columns.
    fn splits(&self) -> bool {
        split::fills(self.dtype.width(), self.array_len.unwrap_or(1))
    }
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
                row_major: false,
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
                row_major: false,
            }),
        }
    }
    groups
}

/// One buffer of a window or batch: C-contiguous, shaped `[columns, rows]` or `[rows, len]`.
/// Dropping it gives its memory back to its loader's pool.
#[derive(Debug)]
pub struct BatchBuffer {
    storage: Storage,
    pool: Option<Arc<BufferPool>>,
    /// Element dtype.
    pub dtype: DType,
    /// Shape (row-major).
    pub shape: [usize; 2],
    /// Address of the first element once views hand it out.
    address: usize,
}

impl Drop for BatchBuffer {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give(std::mem::replace(&mut self.storage, Storage::new(1, 0)));
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
            address: 0,
        }
    }

    /// Address of the first element (valid while the buffer lives; never null).
    pub fn as_ptr(&self) -> *const u8 {
        self.storage.as_ptr()
    }

    /// Mutable address of the first element, for handing the buffer to another owner
    /// (numpy) that may write to it.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.storage.as_mut_ptr()
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> usize {
        self.storage.byte_len()
    }

    /// The filled buffer, shared by the views that hand it out (its address taken now, while
    /// it is exclusively owned).
    fn into_shared(mut self) -> Arc<Self> {
        self.address = self.as_mut_ptr() as usize;
        Arc::new(self)
    }

    /// The elements' bytes (in the machine's byte order).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.storage.bytes().to_vec()
    }
}

/// Rows `[from, from + rows)` of a window or batch buffer: one group of one batch. Batches
/// that lie inside one shuffle window are views of it (no copy); the window's memory returns
/// to the pool when its last view is dropped.
#[derive(Debug, Clone)]
pub struct BatchView {
    buffer: Arc<BatchBuffer>,
    /// Whether the buffer stacks scalar columns (`[columns, rows]`) rather than holding one
    /// array column (`[rows, len]`).
    stacked: bool,
    from: usize,
    rows: usize,
    /// Address of the buffer's first element, taken while it was exclusively owned.
    address: usize,
}

impl BatchView {
    /// A view of rows `[from, from + rows)` of `buffer`.
    fn new(buffer: Arc<BatchBuffer>, stacked: bool, from: usize, rows: usize) -> Self {
        let address = buffer.address;
        Self {
            buffer,
            stacked,
            from,
            rows,
            address,
        }
    }

    /// A view of all of `buffer`.
    fn whole(buffer: BatchBuffer, group: &Group) -> Self {
        let stacked = group.row_len().is_none();
        let rows = buffer.shape[usize::from(stacked)];
        Self::new(buffer.into_shared(), stacked, 0, rows)
    }

    /// Element dtype.
    pub fn dtype(&self) -> DType {
        self.buffer.dtype
    }

    /// Shape: `[columns, rows]` for stacked scalars, `[rows, len]` for an array column.
    pub fn shape(&self) -> [usize; 2] {
        let [a, b] = self.buffer.shape;
        if self.stacked {
            [a, self.rows]
        } else {
            [self.rows, b]
        }
    }

    /// Strides in bytes (the underlying buffer's row-major strides).
    pub fn strides(&self) -> [usize; 2] {
        let width = self.buffer.dtype.width();
        [self.buffer.shape[1] * width, width]
    }

    /// Address of the first element. The memory stays valid while the view lives and may be
    /// written through (numpy arrays are writable, as `torch.from_numpy` wants): views of one
    /// buffer never overlap, and nothing on the Rust side reads rows once a view hands them out.
    pub fn address(&self) -> usize {
        let row = if self.stacked {
            self.from
        } else {
            self.from * self.buffer.shape[1]
        };
        self.address + row * self.buffer.dtype.width()
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> usize {
        let [a, b] = self.shape();
        a * b * self.buffer.dtype.width()
    }

    /// The elements in row-major order (bytes in the machine's order).
    pub fn to_bytes(&self) -> Vec<u8> {
        let all = self.buffer.to_bytes();
        let width = self.buffer.dtype.width();
        let [stride, _] = self.strides();
        let [rows, cols] = self.shape();
        let start = self.address() - self.address;
        (0..rows)
            .flat_map(|r| {
                let at = start + r * stride;
                all[at..at + cols * width].to_vec()
            })
            .collect()
    }

    /// The elements of an 8-byte dtype as raw `u64` bits, row-major (tests and checks).
    pub fn to_u64(&self) -> Option<Vec<u64>> {
        (self.buffer.dtype.width() == 8).then(|| {
            self.to_bytes()
                .chunks_exact(8)
                .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default()))
                .collect()
        })
    }
}

/// Rows per block of [`transpose`]: a block's `[rows, columns]` output stays in cache while
/// each column's run of it is read.
const TRANSPOSE_BLOCK: usize = 64;

/// Writes `src`, `columns` runs of `rows` values (`[columns, rows]`), into `out` as
/// `[rows, columns]`.
fn transpose<T: Plain>(src: &[T], columns: usize, rows: usize, out: &mut [T]) {
    assert!(
        src.len() >= rows * columns && out.len() >= rows * columns,
        "transpose buffers too small"
    );
    for block in (0..rows).step_by(TRANSPOSE_BLOCK) {
        let end = rows.min(block + TRANSPOSE_BLOCK);
        for c in 0..columns {
            let values = &src[c * rows + block..c * rows + end];
            for (r, value) in values.iter().enumerate() {
                out[(block + r) * columns + c] = *value;
            }
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
    /// One view per group.
    pub buffers: Vec<BatchView>,
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
    buffers: Vec<Arc<BatchBuffer>>,
    rows: usize,
    /// Bytes written to fill it (its buffers, and the scratch of row-major groups).
    written: usize,
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
        let rows = permutation.len();
        let ranges: Vec<_> = segments
            .iter()
            .map(|s| s.start as u32..(s.start + s.len) as u32)
            .collect();
        let lens: Vec<usize> = segments.iter().map(|s| s.len).collect();
        let split = groups
            .iter()
            .any(Group::splits)
            .then(|| Split::new(permutation, &lens))
            .flatten();
        let (mut segment_of, mut row_of) = (Vec::new(), Vec::new());
        let gather = match split {
            // Every column splits: no per-position lists (two passes over the positions less).
            Some(split) if groups.iter().all(Group::splits) => Gather::split(&ranges, split),
            split => {
                segment_of.reserve(rows);
                row_of.reserve(rows);
                // Each batch's block of positions ascends: walk the segments forward, and
                // search again only where a position goes back (a binary search per position
                // cost as much as the window's shuffle).
                let (mut s, mut previous) = (0, 0);
                for &p in permutation {
                    if p < previous {
                        s = starts.partition_point(|&start| start <= p) - 1;
                    }
                    while starts.get(s + 1).is_some_and(|&next| next <= p) {
                        s += 1;
                    }
                    previous = p;
                    segment_of.push(s as u32);
                    row_of.push((segments[s].start as u32) + (p - starts[s]));
                }
                Gather::new(&segment_of, &row_of, &ranges, split)
            }
        };
        let mut buffers = allocate(groups, rows, pool);
        let bytes: usize = buffers.iter().map(BatchBuffer::byte_len).sum();
        let mut written = bytes;
        // Row-major stacked scalars are gathered column by column (the kernels' fast order)
        // into a scratch `[columns, rows]` buffer, then transposed into the window, here on a
        // gather thread rather than once per batch on the assembler's.
        let mut scratch: Vec<Option<Storage>> = groups
            .iter()
            .map(|g| {
                g.row_major
                    .then(|| pool.take(g.dtype.width(), g.columns.len() * rows))
            })
            .collect();
        // Per group, its columns (of one width and length, gathered a few at a time).
        let mut tasks: Vec<(Vec<Column<'_>>, usize, usize)> = Vec::new();
        for ((group, buffer), scratch) in groups.iter().zip(buffers.iter_mut()).zip(&mut scratch) {
            let len = group.array_len.unwrap_or(1);
            let width = group.dtype.width();
            let per_column = (rows * len * width).max(1);
            let dst = match scratch {
                Some(scratch) => scratch.bytes_mut(),
                None => buffer.storage.bytes_mut(),
            };
            let columns = dst
                .chunks_mut(per_column)
                .zip(&group.columns)
                .map(|(dst, &column)| Column {
                    dst,
                    sources: segments
                        .iter()
                        .map(|s| s.chunk.columns[column].as_slice())
                        .collect(),
                })
                .collect();
            tasks.push((columns, width, len));
        }
        let count: usize = tasks.iter().map(|(columns, ..)| columns.len()).sum();
        let threads = if bytes >= PARALLEL_WINDOW_BYTES {
            threads.clamp(1, count.max(1))
        } else {
            1
        };
        let run = |tasks: Vec<(Vec<Column<'_>>, usize, usize)>| {
            for (mut columns, width, len) in tasks {
                gather.run(width, len, &mut columns);
            }
        };
        if threads == 1 {
            run(tasks);
        } else {
            // Each thread takes every `threads`-th column of every group.
            let mut parts: Vec<Vec<_>> = (0..threads).map(|_| Vec::new()).collect();
            for (columns, width, len) in tasks {
                let mut split: Vec<Vec<Column<'_>>> = (0..threads).map(|_| Vec::new()).collect();
                for (i, column) in columns.into_iter().enumerate() {
                    split[i % threads].push(column);
                }
                for (part, columns) in parts.iter_mut().zip(split) {
                    part.push((columns, width, len));
                }
            }
            std::thread::scope(|scope| {
                for part in parts {
                    scope.spawn(|| run(part));
                }
            });
        }
        for ((group, buffer), scratch) in groups.iter().zip(buffers.iter_mut()).zip(scratch) {
            let Some(scratch) = scratch else {
                continue;
            };
            written += scratch.byte_len();
            let (columns, out) = (group.columns.len(), &mut buffer.storage);
            match group.dtype.width() {
                1 => transpose::<u8>(scratch.values(), columns, rows, out.values_mut()),
                2 => transpose::<u16>(scratch.values(), columns, rows, out.values_mut()),
                4 => transpose::<u32>(scratch.values(), columns, rows, out.values_mut()),
                _ => transpose::<u64>(scratch.values(), columns, rows, out.values_mut()),
            }
            pool.give(scratch);
        }
        let buffers = buffers.into_iter().map(BatchBuffer::into_shared).collect();
        Self {
            buffers,
            rows,
            written,
        }
    }

    /// Bytes written to fill the window: one pass over its rows (two for a row-major
    /// group: gathered by column, then transposed).
    pub fn bytes_written(&self) -> usize {
        self.written
    }

    /// Window positions `[from, from + n)` as views, one per group of `groups`.
    pub fn view(&self, groups: &[Group], from: usize, n: usize) -> Vec<BatchView> {
        groups
            .iter()
            .zip(&self.buffers)
            .map(|(group, buffer)| {
                BatchView::new(Arc::clone(buffer), group.row_len().is_none(), from, n)
            })
            .collect()
    }

    /// Copies window positions `[from, from + n)` into rows `[at, at + n)` of `out` (one
    /// buffer per group of `groups`); returns the bytes copied.
    pub fn copy_out(
        &self,
        groups: &[Group],
        out: &mut [BatchBuffer],
        from: usize,
        n: usize,
        at: usize,
    ) -> usize {
        let mut copied = 0;
        for ((group, window), buffer) in groups.iter().zip(&self.buffers).zip(out.iter_mut()) {
            let layout = Copy {
                columns: group.columns.len(),
                len: group.row_len(),
                src_rows: self.rows,
                dst_rows: buffer.shape[if group.row_len().is_some() { 0 } else { 1 }],
                from,
                n,
                at,
            };
            let (src, dst) = (&window.storage, &mut buffer.storage);
            match group.dtype.width() {
                1 => layout.run::<u8>(src.values(), dst.values_mut()),
                2 => layout.run::<u16>(src.values(), dst.values_mut()),
                4 => layout.run::<u32>(src.values(), dst.values_mut()),
                _ => layout.run::<u64>(src.values(), dst.values_mut()),
            }
            copied += n * group.row_len().unwrap_or(group.columns.len()) * group.dtype.width();
        }
        copied
    }
}

/// Windows of at least this many bytes are gathered on several threads.
const PARALLEL_WINDOW_BYTES: usize = 1 << 20;

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
    fn run<T: Plain>(&self, src: &[T], dst: &mut [T]) {
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
        .map(|group| match group.row_len() {
            Some(len) => BatchBuffer::from_pool(pool, group.dtype, [rows, len]),
            None => BatchBuffer::from_pool(pool, group.dtype, [group.columns.len(), rows]),
        })
        .collect()
}

/// Views of whole batch buffers made by [`allocate`] and filled.
pub fn whole_views(groups: &[Group], buffers: Vec<BatchBuffer>) -> Vec<BatchView> {
    buffers
        .into_iter()
        .zip(groups)
        .map(|(buffer, group)| BatchView::whole(buffer, group))
        .collect()
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
        // Views of the window hold the same rows as copies out of it.
        for (copy, view) in out_one.iter().zip(four.view(&groups, 0, n)) {
            assert_eq!(copy.to_bytes(), view.to_bytes());
        }
        let ids = whole_views(&groups, out_one)[0].to_u64().unwrap();
        assert!(ids
            .iter()
            .zip(&permutation)
            .all(|(&id, &p)| id == u64::from(p)));
    }

    /// Issue 24: with `stack`, every batch was transposed on the assembler's thread (108
    /// us a batch of 4096 rows, twice the unstacked loader). The window itself is now gathered
    /// row-major: a batch inside it is a view at its rows' offset (no copy), holding the same
    /// values as the `[columns, rows]` window, transposed; copies out of it agree too.
    #[test]
    fn row_major_windows_hand_out_views_of_the_transposed_rows() {
        let specs = [
            ColumnSpec::for_test("id", DType::Int64, 1),
            ColumnSpec::for_test("x", DType::Float32, 1),
            ColumnSpec::for_test("v", DType::Float32, 2),
            ColumnSpec::for_test("y", DType::Float32, 1),
        ];
        let columnar = layout(&specs);
        let mut stacked = columnar.clone();
        let g = stacked
            .iter()
            .position(|g| g.dtype == DType::Float32 && g.array_len.is_none());
        let g = g.unwrap();
        stacked[g].row_major = true;
        assert_eq!(stacked[g].names, ["x", "y"]);
        let n = 70_000usize;
        let a = chunk((0..n as i64).collect(), 0.0);
        let mut columns = a.columns.clone();
        columns.push(Buffer::from_vec(
            (0..n).map(|i| -(i as f32)).collect::<Vec<_>>(),
        ));
        let a = Arc::new(Chunk { rows: n, columns });
        let segments = vec![Segment {
            chunk: a,
            start: 0,
            len: n,
        }];
        let permutation: Vec<u32> = (0..n).map(|i| ((i * 7919) % n) as u32).collect();
        let pool = Arc::new(BufferPool::default());
        for threads in [1, 3] {
            let want = Window::new(&segments, &permutation, &columnar, &pool, threads);
            let got = Window::new(&segments, &permutation, &stacked, &pool, threads);
            let whole = got.view(&stacked, 0, n);
            for (from, rows) in [(0, 256), (256, 256), (n - 100, 100)] {
                let view = &got.view(&stacked, from, rows)[g];
                assert_eq!(view.shape(), [rows, 2]);
                assert_eq!(view.strides(), [8, 4], "C-contiguous rows of two f32");
                assert_eq!(
                    view.address(),
                    whole[g].address() + from * 8,
                    "a view of the window, not a copy"
                );
                let by_column = want.view(&columnar, from, rows)[g].to_bytes();
                let by_row = view.to_bytes();
                for r in 0..rows {
                    for c in 0..2 {
                        let at = |k: usize| by_column[k * 4..k * 4 + 4].to_vec();
                        assert_eq!(
                            by_row[(r * 2 + c) * 4..(r * 2 + c) * 4 + 4],
                            at(c * rows + r)
                        );
                    }
                }
                let mut out = allocate(&stacked, rows, &pool);
                got.copy_out(&stacked, &mut out, from, rows, 0);
                assert_eq!(out[g].to_bytes(), by_row, "copies agree with views");
                assert_eq!(out[g].shape, [rows, 2]);
            }
            // The other groups are as without stack.
            for k in (0..stacked.len()).filter(|&k| k != g) {
                assert_eq!(
                    whole[k].to_bytes(),
                    want.view(&columnar, 0, n)[k].to_bytes()
                );
            }
        }
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
        let views = window.view(&groups, 1, 3);
        let id_group = groups.iter().position(|g| g.dtype == DType::Int64).unwrap();
        let ids: Vec<i64> = views[id_group]
            .to_u64()
            .unwrap()
            .iter()
            .map(|&x| x as i64)
            .collect();
        assert_eq!(ids, vec![11, 20, 12]);
        assert_eq!(views[1].to_bytes(), out[1].to_bytes());
        assert_eq!(views[2].to_bytes(), out[2].to_bytes());
        assert_eq!(views[2].shape(), [3, 2], "three rows of two");
        assert_eq!(views[2].strides(), [8, 4]);
        assert_eq!(
            views[1].shape(),
            [1, 3],
            "one f32 scalar column, three rows"
        );
        assert_eq!(
            views[1].strides(),
            [16, 4],
            "a row of the 4-row window apart"
        );
        drop(views);
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
