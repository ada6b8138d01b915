//! `Config::parse` on arbitrary text with `${VAR}` interpolation: never panics, and the
//! effective configuration that `ironic-proxy check` prints parses back to itself.
//!
//! Input: optional environment lines `NAME=value` up to the first NUL byte, then the TOML text.
//! Without a NUL the whole input is TOML and the environment is a fixed small map.
#![no_main]

use ironic_proxy::config::Config;
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;

fn env(lines: Option<&str>) -> HashMap<String, String> {
    let mut env: HashMap<String, String> = [
        ("POD_IP", "10.0.0.5"),
        ("POD_NAME", "ironic-0"),
        ("POD_NAMESPACE", "metal3"),
        ("EMPTY", ""),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    for line in lines.unwrap_or_default().lines() {
        if let Some((k, v)) = line.split_once('=') {
            env.insert(k.to_owned(), v.to_owned());
        }
    }
    env
}

fuzz_target!(|data: &[u8]| {
    let (env_part, toml_part) = match data.iter().position(|b| *b == 0) {
        Some(i) => (Some(&data[..i]), &data[i + 1..]),
        None => (None, data),
    };
    let Ok(text) = std::str::from_utf8(toml_part) else {
        return;
    };
    let env_text = env_part.map(String::from_utf8_lossy);
    let env = env(env_text.as_deref());
    let Ok(config) = Config::parse(text, &env) else {
        return;
    };
    // The rendered form is fully expanded: it must need no environment at all.
    let rendered = config.render();
    let none: HashMap<String, String> = HashMap::new();
    let again = match Config::parse(&rendered, &none) {
        Ok(c) => c,
        Err(e) => panic!("rendered configuration does not parse: {e}\n--- input\n{text}\n--- rendered\n{rendered}"),
    };
    let twice = again.render();
    assert_eq!(
        rendered, twice,
        "render is not a fixed point\n--- input\n{text}"
    );
});
