//! The negotiation simulator: `ranks` virtual ranks, one thread each, run the real negotiation
//! ([`super::negotiate`]), the real cycle message codec and the real coordinator (and its response
//! cache) over in-memory channels, in virtual time, so a 1,024-rank job runs on one small machine
//! and its figures do not depend on how loaded the machine is.
//!
//! Time model: every rank has a virtual clock, starting at 0 each cycle (every rank submits the
//! step's tensors at the same moment). The CPU time a rank's thread spends between two link
//! operations (measured with `CLOCK_THREAD_CPUTIME_ID`: encoding, merging, decoding, deciding)
//! advances its clock. Sending `b` bytes occupies the sender for `b / bandwidth`; the message
//! arrives `latency` after that. A receive sets the clock to the later of its own value and the
//! message's arrival. A rank's agreement time is its clock once it has the cycle's decision.
//!
//! Two corrections keep the host's artefacts out of the figures: the cost of reading the CPU
//! clock itself (a system call, ~0.5 µs on a VM, measured at the start of every run) is taken
//! off every measured interval, and each virtual rank gets its own malloc heap, as the process
//! it stands for has (glibc's default of 8 heaps per core made 1,024 threads on 2 cores queue
//! for 16 heaps, which doubled the decision's CPU and made the slowest ranks several times slower).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::digest::{just, Entry};
use super::tree::Node;
use super::{negotiate_with, Digest, Links, Negotiation, Protocol, TREE_FANOUT};
use crate::dtype::{DType, ReduceOp};
use crate::engine::coordinator::{Coordinator, Response, Senders};
use crate::engine::cpu_clock;
use crate::engine::message::{CycleMessage, MAX_MESSAGE_LEN};
use crate::error::{Error, Result};
use crate::wire::{OpDescriptor, OpKind};

/// The modelled network between any two ranks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkModel {
    /// One-way latency of a message.
    pub latency: Duration,
    /// Bytes per second a rank sends.
    pub bandwidth: f64,
}

impl Default for LinkModel {
    /// 5 µs and 10 GB/s: a datacenter network (25–100 Gb/s NICs, TCP).
    fn default() -> Self {
        LinkModel {
            latency: Duration::from_micros(5),
            bandwidth: 10e9,
        }
    }
}

/// One simulated job.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Virtual ranks (threads).
    pub ranks: usize,
    /// The negotiation knob every rank uses.
    pub negotiation: Negotiation,
    /// Children per node of the tree (the engine's is [`TREE_FANOUT`]).
    pub fanout: usize,
    /// The network.
    pub link: LinkModel,
    /// Tensors per step (each an f32 allreduce).
    pub tensors: usize,
    /// Steps, one cycle each: the first negotiates full descriptors, the others cache bits.
    pub steps: usize,
    /// A rank that submits the first tensor of the first step with another shape.
    pub mismatch_rank: Option<usize>,
    /// Response cache entries (as `KOLO_CACHE_CAPACITY`).
    pub cache_capacity: usize,
    /// A per-thread counter (e.g. bytes allocated by this thread) read when a rank starts a
    /// step and when it has the step's decision; the difference is [`RankCycle::probed`].
    pub probe: Option<fn() -> u64>,
}

impl SimConfig {
    /// `ranks` ranks negotiating a 161-tensor step (ResNet-50's gradients) twice.
    pub fn new(ranks: usize, negotiation: Negotiation) -> Self {
        SimConfig {
            ranks,
            negotiation,
            fanout: TREE_FANOUT,
            link: LinkModel::default(),
            tensors: 161,
            steps: 2,
            mismatch_rank: None,
            cache_capacity: 1024,
            probe: None,
        }
    }
}

/// One rank's figures for one cycle.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankCycle {
    /// Messages this rank sent.
    pub messages: usize,
    /// Bytes this rank sent (payloads).
    pub bytes: usize,
    /// Thread CPU time of this rank's work.
    pub cpu: Duration,
    /// Virtual time at which this rank had the cycle's decision.
    pub agreed_at: Duration,
    /// The decision, one line per response (`run name`, `cached name`, `fail name`, ...).
    pub decision: Vec<String>,
    /// Where [`RankCycle::cpu`] went.
    pub phases: Phases,
    /// How much [`SimConfig::probe`] grew during the step (0 without a probe).
    pub probed: u64,
}

