//! Host lists (`-H`, `--hostfile`), slot planning, and which hosts run locally.

use std::net::IpAddr;

use crate::error::{Error, Result};

/// One host entry and its slot count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSlots {
    /// The host as given (a name or an IP, optionally `user@host`).
    pub host: String,
    /// How many processes it may run.
    pub slots: usize,
}

/// `host` with `slots` slots: the tests' shorthand.
#[cfg(test)]
pub(crate) fn hs(host: &str, slots: usize) -> HostSlots {
    HostSlots {
        host: host.into(),
        slots,
    }
}

/// Parses `-H host:slots,host:slots` (`host` alone means one slot).
pub fn parse_hosts_flag(text: &str) -> Result<Vec<HostSlots>> {
    let entries: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    if entries.is_empty() {
        return Err(Error::Config(
            "kolorun: -H/--hosts is empty; give host:slots,host:slots".into(),
        ));
    }
    let hosts = entries
        .into_iter()
        .map(|entry| parse_entry(entry, &format!("-H entry {entry:?}")))
        .collect::<Result<Vec<_>>>()?;
    check_unique(hosts, "-H")
}

/// Parses a hostfile: one host per line, `host slots=N`, `host:N` or `host`; `#` starts a
/// comment; blank lines are skipped. `path` names the file in errors.
pub fn parse_hostfile(text: &str, path: &str) -> Result<Vec<HostSlots>> {
    let mut hosts = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let what = format!("{path} line {}", number + 1);
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        let rest: Vec<&str> = words.collect();
        let entry = match rest.as_slice() {
            [] => parse_entry(first, &what)?,
            [slots] => {
                let count = slots
                    .strip_prefix("slots=")
                    .or_else(|| slots.strip_prefix("max_slots="))
                    .ok_or_else(|| {
                        Error::Config(format!(
                            "kolorun: {what}: expected `host slots=N`, got {line:?}"
                        ))
                    })?;
                HostSlots {
                    host: checked_host(first, &what)?,
                    slots: parse_slots(count, &what)?,
                }
            }
            _ => {
                return Err(Error::Config(format!(
                    "kolorun: {what}: expected `host slots=N`, got {line:?}"
                )))
            }
        };
        hosts.push(entry);
    }
    if hosts.is_empty() {
        return Err(Error::Config(format!(
            "kolorun: hostfile {path} lists no hosts"
        )));
    }
    check_unique(hosts, path)
}

fn parse_entry(entry: &str, what: &str) -> Result<HostSlots> {
    // `host:N`, but an IPv6 literal alone (`::1`) or bracketed (`[::1]:2`) keeps its colons.
    if let Some((host, slots)) = entry.rsplit_once(':') {
        let bare_ipv6 = entry.parse::<IpAddr>().is_ok();
        if !bare_ipv6 && !host.is_empty() {
            let host = host.trim_start_matches('[').trim_end_matches(']');
            return Ok(HostSlots {
                host: checked_host(host, what)?,
                slots: parse_slots(slots, what)?,
            });
        }
    }
    Ok(HostSlots {
        host: checked_host(entry, what)?,
        slots: 1,
    })
}

/// `host` (`name`, `ip` or `user@name`) when ssh can only read it as a destination: not empty,
/// neither it nor its user or host part starting with `-` (which ssh would take for an option
/// such as `-oProxyCommand=…`, running local code), and no whitespace or control characters
/// (which would split or hide it in logs). A `Config` error naming the entry and `what` (where
/// it came from) otherwise.
pub fn checked_host(host: &str, what: &str) -> Result<String> {
    match host_problem(host) {
        Some(rule) => Err(Error::Config(format!(
            "kolorun: {what}: host entry {host:?} is refused: {rule}; give a host name, an IP \
             address or user@host"
        ))),
        None => Ok(host.to_owned()),
    }
}

/// Why [`checked_host`] refuses `host`, or `None` when it is a usable destination.
pub fn host_problem(host: &str) -> Option<&'static str> {
    if host.is_empty() {
        return Some("it is empty");
    }
    if host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("it contains whitespace or a control character");
    }
    let (user, name) = match host.rsplit_once('@') {
        Some((user, name)) => (Some(user), name),
        None => (None, host),
    };
    if host.starts_with('-') || name.starts_with('-') {
        return Some("it starts with `-`, which ssh would read as an option");
    }
    if name.is_empty() || user.is_some_and(str::is_empty) {
        return Some("its user or host part is empty");
    }
    None
}

fn parse_slots(text: &str, what: &str) -> Result<usize> {
    text.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            Error::Config(format!(
                "kolorun: {what}: slot count {text:?} is not a positive number"
            ))
        })
}

fn check_unique(hosts: Vec<HostSlots>, source: &str) -> Result<Vec<HostSlots>> {
    for (i, entry) in hosts.iter().enumerate() {
        if hosts[..i].iter().any(|earlier| earlier.host == entry.host) {
            return Err(Error::Config(format!(
                "kolorun: host {:?} appears more than once in {source}; list it once with the \
                 total slot count",
                entry.host
            )));
        }
    }
    Ok(hosts)
}

