//! The segment protocol with one thread per simulated local rank, each mapping the segments
//! itself as a separate process would.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::*;
use crate::collectives::shm::Node;

/// A fresh directory under /dev/shm (removed on drop) and a job id unique to the test.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let path = Path::new(SHM_DIR).join(format!("kolotest-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path).unwrap();
        Dir(path)
    }

    fn entries(&self) -> Vec<String> {
        std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The tests' data-plane key (one per test process).
fn key() -> &'static MacKey {
    static KEY: std::sync::OnceLock<MacKey> = std::sync::OnceLock::new();
    KEY.get_or_init(|| MacKey::derive(&crate::control::JobSecret::generate(), "data plane"))
}

/// Runs `body(node)` on `n` threads, each with its own node over segments in `dir`.
fn run<T: Send + 'static>(
    dir: &Dir,
    n: usize,
    half: usize,
    body: impl Fn(usize, ShmNode) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let barrier = Arc::new(Barrier::new(n));
    let body = Arc::new(body);
    let handles: Vec<_> = (0..n)
        .map(|me| {
            let (barrier, body, path) = (Arc::clone(&barrier), Arc::clone(&body), dir.0.clone());
            std::thread::spawn(move || {
                let node = ShmNode::setup(
                    names(&path),
                    (0..n).collect(),
                    me,
                    half,
                    Duration::from_secs(20),
                    |_| {
                        barrier.wait();
                        Ok(())
                    },
                )
                .unwrap();
                body(me, node)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn names(dir: &std::path::Path) -> SegmentNames<'_> {
    SegmentNames {
        dir,
        key: key(),
        set: 0,
    }
}

fn ok(_: usize) -> Result<(), Failure> {
    Ok(())
}

#[test]
fn segments_are_unlinked_once_every_rank_mapped_them() {
    let dir = Dir::new("unlink");
    let (path, n) = (dir.0.clone(), 3);
    let barrier = Arc::new(Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|me| {
            let (barrier, path) = (Arc::clone(&barrier), path.clone());
            std::thread::spawn(move || {
                let mut during = 0;
                let node = ShmNode::setup(
                    names(&path),
                    vec![4, 7, 9],
                    me,
                    4096,
                    Duration::from_secs(5),
                    |round| {
                        barrier.wait();
                        if round == 0 {
                            during = std::fs::read_dir(&path).unwrap().count();
                        }
                        barrier.wait();
                        Ok(())
                    },
                )
                .unwrap();
                assert_eq!(node.members(), [4, 7, 9]);
                during
            })
        })
        .collect();
    let seen: Vec<usize> = threads.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(
        seen,
        [3, 3, 3],
        "every rank's segment exists while they map"
    );
    assert!(dir.entries().is_empty(), "left behind: {:?}", dir.entries());
    let name = key().name(b"shared-memory segments", 32);
    assert_eq!(name.len(), 32);
    assert!(names(&dir.0)
        .path(7)
        .to_string_lossy()
        .ends_with(&format!("kolo-{name}-7")));
    assert!(SegmentNames {
        set: 3,
        ..names(&dir.0)
    }
    .path(7)
    .to_string_lossy()
    .ends_with(&format!("kolo-{name}-set3-7")));
}

#[test]
fn a_failed_setup_leaves_nothing_behind() {
    let dir = Dir::new("failed");
    let result = ShmNode::setup(
        names(&dir.0),
        vec![0, 1],
        0,
        4096,
        Duration::from_secs(1),
        |_| Ok(()),
    );
    // Rank 1 never created its segment: mapping it fails, and rank 0's own is removed.
    assert!(matches!(result, Err(Error::SharedMemory(_))), "{result:?}");
    assert!(dir.entries().is_empty(), "left behind: {:?}", dir.entries());
}

/// Sets up rank 0 of two over `dir` whose rank 1 "created" its segment with `plant(path)`.
/// Rank 0's setup of a 2-rank node after `plant` put something at rank `at`'s segment name.
fn setup_with_planted(dir: &Dir, at: usize, plant: impl FnOnce(&Path)) -> Result<ShmNode, Error> {
    let names = names(&dir.0);
    plant(&names.path(at));
    ShmNode::setup(names, vec![0, 1], 0, 4096, Duration::from_secs(1), |_| {
        Ok(())
    })
}

fn shm_error_text(result: Result<ShmNode, Error>) -> String {
    match result {
        Err(Error::SharedMemory(m)) => m,
        other => panic!("expected a SharedMemory error, got {other:?}"),
    }
}

/// Asserts that rank 0's setup refused what was planted at its own segment name.
fn assert_own_name_refused(result: Result<ShmNode, Error>, dir: &Dir) {
    let own = names(&dir.0).path(0);
    let m = shm_error_text(result);
    assert!(
        m.contains("already exists") && m.contains(&own.display().to_string()),
        "{m}"
    );
}

#[test]
fn a_symlink_at_a_segment_name_is_never_followed() {
    let dir = Dir::new("symlink");
    let victim = dir.0.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    // At a peer's name: opening refuses it.
    let m = shm_error_text(setup_with_planted(&dir, 1, |path| {
        std::os::unix::fs::symlink(&victim, path).unwrap()
    }));
    assert!(m.contains("symlink") && m.contains("kolo-"), "{m}");
    // At this rank's own name: creating refuses it (O_EXCL|O_NOFOLLOW), nothing is written
    // through it.
    let result = setup_with_planted(&dir, 0, |path| {
        std::os::unix::fs::symlink(&victim, path).unwrap()
    });
    assert_own_name_refused(result, &dir);
    let own = names(&dir.0).path(0);
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(std::fs::symlink_metadata(&own)
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn a_segment_of_another_user_or_mode_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = Dir::new("owner");
    let len = DATA_OFFSET + 2 * 4096;
    // Same uid, but readable by others.
    let m = shm_error_text(setup_with_planted(&dir, 1, |path| {
        std::fs::write(path, vec![0u8; len]).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    }));
    assert!(m.contains("mode is 644"), "{m}");
    std::fs::remove_file(names(&dir.0).path(1)).unwrap();
    // Another uid (chown needs root; skipped otherwise).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping the other-uid case: chown needs root");
        return;
    }
    let m = shm_error_text(setup_with_planted(&dir, 1, |path| {
        std::fs::write(path, vec![0u8; len]).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(path, Some(65534), Some(65534)).unwrap();
    }));
    assert!(m.contains("belongs to uid 65534"), "{m}");
}

#[test]
fn a_pre_created_own_segment_is_refused_not_reused() {
    let dir = Dir::new("precreated");
    let result = setup_with_planted(&dir, 0, |path| {
        std::fs::write(path, b"someone else's").unwrap()
    });
    assert_own_name_refused(result, &dir);
    assert_eq!(
        std::fs::read(names(&dir.0).path(0)).unwrap(),
        b"someone else's"
    );
}

#[test]
fn a_dead_creators_segment_is_reclaimed_and_a_live_ones_kept() {
    let dir = Dir::new("stale");
    let len = DATA_OFFSET + 2 * 4096;
    let header = |pid: u32| {
        let mut bytes = vec![0u8; len];
        bytes[..8].copy_from_slice(&MAGIC.to_le_bytes());
        bytes[PID_OFFSET..PID_OFFSET + 4].copy_from_slice(&pid.to_le_bytes());
        bytes[PIDNS_OFFSET..PIDNS_OFFSET + 8].copy_from_slice(&pid_namespace().to_le_bytes());
        bytes
    };
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let write_private = |name: &str, bytes: &[u8]| {
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.0.join(name);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut file, bytes).unwrap();
    };
    write_private("kolo-deadbeef-0", &header(dead));
    write_private("kolo-alive-0", &header(std::process::id()));
    write_private("other-file", &header(dead));
    assert_eq!(reclaim_stale(&dir.0), 1);
    let mut left = dir.entries();
    left.sort();
    assert_eq!(left, ["kolo-alive-0", "other-file"]);
}

#[test]
fn a_small_shm_dir_is_a_typed_error_at_setup_naming_size_and_free_space() {
    let dir = Dir::new("tmpfs");
    let target = std::ffi::CString::new(dir.0.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mounting a fresh tmpfs on our own empty directory (root only).
    let rc = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            c"size=16m".as_ptr().cast(),
        )
    };
    if rc != 0 {
        eprintln!(
            "skipping: cannot mount a 16 MiB tmpfs: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    struct Unmount(std::ffi::CString);
    impl Drop for Unmount {
        fn drop(&mut self) {
            // SAFETY: unmounting the tmpfs this test mounted.
            unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
        }
    }
    let _unmount = Unmount(target);
    // Two 8 MiB halves plus the header: more than the 16 MiB there.
    let result = ShmNode::setup(
        names(&dir.0),
        vec![0, 1],
        0,
        8 << 20,
        Duration::from_secs(1),
        |_| Ok(()),
    );
    let m = shm_error_text(result);
    assert!(
        m.contains(&format!("needs {} bytes", DATA_OFFSET + (16 << 20))),
        "{m}"
    );
    assert!(
        m.contains("free") && m.contains("--shm-size") && m.contains("KOLO_TRANSPORT=tcp"),
        "{m}"
    );
    assert!(dir.entries().is_empty(), "left behind: {:?}", dir.entries());
}

#[test]
fn phases_never_show_a_half_being_overwritten() {
    let dir = Dir::new("phases");
    let n = 3;
    let results = run(&dir, n, 4096, move |me, node| {
        let mut checked = 0u64;
        for p in 0..3000u64 {
            let halves = node
                .phase(&ok, |half| {
                    let value = p * 16 + me as u64;
                    for w in half.chunks_exact_mut(8).take(64) {
                        w.copy_from_slice(&value.to_le_bytes());
                    }
                    Ok(())
                })
                .unwrap();
            // Every rank published p; nobody may have started p + 2 on this half yet.
            for j in 0..n {
                for w in halves.get(j).chunks_exact(8).take(64) {
                    assert_eq!(u64::from_le_bytes(w.try_into().unwrap()), p * 16 + j as u64);
                    checked += 1;
                }
            }
        }
        checked
    });
    assert_eq!(results, vec![3000 * 64 * 3; 3]);
}

#[test]
fn a_wait_stops_when_the_liveness_check_fails_or_times_out() {
    let dir = Dir::new("dead");
    let results = run(&dir, 2, 4096, |me, mut node| {
        if me == 1 {
            // The "dead" peer: maps everything, then never publishes.
            std::thread::sleep(Duration::from_millis(300));
            return None;
        }
        let started = Instant::now();
        let gone = |_: usize| -> Result<(), Failure> {
            if started.elapsed() > Duration::from_millis(50) {
                Err(Failure::Aborted)
            } else {
                Ok(())
            }
        };
        let failure = node.phase(&gone, |_| Ok(())).map(|_| ()).unwrap_err();
        assert!(matches!(failure, Failure::Aborted), "{failure:?}");
        assert!(started.elapsed() < Duration::from_millis(200));
        node.op_timeout = Duration::from_millis(100);
        let failure = node.phase(&ok, |_| Ok(())).map(|_| ()).unwrap_err();
        assert!(
            matches!(failure, Failure::Timeout { ref peers } if peers == &[1]),
            "{failure:?}"
        );
        Some(started.elapsed())
    });
    assert!(results[0].unwrap() < Duration::from_secs(2));
}

#[test]
fn a_peer_that_posted_then_left_while_this_rank_was_descheduled_completed_the_phase() {
    // Rank 1 posts the phase and shuts down (its TCP link then shows a Fail frame) in the
    // window between rank 0's last look at the posted word and its liveness check: the phase
    // is complete, not failed (a reset's last engine cycle, on a loaded machine).
    let dir = Dir::new("posted-left");
    let go = Arc::new(Barrier::new(2));
    let results = run(&dir, 2, 4096, move |me, node| {
        if me == 1 {
            go.wait();
            return node.phase(&ok, |_| Ok(())).is_ok();
        }
        let released = std::sync::atomic::AtomicBool::new(false);
        let left = |_: usize| -> Result<(), Failure> {
            if !released.swap(true, Ordering::SeqCst) {
                go.wait();
                let deadline = Instant::now() + Duration::from_secs(5);
                while node.word(1, POSTED_OFFSET).load(Ordering::SeqCst) == 0 {
                    assert!(Instant::now() < deadline, "rank 1 never posted");
                    std::thread::yield_now();
                }
            }
            Err(Failure::GaveUp {
                peer: 1,
                reason: "rank 1 shut down its communicator".into(),
            })
        };
        let outcome = node.phase(&left, |_| Ok(())).map(|_| ());
        assert!(outcome.is_ok(), "{outcome:?}");
        true
    });
    assert_eq!(results, [true, true]);
}

#[test]
fn a_peer_ahead_is_seen() {
    let dir = Dir::new("ahead");
    run(&dir, 2, 4096, |me, node| {
        if me == 0 {
            node.phase(&ok, |_| Ok(())).map(|_| ()).unwrap();
        } else {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !node.peer_ahead() {
                assert!(Instant::now() < deadline);
                std::thread::yield_now();
            }
            node.phase(&ok, |_| Ok(())).map(|_| ()).unwrap();
            assert!(!node.peer_ahead());
        }
    });
}

fn f32s(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
    values.into_iter().flat_map(f32::to_le_bytes).collect()
}

#[test]
fn node_collectives_match_the_reference() {
    use crate::dtype::{DType, ReduceOp};
    let dir = Dir::new("collectives");
    let n = 3;
    // A small half (16 KiB) so every algorithm takes many phases; each way of storing into it.
    for streaming in [false, true] {
        run(&dir, n, 16 << 10, move |me, mut node| {
            node.forced_stores = Some(streaming);
            let node = Node {
                alive: &ok,
                node: &node,
            };
            let input = |r: usize, len: usize| -> Vec<f32> {
                (0..len).map(|i| ((i * 7 + r * 3) % 11) as f32).collect()
            };
            for len in [0usize, 1, 5, 1000, 4096, 30_011] {
                let mut buf = f32s(input(me, len));
                node.allreduce(&mut buf, DType::F32, ReduceOp::Sum, 0.5)
                    .unwrap();
                let expected =
                    f32s((0..len).map(|i| (0..n).map(|r| input(r, len)[i]).sum::<f32>() * 0.5));
                assert_eq!(buf, expected, "allreduce of {len}");

                let segs = crate::collectives::shm_test_segments(len * 4, n);
                let mut out = vec![0u8; segs[me].len()];
                let full = f32s(input(me, len));
                node.reducescatter(&full, &mut out, &segs, DType::F32, ReduceOp::Max, 1.0)
                    .unwrap();
                let max =
                    f32s((0..len).map(|i| (0..n).map(|r| input(r, len)[i]).fold(0.0, f32::max)));
                assert_eq!(out, max[segs[me].clone()], "reducescatter of {len}");

                let mut gathered = vec![0u8; len * 4 * n];
                let gsegs: Vec<_> = (0..n).map(|r| r * len * 4..(r + 1) * len * 4).collect();
                gathered[gsegs[me].clone()].copy_from_slice(&f32s(input(me, len)));
                node.allgather(&mut gathered, &gsegs).unwrap();
                let all: Vec<u8> = (0..n).flat_map(|r| f32s(input(r, len))).collect();
                assert_eq!(gathered, all, "allgather of {len}");

                let mut b = f32s(input(me, len));
                node.broadcast(&mut b, 2).unwrap();
                assert_eq!(b, f32s(input(2, len)), "broadcast of {len}");
            }
            // alltoall: rank r sends (r + j) * 5000 + 1 bytes to rank j.
            let size = |from: usize, to: usize| (from + to) * 5000 + 1;
            let byte = |from: usize, to: usize, i: usize| (from * 31 + to * 7 + i) as u8;
            let send: Vec<_> = (0..n)
                .scan(0, |at, j| {
                    let r = *at..*at + size(me, j);
                    *at = r.end;
                    Some(r)
                })
                .collect();
            let recv: Vec<_> = (0..n)
                .scan(0, |at, j| {
                    let r = *at..*at + size(j, me);
                    *at = r.end;
                    Some(r)
                })
                .collect();
            let mut input = vec![0u8; send.last().unwrap().end];
            for (j, r) in send.iter().enumerate() {
                for (i, b) in input[r.clone()].iter_mut().enumerate() {
                    *b = byte(me, j, i);
                }
            }
            let mut output = vec![0u8; recv.last().unwrap().end];
            output[recv[me].clone()].copy_from_slice(&input[send[me].clone()]);
            node.alltoall(&input, &send, &mut output, &recv, size(n - 1, n - 1))
                .unwrap();
            for (j, r) in recv.iter().enumerate() {
                for (i, b) in output[r.clone()].iter().enumerate() {
                    assert_eq!(*b, byte(j, me, i), "alltoall from {j}");
                }
            }
            let long = vec![me as u8; 40_000 * (me + 1)];
            let got = node.exchange(&long, 1 << 20).unwrap();
            for (j, payload) in got.iter().enumerate() {
                assert_eq!(payload, &vec![j as u8; 40_000 * (j + 1)]);
            }
        });
    }
    assert!(dir.entries().is_empty());
}

#[test]
fn scattered_allreduce_and_broadcast_match_the_contiguous_ones() {
    use crate::collectives::scattered::Scattered;
    use crate::dtype::{DType, ReduceOp};
    let dir = Dir::new("scattered");
    let n = 3;
    // A 16 KiB half: the large algorithm runs many rounds whose segments cross tensor ends.
    run(&dir, n, 16 << 10, move |me, node| {
        let node = Node {
            alive: &ok,
            node: &node,
        };
        let input = |r: usize, len: usize, salt: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 7 + r * 3 + salt) % 13) as f32)
                .collect()
        };
        // Tensor lengths (elements): empty ones, one-element ones, ones larger than a half.
        for lens in [
            vec![1usize, 0, 2, 5],
            vec![3000, 1, 0, 4099, 7, 2500],
            vec![10_000, 17, 6000, 1],
        ] {
            let mut tensors: Vec<Vec<u8>> = lens
                .iter()
                .enumerate()
                .map(|(t, &len)| f32s(input(me, len, t)))
                .collect();
            let mut batch =
                Scattered::new(tensors.iter_mut().map(|t| &mut t[..]).collect()).unwrap();
            node.allreduce_scattered(&mut batch, DType::F32, ReduceOp::Sum, 0.5)
                .unwrap();
            for (t, &len) in lens.iter().enumerate() {
                let expected =
                    f32s((0..len).map(|i| (0..n).map(|r| input(r, len, t)[i]).sum::<f32>() * 0.5));
                assert_eq!(tensors[t], expected, "tensor {t} of {lens:?}");
            }
            let mut tensors: Vec<Vec<u8>> = lens
                .iter()
                .enumerate()
                .map(|(t, &len)| f32s(input(me, len, t)))
                .collect();
            let mut batch =
                Scattered::new(tensors.iter_mut().map(|t| &mut t[..]).collect()).unwrap();
            node.broadcast_scattered(&mut batch, 1).unwrap();
            for (t, &len) in lens.iter().enumerate() {
                assert_eq!(
                    tensors[t],
                    f32s(input(1, len, t)),
                    "broadcast {t} of {lens:?}"
                );
            }
        }
    });
    assert!(dir.entries().is_empty());
}

