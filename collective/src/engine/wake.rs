//! Waking the engine thread when an op is submitted: a socket pair whose read end the engine
//! polls between cycles, together with its peers' connections, and a futex word for when it
//! sleeps on the shared-memory counters instead (see [`crate::transport::Watch`]).

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::transport::{futex_wake, WakeSignal};

/// The submitters' side writes one byte per wait of the engine (later notifications are free
/// until the engine re-arms); the engine's side polls and drains.
#[derive(Debug)]
pub(crate) struct Wake {
    sender: UnixStream,
    receiver: UnixStream,
    notified: AtomicBool,
    /// Bumped (and futex-woken) with every write.
    word: AtomicU32,
}

impl Wake {
    pub(crate) fn new() -> io::Result<Self> {
        let (sender, receiver) = UnixStream::pair()?;
        sender.set_nonblocking(true)?;
        receiver.set_nonblocking(true)?;
        Ok(Wake {
            sender,
            receiver,
            notified: AtomicBool::new(false),
            word: AtomicU32::new(0),
        })
    }

    /// Wakes the engine thread. Call after the work is visible to it (pushed to the inbox).
    pub(crate) fn notify(&self) {
        if !self.notified.swap(true, Ordering::AcqRel) {
            // A full socket buffer already wakes the engine; nothing else can go wrong that
            // the engine's cycle timer does not cover.
            let _ = (&self.sender).write(&[1]);
            self.word.fetch_add(1, Ordering::SeqCst);
            futex_wake(&self.word);
        }
    }

    /// Re-arms: later notifications write again. The engine calls this before it looks for
    /// work, so a notification either finds the work or wakes the next wait.
    /// Returns what the engine waits on until the next notification.
    pub(crate) fn rearm(&self) -> WakeSignal<'_> {
        self.notified.store(false, Ordering::SeqCst);
        let mut sink = [0u8; 64];
        while matches!((&self.receiver).read(&mut sink), Ok(n) if n > 0) {}
        WakeSignal {
            fd: self.fd(),
            word: &self.word,
            seen: self.word.load(Ordering::SeqCst),
        }
    }

    /// What the engine polls.
    pub(crate) fn fd(&self) -> RawFd {
        self.receiver.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::wait_readable;
    use std::time::Duration;

    #[test]
    fn notify_wakes_one_wait_until_rearmed() {
        let wake = Wake::new().unwrap();
        let idle = Duration::from_millis(20);
        assert_eq!(wait_readable(&[wake.fd()], idle).unwrap(), [false]);
        wake.notify();
        wake.notify();
        assert_eq!(wait_readable(&[wake.fd()], idle).unwrap(), [true]);
        wake.rearm();
        assert_eq!(wait_readable(&[wake.fd()], idle).unwrap(), [false]);
        wake.notify();
        assert_eq!(wait_readable(&[wake.fd()], idle).unwrap(), [true]);
    }
}
