//! The agent's CPU profile (`/debug/pprof/profile` on the status port): while a profile runs,
//! every 10 ms of CPU the process uses, the thread using it is interrupted and its stack
//! recorded (100 Hz, Go's rate); at the end the stacks are named from the executable's symbol
//! table and written in pprof's profile format, gzip-compressed, as Go's agent serves it and
//! `go tool pprof` reads it.
//!
//! Nothing of it costs anything until a profile is asked for: no timer, no buffer, and no
//! signal handler before the first one (from then on an installed handler that no signal
//! reaches). One profile at a time, as Go's runtime: a second is refused ([`Error::InUse`]).
//!
//! - `sampler`: the timer, the signal handler and the fixed buffer it writes.
//! - `symbols`: the mappings, build IDs and function names of the executable and its
//!   libraries, from `/proc/self`.
//! - `encode`: the stacks as a `perftools.profiles.Profile`.

mod encode;
mod sampler;
mod symbols;

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant, SystemTime};

use prost::Message;

/// Why no profile was made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Another profile is running (the words of Go's runtime).
    #[error("cpu profiling already in use")]
    InUse,
    #[error("cannot start the SIGPROF timer: {0}")]
    Start(#[source] std::io::Error),
    #[error("cannot compress the profile: {0}")]
    Compress(#[source] std::io::Error),
    #[error("the profile's last step did not finish: {0}")]
    Finish(String),
}

/// How often the samples are moved out of the signal handler's buffer.
const COLLECT_EVERY: Duration = Duration::from_millis(100);
/// Distinct stacks kept, at most (each up to 64 addresses: 8 MiB in all); past it a sample of
/// a stack not seen yet is counted as lost.
const MAX_STACKS: usize = 16_384;

/// One recorded stack: the thread's name and the addresses, innermost first.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Stack {
    thread: String,
    pcs: Box<[usize]>,
}

/// A running profile; dropping it stops the sampling (a client gone before the end).
pub struct Profile {
    sampler: sampler::Running,
    stacks: HashMap<Stack, i64>,
    /// Thread names by thread id (`/proc/self/task/<tid>/comm`), read once each.
    threads: HashMap<i32, String>,
    dropped: u64,
    started: SystemTime,
    clock: Instant,
}

impl Profile {
    /// Starts sampling.
    pub fn start() -> Result<Profile, Error> {
        let sampler = sampler::Running::start().map_err(|e| match e {
            sampler::StartError::InUse => Error::InUse,
            sampler::StartError::Os(e) => Error::Start(e),
        })?;
        Ok(Profile {
            sampler,
            stacks: HashMap::new(),
            threads: HashMap::new(),
            dropped: 0,
            started: SystemTime::now(),
            clock: Instant::now(),
        })
    }

    /// Moves the samples recorded since the last call into the profile.
    pub fn collect(&mut self) {
        let Profile {
            sampler,
            stacks,
            threads,
            dropped,
            ..
        } = self;
        sampler.collect(|s| {
            let thread = threads
                .entry(s.tid)
                .or_insert_with(|| thread_name(s.tid))
                .clone();
            let stack = Stack {
                thread,
                pcs: s.pcs.into(),
            };
            if let Some(n) = stacks.get_mut(&stack) {
                *n += 1;
            } else if stacks.len() < MAX_STACKS {
                stacks.insert(stack, 1);
            } else {
                *dropped += 1;
            }
        });
    }

    /// Stops sampling; the profile, gzip-compressed protobuf.
    pub fn finish(mut self) -> Result<Vec<u8>, Error> {
        self.sampler.stop();
        self.collect();
        let duration = self.clock.elapsed();
        let lost = self.sampler.lost() + self.dropped;
        let code = symbols::Code::current();
        let profile = encode::profile(encode::Inputs {
            stacks: &self.stacks,
            lost: i64::try_from(lost).unwrap_or(i64::MAX),
            started: self.started,
            duration,
            code: code.as_ref(),
            period: 1_000_000_000 / i64::from(sampler::HZ),
        });
        let samples: i64 = self.stacks.values().sum();
        tracing::info!(
            samples,
            lost,
            stacks = self.stacks.len(),
            named = code.as_ref().is_some_and(symbols::Code::named),
            "CPU profile done"
        );
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&profile.encode_to_vec())
            .and_then(|()| gz.finish())
            .map_err(Error::Compress)
    }
}

/// A profile of `duration`; its end (reading the symbol table, encoding) runs off the async
/// thread.
pub async fn run(duration: Duration) -> Result<Vec<u8>, Error> {
    let mut profile = Profile::start()?;
    tracing::info!(seconds = duration.as_secs(), "CPU profile started");
    let end = tokio::time::sleep(duration);
    tokio::pin!(end);
    let mut collect = tokio::time::interval(COLLECT_EVERY);
    loop {
        tokio::select! {
            _ = &mut end => break,
            _ = collect.tick() => profile.collect(),
        }
    }
    let gz = tokio::task::spawn_blocking(move || profile.finish())
        .await
        .map_err(|e| Error::Finish(e.to_string()))?;
    // The code pages the profile touched (the unwinder's tables, its own code, the answer's)
    // go back at the idle trimmer's next tick (its heap, freed, at every tick).
    crate::runtime::release_code_later();
    gz
}

/// A thread's name, or its id when it has none readable.
fn thread_name(tid: i32) -> String {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_else(|_| tid.to_string())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Tests that start a profile take this first: there is one profiler per process.
    pub(crate) static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Uses `cpu` of this thread's CPU time (however busy the machine is).
    pub(crate) fn spin(cpu: Duration) -> u64 {
        let used = || {
            let mut t = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            #[allow(unsafe_code)]
            // SAFETY: `t` is a valid timespec to write to.
            unsafe {
                libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t)
            };
            Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
        };
        let end = used() + cpu;
        let mut x = 0u64;
        while used() < end {
            for i in 0..10_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
        x
    }

    #[test]
    fn a_profile_is_gzipped_pprof_naming_the_busy_function() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let mut p = Profile::start().unwrap();
        assert!(matches!(Profile::start(), Err(Error::InUse)));
        for _ in 0..4 {
            spin(Duration::from_millis(100));
            p.collect();
        }
        let gz = p.finish().unwrap();
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
        let profile = proto::perftools::profiles::Profile::decode(&raw[..]).unwrap();
        let names: Vec<&str> = profile
            .function
            .iter()
            .map(|f| profile.string_table[f.name as usize].as_str())
            .collect();
        assert!(
            names
                .iter()
                .any(|n| n.ends_with("cpu_profile::tests::spin")),
            "{names:?}"
        );
        let samples: i64 = profile.sample.iter().map(|s| s.value[0]).sum();
        assert!(samples >= 10, "{samples} samples");
        // Stopped: another may start.
        drop(Profile::start().unwrap());
    }

    #[test]
    fn dropping_a_profile_stops_it() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        drop(Profile::start().unwrap());
        drop(Profile::start().unwrap());
    }
}
