//! The htpasswd file: `user:hash` lines as `htpasswd -B` writes them. Only bcrypt hashes are
//! accepted; any other hash type (MD5 `$apr1$`, SHA `{SHA}`, crypt, plain text) is refused with
//! its line number, never silently accepted or compared.

use std::collections::HashMap;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum HtpasswdError {
    #[error("cannot read {path}", path = .path.display())]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("line {line}: {why}")]
    Line { line: usize, why: String },
    #[error("no users (a file that nobody can log in with is refused)")]
    Empty,
}

/// The users of one generation of the file. Holds bcrypt hashes, never passwords.
#[derive(Debug, Default)]
pub(crate) struct Users {
    hashes: HashMap<String, String>,
}

impl Users {
    pub(crate) fn load(path: &Path) -> Result<Self, HtpasswdError> {
        let bytes = std::fs::read(path).map_err(|source| HtpasswdError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&bytes)
    }

    /// Parses the file's bytes. Blank lines and lines starting with `#` are skipped (as
    /// httpd's mod_authn_file does); everything else must be `user:bcrypt-hash`.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, HtpasswdError> {
        let mut hashes = HashMap::new();
        for (i, raw) in bytes.split(|b| *b == b'\n').enumerate() {
            let line = i + 1;
            let bad = |why: String| HtpasswdError::Line { line, why };
            let text = std::str::from_utf8(raw)
                .map_err(|_| bad("not UTF-8".into()))?
                .trim_end_matches('\r');
            if text.trim().is_empty() || text.starts_with('#') {
                continue;
            }
            let Some((user, hash)) = text.split_once(':') else {
                return Err(bad("expected user:hash".into()));
            };
            if user.is_empty() {
                return Err(bad("empty user name".into()));
            }
            if let Err(kind) = check_bcrypt(hash) {
                return Err(bad(format!(
                    "user {user:?}: {kind} is not accepted; only bcrypt ($2y$, as `htpasswd -B` \
                     writes it)"
                )));
            }
            if hashes.insert(user.to_owned(), hash.to_owned()).is_some() {
                return Err(bad(format!("user {user:?} appears twice")));
            }
        }
        if hashes.is_empty() {
            return Err(HtpasswdError::Empty);
        }
        Ok(Self { hashes })
    }

    pub(crate) fn hash(&self, user: &str) -> Option<&str> {
        self.hashes.get(user).map(String::as_str)
    }

    /// Any stored hash: unknown users are checked against it so that they take as long as
    /// known ones (no user enumeration by timing); the result is discarded.
    pub(crate) fn decoy(&self) -> Option<&str> {
        self.hashes.values().next().map(String::as_str)
    }

    pub(crate) fn len(&self) -> usize {
        self.hashes.len()
    }
}

/// `$2y$NN$` + 22 characters of salt + 31 of hash, in bcrypt's base64 alphabet; on failure
/// the name of the hash type found, for the error message.
fn check_bcrypt(hash: &str) -> Result<(), &'static str> {
    let kind = if hash.starts_with("$apr1$") {
        "MD5 ($apr1$)"
    } else if hash.starts_with("{SHA}") {
        "SHA-1 ({SHA})"
    } else if hash.starts_with("$1$") {
        "MD5-crypt ($1$)"
    } else if hash.starts_with("$5$") || hash.starts_with("$6$") {
        "SHA-crypt ($5$/$6$)"
    } else if !hash.starts_with('$') {
        "a crypt(3) or plain-text password"
    } else {
        "an unknown hash type"
    };
    let Some(rest) = ["$2y$", "$2b$", "$2a$"]
        .iter()
        .find_map(|p| hash.strip_prefix(p))
    else {
        return Err(kind);
    };
    let b = rest.as_bytes();
    let alphabet = |c: &u8| c.is_ascii_alphanumeric() || *c == b'.' || *c == b'/';
    let cost_ok = b.len() == 56
        && b[0].is_ascii_digit()
        && b[1].is_ascii_digit()
        && (4..=31).contains(&((b[0] - b'0') * 10 + (b[1] - b'0')))
        && b[2] == b'$'
        && b[3..].iter().all(alphabet);
    if cost_ok {
        Ok(())
    } else {
        Err("a malformed bcrypt hash")
    }
}
