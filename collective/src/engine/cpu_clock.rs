//! The CPU clocks the engine reads: this thread's and this process's (all its threads).

use std::time::Duration;

/// CPU time of the calling thread.
pub(crate) fn thread() -> Duration {
    read(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time of every thread of this process.
pub(crate) fn process() -> Duration {
    read(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn read(clock: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; both clocks exist on every Linux.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}
