//! The sampling: `setitimer(ITIMER_PROF)` makes the kernel send SIGPROF to the thread running
//! each time the process has used another 10 ms of CPU; the handler records that thread's
//! stack into a fixed buffer of slots, without allocating or locking, and the profile
//! ([`super::Profile::collect`]) empties the slots every 100 ms.
//!
//! A slot is free, being written, or full; the handler takes the next free one (a full one
//! not yet collected makes the sample lost, counted), the collector reads the full ones and
//! frees them. The handler reaches the buffer through one static pointer, null when no profile
//! runs; stopping clears it and waits until no handler is still inside before the buffer goes.
//! The stack is walked with the unwinder Rust's panics use (`_Unwind_Backtrace`, from libgcc),
//! once from the handler outward, keeping the frames past the signal's: the interrupted
//! function (its exact address, from the signal's saved registers) and its callers.
// sigaction(2), setitimer(2), the signal handler's reads of the saved registers, and the
// unwinder's C interface.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize};

/// Samples per second of CPU time, as Go's profiler.
pub const HZ: u32 = 100;
/// Frames kept per sample, innermost first (Go's CPU profiles keep 64).
pub const DEPTH: usize = 64;
/// Samples the buffer holds between two collections: 5 s of one busy thread at [`HZ`].
const SLOTS: usize = 512;

const FREE: u8 = 0;
const WRITING: u8 = 1;
const FULL: u8 = 2;

struct Slot {
    state: AtomicU8,
    len: AtomicUsize,
    tid: AtomicI32,
    pcs: [AtomicUsize; DEPTH],
}

impl Slot {
    fn new() -> Self {
        Slot {
            state: AtomicU8::new(FREE),
            len: AtomicUsize::new(0),
            tid: AtomicI32::new(0),
            pcs: std::array::from_fn(|_| AtomicUsize::new(0)),
        }
    }
}

/// What the handler writes to: [`SLOTS`] slots (about 270 KiB), while a profile runs.
struct Buffer {
    slots: Box<[Slot]>,
    next: AtomicUsize,
    lost: AtomicU64,
}

/// The running profile's buffer, for the handler; null when none runs.
static BUFFER: AtomicPtr<Buffer> = AtomicPtr::new(std::ptr::null_mut());
/// Handlers between their look at [`BUFFER`] and their last write to it.
static IN_HANDLER: AtomicUsize = AtomicUsize::new(0);
/// A profile runs (one at a time).
static RUNNING: AtomicBool = AtomicBool::new(false);

/// Why sampling could not start.
#[derive(Debug)]
pub enum StartError {
    InUse,
    Os(std::io::Error),
}

/// Sampling in progress: stops when dropped.
pub struct Running {
    buffer: Arc<Buffer>,
    stopped: bool,
}

/// One recorded sample: the thread and its stack, innermost first (the first address is
/// where the thread was interrupted, the others return addresses).
pub struct Sample<'a> {
    pub tid: i32,
    pub pcs: &'a [usize],
}

impl Running {
    /// Installs the handler and starts the timer; refused while another profile runs.
    pub fn start() -> Result<Running, StartError> {
        if RUNNING
            .compare_exchange(false, true, SeqCst, SeqCst)
            .is_err()
        {
            return Err(StartError::InUse);
        }
        let buffer = Arc::new(Buffer {
            slots: (0..SLOTS).map(|_| Slot::new()).collect(),
            next: AtomicUsize::new(0),
            lost: AtomicU64::new(0),
        });
        if let Err(e) = install_handler() {
            RUNNING.store(false, SeqCst);
            return Err(StartError::Os(e));
        }
        warm_up_unwinder();
        BUFFER.store(Arc::as_ptr(&buffer).cast_mut(), SeqCst);
        let mut running = Running {
            buffer,
            stopped: false,
        };
        if let Err(e) = set_timer(HZ) {
            running.stop();
            return Err(StartError::Os(e));
        }
        Ok(running)
    }