/// `n` local ranks' inputs of `len` bytes of `dtype`: element `i` of rank `r` is
/// `(7i + 3r) % 4 + 1` (so sums, products and averages of up to 3 ranks are exact in every
/// dtype, and bool gets both values as its parity).
fn pattern_inputs(dtype: crate::dtype::DType, len: usize, n: usize) -> Vec<Vec<u8>> {
    use crate::dtype::DType;
    let element = |v: i64| -> Vec<u8> {
        match dtype {
            DType::U8 => vec![v as u8],
            DType::I8 => vec![v as i8 as u8],
            DType::Bool => vec![(v % 2) as u8],
            DType::I16 => (v as i16).to_le_bytes().to_vec(),
            DType::I32 => (v as i32).to_le_bytes().to_vec(),
            DType::I64 => v.to_le_bytes().to_vec(),
            DType::F16 => half::f16::from_f64(v as f64).to_le_bytes().to_vec(),
            DType::BF16 => crate::reduce::f32_to_bf16(v as f32).to_le_bytes().to_vec(),
            DType::F32 => (v as f32).to_le_bytes().to_vec(),
            DType::F64 => (v as f64).to_le_bytes().to_vec(),
        }
    };
    (0..n)
        .map(|r| {
            // The pattern repeats every 4 elements.
            let period: Vec<u8> = (0..4)
                .flat_map(|i| element((7 * i + 3 * r as i64) % 4 + 1))
                .collect();
            period.iter().copied().cycle().take(len).collect()
        })
        .collect()
}

