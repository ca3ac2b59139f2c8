//! `HOROVOD_THREAD_AFFINITY` (or `KOLO_THREAD_AFFINITY`): pins the engine's background thread
//! to one core per local rank, as Horovod's `parse_and_set_affinity`
//! (`horovod/common/common.cc`) does. The value is a comma list of core ids, one per local
//! rank; local rank `i` gets the `i`-th. Like Horovod, a value kolo cannot use is logged as an
//! error and the thread stays unpinned (training goes on).

/// The core local rank `local_rank` of `local_size` is pinned to by `text`, or why none.
///
/// ```
/// # use kolo_collective::engine::affinity::core_for;
/// assert_eq!(core_for("3,1", 2, 1), Ok(1));
/// assert!(core_for("3", 2, 0).is_err());
/// ```
pub fn core_for(text: &str, local_size: usize, local_rank: usize) -> Result<usize, String> {
    let mut cores = Vec::with_capacity(local_size);
    for item in text.split(',').take(local_size) {
        let core = item.trim().parse::<usize>().map_err(|_| {
            format!("core id {item:?} is not a whole number >= 0 in HOROVOD_THREAD_AFFINITY={text}")
        })?;
        cores.push(core);
    }
    if cores.len() < local_size {
        return Err(format!(
            "expected {local_size} core ids (one per local rank) but got {} in \
             HOROVOD_THREAD_AFFINITY={text}",
            cores.len()
        ));
    }
    Ok(cores[local_rank])
}

/// Pins the calling thread to `core`.
pub fn pin_current_thread(core: usize) -> std::io::Result<()> {
    // SAFETY: `set` is plain data owned by this frame; CPU_SET checks nothing beyond the set's
    // size, so `core` is bounded first; sched_setaffinity(0) applies to the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if core >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        libc::CPU_SET(core, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Applies `text` (the variable's value) to the calling thread, logging what happened.
pub(crate) fn apply(text: &str, local_size: usize, local_rank: usize) {
    match core_for(text, local_size, local_rank) {
        Ok(core) => match pin_current_thread(core) {
            Ok(()) => log::info!("background thread affinity {core}"),
            Err(err) => log::error!(
                "cannot pin the background thread to core {core} (HOROVOD_THREAD_AFFINITY={text}): \
                 {err}"
            ),
        },
        Err(why) => log::error!("{why}; the background thread is not pinned"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_local_rank_takes_its_core() {
        assert_eq!(core_for("1", 1, 0), Ok(1));
        assert_eq!(core_for("3, 1", 2, 0), Ok(3));
        assert_eq!(core_for("3,1", 2, 1), Ok(1));
        // Extra ids are ignored, as in Horovod.
        assert_eq!(core_for("0,1,2", 2, 1), Ok(1));
    }

    #[test]
    fn too_few_or_bad_ids_pin_nothing() {
        assert!(core_for("1", 2, 0)
            .unwrap_err()
            .contains("expected 2 core ids"));
        assert!(core_for("a,1", 2, 1).unwrap_err().contains("\"a\""));
        assert!(core_for("-1", 1, 0).is_err());
    }

    #[test]
    fn pinning_a_thread_shows_in_its_affinity() {
        std::thread::spawn(|| {
            pin_current_thread(0).unwrap();
            // SAFETY: plain data, filled by the call.
            let set = unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                assert_eq!(
                    libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
                    0
                );
                set
            };
            let pinned: Vec<usize> = (0..64)
                // SAFETY: reads a bit of `set`; 64 is within the set's size.
                .filter(|core| unsafe { libc::CPU_ISSET(*core, &set) })
                .collect();
            assert_eq!(pinned, [0]);
        })
        .join()
        .unwrap();
    }
}
