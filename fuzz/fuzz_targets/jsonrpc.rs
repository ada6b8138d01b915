//! JSON-RPC method extraction (`proxy::jsonrpc`) on arbitrary bodies never panics and holds
//! its rules for every input:
//! - the label is `other` or one of the known methods (bounded cardinality);
//! - a known method is quoted in the bytes scanned (the first `SCAN_LIMIT`);
//! - bytes after a body whose method was found never change it (the scan is forward-only and
//!   looks at what is already in memory);
//! - `is_error` never panics.
#![no_main]

use ironic_proxy::jsonrpc::{is_error, method, KNOWN, OTHER, SCAN_LIMIT};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let m = method(data);
    assert!(m == OTHER || KNOWN.contains(&m), "unbounded label {m:?}");
    if m != OTHER {
        let quoted = format!("\"{m}\"");
        let window = &data[..data.len().min(SCAN_LIMIT)];
        assert!(
            window.windows(quoted.len()).any(|w| w == quoted.as_bytes()),
            "{m} reported but not in the scanned bytes"
        );
        let mut longer = data.to_vec();
        longer.extend_from_slice(b"\"method\": \"destroy_node\"}]]}");
        assert_eq!(method(&longer), m, "appended bytes changed the method");
    }
    let _ = is_error(data);
});
