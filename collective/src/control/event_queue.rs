//! The driver-bound task events (`Post`: start reports, output lines, user messages, exits),
//! queued until the launcher drains them — bounded, with backpressure.
//!
//! The queue holds at most [`MAX_QUEUED_BYTES`] (encoded size). A post that does not fit waits up
//! to [`BACKPRESSURE`] for the launcher to drain; then the oldest *output lines* are dropped to
//! make room (counted, and reported in the driver's log), and until the launcher drains again
//! later posts drop at once instead of waiting, because a launcher that never reads output (or
//! a rank printing faster than it is read) must neither grow the driver's memory nor stall the
//! rank. Start reports, exits and user messages are never dropped: a post that
//! still does not fit is refused with an error the rank sees.

use std::collections::VecDeque;
use std::time::Duration;

use prost::Message;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::control::proto::task_event::Kind;
use crate::control::proto::TaskEvent;

/// The most encoded bytes of events the queue holds.
pub const MAX_QUEUED_BYTES: usize = 64 << 20;
/// How long a post that does not fit waits for the launcher to drain before dropping output.
pub const BACKPRESSURE: Duration = Duration::from_secs(2);

#[derive(Debug, Default)]
struct Queued {
    events: VecDeque<(u32, TaskEvent, usize)>,
    bytes: usize,
    dropped_output: u64,
    /// A post waited [`BACKPRESSURE`] in vain and the launcher has not drained since.
    stalled: bool,
}

/// The queue, its lock and its wake-ups.
#[derive(Debug, Default)]
pub(crate) struct EventQueue {
    queued: std::sync::Mutex<Queued>,
    /// Woken when events arrive.
    arrived: Notify,
    /// Woken when the launcher drained.
    drained: Notify,
}

fn lock(queue: &std::sync::Mutex<Queued>) -> std::sync::MutexGuard<'_, Queued> {
    queue
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl EventQueue {
    /// Queues `events` of task `task_index` in order (see the module doc for what happens when
    /// they do not fit). `Err` is the message of a refused post.
    pub(crate) async fn post(&self, task_index: u32, events: Vec<TaskEvent>) -> Result<(), String> {
        let sized: Vec<(u32, TaskEvent, usize)> = events
            .into_iter()
            .map(|event| {
                let size = event.encoded_len();
                (task_index, event, size)
            })
            .collect();
        let size: usize = sized.iter().map(|(_, _, size)| size).sum();
        if sized.is_empty() {
            return Ok(());
        }
        let deadline = Instant::now() + BACKPRESSURE;
        loop {
            let drained = self.drained.notified();
            {
                let mut queued = lock(&self.queued);
                let late = queued.stalled || Instant::now() >= deadline;
                if late && queued.bytes + size > MAX_QUEUED_BYTES {
                    queued.stalled = true;
                    queued.drop_output_for(size);
                }
                if queued.bytes + size <= MAX_QUEUED_BYTES {
                    queued.bytes += size;
                    queued.events.extend(sized);
                    drop(queued);
                    self.arrived.notify_one();
                    return Ok(());
                }
                if late {
                    return Err(format!(
                        "the launcher has not read this job's task events: its queue on the driver \
                         is full ({MAX_QUEUED_BYTES} bytes of start reports, exits and messages); \
                         send fewer or smaller messages to the driver"
                    ));
                }
            }
            let _ = tokio::time::timeout_at(deadline, drained).await;
        }
    }

    /// Takes every queued event, waiting up to `timeout` for the first one.
    pub(crate) async fn take(&self, timeout: Duration) -> Vec<(u32, TaskEvent)> {
        let deadline = Instant::now() + timeout;
        loop {
            let arrived = self.arrived.notified();
            {
                let mut queued = lock(&self.queued);
                if !queued.events.is_empty() {
                    if queued.dropped_output > 0 {
                        log::warn!(
                            "job driver: {} output line(s) of the tasks were dropped because the \
                             launcher did not read them in time (the queue holds {MAX_QUEUED_BYTES} \
                             bytes)",
                            queued.dropped_output
                        );
                        queued.dropped_output = 0;
                    }
                    queued.bytes = 0;
                    queued.stalled = false;
                    let taken = queued.events.drain(..).map(|(t, e, _)| (t, e)).collect();
                    drop(queued);
                    self.drained.notify_waiters();
                    return taken;
                }
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return Vec::new();
            }
        }
    }

    /// Encoded bytes queued now.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        lock(&self.queued).bytes
    }
}

impl Queued {
    /// Drops the oldest output lines until `size` more bytes fit (or none are left).
    fn drop_output_for(&mut self, size: usize) {
        let mut kept = VecDeque::with_capacity(self.events.len());
        let first_drop = self.dropped_output == 0;
        for (task, event, bytes) in self.events.drain(..) {
            let is_output = matches!(event.kind, Some(Kind::Output(_)));
            if is_output && self.bytes + size > MAX_QUEUED_BYTES {
                self.bytes -= bytes;
                self.dropped_output += 1;
            } else {
                kept.push_back((task, event, bytes));
            }
        }
        self.events = kept;
        if first_drop && self.dropped_output > 0 {
            log::warn!(
                "job driver: dropping the oldest output lines of the tasks: the launcher is not \
                 reading them and the queue holds {MAX_QUEUED_BYTES} bytes"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::proto::OutputLine;

    fn output(n: usize) -> TaskEvent {
        TaskEvent {
            kind: Some(Kind::Output(OutputLine {
                stderr: false,
                text: vec![b'x'; n],
                unix_micros: 0,
            })),
        }
    }

    fn message(n: usize) -> TaskEvent {
        TaskEvent {
            kind: Some(Kind::Message(vec![b'm'; n])),
        }
    }

    #[test]
    fn a_queue_nobody_drains_stays_bounded_and_keeps_what_matters() {
        kolo_runtime::block_on(async {
            let queue = EventQueue::default();
            queue.post(0, vec![message(100)]).await.unwrap();
            // 200 MiB of output in 1 MiB lines: the queue never holds more than its cap.
            for _ in 0..200 {
                queue.post(1, vec![output(1 << 20)]).await.unwrap();
                assert!(queue.bytes() <= MAX_QUEUED_BYTES);
            }
            let taken = queue.take(Duration::ZERO).await;
            assert!(
                matches!(taken[0].1.kind, Some(Kind::Message(_))),
                "the message was dropped"
            );
            assert!(taken.len() < 200, "nothing was dropped");
            // Messages alone past the cap are refused, not dropped.
            queue
                .post(0, vec![message(MAX_QUEUED_BYTES - 16)])
                .await
                .unwrap();
            let err = queue.post(0, vec![message(1 << 20)]).await.unwrap_err();
            assert!(err.contains("queue on the driver is full"), "{err}");
        })
        .unwrap();
    }

    #[test]
    fn a_draining_launcher_relieves_backpressure_without_drops() {
        kolo_runtime::block_on(async {
            let queue = std::sync::Arc::new(EventQueue::default());
            queue
                .post(0, vec![output(MAX_QUEUED_BYTES - 64)])
                .await
                .unwrap();
            let reader = std::sync::Arc::clone(&queue);
            let drain = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                reader.take(Duration::ZERO).await.len()
            });
            queue.post(0, vec![output(1 << 20)]).await.unwrap();
            assert_eq!(drain.await.unwrap(), 1);
            assert_eq!(
                queue.take(Duration::ZERO).await.len(),
                1,
                "the waiting post was lost"
            );
        })
        .unwrap();
    }
}
