//! nvmf-core driven the way a transport drives it: QueuePair::execute / poll.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_config::{
    derive_namespace_ids, AddressFamily, BdevConfig, BdevKind, ListenerConfig, NamespaceConfig,
    SubsystemConfig, TargetConfig, TransportConfig, TransportType, DISCOVERY_NQN,
};
use nvmf_core::{Exec, PortInfo, QueuePair, QueueState, Target};
use nvmf_wire::command::Command;
use nvmf_wire::completion::Completion;
use nvmf_wire::fabrics::{ConnectData, CAP, CC, CSTS, VS};
use nvmf_wire::identify::{ns_descriptors, IdentifyController, IdentifyNamespace};
use nvmf_wire::log::{DiscoveryLogEntry, DiscoveryLogHeader, FirmwareSlotLog};
use nvmf_wire::opcode::{AdminOpcode, IoOpcode};
use nvmf_wire::status::Status;
use nvmf_wire::zerocopy::{FromBytes, IntoBytes};

const NQN: &str = "nqn.2024-01.io.nvmfd:test";
const NQN_RESTRICTED: &str = "nqn.2024-01.io.nvmfd:restricted";
const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000a";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b";
const HOSTID: [u8; 16] = [7; 16];
const MALLOC_BLOCKS: u64 = 2048;

// ---------------------------------------------------------------- fixtures

fn listener(addr: &str, port: &str) -> ListenerConfig {
    ListenerConfig {
        trtype: TransportType::Tcp,
        adrfam: AddressFamily::Ipv4,
        traddr: addr.to_string(),
        trsvcid: port.to_string(),
    }
}

fn ns_cfg(nqn: &str, nsid: u32, bdev: &str) -> NamespaceConfig {
    let ids = derive_namespace_ids(nqn, nsid, bdev, None);
    NamespaceConfig {
        nsid,
        bdev_name: bdev.to_string(),
        nguid: ids.nguid,
        eui64: ids.eui64,
        uuid: ids.uuid,
        anagrpid: nsid,
        ptpl_file: None,
    }
}

fn bdev(name: &str, kind: BdevKind, block_size: u32, num_blocks: u64) -> BdevConfig {
    BdevConfig {
        name: name.to_string(),
        kind,
        block_size,
        num_blocks,
        uuid: None,
        file: None,
        rbd: None,
    }
}

fn config() -> TargetConfig {
    let mut open = SubsystemConfig::new(NQN);
    open.serial_number = "NVMFD0000000001".to_string();
    open.model_number = "nvmfd test disk".to_string();
    open.allow_any_host = true;
    open.namespaces = vec![ns_cfg(NQN, 1, "Malloc0"), ns_cfg(NQN, 2, "Null0")];
    open.listeners = vec![listener("127.0.0.1", "4420")];

    let mut restricted = SubsystemConfig::new(NQN_RESTRICTED);
    restricted.hosts = vec![HOST_A.to_string()];
    restricted.namespaces = vec![ns_cfg(NQN_RESTRICTED, 1, "Malloc1")];
    restricted.listeners = vec![listener("0.0.0.0", "4421")];

    TargetConfig {
        bdevs: vec![
            bdev("Malloc0", BdevKind::Malloc, 512, MALLOC_BLOCKS),
            bdev("Null0", BdevKind::Null, 4096, 1 << 20),
            bdev("Malloc1", BdevKind::Malloc, 4096, 256),
        ],
        transports: vec![TransportConfig::tcp_default()],
        subsystems: vec![open, restricted],
        discovery_listeners: vec![listener("127.0.0.1", "4420")],
        ..Default::default()
    }
}

fn target() -> Arc<Target> {
    Target::from_config(&config()).expect("target")
}

fn port() -> Arc<PortInfo> {
    Arc::new(PortInfo {
        trtype: TransportType::Tcp,
        adrfam: AddressFamily::Ipv4,
        traddr: "127.0.0.1".to_string(),
        trsvcid: "4420".to_string(),
        peer: "127.0.0.1:50000".parse::<SocketAddr>().unwrap(),
        tls: None,
        caps: nvmf_core::TransportCaps::MESSAGE_BASED,
    })
}

/// The port the restricted subsystem listens on (a wildcard listener).
fn restricted_port() -> Arc<PortInfo> {
    Arc::new(PortInfo {
        traddr: "0.0.0.0".to_string(),
        trsvcid: "4421".to_string(),
        ..(*port()).clone()
    })
}

fn done(e: Exec) -> Completion {
    match e {
        Exec::Complete(c) => c,
        other => panic!("expected a completion, got {other:?}"),
    }
}

fn status(c: &Completion) -> Status {
    c.status()
}

#[allow(clippy::too_many_arguments)]
fn connect_raw(
    qp: &mut QueuePair,
    qid: u16,
    sqsize: u16,
    kato: u32,
    cntlid: u16,
    subnqn: &str,
    hostnqn: &str,
) -> Completion {
    let cmd = Command::connect(1, qid, sqsize, 0, kato);
    let mut data = ConnectData::new(HOSTID, cntlid, subnqn, hostnqn)
        .as_bytes()
        .to_vec();
    done(qp.execute(&cmd, &mut data))
}

/// A connected, enabled admin queue.
fn admin_kato(t: &Arc<Target>, nqn: &str, host: &str, kato: u32) -> QueuePair {
    let mut qp = QueuePair::new(t.clone(), port());
    let c = connect_raw(&mut qp, 0, 31, kato, 0xFFFF, nqn, host);
    assert_eq!(status(&c), Status::SUCCESS, "admin connect to {nqn}");
    assert!(qp.is_connected());
    let c = done(qp.execute(&Command::property_set(2, CC, false, 0x0046_0001), &mut []));
    assert_eq!(status(&c), Status::SUCCESS);
    qp
}

fn admin(t: &Arc<Target>, nqn: &str, host: &str) -> QueuePair {
    admin_kato(t, nqn, host, 5000)
}

fn cntlid(qp: &QueuePair) -> u16 {
    qp.controller().expect("controller").cntlid()
}

fn io_queue(t: &Arc<Target>, cntlid: u16, qid: u16, nqn: &str, host: &str) -> QueuePair {
    let mut qp = QueuePair::new(t.clone(), port());
    let c = connect_raw(&mut qp, qid, 127, 0, cntlid, nqn, host);
    assert_eq!(status(&c), Status::SUCCESS, "io connect qid {qid}");
    assert_eq!(qp.qid(), qid);
    assert_eq!(qp.depth(), 128);
    qp
}

fn identify(qp: &mut QueuePair, cns: u8, nsid: u32) -> (Completion, Vec<u8>) {
    let mut cmd = Command::new(AdminOpcode::Identify as u8, 10);
    cmd.set_nsid(nsid).set_cdw10(cns as u32);
    let mut buf = vec![0xAAu8; 4096];
    let c = done(qp.execute(&cmd, &mut buf));
    (c, buf)
}

fn get_log(qp: &mut QueuePair, lid: u8, len: u32, offset: u64, rae: bool) -> (Completion, Vec<u8>) {
    let mut cmd = Command::new(AdminOpcode::GetLogPage as u8, 11);
    cmd.set_nsid(0xFFFF_FFFF).set_get_log_page(lid, len, offset);
    if rae {
        let v = cmd.cdw10() | (1 << 15);
        cmd.set_cdw10(v);
    }
    let mut buf = vec![0xAAu8; len as usize];
    let c = done(qp.execute(&cmd, &mut buf));
    (c, buf)
}

fn set_feature(qp: &mut QueuePair, fid: u8, cdw11: u32) -> Completion {
    let mut cmd = Command::new(AdminOpcode::SetFeatures as u8, 12);
    cmd.set_cdw10(fid as u32).set_cdw11(cdw11);
    done(qp.execute(&cmd, &mut []))
}

fn get_feature(qp: &mut QueuePair, fid: u8, cdw11: u32) -> Completion {
    let mut cmd = Command::new(AdminOpcode::GetFeatures as u8, 13);
    cmd.set_cdw10(fid as u32).set_cdw11(cdw11);
    done(qp.execute(&cmd, &mut []))
}

fn rw(
    qp: &mut QueuePair,
    op: IoOpcode,
    nsid: u32,
    slba: u64,
    nlb: u32,
    data: &mut [u8],
) -> Completion {
    let mut cmd = Command::new(op as u8, 20);
    cmd.set_nsid(nsid).set_lba_range(slba, nlb);
    match qp.execute(&cmd, data) {
        // What the transport sends for it: zeroes.
        Exec::CompleteZeroData(c) => {
            data.fill(0);
            c
        }
        e => done(e),
    }
}

fn aer(qp: &mut QueuePair, cid: u16) -> Exec {
    qp.execute(
        &Command::new(AdminOpcode::AsyncEventRequest as u8, cid),
        &mut [],
    )
}

fn poll_all(qp: &mut QueuePair, now: Instant) -> (QueueState, Vec<Completion>) {
    let mut got = Vec::new();
    let st = qp.poll(now, &mut |c| got.push(c));
    (st, got)
}

// ---------------------------------------------------------------- connect

#[test]
fn admin_connect_creates_controller() {
    let t = target();
    assert_eq!(t.active_controllers(), 0);
    let mut qp = QueuePair::new(t.clone(), port());
    assert!(!qp.is_connected());
    let c = connect_raw(&mut qp, 0, 31, 5000, 0xFFFF, NQN, HOST_A);
    assert_eq!(status(&c), Status::SUCCESS);
    let id = c.dw0() as u16;
    assert!((1..=0xFFEF).contains(&id));
    assert_eq!(cntlid(&qp), id);
    assert_eq!(qp.qid(), 0);
    assert_eq!(qp.depth(), 32);
    assert_eq!(c.sqhd(), 1);
    assert_eq!(t.active_controllers(), 1);
    assert_eq!(qp.controller().unwrap().kato_ms(), 5000);

    let mut qp2 = QueuePair::new(t.clone(), port());
    let c2 = connect_raw(&mut qp2, 0, 31, 5000, 0xFFFF, NQN, HOST_B);
    assert_eq!(status(&c2), Status::SUCCESS);
    assert_ne!(c2.dw0() as u16, id, "controller IDs are distinct");
    assert_eq!(t.active_controllers(), 2);
    drop(qp);
    drop(qp2);
    assert_eq!(t.active_controllers(), 0);
}

#[test]
fn connect_unknown_subsystem() {
    let t = target();
    let mut qp = QueuePair::new(t.clone(), port());
    let c = connect_raw(
        &mut qp,
        0,
        31,
        0,
        0xFFFF,
        "nqn.2024-01.io.nvmfd:nope",
        HOST_A,
    );
    let s = status(&c);
    assert_eq!((s.sct, s.sc), (1, 0x82));
    assert!(!s.dnr, "the subsystem may be created later: no DNR");
    assert_eq!(c.dw0(), (1 << 16) | 256, "IATTR=1 (data), IPO=subnqn");
    assert!(!qp.is_connected());
    assert_eq!(t.active_controllers(), 0);
}

