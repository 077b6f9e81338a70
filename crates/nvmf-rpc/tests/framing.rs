//! Stream framing as SPDK's rpc.py uses it: requests back to back without a
//! delimiter, several per connection, split anywhere, two in one write; a
//! garbage prefix is a parse error (-32700) and closes the connection. Also
//! a minimal Python client imitating rpc.py's JSONRPCClient (python3 is
//! required: scripts/test.sh installs it; without it that test fails).

mod common;

use std::process::Command;
use std::thread::sleep;
use std::time::Duration;

use common::*;
use nvmf_rpc::error::PARSE_ERROR;
use nvmf_rpc::framing::{FrameDecoder, FrameError};
use serde_json::json;

fn req(id: u64, method: &str) -> String {
    json!({"jsonrpc": "2.0", "method": method, "id": id}).to_string()
}

#[test]
fn decoder_units() {
    let mut d = FrameDecoder::new();
    assert_eq!(d.next_value().unwrap(), None);
    d.push(b"  {\"a\":");
    assert_eq!(d.next_value().unwrap(), None);
    d.push(b"1}{\"b\":[2]}\n\n[3]");
    assert_eq!(d.next_value().unwrap(), Some(json!({"a": 1})));
    assert_eq!(d.next_value().unwrap(), Some(json!({"b": [2]})));
    assert_eq!(d.next_value().unwrap(), Some(json!([3])));
    assert_eq!(d.next_value().unwrap(), None);
    assert!(d.is_idle());
    d.push(b"xyz{}");
    assert!(matches!(d.next_value(), Err(FrameError::Parse(_))));
    // Indented JSON as newer rpc.py sends it.
    let mut d = FrameDecoder::new();
    d.push(
        serde_json::to_string_pretty(&json!({"method": "x", "id": 1}))
            .unwrap()
            .as_bytes(),
    );
    assert_eq!(
        d.next_value().unwrap(),
        Some(json!({"method": "x", "id": 1}))
    );
}

#[test]
fn two_requests_in_one_write_no_newline() {
    let h = Harness::new();
    let mut s = h.raw();
    let both = format!(
        "{}{}",
        req(1, "spdk_get_version"),
        req(2, "rpc_get_methods")
    );
    send(&mut s, both.as_bytes());
    let r = read_values(&mut s, 2);
    assert_eq!(r[0]["id"], 1);
    assert_eq!(r[0]["result"]["version"], "nvmfd v0.1.0");
    assert_eq!(r[1]["id"], 2);
    assert!(r[1]["result"].is_array());
}

#[test]
fn one_request_split_across_writes() {
    let h = Harness::new();
    let mut s = h.raw();
    let text = json!({"jsonrpc": "2.0", "method": "bdev_malloc_create", "id": 7,
        "params": {"name": "Malloc0", "num_blocks": 64, "block_size": 512}})
    .to_string();
    for chunk in text.as_bytes().chunks(5) {
        send(&mut s, chunk);
        sleep(Duration::from_millis(2));
    }
    let r = read_values(&mut s, 1).remove(0);
    assert_eq!(r, json!({"jsonrpc": "2.0", "id": 7, "result": "Malloc0"}));
    // Same connection, more requests, byte by byte.
    for b in req(8, "bdev_get_bdevs").as_bytes() {
        send(&mut s, &[*b]);
    }
    let r = read_values(&mut s, 1).remove(0);
    assert_eq!(r["id"], 8);
    assert_eq!(r["result"][0]["name"], "Malloc0");
}

#[test]
fn many_requests_one_connection() {
    let h = Harness::new();
    let mut c = h.client();
    for i in 0..50 {
        c.call(
            "bdev_null_create",
            Some(&json!({"name": format!("N{i}"), "num_blocks": 8, "block_size": 512})),
        )
        .unwrap();
    }
    assert_eq!(h.service.config().bdevs.len(), 50);
}

#[test]
fn garbage_prefix_is_parse_error_and_closes() {
    let h = Harness::new();
    let mut s = h.raw();
    send(
        &mut s,
        format!("garbage{}", req(1, "spdk_get_version")).as_bytes(),
    );
    let out = read_to_eof(&mut s);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["error"]["code"], PARSE_ERROR);
    assert_eq!(v["id"], serde_json::Value::Null);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Parse error"));
    // A request answered before the garbage still counts; the server lives on.
    let mut s = h.raw();
    send(
        &mut s,
        format!("{}}}", req(1, "spdk_get_version")).as_bytes(),
    );
    let out = read_to_eof(&mut s);
    let mut lines = out.lines();
    let first: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(first["id"], 1);
    let second: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(second["error"]["code"], PARSE_ERROR);
    let mut c = h.client();
    c.call("spdk_get_version", None).unwrap();
}