    /// Hands each full slot's sample to `each` and frees the slot.
    pub fn collect(&self, mut each: impl FnMut(Sample<'_>)) {
        let mut pcs = [0usize; DEPTH];
        for slot in self.buffer.slots.iter() {
            if slot.state.load(Acquire) != FULL {
                continue;
            }
            let len = slot.len.load(Relaxed).min(DEPTH);
            for (to, from) in pcs.iter_mut().zip(&slot.pcs[..len]) {
                *to = from.load(Relaxed);
            }
            let tid = slot.tid.load(Relaxed);
            slot.state.store(FREE, Release);
            each(Sample {
                tid,
                pcs: &pcs[..len],
            });
        }
    }

    /// Samples dropped because every slot was full.
    pub fn lost(&self) -> u64 {
        self.buffer.lost.load(Relaxed)
    }

    /// Stops the timer and detaches the buffer from the handler; what it holds can still be
    /// collected. The handler stays installed: a signal already on its way finds no buffer.
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let _ = set_timer(0);
        BUFFER.store(std::ptr::null_mut(), SeqCst);
        // A handler that saw the buffer before it was cleared is counted in IN_HANDLER (both
        // sides SeqCst): wait for it to leave. Handlers take microseconds.
        while IN_HANDLER.load(SeqCst) != 0 {
            std::thread::yield_now();
        }
        RUNNING.store(false, SeqCst);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

fn install_handler() -> std::io::Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::SigAction(on_sigprof),
        // Interrupted system calls restart where they can (the others already retry EINTR).
        SaFlags::SA_SIGINFO | SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handler only touches atomics, the buffer it reaches through BUFFER (kept
    // alive until no handler is inside, see `Running::stop`), errno and the unwinder, which
    // takes no lock the interrupted code can hold in this process and allocates nothing.
    unsafe { sigaction(Signal::SIGPROF, &action) }
        .map(drop)
        .map_err(std::io::Error::from)
}

/// Arms (`hz` > 0) or disarms (0) the process's CPU-time timer.
fn set_timer(hz: u32) -> std::io::Result<()> {
    let period = if hz == 0 {
        libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        }
    } else {
        libc::timeval {
            tv_sec: 0,
            tv_usec: libc::suseconds_t::from(1_000_000 / hz.max(1)),
        }
    };
    let value = libc::itimerval {
        it_interval: period,
        it_value: period,
    };
    // SAFETY: `value` is a valid itimerval; the old value is not asked for.
    if unsafe { libc::setitimer(libc::ITIMER_PROF, &value, std::ptr::null_mut()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

// libgcc's unwinder, which Rust's std links for panics (what the `backtrace` crate calls).
unsafe extern "C" {
    fn _Unwind_Backtrace(
        trace: extern "C" fn(ctx: *mut c_void, arg: *mut c_void) -> c_int,
        arg: *mut c_void,
    ) -> c_int;
    fn _Unwind_GetIP(ctx: *mut c_void) -> usize;
}

const UNWIND_CONTINUE: c_int = 0; // _URC_NO_REASON
const UNWIND_STOP: c_int = 4; // _URC_NORMAL_STOP

/// One walk outside any handler, so that whatever the unwinder sets up on first use is set
/// up in ordinary code.
fn warm_up_unwinder() {
    extern "C" fn first(_: *mut c_void, _: *mut c_void) -> c_int {
        UNWIND_STOP
    }
    // SAFETY: the callback ignores its arguments.
    unsafe { _Unwind_Backtrace(first, std::ptr::null_mut()) };
}

/// The address the signal interrupted, from its saved registers.
fn interrupted_pc(ucontext: *mut c_void) -> usize {
    if ucontext.is_null() {
        return 0;
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        // SAFETY: the kernel passes an SA_SIGINFO handler its ucontext_t.
        let uc = unsafe { &*ucontext.cast::<libc::ucontext_t>() };
        uc.uc_mcontext.gregs[libc::REG_RIP as usize] as usize
    }
    #[cfg(all(target_arch = "aarch64", target_os = "linux"))]
    {
        // SAFETY: the kernel passes an SA_SIGINFO handler its ucontext_t.
        let uc = unsafe { &*ucontext.cast::<libc::ucontext_t>() };
        uc.uc_mcontext.pc as usize
    }
    #[cfg(not(all(
        any(target_arch = "x86_64", target_arch = "aarch64"),
        target_os = "linux"
    )))]
    0
}

