//! `[listeners.auth]`: parsed from its TOML table into [`AuthConfig`]. The file itself is read
//! when the listener starts (and by `check`), not here.

use super::public::{PublicPath, IRONIC_DEFAULT};
use serde::Deserialize;
use std::fmt::Write as _;
use std::path::PathBuf;

type FieldSource = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone, Debug)]
pub struct AuthConfig {
    pub htpasswd: PathBuf,
    pub realm: String,
    pub public: Vec<PublicPath>,
    /// Pass `Authorization` upstream (httpd's mod_proxy does); false strips it.
    pub forward_authorization: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuth {
    htpasswd: String,
    realm: Option<String>,
    public: Option<Vec<String>>,
    forward_authorization: Option<bool>,
}

use crate::error::Message as Msg;

/// The realm when none is configured: what ironic-image's httpd sends.
pub(crate) const DEFAULT_REALM: &str = "Restricted area";

/// Converts the table at `path` (`listeners[0].auth`); each bad field goes to `error` with its
/// key path. `public` defaults to ironic-image's set.
pub(crate) fn from_toml(
    v: toml::Value,
    path: &str,
    error: &mut dyn FnMut(String, FieldSource),
) -> Option<AuthConfig> {
    let raw: RawAuth = match crate::error::toml_table(v, path) {
        Ok(r) => r,
        Err((at, message)) => {
            error(at, Box::new(message));
            return None;
        }
    };
    let mut ok = true;
    if raw.htpasswd.is_empty() {
        error(
            format!("{path}.htpasswd"),
            Box::new(Msg("must name a file".into())),
        );
        ok = false;
    }
    let realm = raw.realm.unwrap_or_else(|| DEFAULT_REALM.to_owned());
    // The realm is a quoted-string in WWW-Authenticate (RFC 9110 §11.6.1); keep it printable.
    if realm.is_empty()
        || !realm
            .bytes()
            .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        error(
            format!("{path}.realm"),
            Box::new(Msg(
                "must be non-empty printable ASCII without \" or \\".into()
            )),
        );
        ok = false;
    }
    let public_raw = raw
        .public
        .unwrap_or_else(|| IRONIC_DEFAULT.iter().map(|s| (*s).to_owned()).collect());
    let mut public = Vec::new();
    for (i, p) in public_raw.iter().enumerate() {
        match p.parse::<PublicPath>() {
            Ok(p) => public.push(p),
            Err(why) => {
                error(format!("{path}.public[{i}]"), Box::new(Msg(why)));
                ok = false;
            }
        }
    }
    ok.then(|| AuthConfig {
        htpasswd: raw.htpasswd.into(),
        realm,
        public,
        forward_authorization: raw.forward_authorization.unwrap_or(true),
    })
}

impl AuthConfig {
    /// The table as `check` prints it, `q` quoting strings as the rest of the file.
    pub fn render(&self, q: &dyn Fn(&str) -> String) -> String {
        let mut o = String::from("[listeners.auth]\n");
        let _ = writeln!(o, "htpasswd = {}", q(&self.htpasswd.display().to_string()));
        let _ = writeln!(o, "realm = {}", q(&self.realm));
        let public: Vec<String> = self.public.iter().map(|p| q(&p.to_string())).collect();
        let _ = writeln!(o, "public = [{}]", public.join(", "));
        let _ = writeln!(o, "forward_authorization = {}", self.forward_authorization);
        o
    }
}