#[test]
fn connect_host_not_allowed() {
    let t = target();
    let mut qp = QueuePair::new(t.clone(), restricted_port());
    let c = connect_raw(&mut qp, 0, 31, 0, 0xFFFF, NQN_RESTRICTED, HOST_B);
    let s = status(&c);
    assert_eq!((s.sct, s.sc), (1, 0x84));
    assert!(!s.dnr, "the host may be allowed later: no DNR");
    assert_eq!(c.dw0(), (1 << 16) | 512);
    assert!(!qp.is_connected());
    let mut ok = QueuePair::new(t.clone(), restricted_port());
    let c = connect_raw(&mut ok, 0, 31, 0, 0xFFFF, NQN_RESTRICTED, HOST_A);
    assert_eq!(status(&c), Status::SUCCESS);
}

/// Over TLS the PSK identity names the host and the subsystem: a Connect
/// naming another host or subsystem is Connect Invalid Host; the matching
/// one connects, and so does a discovery Connect of the same host.
#[test]
fn connect_over_tls_must_match_the_psk_identity() {
    let t = target();
    let tls_port = |host: &str, sub: &str| {
        Arc::new(PortInfo {
            tls: nvmf_core::tls::parse_identity(&format!("NVMe0R01 {host} {sub}")),
            caps: nvmf_core::TransportCaps::MESSAGE_BASED,
            ..(*restricted_port()).clone()
        })
    };
    let mut qp = QueuePair::new(t.clone(), tls_port(HOST_B, NQN_RESTRICTED));
    let c = connect_raw(&mut qp, 0, 31, 0, 0xFFFF, NQN_RESTRICTED, HOST_A);
    let s = status(&c);
    assert_eq!((s.sct, s.sc), (1, 0x84), "identity of another host");
    let mut qp = QueuePair::new(t.clone(), tls_port(HOST_A, NQN));
    let c = connect_raw(&mut qp, 0, 31, 0, 0xFFFF, NQN_RESTRICTED, HOST_A);
    let s = status(&c);
    assert_eq!((s.sct, s.sc), (1, 0x84), "identity of another subsystem");
    let mut ok = QueuePair::new(t.clone(), tls_port(HOST_A, NQN_RESTRICTED));
    let c = connect_raw(&mut ok, 0, 31, 0, 0xFFFF, NQN_RESTRICTED, HOST_A);
    assert_eq!(status(&c), Status::SUCCESS);
    let mut disc = QueuePair::new(t.clone(), tls_port(HOST_A, NQN_RESTRICTED));
    let c = connect_raw(&mut disc, 0, 31, 0, 0xFFFF, DISCOVERY_NQN, HOST_A);
    assert_eq!(
        status(&c),
        Status::SUCCESS,
        "discovery with the host's identity"
    );
}

/// An empty host NQN (SPDK's host default) connects where any host may,
/// and matches no allow-list entry elsewhere (Connect Invalid Host).
#[test]
fn connect_with_empty_host_nqn() {
    let t = target();
    let qp = admin(&t, NQN, "");
    assert_eq!(qp.controller().unwrap().hostnqn(), "");
    let mut io = QueuePair::new(t.clone(), port());
    let cntlid = qp.controller().unwrap().cntlid();
    let c = connect_raw(&mut io, 1, 31, 0, cntlid, NQN, "");
    assert_eq!(status(&c), Status::SUCCESS);
    let mut r = QueuePair::new(t.clone(), restricted_port());
    let c = connect_raw(&mut r, 0, 31, 0, 0xFFFF, NQN_RESTRICTED, "");
    let s = status(&c);
    assert_eq!((s.sct, s.sc), (1, 0x84));
    assert!(!r.is_connected());
}

#[test]
fn connect_bad_sqsize() {
    let t = target();
    for sqsize in [0u16, 128, 0xFFFF] {
        let mut qp = QueuePair::new(t.clone(), port());
        let c = connect_raw(&mut qp, 0, sqsize, 0, 0xFFFF, NQN, HOST_A);
        let s = status(&c);
        assert_eq!((s.sct, s.sc), (1, 0x82), "sqsize {sqsize}");
        assert!(s.dnr, "malformed: DNR");
        assert_eq!(c.dw0(), 44, "IATTR=0 (SQE), IPO=SQSIZE");
    }
    // max_aq_depth 128 → SQSIZE 127 is the largest accepted.
    let mut qp = QueuePair::new(t.clone(), port());
    assert_eq!(
        status(&connect_raw(&mut qp, 0, 127, 0, 0xFFFF, NQN, HOST_A)),
        Status::SUCCESS
    );
}

#[test]
fn connect_bad_format_and_static_cntlid() {
    let t = target();
    let mut qp = QueuePair::new(t.clone(), port());
    let mut cmd = Command::connect(1, 0, 31, 0, 0);
    cmd.set_cdw10(1); // RECFMT 1
    let mut data = ConnectData::new(HOSTID, 0xFFFF, NQN, HOST_A)
        .as_bytes()
        .to_vec();
    let s = status(&done(qp.execute(&cmd, &mut data)));
    assert_eq!((s.sct, s.sc, s.dnr), (1, 0x80, true));

    let c = connect_raw(&mut qp, 0, 31, 0, 5, NQN, HOST_A);
    assert!(status(&c).dnr);
    assert_eq!(
        c.dw0(),
        (1 << 16) | 16,
        "static controller IDs are not offered"
    );

    // Short Connect data.
    let cmd = Command::connect(1, 0, 31, 0, 0);
    let s = status(&done(qp.execute(&cmd, &mut [0u8; 100])));
    assert_eq!(s, Status::SGL_DATA_LENGTH_INVALID.with_dnr());
}