/// The reduction of `inputs` in rank order, times `factor`, with the kernels on whole buffers.
fn reference(
    dtype: crate::dtype::DType,
    op: crate::dtype::ReduceOp,
    inputs: &[Vec<u8>],
    factor: f64,
) -> Vec<u8> {
    let mut acc = inputs[0].clone();
    for input in &inputs[1..] {
        crate::reduce::reduce_into(dtype, op, &mut acc, input).unwrap();
    }
    crate::reduce::scale(dtype, &mut acc, factor).unwrap();
    acc
}

/// The large allreduce at the real half and round sizes: every dtype and elementwise op, on
/// 2 and 3 ranks, at sizes on both sides of the one-phase limit, of a whole round and of two
/// rounds, with element counts that leave uneven segments and partial rounds.
#[test]
fn allreduce_of_every_dtype_and_op_around_the_round_boundaries() {
    use crate::collectives::shm::{ROUND_REGION_MAX, SMALL_ALLREDUCE};
    use crate::dtype::{DType, ReduceOp};
    for (n, streaming) in [(2usize, false), (3, false), (2, true), (3, true)] {
        let dir = Dir::new(&format!("rounds{n}{streaming}"));
        run(&dir, n, DEFAULT_HALF_BYTES, move |me, mut node| {
            node.forced_stores = Some(streaming);
            let node = Node {
                alive: &ok,
                node: &node,
            };
            // ROUND_REGION_MAX is a multiple of every element size and of 64, and below
            // half / 3: each round is n regions of ROUND_REGION_MAX.
            const { assert!(ROUND_REGION_MAX * 3 <= DEFAULT_HALF_BYTES) };
            let round = n * ROUND_REGION_MAX;
            for dtype in DType::ALL {
                let e = dtype.size();
                let sizes = [
                    e,
                    3 * e,
                    SMALL_ALLREDUCE,
                    SMALL_ALLREDUCE + e,
                    round - e,
                    round,
                    round + 7 * e,
                    2 * round + 5 * e,
                ];
                for len in sizes {
                    let inputs = pattern_inputs(dtype, len, n);
                    let mut ops = vec![
                        (ReduceOp::Sum, 1.0),
                        (ReduceOp::Product, 1.0),
                        (ReduceOp::Min, 1.0),
                        (ReduceOp::Max, 1.0),
                    ];
                    if dtype != DType::Bool {
                        ops.push((ReduceOp::Average, 1.0 / n as f64));
                    }
                    for (op, factor) in ops {
                        let mut buf = inputs[me].clone();
                        node.allreduce(&mut buf, dtype, op, factor).unwrap();
                        let expected = reference(dtype, op, &inputs, factor);
                        assert!(
                            buf == expected,
                            "{n} ranks, {op:?} of {len} bytes of {dtype}: first difference at \
                             byte {:?}",
                            buf.iter().zip(&expected).position(|(a, b)| a != b)
                        );
                    }
                }
            }
        });
        assert!(dir.entries().is_empty());
    }
}

