//! Atomic export of a set of files (certificate, key, CA bundle) into a directory, switched
//! together the way Kubernetes projected volumes are (kubelet's `AtomicWriter`):
//!
//! ```text
//! DIR/..2026_01_02_15_04_05.123456789_1a2b3c4d/   one generation: tls.crt tls.key ca.crt
//! DIR/..data -> ..2026_01_02_15_04_05.123456789_1a2b3c4d
//! DIR/tls.crt -> ..data/tls.crt        (and so on for every name)
//! ```
//!
//! A new generation is written into a fresh directory and synced, then one `rename(2)` of a
//! symlink over `..data` publishes all its files at once; the previous generation's directory
//! is removed afterwards. Files are never modified in place, so nobody ever reads a torn file.
//!
//! # What a reader sees
//!
//! - A reader that resolves `..data` **once** (reads the link, or opens the directory) and reads
//!   every file relative to that resolution sees one generation, so `tls.crt` and `tls.key`
//!   always match. If a swap removes that generation in between, the reader gets `ENOENT`, never
//!   a mixed pair, and should resolve again.
//! - A reader that opens `DIR/tls.crt` and then `DIR/tls.key` separately resolves `..data` twice
//!   and, if a swap lands between the two opens, gets the certificate of one generation and the
//!   key of the next. Python's `ssl.SSLContext.load_cert_chain(certfile, keyfile)`, which
//!   Ironic's JSON-RPC client reaches through keystoneauth and `requests` when both `[json_rpc]
//!   certfile` and `keyfile` are set, does exactly that, for each new TLS context. OpenSSL then
//!   refuses the pair ("key values mismatch"), so that one connection attempt fails loudly; it
//!   is never sent with a wrong identity, but Ironic does not retry it: the RPC, and the API call
//!   behind it, fails. The window is the microseconds between two `open`s, once per renewal, and
//!   the previous pair stays valid after a swap. One file holding both the certificate and the
//!   key does not close it: CPython's `load_cert_chain` opens the certificate path twice
//!   (`SSL_CTX_use_certificate_chain_file`, then `SSL_CTX_use_PrivateKey_file` on the same path,
//!   `Modules/_ssl.c`). With hour-long certificates it is rare; the end-to-end test's 12 s
//!   certificates (a renewal every 6 s on every instance) hit it once in CI (2026-12-03, an
//!   enrolment's JSON-RPC call). Closing it needs a key that stays the same across a swap (a key
//!   kept over several renewals, at the cost of a longer-lived key) or a reader that resolves
//!   `..data` once.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

const DATA: &str = "..data";
const DATA_TMP: &str = "..data_tmp";

/// Permissions of exported files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ExportOptions {
    /// Mode of every file (e.g. `0o640`), applied exactly, regardless of the umask. The generation
    /// directory gets the same bits plus `x` wherever `r` is set (`0o640` -> `0o750`).
    pub mode: u32,
    /// Group to own the files and the generation directory, so that Ironic running as another
    /// user in that group can read them. `None` keeps the process's group.
    pub gid: Option<u32>,
}

/// Writes every `(file name, bytes)` as one new generation of `dir` and switches to it atomically.
///
/// See the module documentation for the layout and what readers are guaranteed. Names must be
/// plain file names (no `/`, not starting with `.`). User-visible links of names that are no
/// longer exported are removed.
///
/// If writing the new generation fails, its partial directory is removed and the previous
/// generation stays published. An error after the swap (a visible name occupied by a
/// directory, cleanup failing) leaves the new generation published under `..data`. Only one
/// writer may work on a directory at a time; the caller serialises (one identity task does).
pub(crate) fn write_atomic(
    dir: &Path,
    files: &[(&str, &[u8])],
    opts: &ExportOptions,
) -> io::Result<()> {
    for (name, _) in files {
        check_name(name)?;
    }
    fs::create_dir_all(dir)?;
    let previous = fs::read_link(dir.join(DATA)).ok();

    let generation = generation_name();
    let gen_path = dir.join(&generation);
    if let Err(err) = write_generation(&gen_path, files, opts) {
        let _ = fs::remove_dir_all(&gen_path);
        return Err(err);
    }

    // Publish: a fresh symlink renamed over `..data` replaces it in one step (rename(2)).
    let data_tmp = dir.join(DATA_TMP);
    remove_if_present(&data_tmp)?;
    std::os::unix::fs::symlink(&generation, &data_tmp)?;
    fs::rename(&data_tmp, dir.join(DATA))?;

    for (name, _) in files {
        link_visible_name(dir, name)?;
    }
    sync_dir(dir)?;

    remove_stale(dir, &generation, previous.as_deref(), files)
}

