use super::{is_error, method, KNOWN, OTHER, SCAN_LIMIT};

#[test]
fn known_list_is_sorted_and_unique() {
    assert!(KNOWN.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn reads_the_method_of_an_ironic_call() {
    // What ironic/common/json_rpc/client.py sends (json.dumps of jsonrpc, method, params, id).
    let body = br#"{"jsonrpc": "2.0", "method": "change_node_power_state", "params": {"node_id": "1be26c0b", "new_state": "power on", "context": {"user": null, "roles": ["admin"]}, "rpc.version": "1.62"}, "id": "req-1"}"#;
    assert_eq!(method(body), "change_node_power_state");
    for m in KNOWN {
        let b = format!(r#"{{"jsonrpc":"2.0","method":"{m}","params":{{}},"id":1}}"#);
        assert_eq!(method(b.as_bytes()), *m);
    }
}

#[test]
fn method_after_nested_members_and_with_whitespace() {
    let body = br#" {
        "params" : {"a": [1, 2, {"b": "x}]\"y"}], "c": -1.5e3, "d": true, "e": null},
        "id": 7,
        "method" : "do_node_deploy"
    }"#;
    assert_eq!(method(body), "do_node_deploy");
}

#[test]
fn unknown_unreadable_and_odd_bodies_are_other() {
    let cases: &[&[u8]] = &[
        b"",
        b"not json",
        b"{}",
        b"[]",
        br#"[{"jsonrpc":"2.0","method":"create_node","id":1}]"#, // a batch
        br#"{"jsonrpc":"2.0","method":"reboot_the_world","id":1}"#,
        br#"{"jsonrpc":"2.0","method":"Create_Node","id":1}"#,
        br#"{"jsonrpc":"2.0","method":"create_node\u0000","id":1}"#,
        br#"{"jsonrpc":"2.0","method":"create_nod\u0065","id":1}"#, // escapes: not read
        br#"{"jsonrpc":"2.0","method":42,"id":1}"#,
        br#"{"jsonrpc":"2.0","method":null}"#,
        br#"{"jsonrpc":"2.0","method":"create_node"#, // cut inside the string
        br#"{"params":{"method":"create_node"}}"#,    // not top level
        b"{\"method\":\"create_node\xff\"}",
        b"\xff\xfe{\"method\":\"create_node\"}",
        br#"{"jsonrpc" "2.0", "method": "create_node"}"#, // no colon
    ];
    for c in cases {
        assert_eq!(method(c), OTHER, "{:?}", String::from_utf8_lossy(c));
    }
}

#[test]
fn only_the_window_is_read() {
    // The method just past SCAN_LIMIT is not seen; just inside it is.
    let pad = |n: usize| format!(r#"{{"p":"{}","method":"create_node"}}"#, "x".repeat(n));
    let inside = pad(SCAN_LIMIT - 40);
    assert!(inside.len() <= SCAN_LIMIT);
    assert_eq!(method(inside.as_bytes()), "create_node");
    let outside = pad(SCAN_LIMIT);
    assert_eq!(method(outside.as_bytes()), OTHER);
}

#[test]
fn deep_nesting_and_huge_methods_are_cheap_and_other() {
    let mut deep = b"{\"params\":".to_vec();
    deep.extend(std::iter::repeat_n(b'[', 1_000_000));
    assert_eq!(method(&deep), OTHER);
    let mut huge = b"{\"method\":\"".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 1 << 20));
    huge.extend(b"\"}");
    assert_eq!(method(&huge), OTHER);
}

#[test]
fn error_member_detected() {
    assert!(is_error(
        br#"{"jsonrpc": "2.0", "id": "req-1", "error": {"code": 409, "message": "Node locked"}}"#
    ));
    assert!(!is_error(
        br#"{"jsonrpc": "2.0", "result": {"error": 1}, "id": "req-1"}"#
    ));
    assert!(!is_error(
        br#"{"jsonrpc": "2.0", "result": null, "error": null}"#
    ));
    assert!(!is_error(b""));
    assert!(!is_error(b"<html>"));
}

#[test]
fn any_input_is_handled() {
    // A cheap exhaustive-ish sweep: every prefix of a valid call and of a mangled one.
    let call = br#"{"jsonrpc":"2.0","method":"heartbeat","params":{"a":[{"b":"\"]"}]},"id":1}"#;
    for n in 0..=call.len() {
        let m = method(&call[..n]);
        assert!(m == OTHER || m == "heartbeat");
        let _ = is_error(&call[..n]);
        let mut mangled = call.to_vec();
        mangled[n.min(call.len() - 1)] = b'\\';
        let _ = method(&mangled);
    }
}