#[test]
fn the_first_local_ranks_choice_of_stores_reaches_the_others_per_size() {
    let dir = Dir::new("stores");
    let step = Arc::new(Barrier::new(2));
    let seen = run(&dir, 2, 16 << 10, move |me, node| {
        let mib = 1 << 20;
        let mut seen = Vec::new();
        // Ordinary until tried; a few tuned allreduces of 1 MiB, then a trial of streaming.
        seen.push((node.streaming(mib), node.streaming(TUNED_MIN)));
        step.wait();
        if me == 0 {
            for _ in 0..4 {
                node.tune_stores(false, mib, Duration::from_micros(500));
            }
        }
        step.wait();
        seen.push((node.streaming(mib), node.streaming(TUNED_MIN)));
        step.wait();
        // The trial is 5x cheaper: streaming is kept for 1 MiB, and only for that size.
        if me == 0 {
            node.tune_stores(true, mib, Duration::from_micros(100));
            node.tune_stores(true, mib, Duration::from_micros(100));
        }
        step.wait();
        seen.push((node.streaming(mib), node.streaming(TUNED_MIN)));
        seen
    });
    for (me, seen) in seen.iter().enumerate() {
        assert_eq!(
            seen,
            &[(false, false), (true, false), (true, false)],
            "rank {me}"
        );
    }
    assert!(dir.entries().is_empty());
}

