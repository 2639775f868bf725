//! The agent's process footprint: one runtime thread, glibc malloc held to one arena and given
//! back to the kernel while idle.
//!
//! The agent is I/O-bound (it relays xDS, serves SDS, DNS and the status port); one thread runs
//! every task, and CPU-heavy work (key generation) goes to tokio's blocking pool, whose threads
//! exit after 10 s idle. Running everything on the main thread also keeps Envoy's
//! `PR_SET_PDEATHSIG` tied to a thread that lives as long as the process.
//!
//! Measured with `agent/benches/idle.sh` (see the README figures).
// mallopt(3), malloc_trim(3), madvise(2) and the open-file rlimit.
#![allow(unsafe_code)]

use std::time::Duration;

/// How often the idle trimmer hands freed heap pages back to the kernel.
const TRIM_EVERY: Duration = Duration::from_secs(10);
/// The first trim: after startup (bootstrap, first xDS push, first certificate).
const FIRST_TRIM: Duration = Duration::from_secs(2);

/// Heap a burst may keep until the idle trimmer runs (see [`tune_malloc`]).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const KEEP_WHILE_BUSY: libc::c_int = 16 << 20;

/// Limits glibc malloc to one arena: with a handful of threads that rarely allocate at the same
/// time, per-thread arenas (64 MiB reserved, some hundred KiB touched each) cost memory and buy
/// nothing. And leaves giving memory back to the idle trimmer ([`trim_while_idle`]): glibc
/// would otherwise shrink the heap after each xDS push and map large buffers afresh for each,
/// so that every push pays its page faults again (8% of the relay's CPU in
/// `agent/benches/cds-relay.sh`). Call before any thread starts.
pub fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets malloc parameters; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_TRIM_THRESHOLD, KEEP_WHILE_BUSY);
        libc::mallopt(libc::M_MMAP_THRESHOLD, KEEP_WHILE_BUSY);
    }
}

/// Raises the soft open-file limit to the hard limit, as Go's runtime does for Istio's agent:
/// a kubelet's pod gets a soft limit of 1024, which one peer holding connections to the status
/// port would otherwise reach. Logs the limits in force, or warns when it cannot raise them.
pub fn raise_open_file_limit() -> Option<(u64, u64)> {
    match proto::listen::raise_open_file_limit() {
        Ok((soft, hard)) => {
            tracing::info!(soft, hard, "open file limit");
            Some((soft, hard))
        }
        Err(e) => {
            tracing::warn!(error = %e,
                "cannot raise the open file limit (RLIMIT_NOFILE) to its hard limit; \
                 connections may run out of file descriptors");
            None
        }
    }
}

/// Returns freed heap pages to the kernel (glibc keeps them otherwise: after a big xDS push the
/// freed buffers would stay resident).
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim is thread-safe and takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Code pages to release at the idle trimmer's next tick ([`release_code_later`]).
static RELEASE_CODE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Asks the idle trimmer ([`trim_while_idle`]) to release the code pages at its next tick, as
/// after startup: for work that ran code the idle agent does not (a CPU profile, an xDS response
/// too long to hold).
pub fn release_code_later() {
    RELEASE_CODE.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Unmaps the agent's own code and read-only data after startup, leaving only what the idle
/// agent runs next in its RSS.
///
/// Startup runs code that never runs again (config parsing, bootstrap, the first CSR), and the
/// kernel's fault-around maps 64 KiB of the binary at each first touch, so most of the 10 MiB of
/// machine code stays mapped. `MADV_DONTNEED` on the executable's clean, read-only, private
/// mappings only drops page-table entries: the bytes stay in the page cache (shared and
/// reclaimable, as any file page) and the next touch maps them again (a minor fault). Mappings
/// with private copies (relocated RELRO data, a debugger's breakpoints) are left alone, so no
/// byte can change. Returns the bytes released (0 where unsupported).
pub fn release_startup_code() -> usize {
    #[cfg(target_os = "linux")]
    {
        let (Ok(exe), Ok(smaps)) = (
            std::fs::read_link("/proc/self/exe"),
            std::fs::read_to_string("/proc/self/smaps"),
        ) else {
            return 0;
        };
        let mut released = 0;
        for (range, anonymous_kib) in clean_readonly_mappings(&smaps, &exe) {
            if anonymous_kib != 0 {
                continue;
            }
            // SAFETY: the range is a whole, read-only, private mapping of our executable with
            // no private (anonymous) pages: dropping its page-table entries loses nothing, the
            // next access maps the same file bytes again.
            if unsafe {
                libc::madvise(
                    range.0 as *mut libc::c_void,
                    range.1 - range.0,
                    libc::MADV_DONTNEED,
                )
            } == 0
            {
                released += range.1 - range.0;
            }
        }
        released
    }
    #[cfg(not(target_os = "linux"))]
    0
}

/// `((start, end), Anonymous kB)` for each non-writable private mapping of `exe` in `smaps`.
fn clean_readonly_mappings(smaps: &str, exe: &std::path::Path) -> Vec<((usize, usize), u64)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, usize)> = None;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((start, end)) = first.split_once('-')
            && let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            )
        {
            // A mapping header: `start-end perms offset dev inode [path]`.
            let perms = fields.next().unwrap_or("");
            let path = line.find('/').map(|i| std::path::Path::new(&line[i..]));
            let ours = path == Some(exe)
                && perms.len() == 4
                && perms.as_bytes()[1] != b'w'
                && perms.as_bytes()[3] == b'p';
            current = ours.then_some((start, end));
        } else if first == "Anonymous:"
            && let Some(range) = current.take()
        {
            let kib = fields
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(u64::MAX);
            out.push((range, kib));
        }
    }
    out
}

