//! Per-host namespace visibility (`no_auto_visible`, docs/VISIBILITY.md)
//! driven the way a transport drives the core: what each host sees through
//! Identify, the ANA log and I/O, and who hears of a change.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use nvmf_config::{
    derive_namespace_ids, AddressFamily, BdevConfig, BdevKind, ListenerConfig, NamespaceConfig,
    SubsystemConfig, TargetConfig, TransportConfig, TransportType,
};
use nvmf_core::{Exec, NsVisibility, PortInfo, QueuePair, Target};
use nvmf_wire::command::Command;
use nvmf_wire::completion::Completion;
use nvmf_wire::fabrics::{ConnectData, CC};
use nvmf_wire::opcode::{AdminOpcode, IoOpcode};
use nvmf_wire::status::Status;
use nvmf_wire::zerocopy::IntoBytes;

const NQN: &str = "nqn.2024-01.io.nvmfd:vis";
const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000a";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b";
const HOST_C: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000c";
/// Namespace Attribute Changed notice for log page 04h (AER dword 0).
const NS_ATTR_NOTICE: u32 = 0x0004_0002;

fn listener() -> ListenerConfig {
    ListenerConfig {
        trtype: TransportType::Tcp,
        adrfam: AddressFamily::Ipv4,
        traddr: "127.0.0.1".to_string(),
        trsvcid: "4420".to_string(),
    }
}

