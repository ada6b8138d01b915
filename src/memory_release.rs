//! Gives back the executable's pages that start-up left resident. At the bottom of the crate:
//! it knows only `/proc` and `madvise`.
//!
//! Start-up (command line, configuration, identity, TLS set-up, the runtime) runs code from all
//! over the binary's text once, and the kernel maps up to 64 KiB around every page touched
//! (fault-around), so most of the text and read-only data stays mapped, counted in RSS and PSS,
//! for the life of the process. Once the server is ready, [`executable_pages`] advises the
//! executable's clean read-only mappings away with `MADV_DONTNEED`: the pages stay in the page
//! cache, so what the request path touches again comes back through a minor fault (no disk
//! read), and what only start-up used is no longer mapped.
//!
//! Only private mappings of our own executable that are not writable and hold no page of their
//! own are advised: `Anonymous` and `Swap` 0 kB in `/proc/self/smaps`. A page written in a
//! private mapping (the relocated RELRO segment, a debugger's breakpoint) is a copy-on-write
//! copy, counted in `Anonymous` while resident and in `Swap` once swapped out; dropping it would
//! lose what was written. `Private_Dirty` says something else for a file page: that the page
//! cache has not written it back yet (a binary copied or linked less than ~30 s before it ran
//! shows its text as `Private_Dirty`, with `Anonymous: 0`); that page is shared with the cache
//! and a later fault maps the same page again, so it does not keep a mapping from being advised.
//!
//! Serving brings pages back: the request path's code, and heap that glibc keeps for reuse once
//! the connections that used it have closed. [`when_idle`] gives both back again once no request
//! has been served for `limits.idle_trim` (5 s by default): the executable's pages as at start-up,
//! and the heap's free pages with `malloc_trim(3)`. A sidecar on every node spends most of its
//! life idle; what it holds then is what the node pays. The first request after a trim faults its
//! code back in (minor faults from the page cache, no disk reads).

use std::io::{self, BufRead, BufReader};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Where the mappings are read from, and the executable's path in them.
const SMAPS: &str = "/proc/self/smaps";
const EXE: &str = "/proc/self/exe";

#[derive(Debug, thiserror::Error)]
pub(crate) enum TrimError {
    #[error("cannot read {path}")]
    Read {
        path: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("madvise(MADV_DONTNEED) of {start:#x}-{end:#x} failed")]
    Advise {
        start: usize,
        end: usize,
        #[source]
        source: io::Error,
    },
}

/// What [`executable_pages`] advised away.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Trimmed {
    /// Mappings advised.
    pub(crate) mappings: usize,
    /// Their size in bytes.
    pub(crate) bytes: usize,
    /// How much of them was resident before, in bytes.
    pub(crate) resident: u64,
}

/// One whole mapping of the executable that holds only file pages, and its resident size.
#[derive(Debug, PartialEq, Eq)]
struct Region {
    start: usize,
    end: usize,
    rss_kib: u64,
}

/// Advises the executable's clean read-only mappings away, once the server is ready. Never
/// fails the caller: a failure is logged (the process keeps its pages, nothing else changes).
pub(crate) fn executable_pages() {
    match trim() {
        Ok(t) => tracing::debug!(
            mappings = t.mappings,
            bytes = t.bytes,
            resident_bytes = t.resident,
            "executable pages advised away (MADV_DONTNEED)"
        ),
        Err(e) => tracing::warn!(
            error = %crate::error::chain(&e),
            "start-up's executable pages stay resident"
        ),
    }
}

/// Requests served since start, on every listener and the admin endpoint: the idle trim's signal.
static SERVED: AtomicU64 = AtomicU64::new(0);

/// Set while [`when_idle`] sleeps after a trim, until the next request wakes it through [`WAKE`]:
/// an idle process has no timer of ours to run (each would fault code back in).
static ASLEEP: AtomicBool = AtomicBool::new(false);
static WAKE: Notify = Notify::const_new();

/// Counts one request: a relaxed increment and a relaxed load on the request path.
pub(crate) fn note_request() {
    SERVED.fetch_add(1, Ordering::Relaxed);
    if ASLEEP.load(Ordering::Relaxed) && ASLEEP.swap(false, Ordering::AcqRel) {
        WAKE.notify_one();
    }
}

