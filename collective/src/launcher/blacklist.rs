//! Failing hosts of an elastic job, as Horovod's `HostState`/`HostManager` blacklist
//! (`horovod/runner/elastic/discovery.py`): a host where a rank failed is blacklisted and gets
//! no new ranks. Without `--blacklist-cooldown-range` it stays blacklisted; with `MIN MAX` it
//! comes back after a cooldown that doubles with each failure:
//!
//! ```text
//! failures += 1
//! delay     = MIN * 2^failures + uniform(0, 1) * MIN
//! cooldown  = max(MIN, min(MAX, delay))
//! ```
//!
//! (so 2–3×MIN after the first failure, 4–5×MIN after the second, …, never beyond MAX). A host
//! blacklisted again while its cooldown runs keeps that cooldown. When the cooldown has ended
//! the host is *resurrected*: usable again, and [`Blacklist::whitelist_resurrected`] clears it
//! once discovery still lists it (Horovod reports that as hosts added). The clock and the
//! random fraction are injected ([`Clock`], [`Jitter`]) so the schedule is testable without
//! waiting.
//!
//! ```
//! use std::time::Duration;
//! use kolo_collective::launcher::blacklist::{Blacklist, ManualClock};
//! use kolo_collective::launcher::CooldownRange;
//!
//! let clock = ManualClock::new();
//! let range = CooldownRange::new(10, 100).unwrap();
//! let mut blacklist = Blacklist::with_clock(Some(range), Box::new(clock.clone()), Box::new(|| 0.5));
//! blacklist.blacklist("node2");
//! assert!(blacklist.is_blacklisted("node2"));
//! clock.advance(Duration::from_secs(25)); // 10 * 2 + 0.5 * 10
//! assert_eq!(blacklist.whitelist_resurrected(["node2"]), ["node2"]);
//! assert!(!blacklist.is_blacklisted("node2"));
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::elastic_args::CooldownRange;
use super::hosts::HostSlots;

/// Where the blacklist reads the time.
pub trait Clock: Send {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// The real monotonic clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told ([`ManualClock::advance`]); clones share the time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    start: Instant,
    offset: Arc<Mutex<Duration>>,
}

impl ManualClock {
    /// A clock standing at the current instant.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            offset: Arc::new(Mutex::new(Duration::ZERO)),
        }
    }

    /// Moves the clock (and its clones) forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut offset = self.offset.lock().unwrap_or_else(|e| e.into_inner());
        *offset += by;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.start + *self.offset.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The random fraction in `[0, 1)` added to a cooldown (Horovod's `random.uniform(0, 1)`).
pub type Jitter = Box<dyn FnMut() -> f64 + Send>;

/// One host's blacklist state (Horovod's `HostState`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct HostState {
    blacklisted: bool,
    /// How many cooldowns it has had.
    failures: u32,
    /// When its cooldown ends (`None`: no cooldown set).
    cooldown_end: Option<Instant>,
}

/// The blacklist of an elastic job's hosts.
pub struct Blacklist {
    range: Option<CooldownRange>,
    clock: Box<dyn Clock>,
    jitter: Jitter,
    hosts: HashMap<String, HostState>,
}

impl std::fmt::Debug for Blacklist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blacklist")
            .field("range", &self.range)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

impl Blacklist {
    /// A blacklist with `--blacklist-cooldown-range` `range` on the system clock with a random
    /// fraction.
    pub fn new(range: Option<CooldownRange>) -> Self {
        Self::with_clock(range, Box::new(SystemClock), Box::new(rand::random::<f64>))
    }

    /// A blacklist reading the time from `clock` and the random fraction from `jitter`.
    pub fn with_clock(range: Option<CooldownRange>, clock: Box<dyn Clock>, jitter: Jitter) -> Self {
        Self {
            range,
            clock,
            jitter,
            hosts: HashMap::new(),
        }
    }