/// A fused batch at the real half and round sizes: tensors of odd lengths whose ends fall
/// inside rounds and inside the reduction's blocks, averaged on 2 and 3 ranks.
#[test]
fn a_fused_batch_across_rounds_matches_the_tensors_reduced_alone() {
    use crate::collectives::scattered::Scattered;
    use crate::dtype::{DType, ReduceOp};
    for n in [2usize, 3] {
        let dir = Dir::new(&format!("fused{n}"));
        run(&dir, n, DEFAULT_HALF_BYTES, move |me, node| {
            let node = Node {
                alive: &ok,
                node: &node,
            };
            for dtype in [DType::F32, DType::BF16, DType::I64] {
                let e = dtype.size();
                let lens = [1usize, 131_075, 0, 200_001, 7, 4099, 262_144, 3];
                let inputs: Vec<Vec<Vec<u8>>> = lens
                    .iter()
                    .map(|&l| pattern_inputs(dtype, l * e, n))
                    .collect();
                let mut tensors: Vec<Vec<u8>> = inputs.iter().map(|t| t[me].clone()).collect();
                let mut batch =
                    Scattered::new(tensors.iter_mut().map(|t| &mut t[..]).collect()).unwrap();
                let factor = 1.0 / n as f64;
                node.allreduce_scattered(&mut batch, dtype, ReduceOp::Sum, factor)
                    .unwrap();
                for (t, got) in tensors.iter().enumerate() {
                    let expected = reference(dtype, ReduceOp::Sum, &inputs[t], factor);
                    assert!(
                        *got == expected,
                        "{n} ranks, tensor {t} of {lens:?} ({dtype})"
                    );
                }
            }
        });
        assert!(dir.entries().is_empty());
    }
}