/// Gives back what serving took each time the server has been quiet for `after`: no request
/// served in that time since the last one (checked every fifth of `after`, so the trim comes
/// between `after` and 1.4 × `after` after the last request). Then it sleeps until the next
/// request. Runs for the life of the server; `after` zero: never.
pub(crate) async fn when_idle(after: Duration) {
    if after.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval((after / 5).max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Start-up has trimmed already.
    let mut quiet = Quiet::new(SERVED.load(Ordering::Relaxed), Instant::now(), after);
    loop {
        tick.tick().await;
        if !quiet.trim_now(SERVED.load(Ordering::Relaxed), Instant::now()) {
            continue;
        }
        ASLEEP.store(true, Ordering::Release);
        let released = heap_pages();
        // Last but for the line below: what runs after it is faulted back in (a disabled debug
        // line touches next to nothing).
        let pages = trim();
        tracing::debug!(
            malloc_trim_released = released,
            resident_bytes = pages.as_ref().map_or(0, |t| t.resident),
            error = pages.as_ref().err().map(|e| crate::error::chain(e)),
            "idle: memory given back"
        );
        // A request between the store and here leaves a permit: no wake-up is lost.
        WAKE.notified().await;
        tick.reset();
    }
}

/// When to trim: once per quiet spell of `after`, never twice without a request in between.
#[derive(Debug)]
struct Quiet {
    after: Duration,
    /// The request count last seen, and since when it has not moved.
    seen: u64,
    since: Instant,
    trimmed: bool,
}

impl Quiet {
    fn new(served: u64, now: Instant, after: Duration) -> Self {
        Self {
            after,
            seen: served,
            since: now,
            trimmed: true,
        }
    }

    fn trim_now(&mut self, served: u64, now: Instant) -> bool {
        if served != self.seen {
            self.seen = served;
            self.since = now;
            self.trimmed = false;
            return false;
        }
        if self.trimmed || now.duration_since(self.since) < self.after {
            return false;
        }
        self.trimmed = true;
        true
    }
}

/// Returns the free pages of glibc's heaps to the kernel (`malloc_trim(3)`); true when some
/// memory was released. Elsewhere than glibc: nothing to do.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn heap_pages() -> bool {
    // SAFETY: malloc_trim takes a size to keep at the top of the heap and only releases memory
    // that glibc's allocator holds free; no memory the program uses is touched, and it takes
    // the allocator's locks like any malloc call.
    unsafe { libc::malloc_trim(0) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn heap_pages() -> bool {
    false
}

fn trim() -> Result<Trimmed, TrimError> {
    let read = |source| TrimError::Read { path: EXE, source };
    let exe = std::fs::read_link(EXE).map_err(read)?;
    let exe = exe
        .to_str()
        .ok_or_else(|| read(io::ErrorKind::InvalidData.into()))?;
    let read = |source| TrimError::Read {
        path: SMAPS,
        source,
    };
    let smaps = std::fs::File::open(SMAPS).map_err(read)?;
    let regions = droppable(BufReader::new(smaps), exe).map_err(read)?;
    let mut done = Trimmed::default();
    for r in &regions {
        dont_need(r).map_err(|source| TrimError::Advise {
            start: r.start,
            end: r.end,
            source,
        })?;
        done.mappings += 1;
        done.bytes += r.end - r.start;
        done.resident += r.rss_kib * 1024;
    }
    Ok(done)
}

/// The mappings in `smaps` (the format of proc(5)'s `/proc/PID/smaps`) that may be advised
/// away: private mappings of `exe`, not writable, resident in part, and with every page a page
/// of the file (none anonymous, none swapped). A mapping missing one of the fields that say so
/// is left alone.
fn droppable(smaps: impl BufRead, exe: &str) -> io::Result<Vec<Region>> {
    /// The mapping being read: its range and what its fields said so far.
    struct Candidate {
        start: usize,
        end: usize,
        rss_kib: Option<u64>,
        own_pages_kib: [Option<u64>; 2],
    }
    const OWN_PAGES: [&str; 2] = ["Anonymous:", "Swap:"];
    let finish = |c: Candidate, out: &mut Vec<Region>| {
        let clean = c.own_pages_kib.iter().all(|kib| *kib == Some(0));
        match c.rss_kib {
            Some(rss_kib) if clean && rss_kib > 0 => out.push(Region {
                start: c.start,
                end: c.end,
                rss_kib,
            }),
            _ => {}
        }
    };
    let mut out = Vec::new();
    let mut current: Option<Candidate> = None;
    for line in smaps.lines() {
        let line = line?;
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if first.ends_with(':') {
            // A field of the mapping above: `Rss:  1234 kB`.
            let Some(c) = current.as_mut() else { continue };
            let kib = words.next().and_then(|v| v.parse().ok());
            if first == "Rss:" {
                c.rss_kib = kib;
            } else if let Some(i) = OWN_PAGES.iter().position(|f| *f == first) {
                c.own_pages_kib[i] = kib;
            }
            continue;
        }
        // A mapping's header: `start-end perms offset dev inode path`; the path may hold spaces.
        if let Some(c) = current.take() {
            finish(c, &mut out);
        }
        let perms = words.next().unwrap_or_default().as_bytes();
        let path = header_path(&line);
        let private_read_only = perms.len() == 4 && perms[1] == b'-' && perms[3] == b'p';
        if !private_read_only || path != Some(exe) {
            continue;
        }
        let range = first.split_once('-').and_then(|(s, e)| {
            Some((
                usize::from_str_radix(s, 16).ok()?,
                usize::from_str_radix(e, 16).ok()?,
            ))
        });
        if let Some((start, end)) = range.filter(|(s, e)| s < e) {
            current = Some(Candidate {
                start,
                end,
                rss_kib: None,
                own_pages_kib: [None; 2],
            });
        }
    }
    if let Some(c) = current {
        finish(c, &mut out);
    }
    Ok(out)
}

/// The path of a header line, after its five fields; `None` for an anonymous mapping.
fn header_path(line: &str) -> Option<&str> {
    let mut rest = line;
    for _ in 0..5 {
        rest = rest.trim_start().split_once(char::is_whitespace)?.1;
    }
    Some(rest.trim()).filter(|p| !p.is_empty())
}

/// `madvise(MADV_DONTNEED)` over one mapping that [`droppable`] chose. One of the crate's
/// unsafe functions (listed at `unsafe_code` in Cargo.toml).
#[allow(unsafe_code)]
fn dont_need(r: &Region) -> io::Result<()> {
    // SAFETY: madvise reads and writes no memory of ours; it changes what backs the range
    // `r.start..r.end`, one whole mapping as smaps listed it (page-aligned), a private mapping
    // of our executable, which the process never unmaps. When smaps was read it was not
    // writable and held no anonymous or swapped page: every page in it was the file's own,
    // shared with the page cache. Nothing in the crate writes to or mprotects the executable's
    // mappings, so that still holds. MADV_DONTNEED on such pages only unmaps them; the next
    // access faults the same file bytes back in, so the code and the `'static` data in the
    // range read the same before and after.
    let rc = unsafe {
        libc::madvise(
            r.start as *mut libc::c_void,
            r.end - r.start,
            libc::MADV_DONTNEED,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::Quiet;
    use std::time::Duration;
    use tokio::time::Instant;

    #[test]
    fn trims_once_per_quiet_spell_and_only_after_a_request() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut q = Quiet::new(7, t0, s(5));
        // Just started (start-up trimmed): nothing served since, nothing to give back.
        assert!(!q.trim_now(7, t0 + s(60)));
        // Requests at 61 s; quiet from then on.
        assert!(!q.trim_now(9, t0 + s(61)));
        assert!(!q.trim_now(9, t0 + s(65)), "4 s of quiet is not 5");
        assert!(q.trim_now(9, t0 + s(66)), "5 s of quiet");
        assert!(!q.trim_now(9, t0 + s(200)), "once per quiet spell");
        // A request resets the spell.
        assert!(!q.trim_now(10, t0 + s(201)));
        assert!(
            !q.trim_now(11, t0 + s(205)),
            "another request: the spell starts again"
        );
        assert!(!q.trim_now(11, t0 + s(209)));
        assert!(q.trim_now(11, t0 + s(210)));
    }

    use super::{droppable, header_path, Region};

    const EXE: &str = "/usr/local/bin/ironic proxy";

    /// A mapping's header and fields as the kernel prints them (fields it prints and we do not
    /// read are left out); `own` is `[Anonymous, Private_Dirty, Swap]` in kB.
    fn mapping(range: &str, perms: &str, path: &str, rss: u64, own: [u64; 3]) -> String {
        format!(
            "{range} {perms} 00000000 fd:01 1234      {path}\n\
             Size:               7528 kB\n\
             Rss:              {rss:>6} kB\n\
             Pss:              {rss:>6} kB\n\
             Private_Dirty:    {:>6} kB\n\
             Anonymous:        {:>6} kB\n\
             Swap:             {:>6} kB\n\
             VmFlags: rd ex mr mw me dw\n",
            own[1], own[0], own[2]
        )
    }

    #[test]
    fn only_clean_read_only_mappings_of_the_executable() {
        let smaps = [
            // rodata and eh_frame: clean, read-only.
            mapping("55d0a0000000-55d0a0200000", "r--p", EXE, 1400, [0, 0, 0]),
            // text: clean.
            mapping("55d0a0200000-55d0a0950000", "r-xp", EXE, 5600, [0, 0, 0]),
            // RELRO: read-only now, but relocated, so its pages are the process's own.
            mapping("55d0a0950000-55d0a0990000", "r--p", EXE, 256, [256, 0, 0]),
            // .data: writable.
            mapping("55d0a0990000-55d0a0994000", "rw-p", EXE, 16, [16, 16, 0]),
            // Read-only but a page of it swapped out after a copy-on-write (a debugger's
            // breakpoint): the swapped copy would be lost.
            mapping("55d0a0994000-55d0a0998000", "r-xp", EXE, 4, [0, 0, 4]),
            // Dirty in the page cache, not written back yet (a binary copied just before it
            // ran), but no page of its own: the same pages come back.
            mapping("55d0a0998000-55d0a099c000", "r-xp", EXE, 4, [0, 4, 0]),
            // Nothing resident: nothing to give back.
            mapping("55d0a099c000-55d0a09a0000", "r--p", EXE, 0, [0, 0, 0]),
            // A library, a shared mapping of the executable, an anonymous mapping.
            mapping(
                "7f0000000000-7f0000100000",
                "r-xp",
                "/usr/lib/libc.so.6",
                900,
                [0, 0, 0],
            ),
            mapping("7f0000100000-7f0000200000", "r--s", EXE, 8, [0, 0, 0]),
            mapping("7f0000200000-7f0000300000", "r--p", "", 8, [0, 0, 0]),
        ]
        .concat();
        let got = droppable(smaps.as_bytes(), EXE).expect("in memory");
        assert_eq!(
            got,
            [
                Region {
                    start: 0x55d0_a000_0000,
                    end: 0x55d0_a020_0000,
                    rss_kib: 1400
                },
                Region {
                    start: 0x55d0_a020_0000,
                    end: 0x55d0_a095_0000,
                    rss_kib: 5600
                },
                Region {
                    start: 0x55d0_a099_8000,
                    end: 0x55d0_a099_c000,
                    rss_kib: 4
                },
            ]
        );
    }

    #[test]
    fn a_mapping_missing_a_field_is_left_alone() {
        let full = mapping("1000-2000", "r-xp", EXE, 4, [0, 0, 0]);
        assert_eq!(droppable(full.as_bytes(), EXE).expect("in memory").len(), 1);
        for field in ["Anonymous:", "Swap:", "Rss:"] {
            let without: String = full
                .lines()
                .filter(|l| !l.starts_with(field))
                .map(|l| format!("{l}\n"))
                .collect();
            let got = droppable(without.as_bytes(), EXE).expect("in memory");
            assert!(got.is_empty(), "without {field}: {got:?}");
        }
    }

    #[test]
    fn another_file_whose_path_starts_like_ours_is_not_ours() {
        let other = mapping("1000-2000", "r-xp", &format!("{EXE} (deleted)"), 4, [0; 3]);
        assert!(droppable(other.as_bytes(), EXE)
            .expect("in memory")
            .is_empty());
        let other = mapping("1000-2000", "r-xp", "/usr/local/bin/ironic", 4, [0; 3]);
        assert!(droppable(other.as_bytes(), EXE)
            .expect("in memory")
            .is_empty());
    }

    #[test]
    fn header_paths_keep_their_spaces_and_anonymous_mappings_have_none() {
        let line = "55d0a0200000-55d0a0950000 r-xp 00200000 fd:01 1234    /a b/c (deleted)";
        assert_eq!(header_path(line), Some("/a b/c (deleted)"));
        assert_eq!(header_path("7f00-7f10 rw-p 00000000 00:00 0 "), None);
        assert_eq!(header_path("7f00-7f10 rw-p 00000000 00:00 0"), None);
    }

    /// The real thing, on this test process: its own executable is found and advised, and the
    /// process keeps running the code it dropped.
    #[test]
    #[cfg(target_os = "linux")]
    fn this_process_trims_its_own_executable_and_keeps_running() {
        let done = super::trim().expect("trim this test binary");
        assert!(done.mappings >= 1, "{done:?}");
        assert!(done.resident > 0, "{done:?}");
        // Running again touches only what ran since, a fraction of what was resident.
        let again = super::trim().expect("trim again");
        assert!(again.resident < done.resident, "{again:?} after {done:?}");
    }
}