#[test]
fn command_before_connect_is_fatal() {
    let t = target();
    let mut qp = QueuePair::new(t, port());
    let mut buf = vec![0u8; 4096];
    match qp.execute(&Command::new(AdminOpcode::Identify as u8, 1), &mut buf) {
        Exec::Fatal { reason } => assert!(reason.contains("Connect"), "{reason}"),
        other => panic!("{other:?}"),
    }
    match qp.execute(&Command::property_get(1, CAP, true), &mut []) {
        Exec::Fatal { .. } => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn connect_only_through_the_subsystems_own_listeners() {
    let t = target();
    // The restricted subsystem listens on 0.0.0.0:4421 only: through
    // 127.0.0.1:4420 it does not exist for the host (IPO = SUBNQN).
    let mut qp = QueuePair::new(t.clone(), port());
    let c = connect_raw(&mut qp, 0, 31, 0, 0xFFFF, NQN_RESTRICTED, HOST_A);
    assert_eq!((status(&c).sct, status(&c).sc), (1, 0x82));
    assert!(!status(&c).dnr, "a listener may be added later: no DNR");
    assert_eq!(c.dw0(), (1 << 16) | 256);
    assert_eq!(t.active_controllers(), 0);
    // The discovery subsystem answers on every port.
    let mut d = QueuePair::new(t.clone(), restricted_port());
    let c = connect_raw(&mut d, 0, 31, 0, 0xFFFF, DISCOVERY_NQN, HOST_A);
    assert_eq!(status(&c), Status::SUCCESS);
    // And the restricted subsystem through its own port.
    let mut ok = QueuePair::new(t.clone(), restricted_port());
    let c = connect_raw(&mut ok, 0, 31, 0, 0xFFFF, NQN_RESTRICTED, HOST_A);
    assert_eq!(status(&c), Status::SUCCESS);
}

#[test]
fn io_queue_connect_paths() {
    let t = target();
    let a = admin(&t, NQN, HOST_A);
    let id = cntlid(&a);

    let q1 = io_queue(&t, id, 1, NQN, HOST_A);
    assert!(!q1.is_admin());

    // Unknown controller ID.
    let mut qp = QueuePair::new(t.clone(), port());
    let c = connect_raw(&mut qp, 1, 127, 0, id.wrapping_add(100), NQN, HOST_A);
    assert_eq!((status(&c).sct, status(&c).sc), (1, 0x82));
    assert!(
        !status(&c).dnr,
        "controller gone: a new admin connect cures it"
    );
    assert_eq!(c.dw0(), (1 << 16) | 16);
    // Right ID, other host.
    let c = connect_raw(&mut qp, 2, 127, 0, id, NQN, HOST_B);
    assert_eq!(c.dw0(), (1 << 16) | 16);
    // Right ID, other subsystem (reached through that subsystem's port).
    let mut other = QueuePair::new(t.clone(), restricted_port());
    let c = connect_raw(&mut other, 2, 127, 0, id, NQN_RESTRICTED, HOST_A);
    assert_eq!(c.dw0(), (1 << 16) | 16);
    // QID beyond the negotiated count.
    let c = connect_raw(&mut qp, 128, 127, 0, id, NQN, HOST_A);
    assert_eq!(c.dw0(), 42, "IPO=QID");
    assert!(status(&c).dnr);
    // Already connected.
    let c = connect_raw(&mut qp, 1, 127, 0, id, NQN, HOST_A);
    assert_eq!(c.dw0(), 42);
    // SQSIZE beyond MQES.
    let c = connect_raw(&mut qp, 2, 128, 0, id, NQN, HOST_A);
    assert_eq!(c.dw0(), 44);
    assert!(!qp.is_connected());

    // Negotiate fewer queues: qid 3 is then out of range.
    let mut a = a;
    let c = set_feature(&mut a, 0x07, 1 | (1 << 16));
    assert_eq!(c.dw0(), 1 | (1 << 16));
    let c = connect_raw(&mut qp, 3, 127, 0, id, NQN, HOST_A);
    assert_eq!(c.dw0(), 42);
    let _q2 = io_queue(&t, id, 2, NQN, HOST_A);

    // A dropped I/O queue frees its QID.
    drop(q1);
    let _q1 = io_queue(&t, id, 1, NQN, HOST_A);
}

/// Live maintenance: a subsystem deleted under I/O. Its queues take no new
/// command and answer none (the host resends it after the connection
/// drops), they close on the next poll, a reconnect meanwhile is refused
/// without DNR, and once the subsystem is re-created the host connects and
/// does I/O again.
#[test]
fn subsystem_delete_and_recreate_under_io() {
    let t = target();
    let mut a = admin(&t, NQN, HOST_A);
    let mut q = io_queue(&t, cntlid(&a), 1, NQN, HOST_A);
    let mut buf = vec![0x5Au8; 512];
    assert_eq!(
        status(&rw(&mut q, IoOpcode::Write, 1, 0, 1, &mut buf)),
        Status::SUCCESS
    );

    t.remove_subsystem(NQN).unwrap();
    let mut cmd = Command::new(IoOpcode::Write as u8, 21);
    cmd.set_nsid(1).set_lba_range(0, 1);
    assert_eq!(
        q.execute(&cmd, &mut buf),
        Exec::Pending,
        "no answer on a torn-down controller's queue"
    );
    let mut rd = Command::new(IoOpcode::Read as u8, 22);
    rd.set_nsid(1).set_lba_range(0, 1);
    assert_eq!(q.execute(&rd, &mut buf), Exec::Pending);
    let (st, got) = poll_all(&mut q, Instant::now());
    assert!(got.is_empty(), "nothing answered: {got:?}");
    assert_eq!(
        st,
        QueueState::Close {
            reason: "subsystem removed"
        }
    );
    assert!(matches!(
        poll_all(&mut a, Instant::now()).0,
        QueueState::Close { .. }
    ));
    drop(q);
    drop(a);

    // Reconnect while the subsystem is gone: retryable.
    let mut qp = QueuePair::new(t.clone(), port());
    let c = connect_raw(&mut qp, 0, 31, 0, 0xFFFF, NQN, HOST_A);
    let s = status(&c);
    assert_eq!((s.sct, s.sc, s.dnr), (1, 0x82, false));

    // Re-created: the host gets back in and reads what it wrote.
    let cfg = config();
    t.add_subsystem(cfg.subsystem(NQN).unwrap()).unwrap();
    let a = admin(&t, NQN, HOST_A);
    let mut q = io_queue(&t, cntlid(&a), 1, NQN, HOST_A);
    let mut back = vec![0u8; 512];
    assert_eq!(
        status(&rw(&mut q, IoOpcode::Read, 1, 0, 1, &mut back)),
        Status::SUCCESS
    );
    assert_eq!(back, vec![0x5Au8; 512], "same backend, same data");
}

#[test]
fn admin_drop_closes_io_queues() {
    let t = target();
    let a = admin(&t, NQN, HOST_A);
    let mut q = io_queue(&t, cntlid(&a), 1, NQN, HOST_A);
    assert_eq!(poll_all(&mut q, Instant::now()).0, QueueState::Open);
    drop(a);
    assert_eq!(t.active_controllers(), 0);
    match poll_all(&mut q, Instant::now()).0 {
        QueueState::Close { reason } => assert_eq!(reason, "controller destroyed"),
        s => panic!("{s:?}"),
    }
}

#[test]
fn second_connect_on_a_queue_is_a_sequence_error() {
    let t = target();
    let mut a = admin(&t, NQN, HOST_A);
    let c = connect_raw(&mut a, 0, 31, 0, 0xFFFF, NQN, HOST_A);
    assert_eq!(status(&c), Status::COMMAND_SEQUENCE_ERROR.with_dnr());
    let mut q = io_queue(&t, cntlid(&a), 1, NQN, HOST_A);
    let c = connect_raw(&mut q, 1, 31, 0, 1, NQN, HOST_A);
    assert_eq!(status(&c), Status::COMMAND_SEQUENCE_ERROR.with_dnr());
}

// ---------------------------------------------------------------- properties

#[test]
fn properties() {
    let t = target();
    let mut qp = QueuePair::new(t.clone(), port());
    connect_raw(&mut qp, 0, 31, 0, 0xFFFF, NQN, HOST_A);

    let c = done(qp.execute(&Command::property_get(2, CAP, true), &mut []));
    let cap = c.result64();
    assert_eq!(cap & 0xFFFF, 127, "MQES = max_queue_depth - 1");
    assert_ne!(cap & (1 << 16), 0, "CQR");
    assert_eq!((cap >> 24) & 0xFF, 15, "TO");
    assert_eq!((cap >> 32) & 0xF, 0, "DSTRD");
    assert_ne!(cap & (1 << 37), 0, "CSS NVM");
    assert_eq!((cap >> 48) & 0xF, 0, "MPSMIN");

    let vs = done(qp.execute(&Command::property_get(3, VS, false), &mut [])).dw0();
    assert_eq!(vs, 0x0001_0300);

    let csts = |qp: &mut QueuePair| {
        done(qp.execute(&Command::property_get(4, CSTS, false), &mut [])).dw0()
    };
    assert_eq!(csts(&mut qp), 0);
    // EN=1 with IOSQES=6, IOCQES=4.
    let c = done(qp.execute(&Command::property_set(5, CC, false, 0x0046_0001), &mut []));
    assert_eq!(status(&c), Status::SUCCESS);
    assert_eq!(csts(&mut qp) & 1, 1, "RDY");
    let cc = done(qp.execute(&Command::property_get(6, CC, false), &mut [])).dw0();
    assert_eq!(cc, 0x0046_0001);
    // EN=0: reset.
    done(qp.execute(&Command::property_set(7, CC, false, 0x0046_0000), &mut []));
    assert_eq!(csts(&mut qp) & 1, 0);
    // Enable, then normal shutdown.
    done(qp.execute(&Command::property_set(8, CC, false, 0x0046_0001), &mut []));
    done(qp.execute(&Command::property_set(9, CC, false, 0x0046_4001), &mut []));
    assert_eq!((csts(&mut qp) >> 2) & 3, 2, "SHST complete");

    // Bad configuration → CFS.
    let mut qp2 = QueuePair::new(t.clone(), port());
    connect_raw(&mut qp2, 0, 31, 0, 0xFFFF, NQN, HOST_A);
    done(qp2.execute(&Command::property_set(5, CC, false, 0x0001), &mut []));
    assert_eq!(csts(&mut qp2) & 0x3, 0x2, "CFS, not RDY");

    // Unknown property, read-only property.
    let c = done(qp.execute(&Command::property_get(10, 0x40, false), &mut []));
    assert_eq!(status(&c), Status::INVALID_FIELD.with_dnr());
    let c = done(qp.execute(&Command::property_set(11, CSTS, false, 1), &mut []));
    assert_eq!(status(&c), Status::INVALID_FIELD.with_dnr());
}

// ---------------------------------------------------------------- identify

#[test]
fn identify_controller_fields() {
    let t = target();
    let mut qp = admin(&t, NQN, HOST_A);
    let (c, buf) = identify(&mut qp, 1, 0);
    assert_eq!(status(&c), Status::SUCCESS);
    let id = IdentifyController::ref_from_bytes(&buf[..]).unwrap();
    assert_eq!(id.cntlid.get(), cntlid(&qp));
    assert_eq!(id.serial(), "NVMFD0000000001");
    assert_eq!(&id.sn[15..], b"     ", "space padded");
    assert_eq!(id.model(), "nvmfd test disk");
    assert_eq!(id.firmware(), env!("CARGO_PKG_VERSION"));
    assert_eq!(id.subnqn(), NQN);
    assert_eq!(id.ver.get(), 0x0001_0300);
    assert_eq!(id.cntrltype, 1);
    assert_eq!(id.kas.get(), 10);
    assert_eq!(id.ioccsz.get(), (64 + 4096) / 16);
    assert_eq!(id.iorcsz.get(), 1);
    assert_eq!(id.icdoff.get(), 0);
    assert_eq!(id.msdbd, 1);
    assert_eq!(id.sgls.get(), (1 << 0) | (1 << 20));
    assert_eq!(id.mdts, 5, "128 KiB = 2^5 × 4 KiB");
    assert_eq!(id.maxcmd.get(), 128);
    assert_eq!(id.nn.get(), 32);
    assert_eq!(id.sqes, 0x66);
    assert_eq!(id.cqes, 0x44);
    assert_eq!(id.aerl, 3);
    assert_ne!(id.oncs.get() & (1 << 2), 0, "DSM");
    assert_ne!(id.oncs.get() & (1 << 3), 0, "Write Zeroes");
    assert_eq!(id.vwc & 1, 1);
    assert_eq!(id.oaes.get(), 1 << 8);
    assert_eq!(id.lpa, (1 << 1) | (1 << 2));
    assert_eq!(id.cmic & 0x2, 0x2);
    assert_eq!(id.fcatt, 0);
}

/// Identify reports the facts of the transport the admin queue came in on
/// (NVMe/RDMA's keyed SGLs), and the limits configured for that transport.
#[test]
fn identify_reports_the_connections_transport() {
    let mut cfg = config();
    let mut tcp = nvmf_config::TransportConfig::tcp_default();
    tcp.in_capsule_data_size = 8192;
    tcp.max_queue_depth = 64;
    cfg.transports = vec![tcp];
    let t = Target::from_config(&cfg).expect("target");
    let keyed = Arc::new(PortInfo {
        caps: nvmf_core::TransportCaps {
            keyed_sgls: true,
            msdbd: 16,
        },
        ..(*port()).clone()
    });
    let mut qp = QueuePair::new(t.clone(), keyed);
    let c = connect_raw(&mut qp, 0, 31, 5000, 0xFFFF, NQN, HOST_A);
    assert_eq!(status(&c), Status::SUCCESS);
    let (c, buf) = identify(&mut qp, 1, 0);
    assert_eq!(status(&c), Status::SUCCESS);
    let id = IdentifyController::ref_from_bytes(&buf[..]).unwrap();
    assert_eq!(id.sgls.get(), (1 << 0) | (1 << 2) | (1 << 20), "keyed SGLs");
    assert_eq!(id.msdbd, 16);
    assert_eq!(id.ioccsz.get(), (64 + 8192) / 16);
    assert_eq!(id.maxcmd.get(), 64);
    let cap = done(qp.execute(&Command::property_get(9, CAP, true), &mut []));
    assert_eq!(
        cap.dw0() & 0xFFFF,
        63,
        "CAP.MQES from that transport's depth"
    );
}

#[test]
fn identify_discovery_controller_fields() {
    let t = target();
    let mut qp = admin_kato(&t, DISCOVERY_NQN, HOST_B, 0);
    let (c, buf) = identify(&mut qp, 1, 0);
    assert_eq!(status(&c), Status::SUCCESS);
    let id = IdentifyController::ref_from_bytes(&buf[..]).unwrap();
    assert_eq!(id.cntrltype, 2);
    assert_eq!(id.nn.get(), 0);
    assert_eq!(id.ioccsz.get(), 0, "reserved on discovery");
    assert_eq!(id.iorcsz.get(), 0);
    assert_eq!(id.kas.get(), 10);
    assert_eq!(id.oaes.get(), 1 << 31);
    assert_eq!(id.subnqn(), DISCOVERY_NQN);
    assert_eq!(id.cntlid.get(), cntlid(&qp));
    assert_ne!(id.maxcmd.get(), 0);
    assert_ne!(id.lpa & (1 << 2), 0);
    // Only the controller page.
    let (c, _) = identify(&mut qp, 0, 1);
    assert_eq!(status(&c), Status::INVALID_FIELD.with_dnr());
    // KATO 0 on discovery still gets a default timeout.
    assert!(qp.controller().unwrap().kato_ms() > 0);
}

#[test]
fn identify_namespace_and_lists() {
    let t = target();
    let mut qp = admin(&t, NQN, HOST_A);
    let (c, buf) = identify(&mut qp, 0, 1);
    assert_eq!(status(&c), Status::SUCCESS);
    let id = IdentifyNamespace::ref_from_bytes(&buf[..]).unwrap();
    let expect = ns_cfg(NQN, 1, "Malloc0");
    assert_eq!(id.nsze.get(), MALLOC_BLOCKS);
    assert_eq!(id.ncap.get(), MALLOC_BLOCKS);
    assert_eq!(id.nuse.get(), MALLOC_BLOCKS);
    assert_eq!(id.block_size(), 512);
    assert_eq!(id.nlbaf, 0);
    assert_eq!(id.dlfeat & 7, 1, "deallocated blocks read zeroes");
    assert_eq!(id.nguid, expect.nguid);
    assert_eq!(id.eui64, expect.eui64);
    assert_eq!(id.nmic & 1, 1);

    let (_, buf) = identify(&mut qp, 0, 2);
    let id = IdentifyNamespace::ref_from_bytes(&buf[..]).unwrap();
    assert_eq!(id.block_size(), 4096);

    // Inactive but valid NSID: zero page.
    let (c, buf) = identify(&mut qp, 0, 5);
    assert_eq!(status(&c), Status::SUCCESS);
    assert!(buf.iter().all(|&b| b == 0));
    // Invalid NSIDs.
    for nsid in [0u32, 33, 0xFFFF_FFFF] {
        let (c, _) = identify(&mut qp, 0, nsid);
        assert_eq!(
            status(&c),
            Status::INVALID_NAMESPACE.with_dnr(),
            "nsid {nsid}"
        );
    }

    // Active namespace list.
    let (c, buf) = identify(&mut qp, 2, 0);
    assert_eq!(status(&c), Status::SUCCESS);
    assert_eq!(&buf[..12], &[1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
    let (_, buf) = identify(&mut qp, 2, 1);
    assert_eq!(&buf[..8], &[2, 0, 0, 0, 0, 0, 0, 0]);
    let (_, buf) = identify(&mut qp, 2, 2);
    assert!(buf.iter().all(|&b| b == 0));
    let (c, _) = identify(&mut qp, 2, 0xFFFF_FFFE);
    assert_eq!(status(&c), Status::INVALID_NAMESPACE.with_dnr());

    // Descriptor list.
    let (c, buf) = identify(&mut qp, 3, 1);
    assert_eq!(status(&c), Status::SUCCESS);
    let descs: Vec<(u8, Vec<u8>)> = ns_descriptors(&buf).map(|(t, v)| (t, v.to_vec())).collect();
    assert_eq!(
        descs,
        vec![
            (1, expect.eui64.to_vec()),
            (2, expect.nguid.to_vec()),
            (3, expect.uuid.to_vec()),
            (4, vec![0]),
        ]
    );
    let (c, _) = identify(&mut qp, 3, 7);
    assert_eq!(status(&c), Status::INVALID_NAMESPACE.with_dnr());

    // Unknown CNS.
    let (c, _) = identify(&mut qp, 0x1F, 0);
    assert_eq!(status(&c), Status::INVALID_FIELD.with_dnr());

    // NVM command set specific controller / namespace pages: zeroes, but
    // for the controller page's Verify Size Limit (byte 0, = MDTS).
    let (c, buf) = identify(&mut qp, 0x06, 0);
    assert_eq!(status(&c), Status::SUCCESS);
    let (c, id) = identify(&mut qp, 1, 0);
    assert_eq!(status(&c), Status::SUCCESS);
    assert_eq!(buf[0], id[77], "VSL = MDTS");
    assert!(buf[1..].iter().all(|&b| b == 0));
    let (c, buf) = identify(&mut qp, 0x05, 1);
    assert_eq!(status(&c), Status::SUCCESS);
    assert!(buf.iter().all(|&b| b == 0));
    let (c, _) = identify(&mut qp, 0x05, 9);
    assert_eq!(status(&c), Status::INVALID_NAMESPACE.with_dnr());
    let mut cmd = Command::new(AdminOpcode::Identify as u8, 1);
    cmd.set_cdw10(0x06).set_cdw11(2 << 24); // CSI ZNS
    let mut page = vec![0u8; 4096];
    assert_eq!(
        status(&done(qp.execute(&cmd, &mut page))),
        Status::INVALID_FIELD.with_dnr()
    );
}

#[test]
fn seventy_namespaces_have_distinct_ids() {
    let mut cfg = config();
    cfg.bdevs.clear();
    let mut sub = SubsystemConfig::new(NQN);
    sub.allow_any_host = true;
    sub.max_namespaces = 100;
    sub.listeners = vec![listener("127.0.0.1", "4420")];
    for nsid in 1..=70u32 {
        let name = format!("Malloc{nsid}");
        cfg.bdevs.push(bdev(&name, BdevKind::Malloc, 512, 16));
        sub.namespaces.push(ns_cfg(NQN, nsid, &name));
    }
    cfg.subsystems = vec![sub];
    let t = Target::from_config(&cfg).unwrap();
    let mut qp = admin(&t, NQN, HOST_A);

    let (_, list) = identify(&mut qp, 2, 0);
    let nsids: Vec<u32> = list
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .take_while(|&n| n != 0)
        .collect();
    assert_eq!(nsids, (1..=70).collect::<Vec<_>>());

    let mut seen = std::collections::HashSet::new();
    for nsid in nsids {
        let (_, buf) = identify(&mut qp, 3, nsid);
        for (ty, v) in ns_descriptors(&buf) {
            if ty != 4 {
                assert!(v.iter().any(|&b| b != 0));
                assert!(
                    seen.insert((ty, v.to_vec())),
                    "duplicate id type {ty} nsid {nsid}"
                );
            }
        }
    }
    assert_eq!(seen.len(), 70 * 3);
}

// ---------------------------------------------------------------- features

#[test]
fn features() {
    let t = target();
    let mut qp = admin(&t, NQN, HOST_A);

    // Number of queues.
    let c = set_feature(&mut qp, 0x07, 7 | (3 << 16));
    assert_eq!(status(&c), Status::SUCCESS);
    assert_eq!(c.dw0(), 7 | (3 << 16));
    assert_eq!(get_feature(&mut qp, 0x07, 0).dw0(), 3 | (3 << 16));
    let c = set_feature(&mut qp, 0x07, 1000 | (1000 << 16));
    assert_eq!(c.dw0(), 126 | (126 << 16));
    let c = set_feature(&mut qp, 0x07, 0xFFFF);
    assert_eq!(status(&c), Status::INVALID_FIELD.with_dnr());

    // Keep-alive timer.
    assert_eq!(get_feature(&mut qp, 0x0F, 0).dw0(), 5000);
    assert_eq!(status(&set_feature(&mut qp, 0x0F, 15000)), Status::SUCCESS);
    assert_eq!(get_feature(&mut qp, 0x0F, 0).dw0(), 15000);

    // Async event configuration.
    assert_eq!(get_feature(&mut qp, 0x0B, 0).dw0(), 1 << 8);
    assert_eq!(status(&set_feature(&mut qp, 0x0B, 0)), Status::SUCCESS);
    assert_eq!(get_feature(&mut qp, 0x0B, 0).dw0(), 0);
    assert_eq!(
        status(&set_feature(&mut qp, 0x0B, 0x1F | (1 << 8))),
        Status::SUCCESS
    );
    assert_eq!(get_feature(&mut qp, 0x0B, 0).dw0(), 0x1F | (1 << 8));
    set_feature(&mut qp, 0x0B, 0);
    assert_eq!(
        status(&set_feature(&mut qp, 0x0B, 1 << 31)),
        Status::INVALID_FIELD.with_dnr(),
        "discovery change is not an NVM controller event"
    );

    // Volatile write cache.
    assert_eq!(get_feature(&mut qp, 0x06, 0).dw0(), 1);
    set_feature(&mut qp, 0x06, 0);
    assert_eq!(get_feature(&mut qp, 0x06, 0).dw0(), 0);

    // Temperature threshold (composite sensor only): over 343 K / under 0 K
    // by default, kept per controller; other sensors and THSEL 2 refused.
    assert_eq!(get_feature(&mut qp, 0x04, 0).dw0(), 343);
    assert_eq!(get_feature(&mut qp, 0x04, 1 << 20).dw0(), 0);
    assert_eq!(status(&set_feature(&mut qp, 0x04, 350)), Status::SUCCESS);
    assert_eq!(
        status(&set_feature(&mut qp, 0x04, (1 << 20) | 270)),
        Status::SUCCESS
    );
    assert_eq!(get_feature(&mut qp, 0x04, 0).dw0(), 350);
    assert_eq!(get_feature(&mut qp, 0x04, 1 << 20).dw0(), 270);
    assert_eq!(
        status(&set_feature(&mut qp, 0x04, (0xF << 16) | 360)),
        Status::SUCCESS,
        "TMPSEL 1111b: all sensors"
    );
    assert_eq!(get_feature(&mut qp, 0x04, 0).dw0(), 360);
    for cdw11 in [1 << 16, 0xF << 16, 9 << 16, 2 << 20] {
        assert_eq!(
            status(&get_feature(&mut qp, 0x04, cdw11)),
            Status::INVALID_FIELD.with_dnr(),
            "get cdw11 {cdw11:#x}"
        );
    }
    assert_eq!(
        status(&set_feature(&mut qp, 0x04, 3 << 20)),
        Status::INVALID_FIELD.with_dnr()
    );

    // Features with nothing to configure.
    for fid in [0x01u8, 0x02, 0x05, 0x08] {
        let c = get_feature(&mut qp, fid, 0);
        assert_eq!((status(&c), c.dw0()), (Status::SUCCESS, 0), "fid {fid:#x}");
    }

    // Unknown feature, save bit.
    assert_eq!(
        status(&get_feature(&mut qp, 0x7E, 0)),
        Status::INVALID_FIELD.with_dnr()
    );
    assert_eq!(
        status(&set_feature(&mut qp, 0x7E, 0)),
        Status::INVALID_FIELD.with_dnr()
    );
    let mut cmd = Command::new(AdminOpcode::SetFeatures as u8, 1);
    cmd.set_cdw10(0x0F | (1 << 31)).set_cdw11(1000);
    let s = status(&done(qp.execute(&cmd, &mut [])));
    assert_eq!((s.sct, s.sc), (1, 0x0D));

    // Host identifier: 128-bit only.
    let mut cmd = Command::new(AdminOpcode::GetFeatures as u8, 1);
    cmd.set_cdw10(0x81).set_cdw11(1);
    let mut buf = [0u8; 16];
    assert_eq!(status(&done(qp.execute(&cmd, &mut buf))), Status::SUCCESS);
    assert_eq!(buf, HOSTID);
    assert_eq!(
        status(&get_feature(&mut qp, 0x81, 0)),
        Status::INVALID_FIELD.with_dnr()
    );
    assert_eq!(
        status(&set_feature(&mut qp, 0x81, 1)),
        Status::COMMAND_SEQUENCE_ERROR.with_dnr()
    );

    // Supported capabilities (SEL=3).
    let mut cmd = Command::new(AdminOpcode::GetFeatures as u8, 1);
    cmd.set_cdw10(0x0F | (3 << 8));
    assert_eq!(done(qp.execute(&cmd, &mut [])).dw0(), 1 << 2);
}

#[test]
fn discovery_features_are_limited() {
    let t = target();
    let mut d = admin(&t, DISCOVERY_NQN, HOST_A);
    assert_eq!(status(&set_feature(&mut d, 0x0F, 30000)), Status::SUCCESS);
    assert_eq!(get_feature(&mut d, 0x0F, 0).dw0(), 30000);
    assert_eq!(get_feature(&mut d, 0x0B, 0).dw0(), 1 << 31);
    assert_eq!(
        status(&get_feature(&mut d, 0x07, 0)),
        Status::INVALID_FIELD.with_dnr()
    );
    assert_eq!(
        status(&set_feature(&mut d, 0x06, 1)),
        Status::INVALID_FIELD.with_dnr()
    );
}

// ---------------------------------------------------------------- admin misc

#[test]
fn admin_opcodes() {
    let t = target();
    let mut qp = admin(&t, NQN, HOST_A);
    let c = done(qp.execute(&Command::new(AdminOpcode::Abort as u8, 3), &mut []));
    assert_eq!((status(&c), c.dw0() & 1), (Status::SUCCESS, 1));
    let c = done(qp.execute(&Command::new(AdminOpcode::KeepAlive as u8, 3), &mut []));
    assert_eq!(status(&c), Status::SUCCESS);
    for op in [0x00u8, 0x01, 0x04, 0x05, 0x80, 0x3F, 0xFF] {
        let c = done(qp.execute(&Command::new(op, 3), &mut []));
        assert_eq!(
            status(&c),
            Status::INVALID_OPCODE.with_dnr(),
            "opcode {op:#x}"
        );
    }

    let mut d = admin(&t, DISCOVERY_NQN, HOST_A);
    for op in [AdminOpcode::Abort as u8, 0x01, 0x80] {
        let c = done(d.execute(&Command::new(op, 3), &mut []));
        assert_eq!(
            status(&c),
            Status::INVALID_OPCODE.with_dnr(),
            "opcode {op:#x}"
        );
    }
    let c = done(d.execute(&Command::new(AdminOpcode::KeepAlive as u8, 3), &mut []));
    assert_eq!(status(&c), Status::SUCCESS);
}

#[test]
fn sqhd_wraps_at_depth() {
    let t = target();
    let mut qp = QueuePair::new(t.clone(), port());
    let c = connect_raw(&mut qp, 0, 3, 0, 0xFFFF, NQN, HOST_A); // depth 4
    assert_eq!(c.sqhd(), 1);
    let heads: Vec<u16> = (0..6)
        .map(|_| done(qp.execute(&Command::new(AdminOpcode::KeepAlive as u8, 1), &mut [])).sqhd())
        .collect();
    assert_eq!(heads, vec![2, 3, 0, 1, 2, 3]);
    let c = done(qp.execute(&Command::new(AdminOpcode::KeepAlive as u8, 9), &mut []));
    assert_eq!((c.cid(), c.sqid()), (9, 0));
}

/// A command the transport fails itself (bad SGL, digest error) still
/// consumed an SQ entry: SQHD moves and the completion reports it.
#[test]
fn transport_failed_commands_report_real_sqhd() {
    let t = target();
    let mut qp = QueuePair::new(t.clone(), port());
    let c = connect_raw(&mut qp, 0, 3, 0, 0xFFFF, NQN, HOST_A); // depth 4
    assert_eq!(c.sqhd(), 1);
    let errors = qp.stats().errors;
    let c = qp.complete_unexecuted(
        &Command::new(AdminOpcode::KeepAlive as u8, 5),
        Status::TRANSIENT_TRANSPORT_ERROR,
    );
    assert_eq!((c.cid(), c.sqid(), c.sqhd()), (5, 0, 2));
    assert_eq!(status(&c), Status::TRANSIENT_TRANSPORT_ERROR);
    assert_eq!(qp.stats().errors, errors + 1);
    let heads: Vec<u16> = (0..3)
        .map(|i| {
            let cmd = Command::new(AdminOpcode::KeepAlive as u8, i);
            if i == 1 {
                qp.complete_unexecuted(&cmd, Status::INVALID_FIELD).sqhd()
            } else {
                done(qp.execute(&cmd, &mut [])).sqhd()
            }
        })
        .collect();
    assert_eq!(
        heads,
        vec![3, 0, 1],
        "executed and transport-failed commands share SQHD"
    );
}

#[test]
fn sq_flow_control_disabled_reports_zero_sqhd() {
    let t = target();
    let mut qp = QueuePair::new(t.clone(), port());
    let cmd = Command::connect(1, 0, 31, 1 << 2, 0);
    let mut data = ConnectData::new(HOSTID, 0xFFFF, NQN, HOST_A)
        .as_bytes()
        .to_vec();
    let c = done(qp.execute(&cmd, &mut data));
    assert_eq!((status(&c), c.sqhd()), (Status::SUCCESS, 0));
    let c = done(qp.execute(&Command::new(AdminOpcode::KeepAlive as u8, 1), &mut []));
    assert_eq!(c.sqhd(), 0);
}

#[test]
fn queue_pair_is_send() {
    fn is_send<T: Send>() {}
    fn is_send_sync<T: Send + Sync>() {}
    is_send::<QueuePair>();
    is_send_sync::<Target>();
}

// ---------------------------------------------------------------- log pages

#[test]
fn log_pages() {
    let t = target();
    let mut qp = admin(&t, NQN, HOST_A);

    let (c, buf) = get_log(&mut qp, 0x01, 64, 0, false);
    assert_eq!(status(&c), Status::SUCCESS);
    assert!(buf.iter().all(|&b| b == 0));

    let (c, buf) = get_log(&mut qp, 0x02, 512, 0, false);
    assert_eq!(status(&c), Status::SUCCESS);
    let temp = u16::from_le_bytes([buf[1], buf[2]]);
    assert!((273..373).contains(&temp));

    let (c, buf) = get_log(&mut qp, 0x03, 512, 0, false);
    assert_eq!(status(&c), Status::SUCCESS);
    let fw = FirmwareSlotLog::ref_from_bytes(&buf[..]).unwrap();
    assert_eq!(fw.afi & 7, 1);
    assert!(fw.frs[0].starts_with(env!("CARGO_PKG_VERSION").as_bytes()));

    let (c, buf) = get_log(&mut qp, 0x04, 4096, 0, false);
    assert_eq!(status(&c), Status::SUCCESS);
    assert!(buf.iter().all(|&b| b == 0));

    let (c, buf) = get_log(&mut qp, 0x05, 4096, 0, false);
    assert_eq!(status(&c), Status::SUCCESS);
    let acs = |op: u8| {
        u32::from_le_bytes(
            buf[op as usize * 4..op as usize * 4 + 4]
                .try_into()
                .unwrap(),
        )
    };
    let iocs = |op: u8| acs_at(&buf, 1024 + op as usize * 4);
    assert_eq!(acs(0x06), 1);
    assert_eq!(acs(0x01), 0, "Create I/O SQ is not supported");
    assert_eq!(iocs(0x02), 1);
    assert_eq!(iocs(0x01), 3, "write: CSUPP | LBCC");

    // Partial reads with offsets; what lies past the page reads zero.
    let (_, whole) = get_log(&mut qp, 0x03, 512, 0, false);
    let (c, part) = get_log(&mut qp, 0x03, 16, 8, false);
    assert_eq!(status(&c), Status::SUCCESS);
    assert_eq!(&part[..], &whole[8..24]);
    let (c, tail) = get_log(&mut qp, 0x03, 64, 480, false);
    assert_eq!(status(&c), Status::SUCCESS);
    assert_eq!(&tail[..32], &whole[480..]);
    assert!(tail[32..].iter().all(|&b| b == 0));
    let (c, _) = get_log(&mut qp, 0x03, 64, 512, false);
    assert_eq!(status(&c), Status::INVALID_FIELD.with_dnr());
    let (c, _) = get_log(&mut qp, 0x03, 64, 1 << 40, false);
    assert_eq!(status(&c), Status::INVALID_FIELD.with_dnr());
    let (c, _) = get_log(&mut qp, 0x03, 64, 2, false);
    assert_eq!(
        status(&c),
        Status::INVALID_FIELD.with_dnr(),
        "offset not dword aligned"
    );

    // Unknown log pages; the discovery log is not on NVM controllers.
    for lid in [0x70u8, 0x0C, 0xC0, 0xFF] {
        let (c, _) = get_log(&mut qp, lid, 64, 0, false);
        let s = status(&c);
        assert_eq!((s.sct, s.sc, s.dnr), (1, 0x09, true), "lid {lid:#x}");
    }

    // Transfer length must match NUMD.
    let mut cmd = Command::new(AdminOpcode::GetLogPage as u8, 1);
    cmd.set_get_log_page(0x02, 512, 0);
    let c = done(qp.execute(&cmd, &mut [0u8; 100]));
    assert_eq!(status(&c), Status::SGL_DATA_LENGTH_INVALID.with_dnr());
}

fn acs_at(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().unwrap())
}

fn discovery_entries(buf: &[u8]) -> (u64, u64, Vec<DiscoveryLogEntry>) {
    let hdr = DiscoveryLogHeader::ref_from_bytes(&buf[..1024]).unwrap();
    let n = hdr.numrec.get();
    let entries = (0..n as usize)
        .map(|i| *DiscoveryLogEntry::ref_from_bytes(&buf[1024 * (i + 1)..1024 * (i + 2)]).unwrap())
        .collect();
    (hdr.genctr.get(), n, entries)
}

#[test]
fn discovery_log_filters_by_host() {
    let t = target();

    let mut d = admin(&t, DISCOVERY_NQN, HOST_A);
    let (c, buf) = get_log(&mut d, 0x70, 4096, 0, false);
    assert_eq!(status(&c), Status::SUCCESS);
    let (genctr, numrec, e) = discovery_entries(&buf);
    assert!(genctr > 0);
    assert_eq!(
        numrec, 3,
        "two NVM subsystems + current discovery subsystem"
    );
    assert_eq!(e[0].subnqn(), NQN);
    assert_eq!(e[0].trtype, 3);
    assert_eq!(e[0].adrfam, 1);
    assert_eq!(e[0].subtype, 2);
    assert_eq!(
        e[0].treq, 0x04,
        "secure channel not specified, SQ flow control disable supported"
    );
    assert_eq!(e[0].cntlid.get(), 0xFFFF);
    assert_eq!(e[0].asqsz.get(), 128);
    assert_eq!(e[0].traddr(), "127.0.0.1");
    assert_eq!(e[0].trsvcid(), "4420");
    assert_eq!(e[0].tsas[0], 0);
    assert_ne!(e[0].portid.get(), 0);
    assert_eq!(e[1].subnqn(), NQN_RESTRICTED);
    assert_eq!(e[1].trsvcid(), "4421");
    assert_eq!(
        e[1].traddr(),
        "127.0.0.1",
        "wildcard listener reported as the address used"
    );
    assert_ne!(e[1].portid.get(), e[0].portid.get());
    assert_eq!(e[2].subtype, 3);
    assert_eq!(e[2].subnqn(), DISCOVERY_NQN);
    assert_eq!(e[2].portid.get(), e[0].portid.get());

    assert_eq!(t.port_id("4421", "0.0.0.0"), e[1].portid.get());
    assert_eq!(
        t.port_id("4421", "10.1.2.3"),
        e[1].portid.get(),
        "local address on a wildcard listener"
    );
    assert_eq!(t.port_id("9999", "127.0.0.1"), 0);

    let mut d = admin(&t, DISCOVERY_NQN, HOST_B);
    let (_, buf) = get_log(&mut d, 0x70, 4096, 0, false);
    let (_, numrec, e) = discovery_entries(&buf);
    assert_eq!(numrec, 2);
    assert_eq!(e[0].subnqn(), NQN);
    assert_eq!(e[1].subtype, 3);

    // Header only, then the records at an offset (how nvme-cli reads it).
    let (_, hdr) = get_log(&mut d, 0x70, 1024, 0, false);
    assert_eq!(&hdr[..], &buf[..1024]);
    let (c, rec) = get_log(&mut d, 0x70, 2048, 1024, false);
    assert_eq!(status(&c), Status::SUCCESS);
    assert_eq!(&rec[..], &buf[1024..3072]);
    let (c, _) = get_log(&mut d, 0x70, 1024, 3072, false);
    assert_eq!(status(&c), Status::INVALID_FIELD.with_dnr());

    // The discovery controller offers no NVM log pages.
    let (c, _) = get_log(&mut d, 0x02, 512, 0, false);
    assert_eq!((status(&c).sct, status(&c).sc), (1, 0x09));
}

// ---------------------------------------------------------------- async events

#[test]
fn aer_limit_and_namespace_change() {
    let t = target();
    let mut qp = admin(&t, NQN, HOST_A);
    for cid in 100..104 {
        assert_eq!(aer(&mut qp, cid), Exec::Pending);
    }
    let s = status(&done(aer(&mut qp, 104)));
    assert_eq!((s.sct, s.sc, s.dnr), (1, 0x05, true));

    let now = Instant::now();
    let (st, got) = poll_all(&mut qp, now);
    assert_eq!(st, QueueState::Open);
    assert!(got.is_empty(), "no event yet");

    t.add_namespace(NQN, &ns_cfg(NQN, 3, "Malloc1")).unwrap();
    let (_, got) = poll_all(&mut qp, now);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].cid(), 100, "oldest AER first");
    assert_eq!(got[0].status(), Status::SUCCESS);
    assert_eq!(
        got[0].dw0(),
        0x0004_0002,
        "notice, NS attribute changed, log 04h"
    );

    // Masked until the log page is read.
    t.remove_namespace(NQN, 3).unwrap();
    assert!(poll_all(&mut qp, now).1.is_empty());

    let (_, buf) = get_log(&mut qp, 0x04, 4096, 0, false);
    assert_eq!(&buf[..12], &[3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let (_, buf) = get_log(&mut qp, 0x04, 4096, 0, false);
    assert!(buf.iter().all(|&b| b == 0), "cleared by reading");

    t.add_namespace(NQN, &ns_cfg(NQN, 4, "Malloc1")).unwrap();
    let (_, got) = poll_all(&mut qp, now);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].cid(), 101);

    // Identify sees the new namespace.
    let (_, list) = identify(&mut qp, 2, 0);
    assert_eq!(&list[..12], &[1, 0, 0, 0, 2, 0, 0, 0, 4, 0, 0, 0]);

    // With the event disabled nothing is reported.
    get_log(&mut qp, 0x04, 4096, 0, false);
    set_feature(&mut qp, 0x0B, 0);
    t.remove_namespace(NQN, 4).unwrap();
    assert!(poll_all(&mut qp, now).1.is_empty());

    // Errors of the control API.
    assert!(
        t.add_namespace(NQN, &ns_cfg(NQN, 1, "Malloc1")).is_err(),
        "NSID in use"
    );
    assert!(
        t.add_namespace(NQN, &ns_cfg(NQN, 33, "Malloc1")).is_err(),
        "NSID > max"
    );
    assert!(
        t.add_namespace(NQN, &ns_cfg(NQN, 5, "nope")).is_err(),
        "unknown bdev"
    );
    assert!(t
        .add_namespace("nqn.x", &ns_cfg(NQN, 5, "Malloc1"))
        .is_err());
    assert!(t.remove_namespace(NQN, 9).is_err());
}

#[test]
fn discovery_change_event() {
    let t = target();
    let mut d = admin(&t, DISCOVERY_NQN, HOST_A);
    let (_, buf) = get_log(&mut d, 0x70, 4096, 0, false);
    let (gen0, _, _) = discovery_entries(&buf);
    assert_eq!(aer(&mut d, 7), Exec::Pending);
    t.notify_discovery_change();
    let (_, got) = poll_all(&mut d, Instant::now());
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].dw0(), 0x0070_F002);
    let (_, buf) = get_log(&mut d, 0x70, 4096, 0, false);
    let (gen1, _, _) = discovery_entries(&buf);
    assert!(gen1 > gen0);
}