/// Minor page faults this thread has taken.
fn minor_faults() -> i64 {
    // SAFETY: getrusage writes one rusage into the zeroed struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid `who` and a live struct to write.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    assert_eq!(rc, 0);
    usage.ru_minflt
}

/// The segments are mapped with their pages already in place: the first collective over a
/// node does not fault on each page of its own halves (written) and of the peers' (read).
#[test]
fn the_first_collective_takes_no_page_faults_on_the_segments() {
    use crate::dtype::{DType, ReduceOp};
    let dir = Dir::new("prefault");
    let faults = run(&dir, 2, DEFAULT_HALF_BYTES, move |_, node| {
        let node = Node {
            alive: &ok,
            node: &node,
        };
        // 3 MiB through 512 KiB regions: both halves of both segments, 1 MiB of each.
        let mut buf = vec![1u8; 3 << 20];
        let before = minor_faults();
        node.allreduce(&mut buf, DType::U8, ReduceOp::Max, 1.0)
            .unwrap();
        let faults = minor_faults() - before;
        assert!(buf.iter().all(|&b| b == 1));
        faults
    });
    // Unmapped pages would fault ~1000 times (4 MiB of halves touched, 4 KiB pages).
    for (rank, f) in faults.into_iter().enumerate() {
        assert!(
            f < 64,
            "rank {rank} took {f} minor page faults in its first allreduce"
        );
    }
    assert!(dir.entries().is_empty());
}

