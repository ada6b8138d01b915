//! The JSON-RPC method of a call, read from the first bytes of its request body, and whether
//! the answer carries a JSON-RPC `error` member.
//!
//! For `jsonrpc = true` listeners only (Ironic's conductor JSON-RPC). What is read here is for
//! the access log and metrics; it never decides anything about the request, which is forwarded
//! unchanged whatever its body is. So the scan is built to be cheap and bounded rather than a
//! validating parser:
//!
//! - only the body bytes the proxy already holds are looked at (a buffered body, or the part of
//!   a streamed one already read), never more than [`SCAN_LIMIT`] of them: nothing waits for, or
//!   buffers, more of a body because of this;
//! - one forward pass, no recursion, no allocation: nesting only moves a counter, so deeply
//!   nested JSON costs what its bytes cost;
//! - the method must be one of [`KNOWN`] (Ironic's conductor RPC API), anything else, including
//!   a batch (an array; Ironic refuses batches), a body that is not JSON or not UTF-8, or a
//!   `method` that does not end within the window, is [`OTHER`]; so the metric labels stay a
//!   bounded set.
//!
//! The first `method` key of the top-level object is taken. Ironic's client writes `jsonrpc`,
//! `method`, then `params` (`ironic/common/json_rpc/client.py`, `_request`), so the method is in
//! the first few dozen bytes of every call Ironic makes.

/// How many bytes of a body are looked at, at most.
pub const SCAN_LIMIT: usize = 4096;

/// The label for a method that is not in [`KNOWN`] or could not be read.
pub const OTHER: &str = "other";

/// The conductor RPC methods: every name `ironic/conductor/rpcapi.py` (openstack/ironic,
/// RPC API 1.62) passes to `cctxt.call` or `cctxt.cast`, and those of the networking service
/// (`ironic/networking/rpcapi.py`, Ironic 34+: `update_port`, `reset_port`, `get_switches`,
/// `update_lag`, `delete_lag`), sorted for binary search.
pub const KNOWN: &[&str] = &[
    "add_node_traits",
    "attach_virtual_media",
    "change_node_boot_mode",
    "change_node_power_state",
    "change_node_secure_boot",
    "continue_inspection",
    "continue_node_clean",
    "continue_node_deploy",
    "continue_node_service",
    "create_allocation",
    "create_node",
    "create_port",
    "delete_lag",
    "destroy_allocation",
    "destroy_node",
    "destroy_port",
    "destroy_portgroup",
    "destroy_volume_connector",
    "destroy_volume_target",
    "detach_virtual_media",
    "do_node_clean",
    "do_node_deploy",
    "do_node_rescue",
    "do_node_service",
    "do_node_tear_down",
    "do_node_unrescue",
    "do_provisioning_action",
    "driver_vendor_passthru",
    "get_boot_device",
    "get_console_information",
    "get_driver_properties",
    "get_driver_vendor_passthru_methods",
    "get_indicator_state",
    "get_node_vendor_passthru_methods",
    "get_node_with_token",
    "get_raid_logical_disk_properties",
    "get_supported_boot_devices",
    "get_supported_indicators",
    "get_switches",
    "get_virtual_media",
    "heartbeat",
    "inject_nmi",
    "inspect_hardware",
    "object_action",
    "object_backport_versions",
    "object_class_action_versions",
    "remove_node_traits",
    "reset_port",
    "set_boot_device",
    "set_console_mode",
    "set_indicator_state",
    "set_target_raid_config",
    "update_lag",
    "update_node",
    "update_port",
    "update_portgroup",
    "update_portgroup_physical_network",
    "update_volume_connector",
    "update_volume_target",
    "validate_driver_interfaces",
    "vendor_passthru",
    "vif_attach",
    "vif_detach",
    "vif_list",
];

/// The position of a [`method`] label in [`KNOWN`], or `KNOWN.len()` for [`OTHER`]: a dense
/// index for per-method metric handles.
pub fn index(label: &str) -> usize {
    KNOWN.binary_search(&label).unwrap_or(KNOWN.len())
}

