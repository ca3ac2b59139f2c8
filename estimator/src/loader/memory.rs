//! The memory behind batch buffers, and the pool that reuses it.
//!
//! (Transparent huge pages for the 6 MiB windows were tried: the gather wrote them about a
//! tenth faster once warm, but a loader's first epoch, which must fault in its windows, got
//! slower; they are plain heap memory. Tried again with the split filling the windows
//! (session 21, `MADV_HUGEPAGE` on windows of 4 MiB and more, 6 interleaved pairs): later
//! epochs were faster in 4 pairs and took no less CPU per GB, first epochs were slower in 5.)

use std::sync::Mutex;

/// Zeroed memory for `n` values of `width` (1, 2, 4 or 8) bytes, aligned to 8 bytes.
#[derive(Debug)]
pub struct Storage {
    words: Vec<u64>,
    width: usize,
    n: usize,
}

/// Element types a [`Storage`] can be viewed as (plain integers: any bytes are a value).
pub trait Plain: Copy + sealed::Sealed {}
impl Plain for u8 {}
impl Plain for u16 {}
impl Plain for u32 {}
impl Plain for u64 {}
mod sealed {
    pub trait Sealed {}
    impl Sealed for u8 {}
    impl Sealed for u16 {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
}

impl Storage {
    /// Zeroed room for `n` values of `width` bytes.
    pub fn new(width: usize, n: usize) -> Self {
        Self {
            words: vec![0; (width * n).div_ceil(8)],
            width,
            n,
        }
    }

    /// Value width and count (what a pool matches buffers by).
    pub fn shape(&self) -> (usize, usize) {
        (self.width, self.n)
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> usize {
        self.width * self.n
    }

    /// Address of the first byte (valid while the storage lives; never null).
    pub fn as_ptr(&self) -> *const u8 {
        self.words.as_ptr().cast()
    }

    /// Mutable address of the first byte.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.words.as_mut_ptr().cast()
    }

    /// The values' bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the words hold at least `byte_len()` initialized bytes, borrowed with `self`.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.byte_len()) }
    }

    /// The values' bytes, to write.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.byte_len();
        // SAFETY: as in `bytes`, borrowed mutably with `self`.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), len) }
    }

    /// The values as `T` (of the storage's width).
    pub fn values<T: Plain>(&self) -> &[T] {
        assert_eq!(std::mem::size_of::<T>(), self.width, "value width");
        // SAFETY: the words are aligned to 8 bytes and hold `n` values of `T`'s size; every
        // bit pattern is a `T`.
        unsafe { std::slice::from_raw_parts(self.as_ptr().cast(), self.n) }
    }

    /// The values as `T`, to write.
    pub fn values_mut<T: Plain>(&mut self) -> &mut [T] {
        assert_eq!(std::mem::size_of::<T>(), self.width, "value width");
        let n = self.n;
        // SAFETY: as in `values`, borrowed mutably with `self`.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr().cast(), n) }
    }
}

/// Batch buffers given back (dropped) by their users, reused for later batches: no page
/// faults and no zeroing for fresh memory in the steady state.
#[derive(Debug)]
pub struct BufferPool {
    free: Mutex<Vec<Storage>>,
    /// The most buffers of one shape kept.
    per_shape: usize,
}

impl Default for BufferPool {
    fn default() -> Self {
        Self::new(8)
    }
}

impl BufferPool {
    /// A pool keeping up to `per_shape` buffers of each shape (as many as are alive at once).
    pub fn new(per_shape: usize) -> Self {
        Self {
            free: Mutex::new(Vec::new()),
            per_shape,
        }
    }

    /// Storage for `n` values of `width` bytes: a given-back one of that shape, or new.
    pub fn take(&self, width: usize, n: usize) -> Storage {
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            let found = free.iter().position(|s| s.shape() == (width, n));
            found.map(|i| free.swap_remove(i))
        };
        reused.unwrap_or_else(|| Storage::new(width, n))
    }

    /// Keeps `storage` for reuse (up to the pool's limit for its shape).
    pub fn give(&self, storage: Storage) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let shape = storage.shape();
        if free.iter().filter(|s| s.shape() == shape).count() < self.per_shape {
            free.push(storage);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_is_zeroed_aligned_and_typed() {
        for (width, n) in [(1usize, 3usize), (8, 5), (2, 3), (4, 1 << 20)] {
            let mut storage = Storage::new(width, n);
            assert_eq!(storage.byte_len(), width * n);
            assert!(storage.bytes().iter().all(|&b| b == 0));
            assert_eq!(storage.as_ptr() as usize % 8, 0);
            let last = storage.byte_len() - 1;
            storage.bytes_mut()[last] = 7;
            assert_eq!(storage.bytes()[last], 7);
        }
        let mut words = Storage::new(4, 3);
        words.values_mut::<u32>().copy_from_slice(&[1, 2, 3]);
        assert_eq!(words.values::<u32>(), &[1, 2, 3]);
        assert_eq!(words.bytes()[4..8], 2u32.to_ne_bytes());
    }

    #[test]
    #[should_panic(expected = "value width")]
    fn values_of_another_width_are_refused() {
        let _ = Storage::new(4, 2).values::<u64>();
    }

    #[test]
    fn the_pool_hands_back_storage_of_the_same_shape_up_to_its_limit() {
        let pool = BufferPool::new(2);
        let storage = pool.take(4, 1 << 20);
        let address = storage.as_ptr();
        pool.give(storage);
        assert_ne!(pool.take(8, 1 << 19).as_ptr(), address, "another shape");
        assert_eq!(pool.take(4, 1 << 20).as_ptr(), address);
        // Marked, so a kept buffer is told from a new (zeroed) one: the allocator may well
        // hand the dropped third buffer's address to the next new one.
        for _ in 0..3 {
            let mut storage = Storage::new(4, 16);
            storage.values_mut::<u32>().fill(7);
            pool.give(storage);
        }
        let again: Vec<Storage> = (0..3).map(|_| pool.take(4, 16)).collect();
        let kept = again
            .iter()
            .filter(|s| s.values::<u32>().iter().all(|&v| v == 7))
            .count();
        assert_eq!(kept, 2, "two kept");
        assert!(again
            .iter()
            .any(|s| s.values::<u32>().iter().all(|&v| v == 0)));
    }
}