/// One rank's CPU time in one cycle, by phase.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Phases {
    /// Looking the step's tensors up in the response cache and encoding the cycle message.
    pub build: Duration,
    /// The protocol's own work: merging, encoding and decoding digests, forwarding.
    pub negotiate: Duration,
    /// Decoding the distinct cycle messages of the complete digest.
    pub decode: Duration,
    /// The coordinator's decision.
    pub decide: Duration,
}

/// What one simulation found.
#[derive(Debug, Clone)]
pub struct SimReport {
    /// The protocol the ranks ran.
    pub protocol: Protocol,
    /// `cycles[step][rank]`.
    pub cycles: Vec<Vec<RankCycle>>,
    /// For every rank, the distinct peers it exchanged control messages with (the connections
    /// the control plane needs).
    pub peers: Vec<usize>,
    /// For every rank, its depth in the negotiation tree (hops below the root); all zero under
    /// all-to-all, where every message crosses one link.
    pub depth: Vec<usize>,
    /// The modelled network.
    pub link: LinkModel,
}

impl SimReport {
    /// The latest agreement of any rank in `step`.
    pub fn agreement(&self, step: usize) -> Duration {
        self.cycles[step]
            .iter()
            .map(|c| c.agreed_at)
            .max()
            .unwrap_or_default()
    }

    /// For every rank, the earliest it could have had `step`'s decision with the CPU time this
    /// run measured and the protocol's paths: every member's message, once built, crosses its
    /// path to this rank at the link's latency alone (the tree: up to the root, then down to
    /// the rank; all-to-all: one link), then the rank decodes and decides. What a rank's
    /// agreement exceeds it by is the protocol's own work on the path (merging, encoding,
    /// forwarding); the rest is what this host's CPU allows.
    pub fn floor(&self, step: usize) -> Vec<Duration> {
        let cycles = &self.cycles[step];
        let latency = self.link.latency;
        let hops = |n: usize| latency * u32::try_from(n).unwrap_or(u32::MAX);
        // When each member's message could be at the root (the tree) or sent (all-to-all).
        let ready: Vec<Duration> = cycles
            .iter()
            .zip(&self.depth)
            .map(|(c, &depth)| c.phases.build + hops(depth))
            .collect();
        let latest = |except: Option<usize>| {
            ready
                .iter()
                .enumerate()
                .filter(|&(s, _)| Some(s) != except)
                .map(|(_, &t)| t)
                .max()
        };
        let root_has_all = latest(None).unwrap_or_default();
        cycles
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let all_here = match self.protocol {
                    Protocol::Tree => root_has_all + hops(self.depth[r]),
                    Protocol::AllToAll => latest(Some(r))
                        .map_or(c.phases.build, |t| (t + latency).max(c.phases.build)),
                };
                all_here + c.phases.decode + c.phases.decide
            })
            .collect()
    }
}

/// The longest a simulated rank waits for a message (wall time).
const RECV_TIMEOUT: Duration = Duration::from_secs(60);

struct Packet {
    from: usize,
    bytes: Arc<[u8]>,
    arrival: f64,
}

/// [`Links`] over channels with virtual time.
struct SimLinks {
    rank: usize,
    size: usize,
    link: LinkModel,
    outboxes: Arc<Vec<Sender<Packet>>>,
    inbox: Receiver<Packet>,
    stash: HashMap<usize, VecDeque<Packet>>,
    /// Virtual clock, seconds.
    clock: f64,
    /// Thread CPU time when the clock last took it in.
    cpu_mark: Duration,
    /// What reading the CPU clock costs (see [`clock_overhead`]).
    clock_cost: Duration,
    cpu: Duration,
    messages: usize,
    bytes: usize,
    peers: BTreeSet<usize>,
}

/// The least CPU time two back-to-back readings of the thread CPU clock show: the clock's own
/// cost, taken off every measured interval.
fn clock_overhead() -> Duration {
    (0..1000)
        .map(|_| {
            let a = cpu_clock::thread();
            cpu_clock::thread().saturating_sub(a)
        })
        .min()
        .unwrap_or_default()
}