// ---------------------------------------------------------------- keep-alive

#[test]
fn keep_alive_expiry() {
    let t = target();
    let before = Instant::now();
    let mut qp = admin_kato(&t, NQN, HOST_A, 5000);
    let mut io = io_queue(&t, cntlid(&qp), 1, NQN, HOST_A);
    let after = Instant::now();

    assert_eq!(poll_all(&mut qp, after).0, QueueState::Open);
    assert_eq!(
        poll_all(&mut qp, before + Duration::from_millis(4900)).0,
        QueueState::Open
    );
    // Keep Alive restarts the clock.
    let ka = Instant::now();
    done(qp.execute(&Command::new(AdminOpcode::KeepAlive as u8, 1), &mut []));
    assert_eq!(
        poll_all(&mut qp, after + Duration::from_millis(5000)).0,
        QueueState::Open
    );

    let later = Instant::now() + Duration::from_millis(5000);
    assert!(later >= ka + Duration::from_millis(5000));
    match poll_all(&mut qp, later).0 {
        QueueState::Close { reason } => assert_eq!(reason, "keep-alive timeout"),
        s => panic!("{s:?}"),
    }
    match poll_all(&mut io, Instant::now()).0 {
        QueueState::Close { reason } => assert_eq!(reason, "keep-alive timeout"),
        s => panic!("{s:?}"),
    }
    // The controller is gone for new I/O queues too.
    let id = cntlid(&qp);
    let mut q2 = QueuePair::new(t.clone(), port());
    let c = connect_raw(&mut q2, 2, 127, 0, id, NQN, HOST_A);
    assert_eq!(c.dw0(), (1 << 16) | 16);
    drop(qp);
    assert_eq!(t.active_controllers(), 0);
}