/// Writes the files of one generation into the new directory `path` and syncs them.
fn write_generation(path: &Path, files: &[(&str, &[u8])], opts: &ExportOptions) -> io::Result<()> {
    let dir_mode = opts.mode | ((opts.mode & 0o444) >> 2);
    // Created owner-only, then given the group and the exact mode: never broader than asked.
    DirBuilder::new().mode(0o700).create(path)?;
    if let Some(gid) = opts.gid {
        std::os::unix::fs::chown(path, None, Some(gid))?;
    }
    fs::set_permissions(path, fs::Permissions::from_mode(dir_mode))?;
    for (name, contents) in files {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(opts.mode & 0o700)
            .open(path.join(name))?;
        file.write_all(contents)?;
        if let Some(gid) = opts.gid {
            std::os::unix::fs::fchown(&file, None, Some(gid))?;
        }
        file.set_permissions(fs::Permissions::from_mode(opts.mode))?;
        file.sync_all()?;
    }
    sync_dir(path)
}

/// Makes `dir/name` a symlink to `..data/name`, replacing whatever is there in one rename.
fn link_visible_name(dir: &Path, name: &str) -> io::Result<()> {
    let target = Path::new(DATA).join(name);
    let visible = dir.join(name);
    if fs::read_link(&visible).is_ok_and(|t| t == target) {
        return Ok(());
    }
    let tmp = dir.join(format!("..{name}_tmp"));
    remove_if_present(&tmp)?;
    std::os::unix::fs::symlink(&target, &tmp)?;
    fs::rename(&tmp, &visible)
}

/// Removes the previous generation, generations left by an interrupted run, and visible links
/// into `..data` for names that are no longer exported.
fn remove_stale(
    dir: &Path,
    current: &str,
    previous: Option<&Path>,
    files: &[(&str, &[u8])],
) -> io::Result<()> {
    if let Some(previous) = previous.filter(|p| *p != Path::new(current)) {
        remove_dir_if_present(&dir.join(previous))?;
    }
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if is_generation(name) && name != current {
            remove_dir_if_present(&entry.path())?;
        } else if !name.starts_with('.') && !files.iter().any(|(f, _)| *f == name) {
            let points_into_data =
                fs::read_link(entry.path()).is_ok_and(|t| t.parent() == Some(Path::new(DATA)));
            if points_into_data {
                fs::remove_file(entry.path())?;
            }
        }
    }
    Ok(())
}

/// `..2026_01_02_15_04_05.123456789_1a2b3c4d`: sortable by time, unique by the random suffix.
fn generation_name() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!(
        "..{:04}_{:02}_{:02}_{:02}_{:02}_{:02}.{:09}_{:08x}",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second(),
        now.nanosecond(),
        fastrand::u32(..)
    )
}

fn is_generation(name: &str) -> bool {
    name.strip_prefix("..")
        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
}

