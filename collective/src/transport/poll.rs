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

/// Blocks until one of `fds` is readable (data, end of stream, or an error) or `timeout`
/// passes (to the microsecond on Linux); returns which of them were (all false after a
/// timeout or an interrupted wait).
pub(crate) fn wait_readable(fds: &[RawFd], timeout: Duration) -> io::Result<Vec<bool>> {
    let mut polled: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let rc = poll_precisely(&mut polled, timeout)?;
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
        return Ok(vec![false; fds.len()]);
    }
    let ready = libc::POLLIN | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
    Ok(polled.iter().map(|p| p.revents & ready != 0).collect())
}

/// `poll(2)` with a timeout below a millisecond where the system has `ppoll` (the engine
/// waits for sub-millisecond pauses between submissions).
#[cfg(target_os = "linux")]
fn poll_precisely(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<libc::c_int> {
    let nfds = libc::nfds_t::try_from(fds.len())
        .map_err(|_| io::Error::other("too many sockets to poll"))?;
    let limit = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        // Below 1e9, so it fits every c_long.
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `fds` is a live, exclusively borrowed buffer of `nfds` initialized `pollfd`s for
    // the whole call (ppoll only writes their `revents` fields); `limit` is a valid timespec
    // that outlives the call; a null signal mask leaves the mask unchanged.
    Ok(unsafe { libc::ppoll(fds.as_mut_ptr(), nfds, &limit, std::ptr::null()) })
}

/// `poll(2)`; a timeout below a millisecond waits a millisecond.
#[cfg(not(target_os = "linux"))]
fn poll_precisely(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<libc::c_int> {
    let nfds = libc::nfds_t::try_from(fds.len())
        .map_err(|_| io::Error::other("too many sockets to poll"))?;
    let millis = libc::c_int::try_from(timeout.as_micros().div_ceil(1000).max(1))
        .unwrap_or(libc::c_int::MAX);
    // SAFETY: `fds` is a live, exclusively borrowed buffer of `nfds` initialized `pollfd`s for
    // the whole call; poll only writes their `revents` fields.
    Ok(unsafe { libc::poll(fds.as_mut_ptr(), nfds, millis) })
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

    #[test]
    fn wait_readable_reports_which_socket_is_ready() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        let (c, d) = std::os::unix::net::UnixStream::pair().unwrap();
        let fds = [b.as_raw_fd(), d.as_raw_fd()];
        let start = Instant::now();
        let ready = wait_readable(&fds, Duration::from_millis(50)).unwrap();
        assert_eq!(ready, [false, false]);
        assert!(start.elapsed() >= Duration::from_millis(40));
        (&c).write_all(b"x").unwrap();
        assert_eq!(
            wait_readable(&fds, Duration::from_secs(5)).unwrap(),
            [false, true]
        );
        a.write_all(b"y").unwrap();
        drop(c);
        let start = Instant::now();
        assert_eq!(
            wait_readable(&fds, Duration::from_secs(5)).unwrap(),
            [true, true]
        );
        assert!(start.elapsed() < Duration::from_secs(1));
    }
}