#[test]
fn keep_alive_disabled_and_rounded() {
    let t = target();
    let mut qp = admin_kato(&t, NQN, HOST_A, 0);
    let far = Instant::now() + Duration::from_secs(3600);
    assert_eq!(poll_all(&mut qp, far).0, QueueState::Open);

    // 1500 ms rounds up to 2 s.
    let mut qp = admin_kato(&t, NQN, HOST_A, 1500);
    let now = Instant::now();
    assert_eq!(
        poll_all(&mut qp, now + Duration::from_millis(1600)).0,
        QueueState::Open
    );
    assert!(matches!(
        poll_all(&mut qp, now + Duration::from_millis(2100)).0,
        QueueState::Close { .. }
    ));
}

// ---------------------------------------------------------------- I/O

#[test]
fn malloc_write_read_round_trip() {
    let t = target();
    let a = admin(&t, NQN, HOST_A);
    let mut q = io_queue(&t, cntlid(&a), 1, NQN, HOST_A);

    let mut data: Vec<u8> = (0..8 * 512).map(|i| (i * 7 % 251) as u8).collect();
    let c = rw(&mut q, IoOpcode::Write, 1, 100, 8, &mut data);
    assert_eq!(status(&c), Status::SUCCESS);
    assert_eq!(c.sqid(), 1);

    let mut back = vec![0u8; 8 * 512];
    let c = rw(&mut q, IoOpcode::Read, 1, 100, 8, &mut back);
    assert_eq!(status(&c), Status::SUCCESS);
    assert_eq!(back, data);

    // Overlapping partial read.
    let mut part = vec![0u8; 2 * 512];
    rw(&mut q, IoOpcode::Read, 1, 99, 2, &mut part);
    assert!(part[..512].iter().all(|&b| b == 0));
    assert_eq!(&part[512..], &data[..512]);

    // Last block of the namespace.
    let mut one = vec![0x5Au8; 512];
    assert_eq!(
        status(&rw(
            &mut q,
            IoOpcode::Write,
            1,
            MALLOC_BLOCKS - 1,
            1,
            &mut one
        )),
        Status::SUCCESS
    );

    let s = q.stats();
    assert_eq!((s.reads, s.writes), (2, 2));
    assert_eq!(s.bytes_written, 9 * 512);
    assert_eq!(s.bytes_read, 10 * 512);
    assert_eq!(s.errors, 0);

    // Another I/O queue sees the same data.
    let mut q2 = io_queue(&t, cntlid(&a), 2, NQN, HOST_A);
    let mut back2 = vec![0u8; 8 * 512];
    rw(&mut q2, IoOpcode::Read, 1, 100, 8, &mut back2);
    assert_eq!(back2, data);
}

