//! Hostile hosts against DH-HMAC-CHAP on the real `nvmfd` binary: a storm
//! of unauthenticated hosts asking for ffdhe8192 key pairs (Connect with a
//! host NQN that has a key, then AUTH_Negotiate, never more) from many
//! addresses, while a legitimate host reconnects and authenticates; its time
//! to authenticate is compared with the quiet case (issue 23, finding 5).
//! The hosts are raw NVMe/TCP sockets (`raw_sock.rs`) from 127.0.0.x / 127.0.1.x
//! source addresses; the host side of DH-HMAC-CHAP is nvmf-core's own
//! arithmetic (response and FFDHE), as the in-process tests use it.

#[path = "common/raw_sock.rs"]
mod raw_sock;
#[path = "../../nvmf-tcp/tests/common/mod.rs"]
mod tcp_common;

use nvmf_core::auth::chap::{response, ResponseInput, Side};
use nvmf_core::auth::ffdhe::DhKey;
use nvmf_core::auth::DhchapSecret;
use nvmf_testkit::{free_port, TestDir};
use nvmf_wire::auth::{self as w, CtrlMsg};
use nvmf_wire::command::Command;
use nvmf_wire::fabrics::{ConnectData, CNTLID_DYNAMIC};
use nvmf_wire::status::Status;
use raw_sock::Sock;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use tcp_common::host::*;
use zerocopy::IntoBytes;

const NQN: &str = "nqn.2024-01.io.nvmfd:auth-storm";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:a0700000-0000-0000-0000-00000000000a";
const KEY: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
const IO_TIMEOUT: Duration = Duration::from_secs(20);

/// A TCP connection from `src` (any port) to `dst`.
fn sock_from(src: Ipv4Addr, dst: SocketAddr) -> Sock {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
    s.bind(&SocketAddr::new(IpAddr::V4(src), 0).into()).unwrap();
    s.connect_timeout(&dst.into(), IO_TIMEOUT)
        .expect("connect to nvmfd");
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    Sock::new(s)
}

/// ICReq and an admin Connect for `HOST`: the queue must authenticate.
fn connect_admin(w: &mut Sock, host: &mut Host) {
    init(w, host, false, false);
    let cid = host.cid();
    let cmd = Command::connect(cid, 0, 31, 0, 30_000);
    let cd = ConnectData::new([9; 16], CNTLID_DYNAMIC, NQN, HOST);
    let (c, _) = exec(w, host, cmd, Out::InCapsule(cd.as_bytes()), 0);
    assert_eq!(c.status(), Status::SUCCESS, "admin connect");
    assert_ne!(
        c.dw0() & w::AUTHREQ_ATR,
        0,
        "Connect asks for authentication"
    );
}

fn auth_send(w: &mut Sock, host: &mut Host, msg: &[u8]) {
    let cid = host.cid();
    let (c, _) = exec(
        w,
        host,
        Command::auth_send(cid, msg.len() as u32),
        Out::InCapsule(msg),
        0,
    );
    assert_eq!(c.status(), Status::SUCCESS, "Authentication Send");
}

fn auth_recv(w: &mut Sock, host: &mut Host) -> Vec<u8> {
    let cid = host.cid();
    let (c, data) = exec(w, host, Command::auth_recv(cid, 2048), Out::None, 2048);
    assert_eq!(c.status(), Status::SUCCESS, "Authentication Receive");
    data
}

/// A host's whole DH-HMAC-CHAP transaction with `group` (unidirectional).
fn authenticate(w: &mut Sock, host: &mut Host, group: u8) {
    let t_id = 0x2345;
    let mut m = Vec::new();
    w::encode_negotiate(&mut m, t_id, &[w::HASH_SHA256], &[group]);
    auth_send(w, host, &m);
    let buf = auth_recv(w, host);
    let (hash_id, seqnum, c1, ctrl_dh) = match w::parse_ctrl_msg(&buf).expect("controller message")
    {
        CtrlMsg::Challenge {
            hash_id,
            seqnum,
            challenge,
            dh_value,
            ..
        } => (hash_id, seqnum, challenge.to_vec(), dh_value.to_vec()),
        other => panic!("expected a Challenge, got {other:?}"),
    };
    let (host_dh, shared) = if group == w::DHGROUP_NULL {
        (None, None)
    } else {
        let k = DhKey::generate(group).unwrap();
        let s = k.shared_secret(&ctrl_dh).unwrap();
        (Some(k), Some(s))
    };
    let tk = DhchapSecret::parse(KEY).unwrap().transform(HOST);
    let r1 = response(
        Side::Host,
        &ResponseInput {
            hash_id,
            transformed_key: &tk,
            challenge: &c1,
            seqnum,
            t_id,
            sc_c: 0,
            hostnqn: HOST,
            subnqn: NQN,
            shared_secret: shared.as_deref(),
        },
    )
    .unwrap();
    let mut m = Vec::new();
    w::encode_reply(
        &mut m,
        t_id,
        &r1,
        None,
        host_dh.as_ref().map_or(&[][..], |k| k.public()),
    );
    auth_send(w, host, &m);
    let buf = auth_recv(w, host);
    match w::parse_ctrl_msg(&buf).expect("controller message") {
        CtrlMsg::Success1 { .. } => {}
        other => panic!("expected Success1, got {other:?}"),
    }
}