/// Gives every thread (virtual rank) its own malloc heap (glibc only; see the module docs).
/// glibc fixes the limit when a process first has more heaps than it tests for, so this runs
/// before the first simulation starts its threads.
fn one_heap_per_rank() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        // SAFETY: mallopt only sets an allocator parameter.
        ONCE.call_once(|| unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1 << 16);
        });
    }
}

impl SimLinks {
    /// Adds the CPU time spent since the last call to the clock.
    fn account(&mut self) {
        let now = cpu_clock::thread();
        let spent = now
            .saturating_sub(self.cpu_mark)
            .saturating_sub(self.clock_cost);
        self.cpu_mark = now;
        self.cpu += spent;
        self.clock += spent.as_secs_f64();
    }

    /// The CPU time of this cycle so far (taking in what was spent since the last call).
    fn spent(&mut self) -> Duration {
        self.account();
        self.cpu
    }

    fn start_cycle(&mut self) {
        self.clock = 0.0;
        self.cpu = Duration::ZERO;
        self.messages = 0;
        self.bytes = 0;
        self.cpu_mark = cpu_clock::thread();
    }

    fn post(&mut self, peer: usize, bytes: Arc<[u8]>) -> Result<()> {
        self.account();
        self.clock += bytes.len() as f64 / self.link.bandwidth;
        let arrival = self.clock + self.link.latency.as_secs_f64();
        self.messages += 1;
        self.bytes += bytes.len();
        self.peers.insert(peer);
        self.outboxes[peer]
            .send(Packet {
                from: self.rank,
                bytes,
                arrival,
            })
            .map_err(|_| Error::Closed(format!("simulated rank {peer} is gone")))?;
        self.cpu_mark = cpu_clock::thread();
        Ok(())
    }

    /// Receives `peer`'s next message (virtual time: the later of now and its arrival).
    fn recv_shared(&mut self, peer: usize, max_len: usize) -> Result<Arc<[u8]>> {
        self.account();
        let packet = loop {
            if let Some(p) = self.stash.get_mut(&peer).and_then(VecDeque::pop_front) {
                break p;
            }
            match self.inbox.recv_timeout(RECV_TIMEOUT) {
                Ok(p) if p.from == peer => break p,
                Ok(p) => self.stash.entry(p.from).or_default().push_back(p),
                Err(RecvTimeoutError::Timeout) => {
                    return Err(Error::Timeout {
                        what: format!(
                            "simulated rank {} waited for rank {peer}'s message",
                            self.rank
                        ),
                        after: RECV_TIMEOUT,
                    })
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Error::Closed("the simulation ended".into()))
                }
            }
        };
        self.peers.insert(peer);
        if packet.bytes.len() > max_len {
            return Err(Error::Internal(format!(
                "simulated rank {peer} sent {} bytes where at most {max_len} are accepted",
                packet.bytes.len()
            )));
        }
        self.clock = self.clock.max(packet.arrival);
        self.cpu_mark = cpu_clock::thread();
        Ok(packet.bytes)
    }
}

impl Links for SimLinks {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn send(&mut self, peer: usize, bytes: &[u8]) -> Result<()> {
        self.post(peer, Arc::from(bytes))
    }

    /// The copy is charged with the work that follows it (the clock runs from the arrival).
    fn recv(&mut self, peer: usize, max_len: usize) -> Result<Vec<u8>> {
        Ok(self.recv_shared(peer, max_len)?.to_vec())
    }

    /// Sends one shared copy of `payload` to every peer and merges what arrives as it
    /// arrives, so a 1,024-rank all-to-all holds each distinct message once, not n² copies.
    fn exchange_all(&mut self, payload: Vec<u8>, max_len: usize) -> Result<Digest> {
        let shared: Arc<[u8]> = Arc::from(payload);
        let me = self.rank;
        for peer in (0..self.size).filter(|&p| p != me) {
            self.post(peer, Arc::clone(&shared))?;
        }
        let mut all: Vec<Arc<[u8]>> = Vec::with_capacity(self.size);
        let mut index: HashMap<Arc<[u8]>, usize> = HashMap::new();
        for peer in 0..self.size {
            let bytes = if peer == me {
                Arc::clone(&shared)
            } else {
                self.recv_shared(peer, max_len)?
            };
            // Equal messages share one allocation.
            let bytes = match index.get(&bytes) {
                Some(&i) => Arc::clone(&all[i]),
                None => {
                    index.insert(Arc::clone(&bytes), peer);
                    bytes
                }
            };
            all.push(bytes);
        }
        drop(index);
        let mut entries: Vec<Entry> = Vec::new();
        let mut by_pointer: HashMap<*const u8, usize> = HashMap::new();
        for (rank, bytes) in all.iter().enumerate() {
            match by_pointer.get(&bytes.as_ptr()) {
                Some(&i) => match entries[i].ranks.last_mut() {
                    Some(last) if last.end == rank => last.end = rank + 1,
                    _ => entries[i].ranks.push(rank..rank + 1),
                },
                None => {
                    by_pointer.insert(bytes.as_ptr(), entries.len());
                    entries.push(Entry {
                        payload: bytes.to_vec(),
                        ranks: just(rank),
                    });
                }
            }
        }
        Ok(Digest { entries })
    }
}