#[test]
fn null_backend_reads_zeroes() {
    let t = target();
    let a = admin(&t, NQN, HOST_A);
    let mut q = io_queue(&t, cntlid(&a), 1, NQN, HOST_A);
    let mut data = vec![0xFFu8; 4096 * 2];
    assert_eq!(
        status(&rw(&mut q, IoOpcode::Write, 2, 5, 2, &mut data)),
        Status::SUCCESS
    );
    let mut back = vec![0xEEu8; 4096 * 2];
    assert_eq!(
        status(&rw(&mut q, IoOpcode::Read, 2, 5, 2, &mut back)),
        Status::SUCCESS
    );
    assert!(back.iter().all(|&b| b == 0));
    // The core answers "zero data" and leaves the buffer alone (the
    // transport sends the shared zero buffer).
    let mut cmd = Command::new(IoOpcode::Read as u8, 21);
    cmd.set_nsid(2).set_lba_range(5, 2);
    let mut untouched = vec![0xEEu8; 4096 * 2];
    let e = q.execute(&cmd, &mut untouched);
    assert!(
        matches!(e, Exec::CompleteZeroData(c) if c.status().is_success()),
        "{e:?}"
    );
    assert!(untouched.iter().all(|&b| b == 0xEE));
}

#[test]
fn io_errors() {
    let t = target();
    let a = admin(&t, NQN, HOST_A);
    let mut q = io_queue(&t, cntlid(&a), 1, NQN, HOST_A);
    let mut buf = vec![0u8; 512];

    for nsid in [0u32, 3, 33, 0xFFFF_FFFF] {
        let c = rw(&mut q, IoOpcode::Read, nsid, 0, 1, &mut buf);
        assert_eq!(
            status(&c),
            Status::INVALID_NAMESPACE.with_dnr(),
            "nsid {nsid}"
        );
    }
    let c = rw(&mut q, IoOpcode::Read, 1, MALLOC_BLOCKS, 1, &mut buf);
    assert_eq!(status(&c), Status::LBA_OUT_OF_RANGE.with_dnr());
    let mut two = vec![0u8; 1024];
    let c = rw(&mut q, IoOpcode::Write, 1, MALLOC_BLOCKS - 1, 2, &mut two);
    assert_eq!(status(&c), Status::LBA_OUT_OF_RANGE.with_dnr());
    let c = rw(&mut q, IoOpcode::Read, 1, u64::MAX, 1, &mut buf);
    assert_eq!(status(&c), Status::LBA_OUT_OF_RANGE.with_dnr());

    // Transfer length must be NLB × block size.
    let c = rw(&mut q, IoOpcode::Read, 1, 0, 2, &mut buf);
    assert_eq!(status(&c), Status::SGL_DATA_LENGTH_INVALID.with_dnr());
    let c = rw(&mut q, IoOpcode::Write, 1, 0, 1, &mut two);
    assert_eq!(status(&c), Status::SGL_DATA_LENGTH_INVALID.with_dnr());
    // Beyond MDTS (128 KiB).
    let mut big = vec![0u8; 256 * 1024];
    let c = rw(&mut q, IoOpcode::Read, 1, 0, 512, &mut big);
    assert_eq!(status(&c), Status::INVALID_FIELD.with_dnr());

    // Unknown and unsupported opcodes.
    // (04h Write Uncorrectable is not offered.)
    for op in [0x03u8, 0x04, 0x1A, 0x80, 0xFF] {
        let mut cmd = Command::new(op, 1);
        cmd.set_nsid(1);
        let c = done(q.execute(&cmd, &mut []));
        assert_eq!(
            status(&c),
            Status::INVALID_OPCODE.with_dnr(),
            "opcode {op:#x}"
        );
    }
    // Fabrics commands other than Connect.
    let c = done(q.execute(&Command::property_get(1, CAP, true), &mut []));
    assert_eq!(status(&c), Status::INVALID_OPCODE.with_dnr());

    assert!(q.stats().errors >= 10);
}

