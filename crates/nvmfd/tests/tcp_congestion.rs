//! `--tcp-congestion`: the congestion control set on the listen sockets is
//! what every accepted connection uses (read back with `ss -tin` on the
//! server side), and a name the kernel does not accept stops nvmfd with an
//! error naming the option and what is available.

use nvmf_testkit::{bins::nvmfd_command, free_port, Process as Nvmfd};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn sysctl(name: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// A config with only a discovery listener on 127.0.0.1:`port`.
fn config(tag: &str, port: u16) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("nvmfd-cc-{tag}-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("nvmf.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"subsystems":[{{"subsystem":"nvmf","config":[
  {{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
  {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"nqn.2014-08.org.nvmexpress.discovery",
    "listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}}}}}]}}]}}"#
        ),
    )
    .unwrap();
    (dir, cfg)
}

/// Congestion control names `ss -tin` prints for established sockets whose
/// local port is `port` (the server side of our connection).
fn server_side_cc(port: u16) -> Vec<String> {
    let out = Command::new("ss")
        .args([
            "-tin",
            "state",
            "established",
            &format!("( sport = :{port} )"),
        ])
        .output()
        .expect("ss (iproute2) must be installed: scripts/test.sh installs it");
    let text = String::from_utf8_lossy(&out.stdout);
    let known = sysctl("tcp_available_congestion_control");
    text.split_whitespace()
        .filter(|w| known.split_whitespace().any(|k| k == *w))
        .map(str::to_string)
        .collect()
}

#[test]
fn accepted_connections_use_the_chosen_congestion_control() {
    let default = sysctl("tcp_congestion_control");
    let allowed = sysctl("tcp_allowed_congestion_control");
    // reno is always built in; pick something other than the default.
    let want = if default == "reno" { "cubic" } else { "reno" };
    if !allowed.split_whitespace().any(|a| a == want) && unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: {want} not in tcp_allowed_congestion_control ({allowed}) and not root");
        return;
    }
    let port = free_port();
    let (dir, cfg) = config("ok", port);
    let mut d = Nvmfd::spawn(
        nvmfd_command()
            .args(["-m", "0", "--tcp-congestion", want, "-c"])
            .arg(&cfg)
            .arg("-r")
            .arg(dir.join("rpc.sock")),
    );
    assert!(
        d.wait_ready("listening on 127.0.0.1", Duration::from_secs(20)),
        "nvmfd did not start:\n{}",
        d.logs()
    );
    assert!(
        d.logged(&format!("TCP congestion control of connections: {want}")),
        "{}",
        d.logs()
    );
    let _conn = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let start = Instant::now();
    let cc = loop {
        let cc = server_side_cc(port);
        if !cc.is_empty() || start.elapsed() > Duration::from_secs(5) {
            break cc;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        cc,
        vec![want.to_string()],
        "the accepted connection's congestion control (system default {default})"
    );
    d.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_congestion_control_is_refused_at_start() {
    let port = free_port();
    let (dir, cfg) = config("bad", port);
    let out = Command::new(env!("CARGO_BIN_EXE_nvmfd"))
        .args(["-m", "0", "--tcp-congestion", "no-such-cc", "-c"])
        .arg(&cfg)
        .arg("-r")
        .arg(dir.join("rpc.sock"))
        .env_remove("RUST_LOG")
        .output()
        .expect("run nvmfd");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "nvmfd started with an unknown congestion control:\n{err}"
    );
    assert!(
        err.contains("--tcp-congestion no-such-cc") && err.contains("available:"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