#[test]
fn only_a_background_waiter_without_a_core_of_its_own_gives_up_spinning() {
    let full = (SPIN_FOR, YIELD_FOR);
    let short = (BACKGROUND_SPIN_FOR, Duration::ZERO);
    assert_eq!(spin_budget(false, 2, 2), full, "a caller blocks anyway");
    assert_eq!(
        spin_budget(true, 4, 2),
        full,
        "a core per rank and per engine thread"
    );
    assert_eq!(spin_budget(true, 3, 2), short);
    assert_eq!(spin_budget(true, 2, 2), short);
    assert_eq!(spin_budget(true, 1, 1), short);
}

/// CPU time this thread used so far.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer for the calling thread's clock.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(status, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[test]
fn a_background_waiter_without_a_core_of_its_own_sleeps_instead_of_spinning() {
    // Rank 0 waits 3 ms for rank 1 on a background thread of a host with one core per rank:
    // the CPU it uses meanwhile is taken from a computation. With the foreground's budget
    // (spin, then yield) it used 208-233 us; spinning a moment and sleeping, 11-39 us.
    let dir = Dir::new("background");
    let go = Arc::new(Barrier::new(2));
    let used = run(&dir, 2, 4096, move |me, mut node| {
        // A first phase together: what a first wait costs once (page faults, lazy binding)
        // is not what this test is about.
        node.phase(&ok, |_| Ok(())).map(|_| ()).unwrap();
        go.wait();
        if me == 1 {
            std::thread::sleep(Duration::from_millis(3));
            node.phase(&ok, |_| Ok(())).map(|_| ()).unwrap();
            return Duration::ZERO;
        }
        node.cores = 2;
        wait_in_background();
        let before = thread_cpu();
        node.phase(&ok, |_| Ok(())).map(|_| ()).unwrap();
        thread_cpu() - before
    });
    assert!(
        used[0] < Duration::from_micros(100),
        "the background waiter used {:?} of CPU while its peer was 3 ms late",
        used[0]
    );
}