    /// Blacklists `host` (a rank on it failed) and, outside a running cooldown, starts the next
    /// cooldown. Returns when the host comes back (`None`: never, without a cooldown range).
    pub fn blacklist(&mut self, host: &str) -> Option<Instant> {
        let now = self.clock.now();
        let state = self.hosts.entry(host.to_owned()).or_default();
        if !state.blacklisted {
            log::info!("kolorun: blacklisting failing host {host}");
        }
        state.blacklisted = true;
        let cooling = state.cooldown_end.is_some_and(|end| end > now);
        if let (Some(range), false) = (self.range, cooling) {
            state.failures = state.failures.saturating_add(1);
            let cooldown = cooldown(range, state.failures, (self.jitter)());
            log::debug!(
                "kolorun: host {host} cools down for {cooldown:?} (failure {})",
                state.failures
            );
            state.cooldown_end = Some(now + cooldown);
        }
        state.cooldown_end
    }

    /// True while `host` is blacklisted (until [`Blacklist::whitelist_resurrected`] clears
    /// it, even after its cooldown ended), as Horovod's `is_blacklisted`.
    pub fn is_blacklisted(&self, host: &str) -> bool {
        self.hosts.get(host).is_some_and(|s| s.blacklisted)
    }

    /// True when `host`'s cooldown has ended (Horovod's `is_resurrected`).
    pub fn is_resurrected(&self, host: &str) -> bool {
        let now = self.clock.now();
        self.hosts
            .get(host)
            .and_then(|s| s.cooldown_end)
            .is_some_and(|end| end <= now)
    }

    /// True when `host` may get ranks: not blacklisted, or its cooldown has ended.
    pub fn is_usable(&self, host: &str) -> bool {
        !self.is_blacklisted(host) || self.is_resurrected(host)
    }

    /// The hosts of `hosts` that may get ranks, in their order.
    pub fn usable(&self, hosts: &[HostSlots]) -> Vec<HostSlots> {
        hosts
            .iter()
            .filter(|h| self.is_usable(&h.host))
            .cloned()
            .collect()
    }

    /// Whitelists every host of `discovered` whose cooldown has ended and returns them (for
    /// Horovod these count as hosts added). Their failure count stays, so a next failure
    /// cools down longer.
    pub fn whitelist_resurrected<'a>(
        &mut self,
        discovered: impl IntoIterator<Item = &'a str>,
    ) -> Vec<String> {
        let now = self.clock.now();
        let mut back = Vec::new();
        for host in discovered {
            if let Some(state) = self.hosts.get_mut(host) {
                if state.cooldown_end.is_some_and(|end| end <= now) {
                    state.blacklisted = false;
                    state.cooldown_end = None;
                    log::info!("kolorun: host {host} is back after its cooldown");
                    back.push(host.to_owned());
                }
            }
        }
        back
    }

    /// The earliest end of a running cooldown: when the next host comes back (to wake a wait).
    pub fn next_resurrection(&self) -> Option<Instant> {
        let now = self.clock.now();
        self.hosts
            .values()
            .filter(|s| s.blacklisted)
            .filter_map(|s| s.cooldown_end)
            .filter(|end| *end > now)
            .min()
    }

    /// How many cooldowns `host` has had.
    pub fn failures(&self, host: &str) -> u32 {
        self.hosts.get(host).map_or(0, |s| s.failures)
    }
}