#[test]
fn flush_write_zeroes_and_deallocate() {
    let t = target();
    let a = admin(&t, NQN, HOST_A);
    let mut q = io_queue(&t, cntlid(&a), 1, NQN, HOST_A);

    let c = done(q.execute(Command::new(IoOpcode::Flush as u8, 1).set_nsid(1), &mut []));
    assert_eq!(status(&c), Status::SUCCESS);
    let c = done(q.execute(Command::new(IoOpcode::Flush as u8, 1).set_nsid(9), &mut []));
    assert_eq!(status(&c), Status::INVALID_NAMESPACE.with_dnr());

    let mut ones = vec![0xFFu8; 64 * 512];
    rw(&mut q, IoOpcode::Write, 1, 0, 64, &mut ones);

    // Write Zeroes blocks 10..20.
    let mut cmd = Command::new(IoOpcode::WriteZeroes as u8, 2);
    cmd.set_nsid(1).set_lba_range(10, 10);
    assert_eq!(status(&done(q.execute(&cmd, &mut []))), Status::SUCCESS);
    let mut back = vec![0u8; 64 * 512];
    rw(&mut q, IoOpcode::Read, 1, 0, 64, &mut back);
    assert!(back[..10 * 512].iter().all(|&b| b == 0xFF));
    assert!(back[10 * 512..20 * 512].iter().all(|&b| b == 0));
    assert!(back[20 * 512..].iter().all(|&b| b == 0xFF));
    cmd.set_lba_range(MALLOC_BLOCKS - 5, 10);
    assert_eq!(
        status(&done(q.execute(&cmd, &mut []))),
        Status::LBA_OUT_OF_RANGE.with_dnr()
    );

    // Deallocate two ranges: 30..32 and 40..50.
    let mut ranges = vec![0u8; 32];
    ranges[4..8].copy_from_slice(&2u32.to_le_bytes());
    ranges[8..16].copy_from_slice(&30u64.to_le_bytes());
    ranges[20..24].copy_from_slice(&10u32.to_le_bytes());
    ranges[24..32].copy_from_slice(&40u64.to_le_bytes());
    let mut dsm = Command::new(IoOpcode::DatasetManagement as u8, 3);
    dsm.set_nsid(1).set_cdw10(1).set_cdw11(1 << 2);
    assert_eq!(status(&done(q.execute(&dsm, &mut ranges))), Status::SUCCESS);
    rw(&mut q, IoOpcode::Read, 1, 0, 64, &mut back);
    assert!(back[29 * 512..30 * 512].iter().all(|&b| b == 0xFF));
    assert!(back[30 * 512..32 * 512].iter().all(|&b| b == 0));
    assert!(back[32 * 512..40 * 512].iter().all(|&b| b == 0xFF));
    assert!(back[40 * 512..50 * 512].iter().all(|&b| b == 0));
    assert!(back[50 * 512..].iter().all(|&b| b == 0xFF));

    // Without AD nothing changes.
    rw(&mut q, IoOpcode::Write, 1, 0, 64, &mut ones);
    dsm.set_cdw11(1);
    assert_eq!(status(&done(q.execute(&dsm, &mut ranges))), Status::SUCCESS);
    rw(&mut q, IoOpcode::Read, 1, 0, 64, &mut back);
    assert!(back.iter().all(|&b| b == 0xFF));

    // A range past the end: nothing is deallocated.
    dsm.set_cdw11(1 << 2);
    ranges[24..32].copy_from_slice(&(MALLOC_BLOCKS - 1).to_le_bytes());
    assert_eq!(
        status(&done(q.execute(&dsm, &mut ranges))),
        Status::LBA_OUT_OF_RANGE.with_dnr()
    );
    rw(&mut q, IoOpcode::Read, 1, 0, 64, &mut back);
    assert!(back.iter().all(|&b| b == 0xFF));

    // Fewer range bytes than NR says.
    assert_eq!(
        status(&done(q.execute(&dsm, &mut ranges[..16]))),
        Status::SGL_DATA_LENGTH_INVALID.with_dnr()
    );
}

#[test]
fn removed_namespace_leaves_io_path() {
    let t = target();
    let a = admin(&t, NQN, HOST_A);
    let mut q = io_queue(&t, cntlid(&a), 1, NQN, HOST_A);
    let mut buf = vec![0u8; 512];
    assert_eq!(
        status(&rw(&mut q, IoOpcode::Read, 1, 0, 1, &mut buf)),
        Status::SUCCESS
    );
    t.remove_namespace(NQN, 1).unwrap();
    assert_eq!(
        status(&rw(&mut q, IoOpcode::Read, 1, 0, 1, &mut buf)),
        Status::INVALID_NAMESPACE.with_dnr()
    );
    t.add_namespace(NQN, &ns_cfg(NQN, 1, "Malloc0")).unwrap();
    assert_eq!(
        status(&rw(&mut q, IoOpcode::Read, 1, 0, 1, &mut buf)),
        Status::SUCCESS
    );
}

// ---------------------------------------------------------------- robustness

/// Small deterministic PRNG (xorshift) for the no-panic sweep.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn random_commands_never_panic() {
    let t = target();
    let mut a = admin(&t, NQN, HOST_A);
    let mut d = admin(&t, DISCOVERY_NQN, HOST_A);
    let mut q = io_queue(&t, cntlid(&a), 1, NQN, HOST_A);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let lens = [0usize, 1, 4, 16, 64, 512, 1024, 4096, 8192];
    for i in 0..20_000 {
        let mut raw = [0u8; 64];
        for chunk in raw.chunks_mut(8) {
            chunk.copy_from_slice(&rng.next().to_le_bytes());
        }
        let mut cmd = Command::read_from_bytes(&raw[..]).unwrap();
        // Bias towards real opcodes and small NSIDs so the checks past the
        // first ones run too.
        if i % 2 == 0 {
            let ops: &[u8] = if i % 4 == 0 {
                &[0x00, 0x01, 0x02, 0x08, 0x09, 0x7F]
            } else {
                &[0x02, 0x06, 0x08, 0x09, 0x0A, 0x0C, 0x18, 0x7F]
            };
            cmd.set_opcode(ops[(rng.next() % ops.len() as u64) as usize]);
            cmd.set_nsid((rng.next() % 4) as u32);
            if rng.next().is_multiple_of(2) {
                let v = cmd.cdw10() & 0xFF;
                cmd.set_cdw10(v);
            }
        }
        if cmd.opcode() == 0x7F && cmd.fctype() == 0x00 {
            continue; // Property Set of CC could disable, fine, but keep the sweep on a live controller
        }
        let mut data = vec![0u8; lens[(rng.next() % lens.len() as u64) as usize]];
        for b in data.iter_mut() {
            *b = rng.next() as u8;
        }
        let qp = match i % 3 {
            0 => &mut a,
            1 => &mut d,
            _ => &mut q,
        };
        let _ = qp.execute(&cmd, &mut data);
        let _ = qp.poll(Instant::now(), &mut |_| {});
    }
}

#[test]
fn embedded_default_config_builds() {
    let cfg = TargetConfig::embedded_default();
    let t = Target::from_config(&cfg).unwrap();
    assert!(!t.listen_addresses().is_empty());
    let sub = &t.subsystems()[0];
    let ns = sub.namespaces();
    assert_eq!(ns.active_nsids(), &[1]);
    assert_eq!(ns.get(1).unwrap().num_blocks() * 512, 1 << 30);
}

#[test]
fn config_errors() {
    let mut cfg = config();
    cfg.subsystems[0].namespaces.push(ns_cfg(NQN, 9, "missing"));
    assert!(Target::from_config(&cfg).is_err());

    let mut cfg = config();
    cfg.bdevs.push(bdev("Malloc0", BdevKind::Null, 512, 8));
    assert!(Target::from_config(&cfg).is_err());

    let mut cfg = config();
    cfg.bdevs[0].block_size = 1000;
    assert!(Target::from_config(&cfg).is_err());

    let mut cfg = config();
    let dup = cfg.subsystems[0].clone();
    cfg.subsystems.push(dup);
    assert!(Target::from_config(&cfg).is_err());

    let mut cfg = config();
    cfg.subsystems[0].namespaces.push(ns_cfg(NQN, 1, "Malloc1"));
    assert!(Target::from_config(&cfg).is_err(), "NSID used twice");
}

// ---------------------------------------------------------------- stable buffers

/// A file (io_uring) namespace added at run time to a subsystem whose I/O
/// queue cached a malloc-only table: the transport's question "must data
/// buffers stay put?" has to see the new namespace before the first command
/// to it runs, or in-capsule data would go to the kernel from the moving
/// receive buffer.
#[test]
fn runtime_file_namespace_needs_stable_buffers_before_first_io() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("queue_pair");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("stable_buffers.img");
    let _ = std::fs::remove_file(&path);
    std::fs::File::create(&path)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let json = format!(
        r#"{{"subsystems":[{{"subsystem":"bdev","config":[{{"method":"bdev_uring_create","params":{{"name":"File0","filename":"{}"}}}}]}}]}}"#,
        path.display()
    );
    let file_cfg = TargetConfig::from_json_str(&json).unwrap();

    let t = target();
    let a = admin(&t, NQN, HOST_A);
    let mut q = io_queue(&t, cntlid(&a), 1, NQN, HOST_A);
    // Malloc + null only: no stable buffers, and the snapshot is cached.
    assert!(!q.needs_stable_buffers());
    let mut buf = vec![0u8; 512];
    assert_eq!(
        status(&rw(&mut q, IoOpcode::Read, 1, 0, 1, &mut buf)),
        Status::SUCCESS
    );
    assert!(!q.needs_stable_buffers());

    t.add_backend(&file_cfg.bdevs[0]).unwrap();
    t.add_namespace(NQN, &ns_cfg(NQN, 3, "File0")).unwrap();
    // No command has run since: the answer must already cover NSID 3.
    assert!(q.needs_stable_buffers());

    // Removing it again goes back (after the next check).
    t.remove_namespace(NQN, 3).unwrap();
    assert!(!q.needs_stable_buffers());
    let _ = std::fs::remove_file(&path);
}

