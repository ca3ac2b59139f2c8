//! Waking the engine thread when an op is submitted: a socket pair whose read end the engine
//! polls between cycles, together with its peers' connections.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};

/// The submitters' side writes one byte per wait of the engine (later notifications are free
/// until the engine re-arms); the engine's side polls and drains.
#[derive(Debug)]
pub(crate) struct Wake {
    sender: UnixStream,
    receiver: UnixStream,
    notified: AtomicBool,
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
        })
    }

    /// Wakes the engine thread. Call after the work is visible to it (pushed to the inbox).
    pub(crate) fn notify(&self) {
        if !self.notified.swap(true, Ordering::AcqRel) {
            // A full socket buffer already wakes the engine; nothing else can go wrong that
            // the engine's cycle timer does not cover.
            let _ = (&self.sender).write(&[1]);
        }
    }

    /// Re-arms: later notifications write again. The engine calls this before it looks for
    /// work, so a notification either finds the work or wakes the next wait.
    pub(crate) fn rearm(&self) {
        self.notified.store(false, Ordering::Release);
        let mut sink = [0u8; 64];
        while matches!((&self.receiver).read(&mut sink), Ok(n) if n > 0) {}
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
