//! bcrypt verifications on threads of their own, at the lowest CPU priority the process may
//! give itself, so that a flood of wrong passwords takes only the CPU that serving other
//! connections leaves over.
//!
//! Why not tokio's blocking pool: its threads run at the workers' priority, so on a machine with
//! few cores the scheduler shares the CPU fairly between a worker that has a request to answer and
//! a thread in the middle of a bcrypt verification (milliseconds of CPU each), and the request
//! waits for time slices. Here each thread lowers its own nice value to [`NICE`] when it starts
//! (Linux: `setpriority(PRIO_PROCESS, tid)` applies to the calling thread only, see setpriority(2),
//! "BUGS") and moves itself to the `SCHED_IDLE` policy, so that a worker that wakes up preempts it
//! at once: Linux's EEVDF scheduler (6.6 and later) lets a running nice-19 thread of the normal
//! policy finish its slice first, so a waiting request would sit behind a whole slice of bcrypt,
//! while it always preempts a `SCHED_IDLE` one for a woken normal thread
//! (`check_preempt_wakeup_fair`). The threads are started on the first verification; there are as
//! many as verifications may run at once ([`super::Limiter`] bounds them and their queue), so a job
//! never waits here for a thread.
//!
//! The cost: when every CPU is busy with other work at normal priority, a first verification
//! waits for it (a client that already authenticated finds its credential in the cache, see
//! [`super::cache`]). If the priority cannot be lowered (another OS, a seccomp filter), the
//! threads run at the normal one and say so once in the log.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::{oneshot, OwnedSemaphorePermit};

/// The nice value of the verification threads: the lowest priority (19), whose scheduling weight
/// is 1/68 of a normal thread's (kernel `sched_prio_to_weight`: 15 against 1024).
pub(crate) const NICE: i32 = 19;

struct Job {
    password: Vec<u8>,
    hash: String,
    reply: oneshot::Sender<bool>,
    /// Held until the verification ends, so that [`super::Limiter`] counts it.
    _permit: OwnedSemaphorePermit,
}

/// The verification threads, fed through one channel.
pub(crate) struct Pool {
    jobs: mpsc::Sender<Job>,
}

impl Pool {
    /// The process-wide pool of `threads` threads (the first call decides the count).
    pub(crate) fn global(threads: usize) -> &'static Self {
        static POOL: OnceLock<Pool> = OnceLock::new();
        POOL.get_or_init(|| Self::start(threads))
    }

    fn start(threads: usize) -> Self {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("bcrypt-{i}"))
                .spawn(move || {
                    lower_priority();
                    work(&rx);
                });
            if let Err(e) = spawned {
                // With no thread at all every job's reply is dropped: verifications fail closed.
                tracing::error!(error = %e, "cannot start a bcrypt verification thread");
            }
        }
        Self { jobs: tx }
    }

    /// Whether `password` matches the bcrypt `hash`; false when it does not, when the hash does
    /// not parse, or when no verification thread runs. `permit` is released when it is done.
    pub(crate) async fn verify(
        &self,
        password: Vec<u8>,
        hash: String,
        permit: OwnedSemaphorePermit,
    ) -> bool {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            password,
            hash,
            reply,
            _permit: permit,
        };
        if self.jobs.send(job).is_err() {
            return false;
        }
        answer.await.unwrap_or(false)
    }
}

fn work(rx: &Mutex<mpsc::Receiver<Job>>) {
    loop {
        // The lock is held only while waiting for the next job, never during a verification.
        let job = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(Job {
            password,
            hash,
            reply,
            _permit: permit,
        }) = job
        else {
            return;
        };
        let ok = bcrypt::verify(&password, &hash).unwrap_or(false);
        // The slot is free before the answer is out, so the next request finds it free.
        drop(permit);
        // The client may have gone away; its answer is not needed then.
        let _ = reply.send(ok);
    }
}

/// Lowers the calling thread's priority to [`NICE`] and `SCHED_IDLE`; logged once if that is not
/// possible.
fn lower_priority() {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if let Err(why) = set_own_priority(NICE) {
        if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(error = %why, "bcrypt runs at normal priority: cannot lower it");
        }
    }
}

#[cfg(target_os = "linux")]
fn set_own_priority(nice: i32) -> Result<(), String> {
    let tid = rustix::thread::gettid();
    rustix::process::setpriority_process(Some(tid), nice).map_err(|e| e.to_string())?;
    set_own_policy_idle()
}

/// Moves the calling thread to `SCHED_IDLE`, see sched(7). Written with libc because rustix has
/// no `sched_setscheduler`. One of the crate's unsafe functions (listed at `unsafe_code` in
/// Cargo.toml).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn set_own_policy_idle() -> Result<(), String> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid, initialised sched_param that outlives the call; pid 0 is the
    // calling thread; the call reads `param` and writes nothing of ours.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().to_string())
    }
}

#[cfg(not(target_os = "linux"))]
fn set_own_priority(_nice: i32) -> Result<(), String> {
    // Elsewhere PRIO_PROCESS would lower the whole process, event loop included.
    Err("per-thread priority is only set on Linux".to_owned())
}