extern "C" fn on_sigprof(_: c_int, _: *mut libc::siginfo_t, ucontext: *mut c_void) {
    // SAFETY: errno is this thread's; the interrupted code's value is put back on return.
    let errno = unsafe { *libc::__errno_location() };
    IN_HANDLER.fetch_add(1, SeqCst);
    let buffer = BUFFER.load(SeqCst);
    if !buffer.is_null() {
        // SAFETY: non-null, the buffer stays alive while IN_HANDLER counts this handler
        // (`Running::stop` waits for it before the Arc can go).
        record(unsafe { &*buffer }, interrupted_pc(ucontext));
    }
    IN_HANDLER.fetch_sub(1, SeqCst);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// The walk's state, passed through the unwinder to [`each_frame`].
struct Walk<'a> {
    slot: &'a Slot,
    /// The interrupted address: frames are kept once the walk has passed it.
    pc: usize,
    past_signal: bool,
    len: usize,
}

fn record(buffer: &Buffer, pc: usize) {
    let i = buffer.next.fetch_add(1, Relaxed) % buffer.slots.len();
    let slot = &buffer.slots[i];
    if slot
        .state
        .compare_exchange(FREE, WRITING, Acquire, Relaxed)
        .is_err()
    {
        buffer.lost.fetch_add(1, Relaxed);
        return;
    }
    let mut walk = Walk {
        slot,
        pc,
        past_signal: pc == 0,
        len: 0,
    };
    if pc != 0 {
        slot.pcs[0].store(pc, Relaxed);
        walk.len = 1;
    }
    // SAFETY: `walk` outlives the call; `each_frame` is the only user of the pointer.
    unsafe { _Unwind_Backtrace(each_frame, (&raw mut walk).cast()) };
    slot.len.store(walk.len, Relaxed);
    // SAFETY: gettid(2) has no preconditions.
    slot.tid.store(unsafe { libc::gettid() }, Relaxed);
    slot.state.store(FULL, Release);
}

extern "C" fn each_frame(ctx: *mut c_void, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Walk` `record` passed, alive for the whole walk.
    let walk = unsafe { &mut *arg.cast::<Walk<'_>>() };
    // SAFETY: `ctx` is the unwinder's context for this frame.
    let ip = unsafe { _Unwind_GetIP(ctx) };
    if !walk.past_signal {
        // The handler's own frames and the signal trampoline come first; the frame whose
        // address is the interrupted one is already recorded.
        walk.past_signal = ip == walk.pc;
        return UNWIND_CONTINUE;
    }
    if ip == 0 || walk.len >= DEPTH {
        return UNWIND_STOP;
    }
    walk.slot.pcs[walk.len].store(ip, Relaxed);
    walk.len += 1;
    UNWIND_CONTINUE
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cpu_profile::tests::{ONE_AT_A_TIME, spin};

    #[test]
    fn samples_the_busy_thread_and_one_profile_at_a_time() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let mut running = Running::start().expect("start");
        assert!(matches!(Running::start(), Err(StartError::InUse)));
        spin(std::time::Duration::from_millis(300));
        running.stop();
        let me = nix::unistd::gettid().as_raw();
        let (mut mine, mut deep) = (0, 0);
        running.collect(|s| {
            mine += usize::from(s.tid == me);
            deep += usize::from(s.pcs.len() > 3);
        });
        // 300 ms of CPU at 100 Hz: about 30 samples (the timer's slack aside).
        assert!(mine >= 10, "{mine} samples of this thread");
        assert!(
            deep >= mine / 2,
            "stacks walked past the signal: {deep} of {mine}"
        );
        drop(running);
        // Stopped: the next one may start, and nothing is recorded after the stop.
        let again = Running::start().expect("a second profile after the first");
        drop(again);
        assert!(BUFFER.load(SeqCst).is_null());
    }
}