/// How long a legitimate host takes to connect and authenticate (with
/// `group`) from `src`.
fn timed_auth(dst: SocketAddr, src: Ipv4Addr, group: u8) -> Duration {
    let start = Instant::now();
    let mut s = sock_from(src, dst);
    let mut host = Host::new();
    connect_admin(&mut s, &mut host);
    authenticate(&mut s, &mut host, group);
    start.elapsed()
}

fn config(dir: &TestDir, port: u16) -> String {
    let key = dir.path().join("key0");
    std::fs::write(&key, format!("{KEY}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let l =
        format!(r#"{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}"#);
    format!(
        r#"{{"subsystems":[
 {{"subsystem":"keyring","config":[
   {{"method":"keyring_file_add_key","params":{{"name":"key0","path":"{k}"}}}}]}},
 {{"subsystem":"bdev","config":[
   {{"method":"bdev_malloc_create","params":{{"name":"Malloc0","block_size":512,"num_blocks":2048}}}}]}},
 {{"subsystem":"nvmf","config":[
   {{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
   {{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}","allow_any_host":false}}}},
   {{"method":"nvmf_subsystem_add_host","params":{{"nqn":"{NQN}","host":"{HOST}","dhchap_key":"key0"}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":1,"bdev_name":"Malloc0"}}}}}},
   {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NQN}","listen_address":{l}}}}}
 ]}}]}}"#,
        k = key.display()
    )
}

#[test]
fn an_ffdhe8192_storm_from_many_addresses_does_not_starve_a_reconnecting_host() {
    let dir = TestDir::new("auth-storm");
    let port = free_port();
    let d = nvmf_testkit::Daemon::builder(config(&dir, port))
        .args(["-m", "0"])
        .listening(&[port])
        .ready_within(Duration::from_secs(20))
        .start();
    let dst = SocketAddr::from(([127, 0, 0, 1], port));
    let legit = Ipv4Addr::new(127, 0, 0, 1);
    // The host's first authentication (its address becomes known), then
    // the quiet case: its reconnects with ffdhe2048.
    timed_auth(dst, legit, w::DHGROUP_NULL);
    let quiet = (0..3)
        .map(|_| timed_auth(dst, legit, w::DHGROUP_FFDHE2048))
        .min()
        .unwrap();
    // What one ffdhe8192 key pair costs the target (a new host's Negotiate
    // until its Send completes).
    let one = {
        let mut s = sock_from(Ipv4Addr::new(127, 0, 2, 1), dst);
        let mut host = Host::new();
        connect_admin(&mut s, &mut host);
        let mut m = Vec::new();
        w::encode_negotiate(&mut m, 1, &[w::HASH_SHA256], &[w::DHGROUP_FFDHE8192]);
        let start = Instant::now();
        auth_send(&mut s, &mut host, &m);
        start.elapsed()
    };
    // The storm: 32 addresses, 3 connections each, every one sends an
    // ffdhe8192 Negotiate and waits for nothing (96 key pairs queued).
    let mut storm = Vec::new();
    for i in 0..32u8 {
        for _ in 0..3 {
            let mut s = sock_from(Ipv4Addr::new(127, 0, 1, i + 1), dst);
            let mut host = Host::new();
            connect_admin(&mut s, &mut host);
            let mut m = Vec::new();
            w::encode_negotiate(&mut m, 1, &[w::HASH_SHA256], &[w::DHGROUP_FFDHE8192]);
            let cid = host.cid();
            let mut cmd = Command::auth_send(cid, m.len() as u32);
            cmd.set_sgl(nvmf_wire::command::SglDescriptor::in_capsule(
                0,
                m.len() as u32,
            ));
            s.send(&host.capsule(&cmd, &m));
            storm.push(s);
        }
    }
    let during = timed_auth(dst, legit, w::DHGROUP_FFDHE2048);
    // At most the storm's jobs already running when each of the host's two
    // jobs queued are ahead of it (one per auth thread), never the storm.
    let bound = quiet * 3 + one * 4 + Duration::from_millis(500);
    let storm_work = one * 96;
    eprintln!(
        "quiet {quiet:?}, one ffdhe8192 Negotiate {one:?}, during the storm {during:?} (bound {bound:?}; the storm's work about {storm_work:?} on one thread)"
    );
    assert!(
        during <= bound,
        "the reconnecting host's authentication took {during:?} during the storm (quiet {quiet:?}, bound {bound:?})\n{}",
        d.logs()
    );
    drop(storm);
    assert!(!d.logs().contains("panicked"), "{}", d.logs());
}