#[test]
fn server_socket_lifecycle() {
    let h = Harness::new();
    // A second server on a live socket is refused.
    let svc = h.service.clone();
    let e = nvmf_rpc::serve(&h.sock, svc.clone())
        .err()
        .expect("second bind refused");
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
    // A stale socket file is replaced.
    let stale = h.dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let mut srv = nvmf_rpc::serve(&stale, svc).unwrap();
    nvmf_rpc::RpcClient::connect(&stale, 0)
        .unwrap()
        .call("spdk_get_version", None)
        .unwrap();
    srv.shutdown();
    assert!(!stale.exists());
    // Anything that is not a socket is left alone (a mistyped -r must not
    // delete a file).
    let precious = h.dir.path().join("state.json");
    std::fs::write(&precious, b"{}").unwrap();
    let e = nvmf_rpc::serve(&precious, h.service.clone())
        .err()
        .expect("a regular file is not replaced");
    assert!(e.to_string().contains("not a socket"), "{e}");
    assert_eq!(std::fs::read(&precious).unwrap(), b"{}");
}

const PY_CLIENT: &str = r#"
import json, socket, sys
# Imitates SPDK rpc.py's JSONRPCClient: json.dumps() per request, no newline,
# one connection for several requests, responses decoded incrementally with
# JSONDecoder().raw_decode() on the buffered text.
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
buf = ""
req_id = 0
def call(method, params=None):
    global buf, req_id
    req_id += 1
    req = {"jsonrpc": "2.0", "method": method, "id": req_id}
    if params:
        req["params"] = params
    sock.sendall(json.dumps(req).encode("utf-8"))
    while True:
        try:
            b = buf.lstrip()
            obj, idx = json.JSONDecoder().raw_decode(b)
            buf = b[idx:]
            break
        except ValueError:
            data = sock.recv(4096)
            if not data:
                raise SystemExit("connection closed")
            buf += data.decode("utf-8")
    if obj.get("id") != req_id:
        raise SystemExit("wrong id %r" % obj)
    if "error" in obj:
        return {"error": obj["error"]}
    return obj["result"]
out = []
out.append(call("nvmf_create_transport", {"trtype": "TCP", "io_unit_size": 8192}))
out.append(call("bdev_malloc_create", {"num_blocks": 1024, "block_size": 512, "name": "Malloc0"}))
out.append(call("nvmf_create_subsystem", {"nqn": "nqn.2016-06.io.spdk:cnode1", "allow_any_host": True}))
out.append(call("nvmf_subsystem_add_ns", {"nqn": "nqn.2016-06.io.spdk:cnode1", "namespace": {"bdev_name": "Malloc0"}}))
out.append(call("nvmf_subsystem_add_listener", {"nqn": "nqn.2016-06.io.spdk:cnode1", "listen_address": {"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": "4420"}}))
out.append(call("nvmf_subsystem_add_ns", {"nqn": "nqn.2016-06.io.spdk:cnode1", "namespace": {"bdev_name": "Nope"}}))
out.append(call("spdk_get_version"))
# rpc.py's save_config: framework_get_subsystems + framework_get_config.
cfg = {"subsystems": []}
for s in call("framework_get_subsystems"):
    cfg["subsystems"].append({"subsystem": s["subsystem"], "config": call("framework_get_config", {"name": s["subsystem"]})})
out.append(cfg)
print(json.dumps(out))
"#;

#[test]
fn python_client_like_rpc_py() {
    if let Err(e) = Command::new("python3").arg("--version").output() {
        panic!(
            "python3 is needed to run the rpc.py-like client ({e}): install it \
             (scripts/test.sh does, apt-get install python3)"
        );
    }
    let h = Harness::new();
    let out = Command::new("python3")
        .arg("-c")
        .arg(PY_CLIENT)
        .arg(&h.sock)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0], true);
    assert_eq!(v[1], "Malloc0");
    assert_eq!(v[2], true);
    assert_eq!(v[3], 1);
    assert_eq!(v[4], true);
    assert_eq!(v[5]["error"]["code"], -32602);
    assert!(v[5]["error"]["message"].as_str().unwrap().contains("Nope"));
    assert_eq!(v[6]["version"], "nvmfd v0.1.0");
    // What rpc.py's save_config assembled loads back as the same config.
    let cfg = nvmf_config::TargetConfig::from_json_value(&v[7]).unwrap();
    assert_eq!(cfg, h.service.config());
}