// ---------------------------------------------------------------- ANA

const NQN_ANA: &str = "nqn.2024-01.io.nvmfd:ana";

/// `config()` plus a subsystem with ANA reporting: groups 1..=4, namespace 1
/// in group 1 and namespace 2 in group 2, listeners on ports 4420 and 4422,
/// controller IDs 0x100..=0x101 only.
fn ana_config() -> TargetConfig {
    let mut c = config();
    c.bdevs.push(bdev("AnaM0", BdevKind::Malloc, 512, 64));
    c.bdevs.push(bdev("AnaN0", BdevKind::Null, 512, 64));
    let mut s = SubsystemConfig::new(NQN_ANA);
    s.allow_any_host = true;
    s.ana_reporting = true;
    s.max_namespaces = 4;
    s.min_cntlid = 0x100;
    s.max_cntlid = 0x101;
    s.namespaces = vec![ns_cfg(NQN_ANA, 1, "AnaM0"), ns_cfg(NQN_ANA, 2, "AnaN0")];
    s.listeners = vec![listener("127.0.0.1", "4420"), listener("127.0.0.1", "4422")];
    c.subsystems.push(s);
    c
}

fn port_4422() -> Arc<PortInfo> {
    Arc::new(PortInfo {
        trsvcid: "4422".to_string(),
        ..(*port()).clone()
    })
}

/// Admin queue (AEC = everything the controller supports) and I/O queue 1
/// of a new controller through `p`.
fn ana_controller(t: &Arc<Target>, p: Arc<PortInfo>) -> (QueuePair, QueuePair) {
    let mut a = QueuePair::new(t.clone(), p.clone());
    let c = connect_raw(&mut a, 0, 31, 5000, 0xFFFF, NQN_ANA, HOST_A);
    assert_eq!(status(&c), Status::SUCCESS);
    let c = done(a.execute(&Command::property_set(2, CC, false, 0x0046_0001), &mut []));
    assert_eq!(status(&c), Status::SUCCESS);
    let id = cntlid(&a);
    let mut io = QueuePair::new(t.clone(), p);
    let c = connect_raw(&mut io, 1, 127, 0, id, NQN_ANA, HOST_A);
    assert_eq!(status(&c), Status::SUCCESS);
    (a, io)
}

/// (group, state, NSIDs) of an ANA log page.
fn ana_groups(buf: &[u8]) -> Vec<(u32, u8, Vec<u32>)> {
    let u32_at = |o: usize| u32::from_le_bytes(buf[o..o + 4].try_into().unwrap());
    let ngrps = u16::from_le_bytes([buf[8], buf[9]]);
    let mut at = 16;
    let mut out = Vec::new();
    for _ in 0..ngrps {
        let (grp, n, state) = (u32_at(at), u32_at(at + 4) as usize, buf[at + 16]);
        let nsids = (0..n).map(|i| u32_at(at + 32 + 4 * i)).collect();
        out.push((grp, state, nsids));
        at += 32 + 4 * n;
    }
    out
}

fn io_status_of(io: &mut QueuePair, nsid: u32) -> Status {
    let mut buf = vec![0u8; 512];
    status(&rw(io, IoOpcode::Read, nsid, 0, 1, &mut buf))
}

#[test]
fn ana_identify_fields_and_log_page() {
    let t = Target::from_config(&ana_config()).unwrap();
    let (mut a, _io) = ana_controller(&t, port());
    assert!((0x100..=0x101).contains(&cntlid(&a)), "cntlid in the range");
    let (_, buf) = identify(&mut a, 1, 0);
    let id = IdentifyController::read_from_bytes(&buf).unwrap();
    assert_eq!(id.cmic & (1 << 3), 1 << 3, "CMIC: ANA reporting");
    assert_eq!((id.anacap, id.anatt), (0x1F, 10));
    assert_eq!((id.anagrpmax.get(), id.nanagrpid.get()), (4, 4));
    assert_ne!(id.oaes.get() & (1 << 11), 0, "OAES: ANA change notices");
    let (_, buf) = identify(&mut a, 0, 2);
    let ns = IdentifyNamespace::read_from_bytes(&buf).unwrap();
    assert_eq!(ns.anagrpid.get(), 2);

    let (c, buf) = get_log(&mut a, 0x0C, 4096, 0, false);
    assert_eq!(status(&c), Status::SUCCESS);
    assert_eq!(ana_groups(&buf), vec![(1, 1, vec![1]), (2, 1, vec![2])]);
    // Return Groups Only (LSP bit 0): no NSID lists
    let mut cmd = Command::new(AdminOpcode::GetLogPage as u8, 11);
    cmd.set_nsid(0xFFFF_FFFF).set_get_log_page(0x0C, 4096, 0);
    let v = cmd.cdw10() | (1 << 8);
    cmd.set_cdw10(v);
    let mut rgo = vec![0xAAu8; 4096];
    assert_eq!(status(&done(a.execute(&cmd, &mut rgo))), Status::SUCCESS);
    assert_eq!(ana_groups(&rgo), vec![(1, 1, vec![]), (2, 1, vec![])]);
    assert!(rgo[16 + 64..].iter().all(|&b| b == 0));

    // Without ANA reporting: no ANA bit, no ANA log page.
    let mut plain = admin(&t, NQN, HOST_A);
    let (_, buf) = identify(&mut plain, 1, 0);
    let id = IdentifyController::read_from_bytes(&buf).unwrap();
    assert_eq!((id.cmic & (1 << 3), id.anagrpmax.get()), (0, 0));
    let (c, _) = get_log(&mut plain, 0x0C, 4096, 0, false);
    assert_eq!(
        (status(&c).sct, status(&c).sc),
        (1, 0x09),
        "Invalid Log Page"
    );
}

#[test]
fn ana_state_change_reaches_the_path_by_event_and_status() {
    let mut cfg = ana_config();
    let t = Target::from_config(&cfg).unwrap();
    let (mut a, mut io) = ana_controller(&t, port());
    let (mut b, mut io_b) = ana_controller(&t, port_4422());
    assert_eq!(aer(&mut a, 100), Exec::Pending);
    assert_eq!(aer(&mut b, 100), Exec::Pending);
    assert_eq!(io_status_of(&mut io, 1), Status::SUCCESS);

    let l4420 = listener("127.0.0.1", "4420");
    fn sub(c: &mut TargetConfig) -> &mut SubsystemConfig {
        c.subsystems.iter_mut().find(|s| s.nqn == NQN_ANA).unwrap()
    }
    sub(&mut cfg).set_ana_state(&l4420, Some(1), nvmf_config::AnaState::Inaccessible);
    assert!(t.sync_ana(sub(&mut cfg)).unwrap());
    assert!(!t.sync_ana(sub(&mut cfg)).unwrap(), "nothing new");
    let now = Instant::now();
    let (_, got) = poll_all(&mut a, now);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].dw0(), 0x000C_0302, "notice, ANA change, log 0Ch");
    assert!(
        poll_all(&mut b, now).1.is_empty(),
        "the other path did not change"
    );

    // I/O to group 1 through 4420: ANA Inaccessible, path related, no DNR
    let s = io_status_of(&mut io, 1);
    assert_eq!((s.sct, s.sc, s.dnr), (3, 0x02, false));
    assert_eq!(io_status_of(&mut io, 2), Status::SUCCESS, "group 2 is fine");
    assert_eq!(io_status_of(&mut io_b, 1), Status::SUCCESS, "4422 is fine");
    let (_, buf) = get_log(&mut a, 0x0C, 4096, 0, false);
    assert_eq!(ana_groups(&buf), vec![(1, 3, vec![1]), (2, 1, vec![2])]);

    // change and persistent loss
    assert_eq!(aer(&mut a, 101), Exec::Pending);
    sub(&mut cfg).set_ana_state(&l4420, Some(1), nvmf_config::AnaState::Change);
    t.sync_ana(sub(&mut cfg)).unwrap();
    let s = io_status_of(&mut io, 1);
    assert_eq!((s.sct, s.sc, s.dnr), (3, 0x03, false), "ANA Transition");
    assert_eq!(
        poll_all(&mut a, now).1.len(),
        1,
        "event re-armed by the log read"
    );
    // masked until the host reads the log again
    assert_eq!(aer(&mut a, 102), Exec::Pending);
    sub(&mut cfg).set_ana_state(&l4420, Some(1), nvmf_config::AnaState::PersistentLoss);
    t.sync_ana(sub(&mut cfg)).unwrap();
    assert!(
        poll_all(&mut a, now).1.is_empty(),
        "masked until 0Ch is read"
    );
    let s = io_status_of(&mut io, 1);
    assert_eq!(
        (s.sct, s.sc, s.dnr),
        (3, 0x01, false),
        "ANA Persistent Loss"
    );
    get_log(&mut a, 0x0C, 4096, 0, false);

    // non-optimized serves I/O; moving a namespace notifies every path
    sub(&mut cfg).set_ana_state(&l4420, None, nvmf_config::AnaState::NonOptimized);
    t.sync_ana(sub(&mut cfg)).unwrap();
    assert_eq!(io_status_of(&mut io, 1), Status::SUCCESS);
    assert_eq!(poll_all(&mut a, now).1.len(), 1);
    get_log(&mut a, 0x0C, 4096, 0, false);
    sub(&mut cfg).namespaces[1].anagrpid = 1;
    t.sync_ana(sub(&mut cfg)).unwrap();
    assert_eq!(poll_all(&mut b, now).1.len(), 1, "4422 sees the move");
    let (_, buf) = get_log(&mut b, 0x0C, 4096, 0, false);
    assert_eq!(ana_groups(&buf), vec![(1, 1, vec![1, 2])]);
    let (_, buf) = identify(&mut b, 0, 2);
    assert_eq!(
        IdentifyNamespace::read_from_bytes(&buf)
            .unwrap()
            .anagrpid
            .get(),
        1
    );
}

#[test]
fn cntlid_range_bounds_controllers() {
    let t = Target::from_config(&ana_config()).unwrap();
    let (a, _) = ana_controller(&t, port());
    let (b, _) = ana_controller(&t, port());
    let mut ids = [cntlid(&a), cntlid(&b)];
    ids.sort();
    assert_eq!(ids, [0x100, 0x101]);
    let mut c = QueuePair::new(t.clone(), port());
    let s = status(&connect_raw(&mut c, 0, 31, 5000, 0xFFFF, NQN_ANA, HOST_A));
    assert_eq!(
        (s.sct, s.sc),
        (1, 0x81),
        "Controller Busy: the range is used up"
    );
}
