//! Waiting on several sockets at once (`poll(2)`).

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// Readiness to wait for on one socket.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Interest {
    pub fd: RawFd,
    pub read: bool,
    pub write: bool,
}

/// Blocks until one of `interests` is ready or `timeout` passes. Readiness is not reported:
/// callers simply retry their non-blocking reads and writes. An interrupted wait returns early.
pub(crate) fn wait(interests: &[Interest], timeout: Duration) -> io::Result<()> {
    let mut fds: Vec<libc::pollfd> = interests
        .iter()
        .map(|i| libc::pollfd {
            fd: i.fd,
            events: (if i.read { libc::POLLIN } else { 0 })
                | (if i.write { libc::POLLOUT } else { 0 }),
            revents: 0,
        })
        .collect();
    let millis = libc::c_int::try_from(timeout.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
    let nfds = libc::nfds_t::try_from(fds.len())
        .map_err(|_| io::Error::other("too many sockets to poll"))?;
    // SAFETY: `fds` is a live, exclusively borrowed buffer of `nfds` initialized `pollfd`s for
    // the whole call; poll only writes their `revents` fields.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), nfds, millis) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::time::Instant;

    #[test]
    fn wait_returns_on_readiness_or_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        let start = Instant::now();
        wait(
            &[Interest {
                fd: b.as_raw_fd(),
                read: true,
                write: false,
            }],
            Duration::from_millis(50),
        )
        .unwrap();
        assert!(start.elapsed() >= Duration::from_millis(40));
        a.write_all(b"x").unwrap();
        let start = Instant::now();
        wait(
            &[Interest {
                fd: b.as_raw_fd(),
                read: true,
                write: false,
            }],
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(start.elapsed() < Duration::from_secs(1));
    }
}