/// The agent's runtime: one thread for every task, plus the blocking pool on demand.
pub fn build() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// One tick of the idle trimmer: the heap trimmed, and the code pages released when
/// [`release_code_later`] asked; true when they were.
fn tick() -> bool {
    trim();
    if !RELEASE_CODE.swap(false, std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    let released = release_startup_code();
    tracing::debug!(released, "released code pages");
    true
}

/// Trims the heap after startup and then every [`TRIM_EVERY`] until the token is cancelled;
/// releases the code pages after startup and at a tick after [`release_code_later`].
pub async fn trim_while_idle(stop: tokio_util::sync::CancellationToken) {
    tokio::select! {
        _ = stop.cancelled() => return,
        _ = tokio::time::sleep(FIRST_TRIM) => {
            trim();
            let released = release_startup_code();
            tracing::debug!(released, "released startup code pages");
        }
    }
    let mut every = tokio::time::interval_at(tokio::time::Instant::now() + TRIM_EVERY, TRIM_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {
                tick();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubelet_soft_open_file_limit_is_raised_to_the_hard_limit() {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit only read and write the struct passed to them.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        if lim.rlim_max > 1024 {
            let kubelet = libc::rlimit {
                rlim_cur: 1024,
                rlim_max: lim.rlim_max,
            };
            // SAFETY: as above.
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &kubelet) }, 0);
        }
        assert_eq!(raise_open_file_limit(), Some((lim.rlim_max, lim.rlim_max)));
        // SAFETY: as above.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(lim.rlim_cur, lim.rlim_max, "in force");
    }

    #[test]
    fn runtime_runs_spawned_and_blocking_tasks_on_one_worker() {
        let rt = build().unwrap();
        let main = std::thread::current().id();
        let (spawned, blocking) = rt.block_on(async {
            let spawned = tokio::spawn(async { std::thread::current().id() })
                .await
                .unwrap();
            let blocking = tokio::task::spawn_blocking(|| std::thread::current().id())
                .await
                .unwrap();
            (spawned, blocking)
        });
        assert_eq!(
            spawned, main,
            "tasks run on the thread that drives the runtime"
        );
        assert_ne!(blocking, main, "blocking work leaves the task thread free");
    }

    const SMAPS: &str = "\
55d0c0000000-55d0c0100000 r--p 00000000 fd:01 42   /opt/bin/pilot-agent
Rss:                 400 kB
Anonymous:             0 kB
55d0c0100000-55d0c0900000 r-xp 00100000 fd:01 42   /opt/bin/pilot-agent
Anonymous:             0 kB
55d0c0900000-55d0c0960000 r--p 00900000 fd:01 42   /opt/bin/pilot-agent
Anonymous:           384 kB
55d0c0960000-55d0c0964000 rw-p 00960000 fd:01 42   /opt/bin/pilot-agent
Anonymous:            16 kB
7f0000000000-7f0000100000 r-xp 00000000 fd:01 7    /usr/lib/libc.so.6
Anonymous:             0 kB
7f0000200000-7f0000300000 r-xp 00000000 fd:01 43   /opt/bin/pilot agent copy
Anonymous:             0 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0    [stack]
Anonymous:           132 kB
";

    #[test]
    fn only_the_executables_readonly_private_mappings_are_candidates() {
        let got = clean_readonly_mappings(SMAPS, std::path::Path::new("/opt/bin/pilot-agent"));
        assert_eq!(
            got,
            vec![
                ((0x55d0c0000000, 0x55d0c0100000), 0),
                ((0x55d0c0100000, 0x55d0c0900000), 0),
                // Relocated RELRO data: private copies, never released.
                ((0x55d0c0900000, 0x55d0c0960000), 384),
            ]
        );
        let spaced =
            clean_readonly_mappings(SMAPS, std::path::Path::new("/opt/bin/pilot agent copy"));
        assert_eq!(spaced, vec![((0x7f0000200000, 0x7f0000300000), 0)]);
    }

    #[test]
    fn released_code_still_runs() {
        // Whatever the test binary's layout, dropping its clean code pages must leave it
        // working: the next call maps the same bytes again.
        let released = release_startup_code();
        assert!(released > 0, "the test binary has clean read-only mappings");
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(v.iter().sum::<u64>(), 500_500);
        assert_eq!(format!("{:?}", Some(released > 0)), "Some(true)");
    }

    #[test]
    fn trimmer_stops_when_cancelled() {
        let rt = build().unwrap();
        rt.block_on(async {
            let stop = tokio_util::sync::CancellationToken::new();
            let task = tokio::spawn(trim_while_idle(stop.clone()));
            stop.cancel();
            task.await.unwrap();
        });
    }

    #[test]
    fn code_pages_asked_for_go_at_the_next_tick() {
        release_code_later();
        assert!(tick(), "released");
    }
}