/// Horovod's cooldown after the `failures`-th failure with random fraction `fraction`.
pub fn cooldown(range: CooldownRange, failures: u32, fraction: f64) -> Duration {
    let lower = range.lower() as f64;
    let upper = range.upper() as f64;
    let fraction = if fraction.is_finite() {
        fraction.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let delay = lower * 2f64.powi(failures.min(64) as i32) + fraction * lower;
    Duration::from_secs_f64(delay.min(upper).max(lower))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::launcher::hosts::hs;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    /// A blacklist on a manual clock whose random fractions are `fractions`, in turn.
    fn blacklist(range: Option<(u64, u64)>, fractions: &[f64]) -> (Blacklist, ManualClock) {
        let clock = ManualClock::new();
        let owned: Vec<f64> = fractions.to_vec();
        let mut fractions = owned.into_iter();
        let jitter = Box::new(move || fractions.next().expect("no fraction left"));
        let range = range.map(|(lower, upper)| CooldownRange::new(lower, upper).unwrap());
        (
            Blacklist::with_clock(range, Box::new(clock.clone()), jitter),
            clock,
        )
    }

    #[test]
    fn horovods_formula_doubles_per_failure_with_a_random_fraction_within_the_range() {
        let range = CooldownRange::new(10, 100).unwrap();
        assert_eq!(cooldown(range, 1, 0.0), secs(20.0));
        assert_eq!(cooldown(range, 1, 0.5), secs(25.0));
        assert_eq!(cooldown(range, 2, 0.25), secs(42.5));
        assert_eq!(cooldown(range, 3, 0.9), secs(89.0));
        assert_eq!(cooldown(range, 4, 0.0), secs(100.0));
        assert_eq!(cooldown(range, 1000, 0.3), secs(100.0));
        // MAX below 2*MIN: the upper limit wins, but never below MIN.
        let tight = CooldownRange::new(10, 12).unwrap();
        assert_eq!(cooldown(tight, 1, 0.9), secs(12.0));
        let flat = CooldownRange::new(10, 10).unwrap();
        assert_eq!(cooldown(flat, 1, 0.9), secs(10.0));
        assert_eq!(cooldown(range, 1, f64::NAN), secs(20.0));
    }

    #[test]
    fn a_host_comes_back_after_its_cooldown_and_a_repeat_failure_waits_longer() {
        let (mut list, clock) = blacklist(Some((10, 100)), &[0.5, 0.0]);
        let hosts = [hs("a", 2), hs("b", 2)];
        let start = clock.now();
        assert_eq!(list.blacklist("b"), Some(start + secs(25.0)));
        assert!(list.is_blacklisted("b") && !list.is_usable("b"));
        assert_eq!(list.usable(&hosts), [hs("a", 2)]);
        assert_eq!(list.next_resurrection(), Some(start + secs(25.0)));
        // Failing again during the cooldown changes nothing (no new random draw either).
        clock.advance(secs(24.9));
        assert_eq!(list.blacklist("b"), Some(start + secs(25.0)));
        assert_eq!(list.failures("b"), 1);
        assert!(list.whitelist_resurrected(["a", "b"]).is_empty());
        clock.advance(secs(0.1));
        assert!(list.is_resurrected("b") && list.is_usable("b"));
        assert_eq!(list.usable(&hosts), hosts);
        // Only a host discovery still lists is whitelisted.
        assert!(list.whitelist_resurrected(["a"]).is_empty());
        assert_eq!(list.whitelist_resurrected(["a", "b"]), ["b"]);
        assert!(!list.is_blacklisted("b") && list.next_resurrection().is_none());
        // The second failure: 10 * 4 + 0 * 10 = 40 s.
        let again = clock.now();
        assert_eq!(list.blacklist("b"), Some(again + secs(40.0)));
        assert_eq!(list.failures("b"), 2);
        clock.advance(secs(39.0));
        assert!(!list.is_usable("b"));
        clock.advance(secs(1.0));
        assert_eq!(list.whitelist_resurrected(["b"]), ["b"]);
    }

    #[test]
    fn without_a_cooldown_range_a_blacklisted_host_never_comes_back() {
        let (mut list, clock) = blacklist(None, &[]);
        assert_eq!(list.blacklist("a"), None);
        clock.advance(Duration::from_secs(24 * 3600));
        assert!(list.is_blacklisted("a") && !list.is_resurrected("a") && !list.is_usable("a"));
        assert!(list.whitelist_resurrected(["a"]).is_empty());
        assert_eq!(list.usable(&[hs("a", 1), hs("b", 1)]), [hs("b", 1)]);
        assert_eq!(list.failures("a"), 0);
        assert!(list.next_resurrection().is_none());
        assert!(!list.is_blacklisted("never-failed") && list.is_usable("never-failed"));
    }

    #[test]
    fn the_system_clock_blacklist_draws_fractions_in_range() {
        let range = CooldownRange::new(1, 3600).unwrap();
        let mut list = Blacklist::new(Some(range));
        let before = Instant::now();
        let end = list.blacklist("a").unwrap();
        let cooldown = end - before;
        assert!(
            cooldown >= secs(2.0) && cooldown <= secs(3.1),
            "{cooldown:?}"
        );
    }
}
