//! Mutual proof of the job secret on every connection to the job driver, before any gRPC byte.
//!
//! The secret never crosses the network. A client opens TCP and sends [`MAGIC`] and a fresh
//! nonce; the driver answers with its own nonce and a tag over both nonces (role "driver"); the
//! client checks that tag — a process that cannot make it is not this job's driver, and the
//! client sends it nothing else — then sends its own tag (role "worker"), and HTTP/2 follows on
//! the same connection. Fresh nonces on both sides make every transcript useless a second time,
//! and the role labels stop a tag being reflected back.
//!
//! Every message has a fixed size, so the driver reads at most [`CLIENT_HELLO_LEN`] +
//! [`TAG_LEN`] bytes from a peer that has not proved itself; each handshake has a deadline
//! ([`HANDSHAKE_TIMEOUT`]) and at most [`MAX_HANDSHAKES`] run at once: a connection that
//! arrives when all are taken ends the oldest unfinished one (a worker's handshake takes one
//! round trip, so the oldest is almost surely idle or junk), so floods of idle or junk
//! connections cost bounded memory and cannot hold the driver, and a worker that arrives right
//! after a flood still gets in.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;
use tokio_stream::wrappers::ReceiverStream;

use crate::control::mac::{nonce, MacKey, TAG_LEN};

/// The first bytes a client sends: protocol name and version.
pub const MAGIC: &[u8; 8] = b"KOLOCTL1";
/// Bytes of the client's opening message: [`MAGIC`] and its nonce.
pub const CLIENT_HELLO_LEN: usize = MAGIC.len() + TAG_LEN;
/// Bytes of the driver's answer: its nonce and its tag.
pub const DRIVER_PROOF_LEN: usize = TAG_LEN + TAG_LEN;
/// How long a connection may take to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How many handshakes the driver runs at once; a connection beyond ends the oldest one.
pub const MAX_HANDSHAKES: usize = 512;
/// The purpose the control plane's key is derived for.
const PURPOSE: &str = "control plane";

/// The control plane's key for `secret`.
pub(crate) fn control_key(secret: &crate::control::JobSecret) -> MacKey {
    MacKey::derive(secret, PURPOSE)
}

fn transcript<'a>(role: &'a [u8], client: &'a [u8], driver: &'a [u8]) -> [&'a [u8]; 4] {
    [MAGIC, role, client, driver]
}

/// Why a client refused a driver: the process at the address could not prove the secret.
#[derive(Debug)]
pub(crate) struct DriverNotProven;

impl std::fmt::Display for DriverNotProven {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the process at this address could not prove it knows the job secret")
    }
}

impl std::error::Error for DriverNotProven {}

/// Client side: proves the key to the driver on `stream` and checks the driver's proof first.
/// An `io::Error` whose inner error is [`DriverNotProven`] means the peer answered but is not
/// this job's driver (or this worker has another job's secret).
pub(crate) async fn prove_to_driver(stream: &mut TcpStream, key: &MacKey) -> io::Result<()> {
    let exchange = async {
        let ours = nonce();
        let mut hello = [0u8; CLIENT_HELLO_LEN];
        hello[..MAGIC.len()].copy_from_slice(MAGIC);
        hello[MAGIC.len()..].copy_from_slice(&ours);
        stream.write_all(&hello).await?;
        let mut answer = [0u8; DRIVER_PROOF_LEN];
        stream.read_exact(&mut answer).await?;
        let (theirs, tag) = answer.split_at(TAG_LEN);
        if !key.verify(&transcript(b"driver", &ours, theirs), tag) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                DriverNotProven,
            ));
        }
        stream
            .write_all(&key.tag(&transcript(b"worker", &ours, theirs)))
            .await
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the job driver did not finish the authentication handshake in time",
            ))
        })
}