/// The descriptor of tensor `i` of a step (shapes vary like a network's layers).
fn tensor(i: usize, bigger: bool) -> OpDescriptor {
    let len = 256 * (1 + (i % 13) as i64) + i64::from(bigger);
    OpDescriptor {
        dtype: DType::F32,
        shape: vec![len],
        op: Some(ReduceOp::Average),
        ..OpDescriptor::new(OpKind::Allreduce, &format!("grad.layer{i}.weight"))
    }
}

fn describe(response: &Response) -> String {
    match response {
        Response::Run { descs, cached } => {
            format!(
                "{} {}",
                if *cached { "cached" } else { "run" },
                descs[0].name
            )
        }
        Response::Fail { name, .. } => format!("fail {name}"),
        Response::Stalled { name, .. } => format!("stalled {name}"),
        Response::Join { last } => format!("join {last}"),
    }
}

/// One rank's steps. Ranks need no barrier between steps: every link is FIFO and every round
/// is per peer, so a rank that runs ahead only queues its next cycle's messages.
fn run_rank(config: &SimConfig, links: &mut SimLinks) -> Result<Vec<RankCycle>> {
    let protocol = config.negotiation.protocol(config.ranks);
    let mut coordinator = Coordinator::new(config.ranks, config.cache_capacity);
    let mut cycles = Vec::with_capacity(config.steps);
    for step in 0..config.steps {
        // What the framework submits: made before the cycle starts, as the engine gets it.
        let submitted: Vec<OpDescriptor> = (0..config.tensors)
            .map(|i| {
                tensor(
                    i,
                    step == 0 && i == 0 && config.mismatch_rank == Some(links.rank),
                )
            })
            .collect();
        let probed = config.probe.map(|p| p());
        links.start_cycle();
        let mut phases = Phases::default();
        let mut msg = CycleMessage::default();
        for desc in submitted {
            msg.announce(desc, Some(&mut coordinator.cache));
        }
        let payload = msg.encode();
        phases.build = links.spent();
        let digest = negotiate_with(links, protocol, config.fanout, payload, MAX_MESSAGE_LEN)?;
        phases.negotiate = links.spent() - phases.build;
        let mut groups = Vec::with_capacity(digest.entries.len());
        for entry in digest.entries {
            let decoded = CycleMessage::decode(&entry.payload, config.ranks, config.cache_capacity)
                .map_err(|e| Error::Internal(format!("an unreadable simulated message: {e}")))?;
            groups.push(Senders {
                msg: decoded,
                ranks: entry.ranks,
            });
        }
        phases.decode = links.spent() - phases.build - phases.negotiate;
        let decision = coordinator.decide_grouped(&groups, Instant::now());
        drop(groups);
        let cpu = links.spent();
        phases.decide = cpu - phases.build - phases.negotiate - phases.decode;
        let agreed_at = Duration::from_secs_f64(links.clock);
        let probed = match (config.probe, probed) {
            (Some(p), Some(before)) => p().saturating_sub(before),
            _ => 0,
        };
        cycles.push(RankCycle {
            messages: links.messages,
            bytes: links.bytes,
            cpu,
            agreed_at,
            decision: decision.responses.iter().map(describe).collect(),
            phases,
            probed,
        });
    }
    Ok(cycles)
}