fn ns_cfg(nsid: u32, bdev: &str) -> NamespaceConfig {
    let ids = derive_namespace_ids(NQN, nsid, bdev, None);
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

fn bdev(name: &str) -> BdevConfig {
    BdevConfig {
        name: name.to_string(),
        kind: BdevKind::Malloc,
        block_size: 512,
        num_blocks: 64,
        uuid: None,
        file: None,
        rbd: None,
    }
}

/// Namespace 1 seen by host A only, 2 by host B only, 3 by everyone; ANA
/// reporting on (so the ANA log's namespace lists are checked too).
fn config() -> TargetConfig {
    let mut s = SubsystemConfig::new(NQN);
    s.allow_any_host = true;
    s.ana_reporting = true;
    s.max_namespaces = 8;
    s.namespaces = vec![ns_cfg(1, "M1"), ns_cfg(2, "M2"), ns_cfg(3, "M3")];
    s.listeners = vec![listener()];
    s.ns_visibility =
        BTreeMap::from([(1, vec![HOST_A.to_string()]), (2, vec![HOST_B.to_string()])]);
    TargetConfig {
        bdevs: vec![bdev("M1"), bdev("M2"), bdev("M3"), bdev("M4")],
        transports: vec![TransportConfig::tcp_default()],
        subsystems: vec![s],
        ..Default::default()
    }
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

fn done(e: Exec) -> Completion {
    match e {
        Exec::Complete(c) => c,
        other => panic!("expected a completion, got {other:?}"),
    }
}

fn connect(t: &Arc<Target>, qid: u16, cntlid: u16, host: &str) -> QueuePair {
    let mut qp = QueuePair::new(t.clone(), port());
    let cmd = Command::connect(1, qid, 31, 0, 5000);
    // Host ID: the NQN's last character (A, B, C), as reservations tell hosts apart by it.
    let id = [*host.as_bytes().last().unwrap(); 16];
    let mut data = ConnectData::new(id, cntlid, NQN, host).as_bytes().to_vec();
    let c = done(qp.execute(&cmd, &mut data));
    assert_eq!(c.status(), Status::SUCCESS, "connect qid {qid} as {host}");
    qp
}

/// (admin queue with CC.EN set and one AER outstanding, I/O queue 1).
fn controller(t: &Arc<Target>, host: &str) -> (QueuePair, QueuePair) {
    let mut a = connect(t, 0, 0xFFFF, host);
    let c = done(a.execute(&Command::property_set(2, CC, false, 0x0046_0001), &mut []));
    assert_eq!(c.status(), Status::SUCCESS);
    let cmd = Command::new(AdminOpcode::AsyncEventRequest as u8, 100);
    assert_eq!(a.execute(&cmd, &mut []), Exec::Pending);
    let id = a.controller().unwrap().cntlid();
    let io = connect(t, 1, id, host);
    (a, io)
}

fn identify(qp: &mut QueuePair, cns: u8, nsid: u32) -> (Status, Vec<u8>) {
    let mut cmd = Command::new(AdminOpcode::Identify as u8, 10);
    cmd.set_nsid(nsid).set_cdw10(cns as u32);
    let mut buf = vec![0xAAu8; 4096];
    let c = done(qp.execute(&cmd, &mut buf));
    (c.status(), buf)
}

fn active_list(qp: &mut QueuePair) -> Vec<u32> {
    let (st, buf) = identify(qp, 2, 0);
    assert_eq!(st, Status::SUCCESS);
    buf.chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .take_while(|&n| n != 0)
        .collect()
}

fn get_log(qp: &mut QueuePair, lid: u8) -> Vec<u8> {
    let mut cmd = Command::new(AdminOpcode::GetLogPage as u8, 11);
    cmd.set_nsid(0xFFFF_FFFF).set_get_log_page(lid, 4096, 0);
    let mut buf = vec![0xAAu8; 4096];
    let c = done(qp.execute(&cmd, &mut buf));
    assert_eq!(c.status(), Status::SUCCESS, "log page {lid:#x}");
    buf
}

fn changed_list(qp: &mut QueuePair) -> Vec<u32> {
    get_log(qp, 0x04)
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .take_while(|&n| n != 0)
        .collect()
}

/// Every NSID the ANA log lists.
fn ana_nsids(qp: &mut QueuePair) -> Vec<u32> {
    let buf = get_log(qp, 0x0C);
    let u32_at = |o: usize| u32::from_le_bytes(buf[o..o + 4].try_into().unwrap());
    let ngrps = u16::from_le_bytes([buf[8], buf[9]]);
    let mut at = 16;
    let mut out = Vec::new();
    for _ in 0..ngrps {
        let n = u32_at(at + 4) as usize;
        out.extend((0..n).map(|i| u32_at(at + 32 + 4 * i)));
        at += 32 + 4 * n;
    }
    out
}

fn read(io: &mut QueuePair, nsid: u32) -> Status {
    let mut cmd = Command::new(IoOpcode::Read as u8, 20);
    cmd.set_nsid(nsid).set_lba_range(0, 1);
    let mut buf = vec![0u8; 512];
    match io.execute(&cmd, &mut buf) {
        Exec::CompleteZeroData(c) | Exec::Complete(c) => c.status(),
        other => panic!("read: {other:?}"),
    }
}

/// Completions the admin queue delivers now (AERs).
fn events(a: &mut QueuePair) -> Vec<u32> {
    let mut got = Vec::new();
    a.poll(Instant::now(), &mut |c| got.push(c.dw0()));
    got
}

const INVALID_NS: Status = Status::INVALID_NAMESPACE.with_dnr();

#[test]
fn a_hidden_namespace_is_an_inactive_nsid() {
    let t = Target::from_config(&config()).unwrap();
    for (host, sees, hidden) in [
        (HOST_A, vec![1, 3], vec![2]),
        (HOST_B, vec![2, 3], vec![1]),
        (HOST_C, vec![3], vec![1, 2]),
    ] {
        let (mut a, mut io) = controller(&t, host);
        assert_eq!(active_list(&mut a), sees, "active list of {host}");
        assert_eq!(ana_nsids(&mut a), sees, "ANA log of {host}");
        for &n in &sees {
            let (st, page) = identify(&mut a, 0, n);
            assert_eq!(st, Status::SUCCESS);
            assert_eq!(page[..8], 64u64.to_le_bytes(), "NSZE of {n}");
            assert_eq!(identify(&mut a, 3, n).0, Status::SUCCESS);
            assert_eq!(read(&mut io, n), Status::SUCCESS, "{host} reads {n}");
        }
        for &n in &hidden {
            // As an inactive NSID: a zero-filled Identify Namespace, Invalid
            // Namespace for the descriptor lists and for I/O.
            let (st, page) = identify(&mut a, 0, n);
            assert_eq!(st, Status::SUCCESS);
            assert!(page.iter().all(|&b| b == 0), "{host}: NSID {n} all zero");
            assert_eq!(identify(&mut a, 3, n).0, INVALID_NS, "CNS 03h {n}");
            assert_eq!(read(&mut io, n), INVALID_NS, "{host} reads {n}");
        }
        // The list starting after a hidden NSID skips it too.
        let (_, buf) = identify(&mut a, 2, 1);
        let after: Vec<u32> = sees.iter().copied().filter(|&n| n > 1).collect();
        assert_eq!(
            buf[..4],
            after[0].to_le_bytes(),
            "{host}: list after NSID 1"
        );
        assert_eq!(buf[4 * after.len()..4 * after.len() + 4], [0; 4]);
    }
}

#[test]
fn without_rules_every_host_gets_the_subsystem_table_itself() {
    let mut cfg = config();
    cfg.subsystems[0].ns_visibility.clear();
    let t = Target::from_config(&cfg).unwrap();
    let sub = t.subsystem(NQN).unwrap();
    let all = sub.namespaces();
    for h in [HOST_A, HOST_B, HOST_C] {
        assert!(Arc::ptr_eq(&sub.namespaces_for(h), &all), "{h}");
    }
    // With rules, a host that sees everything still shares it.
    let t = Target::from_config(&config()).unwrap();
    let sub = t.subsystem(NQN).unwrap();
    sub.set_ns_visibility(2, NsVisibility::Hosts([HOST_A.to_string()].into()))
        .unwrap();
    assert!(Arc::ptr_eq(&sub.namespaces_for(HOST_A), &sub.namespaces()));
    assert!(!Arc::ptr_eq(&sub.namespaces_for(HOST_B), &sub.namespaces()));
}

#[test]
fn add_host_tells_only_that_host_and_the_namespace_works_at_once() {
    let t = Target::from_config(&config()).unwrap();
    let sub = t.subsystem(NQN).unwrap();
    let (mut a, mut io_a) = controller(&t, HOST_A);
    let (mut b, mut io_b) = controller(&t, HOST_B);
    let (mut b2, _io_b2) = controller(&t, HOST_B);
    assert_eq!(read(&mut io_b, 1), INVALID_NS);

    // nvmf_ns_add_host NQN 1 HOST_B.
    let told = sub
        .set_ns_visibility(
            1,
            NsVisibility::Hosts([HOST_A, HOST_B].map(String::from).into()),
        )
        .unwrap();
    assert_eq!(told, 2, "both controllers of host B");
    assert_eq!(events(&mut b), vec![NS_ATTR_NOTICE]);
    assert_eq!(events(&mut b2), vec![NS_ATTR_NOTICE]);
    assert!(events(&mut a).is_empty(), "host A's view did not change");
    assert_eq!(changed_list(&mut b), vec![1]);
    assert_eq!(active_list(&mut b), vec![1, 2, 3]);
    // No reconnect: the I/O queue takes the new table at its next command.
    assert_eq!(read(&mut io_b, 1), Status::SUCCESS);
    // Same rule again: nothing changes, nobody is told.
    let same = NsVisibility::Hosts([HOST_A, HOST_B].map(String::from).into());
    assert_eq!(sub.set_ns_visibility(1, same).unwrap(), 0);

    // nvmf_ns_remove_host NQN 1 HOST_A: A loses it, B keeps it.
    let told = sub
        .set_ns_visibility(1, NsVisibility::Hosts([HOST_B.to_string()].into()))
        .unwrap();
    assert_eq!(told, 1);
    let aer = Command::new(AdminOpcode::AsyncEventRequest as u8, 101);
    assert_eq!(a.execute(&aer, &mut []), Exec::Pending);
    assert_eq!(events(&mut a), vec![NS_ATTR_NOTICE]);
    assert_eq!(changed_list(&mut a), vec![1]);
    assert_eq!(read(&mut io_a, 1), INVALID_NS);
    assert_eq!(active_list(&mut a), vec![3]);
    assert_eq!(read(&mut io_b, 1), Status::SUCCESS);
    assert!(
        sub.set_ns_visibility(7, NsVisibility::All).is_err(),
        "no namespace 7"
    );
}

#[test]
fn adding_removing_or_resizing_a_hidden_namespace_never_reaches_other_hosts() {
    let t = Target::from_config(&config()).unwrap();
    let (mut a, _io_a) = controller(&t, HOST_A);
    let (mut c, mut io_c) = controller(&t, HOST_C);

    let only_a = NsVisibility::Hosts([HOST_A.to_string()].into());
    t.add_namespace_visible(NQN, &ns_cfg(4, "M4"), only_a)
        .unwrap();
    assert_eq!(events(&mut a), vec![NS_ATTR_NOTICE]);
    assert!(events(&mut c).is_empty(), "host C never hears of NSID 4");
    assert_eq!(changed_list(&mut a), vec![4]);
    assert!(changed_list(&mut c).is_empty());
    assert_eq!(active_list(&mut a), vec![1, 3, 4]);
    assert_eq!(active_list(&mut c), vec![3]);
    assert_eq!(read(&mut io_c, 4), INVALID_NS);

    // Resized: only the hosts that see it.
    let aer = Command::new(AdminOpcode::AsyncEventRequest as u8, 101);
    assert_eq!(a.execute(&aer, &mut []), Exec::Pending);
    let sub = t.subsystem(NQN).unwrap();
    let backend = sub.namespaces().get(4).unwrap().backend().clone();
    assert_eq!(sub.resize_backend(&backend, 128), vec![4]);
    assert_eq!(events(&mut a), vec![NS_ATTR_NOTICE]);
    assert!(events(&mut c).is_empty());
    assert_eq!(changed_list(&mut a), vec![4]);

    // Removed: the same.
    assert_eq!(a.execute(&aer, &mut []), Exec::Pending);
    t.remove_namespace(NQN, 4).unwrap();
    assert_eq!(events(&mut a), vec![NS_ATTR_NOTICE]);
    assert!(events(&mut c).is_empty());
    assert!(changed_list(&mut c).is_empty());
    // Its rule went with it: a namespace added again under that NSID is
    // visible to all unless told otherwise.
    t.add_namespace(NQN, &ns_cfg(4, "M4")).unwrap();
    assert_eq!(events(&mut c), vec![NS_ATTR_NOTICE]);
    assert_eq!(read(&mut io_c, 4), Status::SUCCESS);
}

#[test]
fn sync_visibility_applies_a_configuration() {
    let t = Target::from_config(&config()).unwrap();
    let (mut c, mut io_c) = controller(&t, HOST_C);
    let mut cfg = config().subsystems.remove(0);
    cfg.ns_visibility
        .insert(2, vec![HOST_B.to_string(), HOST_C.to_string()]);
    cfg.ns_visibility.insert(3, vec![]);
    assert_eq!(
        t.sync_visibility(&cfg).unwrap(),
        2,
        "host C: gains 2, loses 3"
    );
    assert_eq!(events(&mut c), vec![NS_ATTR_NOTICE]);
    assert_eq!(changed_list(&mut c), vec![2, 3]);
    assert_eq!(active_list(&mut c), vec![2]);
    assert_eq!(read(&mut io_c, 3), INVALID_NS);
    assert_eq!(read(&mut io_c, 2), Status::SUCCESS);
}

/// Runs a reservation command on an I/O queue.
fn resv(io: &mut QueuePair, op: IoOpcode, nsid: u32, cdw10: u32, data: &mut [u8]) -> Status {
    let mut cmd = Command::new(op as u8, 30);
    cmd.set_nsid(nsid).set_cdw10(cdw10);
    done(io.execute(&cmd, data)).status()
}

fn keys(a: u64, b: u64) -> Vec<u8> {
    let mut v = a.to_le_bytes().to_vec();
    v.extend_from_slice(&b.to_le_bytes());
    v
}

#[test]
fn reservation_notices_of_a_hidden_namespace_never_reach_its_host() {
    let t = Target::from_config(&config()).unwrap();
    let sub = t.subsystem(NQN).unwrap();
    let (mut a, mut io_a) = controller(&t, HOST_A);
    let (mut b, mut io_b) = controller(&t, HOST_B);
    // Both register on namespace 3 (visible to all), A holds Write Exclusive.
    let reg = IoOpcode::ReservationRegister;
    assert_eq!(
        resv(&mut io_a, reg, 3, 0, &mut keys(0, 0xA)),
        Status::SUCCESS
    );
    assert_eq!(
        resv(&mut io_b, reg, 3, 0, &mut keys(0, 0xB)),
        Status::SUCCESS
    );
    let acq = IoOpcode::ReservationAcquire;
    assert_eq!(
        resv(&mut io_a, acq, 3, 1 << 8, &mut keys(0xA, 0)),
        Status::SUCCESS
    );

    // Namespace 3 is hidden from A; then B preempts A (a notice for A).
    sub.set_ns_visibility(3, NsVisibility::Hosts([HOST_B.to_string()].into()))
        .unwrap();
    assert_eq!(events(&mut a), vec![NS_ATTR_NOTICE]);
    assert_eq!(changed_list(&mut a), vec![3]);
    assert!(events(&mut b).is_empty());
    let aer = Command::new(AdminOpcode::AsyncEventRequest as u8, 101);
    assert_eq!(a.execute(&aer, &mut []), Exec::Pending);
    assert_eq!(
        resv(&mut io_b, acq, 3, (1 << 8) | 1, &mut keys(0xB, 0xA)),
        Status::SUCCESS
    );
    assert!(
        events(&mut a).is_empty(),
        "no reservation AEN for a hidden namespace"
    );
    let log = get_log(&mut a, 0x80);
    assert!(
        log[..64].iter().all(|&x| x == 0),
        "empty reservation notification log"
    );
    // And A cannot act on it any more: Invalid Namespace before any
    // reservation check.
    assert_eq!(resv(&mut io_a, reg, 3, 0, &mut keys(0, 0xA)), INVALID_NS);
    assert_eq!(read(&mut io_a, 3), INVALID_NS);
}
