//! A bounded queue whose every wait has a timeout and which can be closed from either end.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Multi-producer, multi-consumer bounded FIFO.
#[derive(Debug)]
pub struct Queue<T> {
    state: Mutex<State<T>>,
    not_empty: Condvar,
    not_full: Condvar,
    capacity: usize,
}

#[derive(Debug)]
struct State<T> {
    items: VecDeque<T>,
    closed: bool,
}

/// What a timed pop found.
#[derive(Debug, PartialEq, Eq)]
pub enum Pop<T> {
    /// The next item.
    Item(T),
    /// Nothing arrived in time.
    Empty,
    /// The queue is closed and drained.
    Closed,
}

impl<T> Queue<T> {
    /// A queue holding at most `capacity` (at least 1) items.
    pub fn new(capacity: usize) -> Self {
        Self {
            state: Mutex::new(State {
                items: VecDeque::new(),
                closed: false,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends `item`, waiting (in slices of `poll`) while the queue is full; gives the item
    /// back if the queue is closed. A producer waiting on a full queue is woken when it has
    /// drained to half its capacity, so it then queues a burst of items.
    pub fn push(&self, item: T, poll: Duration) -> Result<(), T> {
        let mut state = self.lock();
        loop {
            if state.closed {
                return Err(item);
            }
            if state.items.len() < self.capacity {
                state.items.push_back(item);
                drop(state);
                self.not_empty.notify_one();
                return Ok(());
            }
            state = self
                .not_full
                .wait_timeout(state, poll)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Takes the next item, waiting at most `timeout`.
    pub fn pop(&self, timeout: Duration) -> Pop<T> {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        loop {
            if let Some(item) = state.items.pop_front() {
                // Producers blocked on a full queue are woken once it has drained to half
                // (or they find room at their next poll), not after every pop: a producer
                // woken per item cost two context switches per small batch.
                let refill = state.items.len() <= self.capacity / 2;
                drop(state);
                if refill {
                    self.not_full.notify_all();
                }
                return Pop::Item(item);
            }
            if state.closed {
                return Pop::Closed;
            }
            let now = Instant::now();
            if now >= deadline {
                return Pop::Empty;
            }
            state = self
                .not_empty
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Closes the queue: pushes fail from now on, pops drain what is left.
    pub fn close(&self) {
        self.lock().closed = true;
        self.not_empty.notify_all();
        self.not_full.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn bounded_fifo_with_close() {
        let queue = Arc::new(Queue::new(2));
        queue.push(1, Duration::from_millis(10)).unwrap();
        queue.push(2, Duration::from_millis(10)).unwrap();
        let producer = {
            let queue = Arc::clone(&queue);
            std::thread::spawn(move || queue.push(3, Duration::from_millis(10)))
        };
        assert_eq!(queue.pop(Duration::from_secs(1)), Pop::Item(1));
        producer.join().unwrap().unwrap();
        assert_eq!(queue.pop(Duration::from_secs(1)), Pop::Item(2));
        assert_eq!(queue.pop(Duration::from_secs(1)), Pop::Item(3));
        assert_eq!(queue.pop(Duration::from_millis(5)), Pop::Empty);
        queue.close();
        assert_eq!(queue.push(4, Duration::from_millis(5)), Err(4));
        assert_eq!(queue.pop(Duration::from_secs(1)), Pop::Closed);
    }

    #[test]
    fn a_blocked_producer_is_woken_once_the_queue_has_drained_to_half() {
        let queue = Arc::new(Queue::new(4));
        for i in 0..4 {
            queue.push(i, Duration::from_millis(10)).unwrap();
        }
        let producer = {
            let queue = Arc::clone(&queue);
            std::thread::spawn(move || queue.push(4, Duration::from_secs(30)))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(queue.pop(Duration::from_secs(1)), Pop::Item(0));
        std::thread::sleep(Duration::from_millis(100));
        assert!(!producer.is_finished(), "woken with the queue 3/4 full");
        assert_eq!(queue.pop(Duration::from_secs(1)), Pop::Item(1));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !producer.is_finished() {
            assert!(Instant::now() < deadline, "not woken at half");
            std::thread::sleep(Duration::from_millis(1));
        }
        producer.join().unwrap().unwrap();
        let rest: Vec<_> = (0..3).map(|_| queue.pop(Duration::from_secs(1))).collect();
        assert_eq!(rest, [Pop::Item(2), Pop::Item(3), Pop::Item(4)]);
    }

    #[test]
    fn close_wakes_a_blocked_producer() {
        let queue = Arc::new(Queue::new(1));
        queue.push(1, Duration::from_millis(10)).unwrap();
        let producer = {
            let queue = Arc::clone(&queue);
            std::thread::spawn(move || queue.push(2, Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(20));
        queue.close();
        assert_eq!(producer.join().unwrap(), Err(2));
    }
}