fn check_name(name: &str) -> io::Result<()> {
    if name.is_empty() || name.starts_with('.') || name.contains('/') || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("export file name {name:?} must be a plain name not starting with '.'"),
        ));
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn remove_if_present(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

fn remove_dir_if_present(path: &Path) -> io::Result<()> {
    match fs::remove_dir_all(path) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

/// The directory `..data` points at now, for readers that want one consistent generation
/// (the tests, as kubelet's readers do).
#[cfg(test)]
fn current_generation(dir: &Path) -> io::Result<std::path::PathBuf> {
    let target = fs::read_link(dir.join(DATA))?;
    if target.components().count() != 1 || target.as_os_str() == std::ffi::OsStr::new("..") {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "..data is not a generation link",
        ));
    }
    Ok(dir.join(target))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a panic is the failure report
mod tests {
    use std::collections::HashMap;
    use std::os::unix::fs::MetadataExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::pki::{generate_ca, issue_leaf, CaSpec, Issuer, LeafRequest};

    /// `n` real certificate/key pairs (PEM), checked to match.
    fn real_pairs(n: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        let ca = generate_ca(&CaSpec::default()).unwrap();
        let issuer = Issuer::from_pem(&ca.cert_pem, &ca.key_pem).unwrap();
        let req = LeafRequest {
            dns_names: vec!["export.test".to_owned()],
            ip_addresses: vec![],
            validity: Duration::from_secs(3600),
        };
        (0..n)
            .map(|_| {
                let leaf = issue_leaf(&issuer, &req).unwrap();
                let key = rcgen::KeyPair::from_pem(&leaf.key_pem).unwrap();
                let (_, cert) = x509_parser::parse_x509_certificate(&leaf.cert_der).unwrap();
                assert_eq!(
                    cert.public_key().subject_public_key.data.as_ref(),
                    key.public_key_raw()
                );
                (leaf.cert_pem.into_bytes(), leaf.key_pem.into_bytes())
            })
            .collect()
    }

    fn opts() -> ExportOptions {
        ExportOptions {
            mode: 0o640,
            gid: None,
        }
    }

    #[test]
    fn reader_resolving_data_once_never_sees_a_mismatched_pair() {
        const GENERATIONS: usize = 300;
        let pairs = real_pairs(8);
        let key_of: HashMap<Vec<u8>, Vec<u8>> = pairs.iter().cloned().collect();
        let all_keys: Vec<Vec<u8>> = pairs.iter().map(|(_, k)| k.clone()).collect();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tls");
        let (c, k) = &pairs[0];
        write_atomic(&dir, &[("tls.crt", c), ("tls.key", k)], &opts()).unwrap();

        let done = Arc::new(AtomicBool::new(false));
        let reader = {
            let (dir, done, key_of) = (dir.clone(), done.clone(), key_of.clone());
            std::thread::spawn(move || {
                let (mut consistent, mut vanished) = (0u64, 0u64);
                while !done.load(Ordering::Relaxed) {
                    let generation = current_generation(&dir).unwrap();
                    let read = fs::read(generation.join("tls.crt"))
                        .and_then(|c| Ok((c, fs::read(generation.join("tls.key"))?)));
                    match read {
                        Ok((cert, key)) => {
                            assert_eq!(key_of.get(&cert), Some(&key), "mismatched pair");
                            consistent += 1;
                        }
                        // The generation was removed after we resolved it: resolve again.
                        Err(e) if e.kind() == io::ErrorKind::NotFound => vanished += 1,
                        Err(e) => panic!("{e}"),
                    }
                }
                (consistent, vanished)
            })
        };
        // A naive reader opening the visible names separately may mix generations, but never
        // sees a torn, empty or unknown file.
        let naive = {
            let (dir, done) = (dir.clone(), done.clone());
            std::thread::spawn(move || {
                let (mut reads, mut mixed) = (0u64, 0u64);
                while !done.load(Ordering::Relaxed) {
                    let (Ok(cert), Ok(key)) =
                        (fs::read(dir.join("tls.crt")), fs::read(dir.join("tls.key")))
                    else {
                        continue;
                    };
                    let expected = key_of.get(&cert).expect("certificate is one we wrote");
                    assert!(all_keys.contains(&key), "key is one we wrote");
                    mixed += u64::from(*expected != key);
                    reads += 1;
                }
                (reads, mixed)
            })
        };

        for i in 1..=GENERATIONS {
            let (c, k) = &pairs[i % pairs.len()];
            write_atomic(&dir, &[("tls.crt", c), ("tls.key", k)], &opts()).unwrap();
        }
        done.store(true, Ordering::Relaxed);
        let (consistent, vanished) = reader.join().unwrap();
        let (naive_reads, naive_mixed) = naive.join().unwrap();
        eprintln!(
            "{GENERATIONS} swaps: {consistent} consistent reads, {vanished} re-resolved; \
             naive reader: {naive_reads} reads, {naive_mixed} mixed"
        );
        assert!(consistent > 0 && naive_reads > 0);

        let generations: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.unwrap().file_name().into_string().ok())
            .filter(|n| is_generation(n))
            .collect();
        assert_eq!(
            generations.len(),
            1,
            "old generations are removed: {generations:?}"
        );
        let (c, k) = &pairs[GENERATIONS % pairs.len()];
        assert_eq!(&fs::read(dir.join("tls.crt")).unwrap(), c);
        assert_eq!(&fs::read(dir.join("tls.key")).unwrap(), k);
    }

    #[test]
    fn files_have_the_requested_mode_group_and_layout() {
        let tmp = tempfile::tempdir().unwrap();
        let own_gid = fs::metadata(tmp.path()).unwrap().gid();
        let dir = tmp.path().join("tls");
        let opts = ExportOptions {
            mode: 0o640,
            gid: Some(own_gid),
        };
        let files: [(&str, &[u8]); 3] =
            [("tls.crt", b"cert"), ("tls.key", b"key"), ("ca.crt", b"ca")];
        write_atomic(&dir, &files, &opts).unwrap();

        for (name, contents) in files {
            let visible = dir.join(name);
            assert_eq!(
                fs::read_link(&visible).unwrap(),
                Path::new("..data").join(name)
            );
            let meta = fs::metadata(&visible).unwrap();
            assert_eq!(meta.mode() & 0o7777, 0o640, "{name}");
            assert_eq!(meta.gid(), own_gid);
            assert_eq!(fs::read(&visible).unwrap(), contents);
        }
        let generation = current_generation(&dir).unwrap();
        assert_eq!(fs::metadata(&generation).unwrap().mode() & 0o7777, 0o750);

        // Dropping a name removes its visible link; a stricter mode applies to the next one.
        let strict = ExportOptions {
            mode: 0o600,
            gid: None,
        };
        write_atomic(&dir, &files[..2], &strict).unwrap();
        assert!(fs::symlink_metadata(dir.join("ca.crt")).is_err());
        assert_eq!(
            fs::metadata(dir.join("tls.key")).unwrap().mode() & 0o7777,
            0o600
        );
        assert!(!generation.exists());
    }

    #[test]
    fn refuses_names_that_escape_or_clash_with_the_layout() {
        let tmp = tempfile::tempdir().unwrap();
        for bad in ["", "..data", ".hidden", "a/b", "../x"] {
            let err = write_atomic(tmp.path(), &[(bad, b"x")], &opts()).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
    }
}
