//! Network helpers shared by workers and launchers: this machine's hostname, the local IP that
//! reaches a given address, and network interface names.

use std::ffi::CStr;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};

use crate::error::{Error, Result};

/// This machine's hostname as the kernel reports it (`gethostname`); `"localhost"` if it
/// cannot be read.
pub fn system_hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes; gethostname writes at most that
    // many and we terminate the buffer ourselves below.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return "localhost".to_owned();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len() - 1);
    match String::from_utf8_lossy(&buf[..end]).trim() {
        "" => "localhost".to_owned(),
        name => name.to_owned(),
    }
}

/// Resolves `host:port` to its first socket address.
pub fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .map_err(|err| Error::Config(format!("cannot resolve {addr:?}: {err}")))?
        .next()
        .ok_or_else(|| Error::Config(format!("{addr:?} resolves to no address")))
}

/// The local IP of the interface the kernel would use to reach `addr` (`host:port`); sends
/// nothing (a connected UDP socket only picks a route).
pub fn local_ip_toward(addr: &str) -> Result<IpAddr> {
    let target = resolve(addr)?;
    let bind: SocketAddr = match target {
        SocketAddr::V4(_) => ([0, 0, 0, 0], 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(bind)?;
    socket.connect(target)?;
    Ok(socket.local_addr()?.ip())
}

/// The IPv4 address (else the first IPv6 address) of the network interface `name`, `None` if
/// no interface has that name or it has no address.
pub fn interface_ip(name: &str) -> Result<Option<IpAddr>> {
    let mut found: Option<IpAddr> = None;
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a pointer to a list it allocates; we free it below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let mut cursor = list;
    while !cursor.is_null() {
        // SAFETY: `cursor` is a non-null node of the list getifaddrs returned, not yet freed.
        let entry = unsafe { &*cursor };
        cursor = entry.ifa_next;
        if entry.ifa_name.is_null() || entry.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let entry_name = unsafe { CStr::from_ptr(entry.ifa_name) };
        if entry_name.to_bytes() != name.as_bytes() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to a sockaddr whose family says its type.
        let family = i32::from(unsafe { (*entry.ifa_addr).sa_family });
        let ip = match family {
            libc::AF_INET => {
                // SAFETY: the family is AF_INET, so the sockaddr is a sockaddr_in.
                let addr = unsafe { &*entry.ifa_addr.cast::<libc::sockaddr_in>() };
                Some(IpAddr::from(addr.sin_addr.s_addr.to_ne_bytes()))
            }
            libc::AF_INET6 => {
                // SAFETY: the family is AF_INET6, so the sockaddr is a sockaddr_in6.
                let addr = unsafe { &*entry.ifa_addr.cast::<libc::sockaddr_in6>() };
                Some(IpAddr::from(addr.sin6_addr.s6_addr))
            }
            _ => None,
        };
        match (ip, found) {
            (Some(ip @ IpAddr::V4(_)), _) => {
                found = Some(ip);
                break;
            }
            (Some(ip), None) => found = Some(ip),
            _ => {}
        }
    }
    // SAFETY: `list` came from a successful getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(list) };
    Ok(found)
}

/// An IP address given literally, or the address of the interface with that name; the error
/// names `what` (the flag or variable).
pub fn resolve_nic_or_ip(value: &str, what: &str) -> Result<IpAddr> {
    let value = value.trim();
    if let Ok(ip) = value.parse::<IpAddr>() {
        return Ok(ip);
    }
    interface_ip(value)?.ok_or_else(|| {
        Error::Config(format!(
            "{what}={value:?} is neither an IP address nor the name of a network interface with \
             an address on this host"
        ))
    })
}

/// How many connections the kernel may hold for a listener before it accepts them (clamped to
/// `net.core.somaxconn`, 4096 by default on Linux 5.4+). The standard library's 128 overflows
/// when a thousand workers connect at once: the kernel then drops their SYNs and each one
/// retries only after a second.
pub const LISTEN_BACKLOG: i32 = 4096;

/// A listening TCP socket on `addr` (`SO_REUSEADDR`, as the standard library sets) with a
/// backlog of [`LISTEN_BACKLOG`], for servers that a whole job connects to at once.
pub fn listen(addr: SocketAddr) -> Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

/// True when `value` is an IP address literal (as opposed to an interface name).
pub fn is_ip_literal(value: &str) -> bool {
    value.trim().parse::<IpAddr>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostname_is_not_empty() {
        assert!(!system_hostname().is_empty());
    }

    #[test]
    fn loopback_reaches_loopback() {
        assert_eq!(
            local_ip_toward("127.0.0.1:9").unwrap(),
            IpAddr::from([127, 0, 0, 1])
        );
    }

    #[test]
    fn a_thousand_connections_wait_for_accept_without_a_dropped_syn() {
        const CONNECTIONS: usize = 1_000;
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit with a valid rlimit; the soft limit stays within the hard.
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
            let needed = (CONNECTIONS + 256) as libc::rlim_t;
            assert!(
                limit.rlim_max >= needed,
                "this test needs {needed} open files; the hard limit (ulimit -Hn) is {}",
                limit.rlim_max
            );
            if limit.rlim_cur < needed {
                limit.rlim_cur = needed;
                assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
            }
        }
        let listener = listen(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let addr = listener.local_addr().unwrap();
        // Nobody accepts: every connection must complete in the kernel's accept queue (a full
        // queue drops the SYN, and the connect hangs until its first retry after 1 s).
        let connected = kolo_runtime::block_on(async move {
            let attempts: Vec<_> = (0..CONNECTIONS)
                .map(|_| {
                    tokio::spawn(tokio::time::timeout(
                        std::time::Duration::from_millis(900),
                        tokio::net::TcpStream::connect(addr),
                    ))
                })
                .collect();
            let mut streams = Vec::new();
            for attempt in attempts {
                if let Ok(Ok(stream)) = attempt.await.unwrap() {
                    streams.push(stream);
                }
            }
            streams.len()
        })
        .unwrap();
        drop(listener);
        assert_eq!(
            connected, CONNECTIONS,
            "connections completed before accept"
        );
    }

    #[test]
    fn nic_or_ip() {
        assert_eq!(
            resolve_nic_or_ip("10.1.2.3", "--network-interface").unwrap(),
            IpAddr::from([10, 1, 2, 3])
        );
        assert_eq!(
            resolve_nic_or_ip("lo", "x").unwrap(),
            IpAddr::from([127, 0, 0, 1])
        );
        let err = resolve_nic_or_ip("nosuchnic0", "--network-interface")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--network-interface") && err.contains("nosuchnic0"),
            "{err}"
        );
    }
}