/// The host of each task index: slots filled host by host in order, the first `np` of them
/// (`np` defaults to every slot). Without hosts, `np` local slots on `localhost`.
pub fn plan_slots(hosts: Option<(&[HostSlots], &str)>, np: Option<usize>) -> Result<Vec<String>> {
    let Some((hosts, source)) = hosts else {
        let np = np.ok_or_else(|| {
            Error::Config("kolorun: -np N is required without -H/--hostfile".into())
        })?;
        return Ok(vec!["localhost".to_owned(); np]);
    };
    let total: usize = hosts.iter().map(|h| h.slots).sum();
    let np = np.unwrap_or(total);
    if np > total {
        return Err(Error::Config(format!(
            "kolorun: -np {np} asks for {np} processes but {source} provides only {total} slot{}",
            if total == 1 { "" } else { "s" }
        )));
    }
    Ok(hosts
        .iter()
        .flat_map(|h| std::iter::repeat_n(h.host.clone(), h.slots))
        .take(np)
        .collect())
}

/// The host part of an entry (`user@host` → `host`).
pub fn host_name(entry: &str) -> &str {
    entry.rsplit_once('@').map_or(entry, |(_, host)| host)
}

/// True when `entry` names this machine in a way that runs it as a local child process:
/// `localhost`, or this machine's hostname (full or short form). Everything else, including
/// `127.0.0.1`, goes through ssh.
pub fn is_local(entry: &str, this_hostname: &str) -> bool {
    if entry.contains('@') {
        return false;
    }
    let short = this_hostname.split('.').next().unwrap_or(this_hostname);
    entry.eq_ignore_ascii_case("localhost")
        || entry.eq_ignore_ascii_case(this_hostname)
        || entry.eq_ignore_ascii_case(short)
}

/// True when `entry` is this machine (local, or a loopback address or name).
pub fn is_loopback(entry: &str, this_hostname: &str) -> bool {
    let host = host_name(entry);
    is_local(host, this_hostname) || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_flag() {
        assert_eq!(
            parse_hosts_flag("a:2, b:1,c").unwrap(),
            [hs("a", 2), hs("b", 1), hs("c", 1)]
        );
        assert_eq!(
            parse_hosts_flag("127.0.0.1:2").unwrap(),
            [hs("127.0.0.1", 2)]
        );
        assert!(parse_hosts_flag("[::1]:2,::1")
            .unwrap_err()
            .to_string()
            .contains("more than once"));
        assert!(parse_hosts_flag("a:0")
            .unwrap_err()
            .to_string()
            .contains("slot count \"0\""));
        assert!(parse_hosts_flag("a:x")
            .unwrap_err()
            .to_string()
            .contains("-H entry \"a:x\""));
        assert!(parse_hosts_flag(",").is_err());
        assert!(parse_hosts_flag("a:1,a:2")
            .unwrap_err()
            .to_string()
            .contains("more than once"));
    }

    #[test]
    fn option_like_or_blank_hosts_are_refused_where_they_are_read() {
        let err = parse_hostfile("node1\n-oProxyCommand=touch /tmp/x slots=2\n", "hosts.txt")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("hosts.txt line 2") && err.contains("-oProxyCommand") && err.contains('-'),
            "{err}"
        );
        let err = parse_hostfile("-oProxyCommand=x\n", "h")
            .unwrap_err()
            .to_string();
        assert!(err.contains("h line 1") && err.contains("option"), "{err}");
        for (entry, rule) in [
            ("-oProxyCommand=x:2", "option"),
            ("me@-oProxyCommand=x", "option"),
            ("a\u{7}b", "control"),
            ("@node", "empty"),
            ("me@", "empty"),
        ] {
            let err = parse_hosts_flag(entry).unwrap_err().to_string();
            assert!(
                err.contains("-H entry") && err.contains(rule),
                "{entry}: {err}"
            );
        }
        assert_eq!(parse_hosts_flag("me@node:2").unwrap(), [hs("me@node", 2)]);
        assert_eq!(parse_hosts_flag("a-b:1").unwrap(), [hs("a-b", 1)]);
    }

    #[test]
    fn hostfile() {
        let text = "# cluster\nnode1 slots=4\nnode2:2  # two GPUs\n\nnode3\n";
        assert_eq!(
            parse_hostfile(text, "hosts.txt").unwrap(),
            [hs("node1", 4), hs("node2", 2), hs("node3", 1)]
        );
        let err = parse_hostfile("node1 gpus=4", "hosts.txt")
            .unwrap_err()
            .to_string();
        assert!(err.contains("hosts.txt line 1"), "{err}");
        assert!(parse_hostfile("# nothing\n", "h")
            .unwrap_err()
            .to_string()
            .contains("no hosts"));
    }

    #[test]
    fn slot_planning() {
        let hosts = [hs("a", 2), hs("b", 2)];
        assert_eq!(
            plan_slots(Some((&hosts, "-H")), None).unwrap(),
            ["a", "a", "b", "b"]
        );
        assert_eq!(
            plan_slots(Some((&hosts, "-H")), Some(3)).unwrap(),
            ["a", "a", "b"]
        );
        let err = plan_slots(Some((&hosts[..1], "-H")), Some(4))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "kolorun: -np 4 asks for 4 processes but -H provides only 2 slots"
        );
        assert_eq!(
            plan_slots(None, Some(2)).unwrap(),
            ["localhost", "localhost"]
        );
        assert!(plan_slots(None, None).is_err());
    }

    #[test]
    fn locality() {
        assert!(is_local("localhost", "node1.example.com"));
        assert!(is_local("node1", "node1.example.com"));
        assert!(is_local("NODE1.example.com", "node1.example.com"));
        assert!(!is_local("127.0.0.1", "node1"));
        assert!(!is_local("me@localhost", "node1"));
        assert!(is_loopback("127.0.0.1", "node1"));
        assert!(is_loopback("me@127.0.0.1", "node1"));
        assert!(!is_loopback("node2", "node1"));
        assert_eq!(host_name("me@node2"), "node2");
    }
}
