//! Fuzzing DH-HMAC-CHAP: arbitrary bytes become (1) raw messages for both
//! parsers of `nvmf_wire::auth` and (2) a sequence of Authentication
//! Send / Receive commands (and ordinary commands) on a queue of an
//! in-process target whose host must authenticate. Invariants: nothing
//! panics; every Receive the target answers parses as a controller message;
//! while the host has not authenticated, every other command gets
//! Authentication Required; once a transaction failed the queue wants to
//! close. Only the null DH group is allowed here, so no case waits on
//! FFDHE arithmetic (its values still reach the parser and get refused).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use nvmf_config::{AddressFamily, ListenerConfig, SubsystemConfig, TargetConfig, TransportType};
use nvmf_core::auth::{AuthPolicy, DhchapSecret, HostKeys};
use nvmf_core::{Exec, PortInfo, QueuePair, QueueState, Target};
use nvmf_wire::auth::{parse_ctrl_msg, parse_host_msg, AUTHREQ_ATR};
use nvmf_wire::command::Command;
use nvmf_wire::fabrics::{ConnectData, CC};
use nvmf_wire::status::Status;
use zerocopy::IntoBytes;

const NQN: &str = "nqn.2016-06.io.nvmfd:fuzz-auth";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000f0";
const KEY: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";

/// What one auth case saw.
#[derive(Debug, Default, Clone, Copy)]
pub struct AuthReport {
    pub sends: usize,
    pub recvs: usize,
    pub refused_before_auth: usize,
    pub failures: usize,
    pub closed: bool,
}

fn target() -> &'static Arc<Target> {
    static T: OnceLock<Arc<Target>> = OnceLock::new();
    T.get_or_init(|| {
        let l = ListenerConfig {
            trtype: TransportType::Tcp,
            adrfam: AddressFamily::Ipv4,
            traddr: "127.0.0.1".into(),
            trsvcid: "4420".into(),
        };
        let mut s = SubsystemConfig::new(NQN);
        s.hosts = vec![HOST.into()];
        s.listeners = vec![l.clone()];
        let cfg = TargetConfig {
            transports: vec![nvmf_config::TransportConfig::tcp_default()],
            subsystems: vec![s],
            discovery_listeners: vec![l],
            ..Default::default()
        };
        let t = Target::from_config(&cfg).expect("fuzz target");
        t.set_log_rate(1);
        let key = Arc::new(DhchapSecret::parse(KEY).expect("key"));
        t.set_host_keys(
            NQN,
            HOST,
            Some(HostKeys {
                key: key.clone(),
                ctrlr_key: Some(key),
            }),
        )
        .expect("keys");
        t.set_auth_policy(
            AuthPolicy::from_names(None, Some(&["null".to_string()])).expect("policy"),
        );
        t
    })
}

fn port() -> Arc<PortInfo> {
    Arc::new(PortInfo {
        trtype: TransportType::Tcp,
        adrfam: AddressFamily::Ipv4,
        traddr: "127.0.0.1".into(),
        trsvcid: "4420".into(),
        peer: "127.0.0.1:50000".parse::<SocketAddr>().expect("addr"),
        tls: None,
        caps: nvmf_core::TransportCaps::MESSAGE_BASED,
    })
}

fn completion(e: Exec) -> nvmf_wire::completion::Completion {
    match e {
        Exec::Complete(c) => c,
        other => panic!("auth command answered {other:?}"),
    }
}

/// Plays `bytes` as one case; panics when an invariant breaks.
pub fn run_auth_bytes(bytes: &[u8]) -> AuthReport {
    // (1) The parsers alone.
    let _ = parse_host_msg(bytes);
    let _ = parse_ctrl_msg(bytes);

    // (2) A queue that must authenticate.
    let mut r = AuthReport::default();
    let mut qp = QueuePair::new(target().clone(), port());
    let cmd = Command::connect(1, 0, 31, 0, 0);
    let mut data = ConnectData::new([1; 16], 0xffff, NQN, HOST)
        .as_bytes()
        .to_vec();
    let c = completion(qp.execute(&cmd, &mut data));
    assert!(c.status().is_success(), "connect: {:?}", c.status());
    assert_ne!(c.dw0() & AUTHREQ_ATR, 0, "AUTHREQ.ATR not set");

    let mut rest = bytes;
    let mut steps = 0;
    while rest.len() >= 3 && steps < 32 {
        steps += 1;
        let op = rest[0] % 4;
        let len = usize::from(u16::from_le_bytes([rest[1], rest[2]])) % 1200;
        rest = &rest[3..];
        let pending = qp.auth_pending();
        match op {
            0 => {
                // Authentication Send with the next `len` bytes.
                let n = len.min(rest.len());
                let mut msg = rest[..n].to_vec();
                rest = &rest[n..];
                let c = completion(qp.execute(&Command::auth_send(3, n as u32), &mut msg));
                r.sends += 1;
                assert!(c.status().is_success() || c.status() == Status::INVALID_FIELD.with_dnr());
            }
            1 => {
                let mut buf = vec![0u8; len];
                let c = completion(qp.execute(&Command::auth_recv(4, len as u32), &mut buf));
                r.recvs += 1;
                assert!(c.status().is_success(), "Receive: {:?}", c.status());
                if let Some(m) = (len >= 8).then(|| parse_ctrl_msg(&buf)) {
                    if let Err(e) = m {
                        if buf.iter().any(|&b| b != 0) {
                            panic!("target answered an unparsable message ({e}): {buf:02x?}");
                        }
                    } else if let Ok(nvmf_wire::auth::CtrlMsg::Failure1 { .. }) = m {
                        r.failures += 1;
                    }
                }
            }
            2 => {
                // An ordinary command: refused while authentication is pending.
                let c = completion(qp.execute(&Command::property_set(5, CC, false, 0), &mut []));
                if pending {
                    r.refused_before_auth += 1;
                    assert_eq!(c.status(), Status::AUTH_REQUIRED.with_dnr());
                }
            }
            _ => {
                // A raw SQE with arbitrary Authentication fields.
                let mut c = Command::auth_send(6, 0);
                if rest.len() >= 4 {
                    c.set_cdw10(u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]));
                    rest = &rest[4..];
                }
                let out = completion(qp.execute(&c, &mut []));
                assert!(!out.status().is_success() || c.is_dhchap_auth());
            }
        }
        if matches!(
            qp.poll(Instant::now(), &mut |_| {}),
            QueueState::Close { .. }
        ) {
            r.closed = true;
            break;
        }
    }
    if r.failures > 0 {
        assert!(
            r.closed
                || matches!(
                    qp.poll(Instant::now(), &mut |_| {}),
                    QueueState::Close { .. }
                ),
            "a failed authentication must close the queue"
        );
    }
    r
}