/// Driver side: checks a connecting client's proof. `Err` says why the connection is dropped.
async fn check_worker(stream: &mut TcpStream, key: &MacKey) -> Result<(), String> {
    let exchange = async {
        let mut hello = [0u8; CLIENT_HELLO_LEN];
        stream
            .read_exact(&mut hello)
            .await
            .map_err(|e| format!("no complete opening message ({e})"))?;
        if &hello[..MAGIC.len()] != MAGIC {
            return Err("it does not speak kolo's control protocol (wrong opening bytes)".into());
        }
        let theirs = &hello[MAGIC.len()..];
        let ours = nonce();
        let mut answer = [0u8; DRIVER_PROOF_LEN];
        answer[..TAG_LEN].copy_from_slice(&ours);
        answer[TAG_LEN..].copy_from_slice(&key.tag(&transcript(b"driver", theirs, &ours)));
        stream
            .write_all(&answer)
            .await
            .map_err(|e| format!("answering failed ({e})"))?;
        let mut proof = [0u8; TAG_LEN];
        stream
            .read_exact(&mut proof)
            .await
            .map_err(|e| format!("no proof of the job secret ({e})"))?;
        if key.verify(&transcript(b"worker", theirs, &ours), &proof) {
            Ok(())
        } else {
            Err("wrong proof of the job secret".into())
        }
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no handshake within {HANDSHAKE_TIMEOUT:?}")))
}

/// The handshakes under way, oldest first (at most [`MAX_HANDSHAKES`]).
#[derive(Default)]
struct Pending {
    next_id: u64,
    running: VecDeque<(u64, SocketAddr, AbortHandle)>,
}

fn lock_pending(pending: &Mutex<Pending>) -> std::sync::MutexGuard<'_, Pending> {
    pending.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The driver's incoming connections, each authenticated: accepts on `listener` until `stop`
/// turns true, runs at most [`MAX_HANDSHAKES`] handshakes at once (a newcomer beyond ends the
/// oldest), and yields only connections whose client proved the key. Refusals are logged with
/// the peer's address.
pub(crate) fn authenticated_incoming(
    listener: TcpListener,
    key: MacKey,
    mut stop: watch::Receiver<bool>,
) -> ReceiverStream<io::Result<TcpStream>> {
    let (sender, receiver) = mpsc::channel(64);
    let key = Arc::new(key);
    let pending = Arc::new(Mutex::new(Pending::default()));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stop.wait_for(|down| *down) => return,
            };
            let (mut stream, peer) = match accepted {
                Ok(pair) => pair,
                Err(err) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    log::warn!("job driver: accepting a connection failed: {err}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let (key, sender, registry) = (Arc::clone(&key), sender.clone(), Arc::clone(&pending));
            // Registered under the lock before the task can finish and unregister itself.
            let mut running = lock_pending(&pending);
            let id = running.next_id;
            running.next_id += 1;
            if running.running.len() >= MAX_HANDSHAKES {
                if let Some((_, oldest, handle)) = running.running.pop_front() {
                    handle.abort();
                    refused(
                        oldest,
                        &format!(
                            "its handshake was the oldest of {MAX_HANDSHAKES} unfinished ones \
                             when another connection came"
                        ),
                    );
                }
            }
            let task = tokio::spawn(async move {
                let checked = check_worker(&mut stream, &key).await;
                lock_pending(&registry)
                    .running
                    .retain(|(other, _, _)| *other != id);
                match checked {
                    Ok(()) => {
                        let _ = stream.set_nodelay(true);
                        let _ = sender.send(Ok(stream)).await;
                    }
                    Err(reason) => refused(peer, &reason),
                }
            });
            running.running.push_back((id, peer, task.abort_handle()));
        }
    });
    ReceiverStream::new(receiver)
}

fn refused(peer: SocketAddr, reason: &str) {
    log::warn!("job driver refused a connection from {peer}: {reason}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::JobSecret;
    use tokio_stream::StreamExt;

    /// The listener's address, its authenticated connections, and the switch that stops it.
    async fn serve(
        key: MacKey,
    ) -> (
        SocketAddr,
        ReceiverStream<io::Result<TcpStream>>,
        watch::Sender<bool>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = watch::channel(false);
        (addr, authenticated_incoming(listener, key, stopped), stop)
    }

    #[test]
    fn the_same_key_passes_and_another_is_refused_on_both_sides() {
        kolo_runtime::block_on(async {
            let secret = JobSecret::generate();
            let (addr, mut incoming, _stop) = serve(control_key(&secret)).await;
            let mut good = TcpStream::connect(addr).await.unwrap();
            prove_to_driver(&mut good, &control_key(&secret))
                .await
                .unwrap();
            assert!(incoming.next().await.unwrap().is_ok());

            let mut bad = TcpStream::connect(addr).await.unwrap();
            let err = prove_to_driver(&mut bad, &control_key(&JobSecret::generate()))
                .await
                .unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
            assert!(err.get_ref().unwrap().is::<DriverNotProven>());
            let nothing = tokio::time::timeout(Duration::from_millis(300), incoming.next()).await;
            assert!(nothing.is_err(), "a worker with the wrong key got through");
        })
        .unwrap();
    }
}