/// The method label for a call whose body starts with `body` (possibly only part of it).
pub fn method(body: &[u8]) -> &'static str {
    let window = &body[..body.len().min(SCAN_LIMIT)];
    let Some(raw) = top_level_string(window, b"method") else {
        return OTHER;
    };
    KNOWN
        .binary_search_by(|k| k.as_bytes().cmp(raw))
        .map_or(OTHER, |i| KNOWN[i])
}

/// Whether a JSON-RPC answer starting with `body` has a top-level `error` member that is not
/// `null` (JSON-RPC 2.0 §5: a response has `result` or `error`). Ironic answers application
/// errors (a locked node, a missing one) with HTTP 200 and such a member
/// (`ironic/common/json_rpc/server.py`, `_handle_error`), writing it before `result` would be.
pub fn is_error(body: &[u8]) -> bool {
    let window = &body[..body.len().min(SCAN_LIMIT)];
    let mut s = Scanner { b: window, i: 0 };
    if !s.eat(b'{') {
        return false;
    }
    s.find_member(b"error").is_some_and(|at| {
        let rest = &window[at..];
        !rest.starts_with(b"null")
    })
}

/// The raw bytes of a top-level string member named `key` (no escapes in it), if the window
/// holds one.
fn top_level_string<'a>(b: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    let mut s = Scanner { b, i: 0 };
    if !s.eat(b'{') {
        // An array is a batch; anything else is not a JSON-RPC call.
        return None;
    }
    let at = s.find_member(key)?;
    s.i = at;
    s.plain_string()
}

/// A forward-only cursor over a window of bytes; every step is bounded by the window.
struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scanner<'a> {
    fn skip_ws(&mut self) {
        while self
            .b
            .get(self.i)
            .is_some_and(|c| matches!(c, b' ' | b'\t' | b'\r' | b'\n'))
        {
            self.i += 1;
        }
    }

    /// Skips whitespace, then consumes `c` if it is next.
    fn eat(&mut self, c: u8) -> bool {
        self.skip_ws();
        if self.b.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    /// After the `{` of an object: walks its members until one named `key` (compared on the
    /// raw bytes between the quotes) and returns the position of its value.
    fn find_member(&mut self, key: &[u8]) -> Option<usize> {
        loop {
            self.skip_ws();
            let name = self.string_raw()?;
            if !self.eat(b':') {
                return None;
            }
            self.skip_ws();
            if name == key {
                return Some(self.i);
            }
            self.skip_value()?;
            if !self.eat(b',') {
                return None;
            }
        }
    }

    /// A string at the cursor without escapes, as its raw bytes.
    fn plain_string(&mut self) -> Option<&'a [u8]> {
        let raw = self.string_raw()?;
        (!raw.contains(&b'\\')).then_some(raw)
    }

    /// A string at the cursor: the bytes between its quotes, escapes left as they are.
    fn string_raw(&mut self) -> Option<&'a [u8]> {
        if self.b.get(self.i) != Some(&b'"') {
            return None;
        }
        let start = self.i + 1;
        let mut j = start;
        loop {
            // Jump to the next quote or backslash (most strings have neither inside).
            j += memchr::memchr2(b'"', b'\\', self.b.get(j..)?)?;
            match self.b[j] {
                b'"' => break,
                _ => j += 2,
            }
        }
        self.i = j + 1;
        Some(&self.b[start..j])
    }

    /// Skips one value of any kind; containers by counting brackets outside strings.
    fn skip_value(&mut self) -> Option<()> {
        match *self.b.get(self.i)? {
            b'"' => self.string_raw().map(|_| ()),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match *self.b.get(self.i)? {
                        b'"' => {
                            self.string_raw()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.i += 1;
                                return Some(());
                            }
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
            }
            _ => {
                // A number or a literal: up to the next delimiter.
                let rest = &self.b[self.i..];
                let n = rest
                    .iter()
                    .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\r' | b'\n'))?;
                if n == 0 {
                    return None;
                }
                self.i += n;
                Some(())
            }
        }
    }
}

#[cfg(test)]
mod tests;