/// Runs the simulation.
pub fn run(config: &SimConfig) -> Result<SimReport> {
    let n = config.ranks;
    if n == 0 {
        return Err(Error::InvalidArgument(
            "a simulation needs at least one rank".into(),
        ));
    }
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..n).map(|_| channel::<Packet>()).unzip();
    let outboxes = Arc::new(senders);
    one_heap_per_rank();
    let clock_cost = clock_overhead();
    let mut threads = Vec::with_capacity(n);
    for (rank, inbox) in receivers.into_iter().enumerate() {
        let config = config.clone();
        let outboxes = Arc::clone(&outboxes);
        let thread = std::thread::Builder::new()
            .name(format!("sim-rank-{rank}"))
            .stack_size(1 << 20)
            .spawn(move || {
                let mut links = SimLinks {
                    rank,
                    size: config.ranks,
                    link: config.link,
                    outboxes,
                    inbox,
                    stash: HashMap::new(),
                    clock: 0.0,
                    cpu_mark: Duration::ZERO,
                    clock_cost,
                    cpu: Duration::ZERO,
                    messages: 0,
                    bytes: 0,
                    peers: BTreeSet::new(),
                };
                let cycles = run_rank(&config, &mut links);
                (cycles, links.peers.len())
            })
            .map_err(Error::Io)?;
        threads.push(thread);
    }
    drop(outboxes);
    let mut per_rank = Vec::with_capacity(n);
    let mut peers = Vec::with_capacity(n);
    let mut failure = None;
    for thread in threads {
        match thread.join() {
            Ok((Ok(cycles), p)) => {
                per_rank.push(cycles);
                peers.push(p);
            }
            Ok((Err(e), _)) => {
                failure.get_or_insert(e);
            }
            Err(_) => {
                failure.get_or_insert(Error::Internal("a simulated rank panicked".into()));
            }
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    let cycles = (0..config.steps)
        .map(|s| per_rank.iter().map(|r| r[s].clone()).collect())
        .collect();
    let protocol = config.negotiation.protocol(n);
    let depth = match protocol {
        Protocol::AllToAll => vec![0; n],
        Protocol::Tree => (0..n)
            .map(|r| Node::of(r, n, config.fanout).depth)
            .collect(),
    };
    Ok(SimReport {
        protocol,
        cycles,
        peers,
        depth,
        link: config.link,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    /// The system allocator, counting the bytes each thread allocates (for the test below; a
    /// thread-local count, so tests running alongside do not disturb it).
    struct Counting;

    thread_local! {
        static ALLOCATED: Cell<u64> = const { Cell::new(0) };
    }

    // SAFETY: every call is forwarded to the system allocator unchanged.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let _ = ALLOCATED.try_with(|c| c.set(c.get() + layout.size() as u64));
            // SAFETY: the caller's contract is passed on.
            unsafe { System.alloc(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: the caller's contract is passed on.
            unsafe { System.dealloc(ptr, layout) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            let grown = new_size.saturating_sub(layout.size()) as u64;
            let _ = ALLOCATED.try_with(|c| c.set(c.get() + grown));
            // SAFETY: the caller's contract is passed on.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;

    fn allocated() -> u64 {
        ALLOCATED.with(Cell::get)
    }

    /// The most bytes any rank allocated in each step of a tree negotiation of `ranks` ranks.
    fn bytes_per_step(ranks: usize) -> Vec<u64> {
        let mut config = SimConfig::new(ranks, Negotiation::Tree);
        config.probe = Some(allocated);
        let report = run(&config).unwrap();
        report
            .cycles
            .iter()
            .map(|step| {
                assert!(step.iter().all(|c| c.decision == step[0].decision));
                step.iter().map(|c| c.probed).max().unwrap_or(0)
            })
            .collect()
    }

    #[test]
    fn a_ranks_work_per_step_does_not_grow_with_the_number_of_ranks() {
        // The memory a rank allocates while it agrees on a 161-tensor step (building, the
        // tree's digests, decoding, the decision) is the same at 64 and 512 ranks, for the
        // first step (descriptors) and the cached one (bits): the coordinator keeps one shared
        // descriptor and a range of ranks per tensor, not one entry per member.
        let small = bytes_per_step(64);
        let large = bytes_per_step(512);
        for (step, (&s, &l)) in small.iter().zip(&large).enumerate() {
            assert!(
                l <= s + s / 10 + 4096,
                "step {step}: a rank allocated {s} bytes at 64 ranks and {l} at 512"
            );
        }
    }
}
