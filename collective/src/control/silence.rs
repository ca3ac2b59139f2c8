//! Naming the lost host when a collective stalls: the data plane only knows which peer it was
//! waiting on, and that peer may itself be blocked behind the rank that really went away. The
//! job driver hears every rank's heartbeat (about once a second), so a rank whose collective
//! timed out asks it which ranks have gone quiet, and adds the answer to its error.

use std::time::Duration;

use crate::control::client::DriverClient;
use crate::control::proto::{SilentRank, SilentRanksReply};

/// How long the question may take; past it the error is raised without the driver's answer.
pub(crate) const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// How every sentence of [`describe`] starts (so a message that already carries one is not
/// given a second).
pub(crate) const OPENING: &str = "the job driver ";
/// A rank counts as silent once this many of its heartbeat intervals passed without one.
const MISSED_HEARTBEATS: u32 = 2;

/// What the driver said: the ranks it lost (at most 16) and a sentence for an error message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// The sentence of [`describe`].
    pub(crate) sentence: String,
    /// The silent ranks listed in it.
    pub(crate) silent: Vec<u32>,
}

/// Asks the driver (bounded by [`ASK_TIMEOUT`]) which ranks it has not heard from for
/// [`MISSED_HEARTBEATS`] heartbeat intervals, as a sentence for an error message; `None`
/// when the driver does not answer (or when called on a runtime thread, which must not block).
pub(crate) fn ask(client: &DriverClient, rank: u32) -> Option<Verdict> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return None;
    }
    let threshold = client.heartbeat_interval() * MISSED_HEARTBEATS;
    let reply = kolo_runtime::block_on(client.silent_ranks(rank, threshold, ASK_TIMEOUT));
    match reply {
        Ok(Ok(reply)) => Some(Verdict {
            sentence: describe(&reply, threshold),
            silent: reply.ranks.iter().map(|r| r.rank).collect(),
        }),
        Ok(Err(err)) => {
            log::debug!("rank {rank} could not ask the job driver which ranks went silent: {err}");
            None
        }
        Err(err) => {
            log::debug!("rank {rank} has no runtime to ask the job driver: {err}");
            None
        }
    }
}

/// The driver's answer as a sentence: the silent ranks with their hosts and addresses, or that
/// every rank is still heard from (none silent for `threshold`).
pub(crate) fn describe(reply: &SilentRanksReply, threshold: Duration) -> String {
    if reply.ranks.is_empty() {
        return format!(
            "{OPENING}still hears from every rank (none silent for {:.1} s), so no host \
             was lost: a rank is stuck or skipped this collective",
            threshold.as_secs_f64()
        );
    }
    let listed: Vec<String> = reply.ranks.iter().map(one).collect();
    let more = (reply.total as usize).saturating_sub(listed.len());
    let more = if more > 0 {
        format!(" and {more} more rank(s)")
    } else {
        String::new()
    };
    let (they, are) = if reply.total > 1 {
        ("they", "are")
    } else {
        ("it", "is")
    };
    format!(
        "{OPENING}has not heard from {}{more}: {they} {are} probably unreachable (host down, \
         network cut, or process stopped)",
        listed.join(", ")
    )
}

fn one(rank: &SilentRank) -> String {
    let ip = rank
        .data_addr
        .parse::<std::net::SocketAddr>()
        .map(|addr| addr.ip().to_string())
        .unwrap_or_else(|_| rank.data_addr.clone());
    let mut text = format!("rank {}", rank.rank);
    if !rank.hostname.is_empty() {
        text.push_str(&format!(" on host {}", rank.hostname));
    }
    if !ip.is_empty() {
        text.push_str(&format!(" ({ip})"));
    }
    let seconds = Duration::from_millis(rank.silent_ms).as_secs_f64();
    text.push_str(&format!(" for {seconds:.1} s"));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn silent(rank: u32, hostname: &str, data_addr: &str, silent_ms: u64) -> SilentRank {
        SilentRank {
            rank,
            hostname: hostname.into(),
            data_addr: data_addr.into(),
            silent_ms,
        }
    }

    #[test]
    fn one_silent_rank_is_named_with_host_address_and_silence() {
        let reply = SilentRanksReply {
            ranks: vec![silent(2, "hostc", "10.231.0.3:4711", 5_120)],
            total: 1,
        };
        assert_eq!(
            describe(&reply, Duration::from_secs(2)),
            "the job driver has not heard from rank 2 on host hostc (10.231.0.3) for 5.1 s: it is \
             probably unreachable (host down, network cut, or process stopped)"
        );
    }

    #[test]
    fn several_are_listed_and_the_rest_counted() {
        let reply = SilentRanksReply {
            ranks: vec![
                silent(1, "b", "10.0.0.2:1", 4_000),
                silent(3, "", "", 3_000),
            ],
            total: 5,
        };
        let text = describe(&reply, Duration::from_secs(2));
        assert!(
            text.starts_with(
                "the job driver has not heard from rank 1 on host b (10.0.0.2) for 4.0 s, rank 3 \
                 for 3.0 s and 3 more rank(s): they are probably unreachable"
            ),
            "{text}"
        );
    }

    #[test]
    fn nobody_silent_says_no_host_was_lost() {
        let text = describe(&SilentRanksReply::default(), Duration::from_secs(2));
        assert!(
            text.contains("still hears from every rank (none silent for 2.0 s)"),
            "{text}"
        );
    }
}
