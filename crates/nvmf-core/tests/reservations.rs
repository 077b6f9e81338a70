//! Reservations (and Compare / Verify) driven the way a transport drives nvmf-core (QueuePair::execute / poll):
//! two hosts with different host identifiers on one namespace, the access rule on the
//! I/O path, notifications (log page 80h + AEN), features 82h/83h, Identify, and a
//! reservation kept through a restart with PTPL and gone without it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_config::{
    derive_namespace_ids, AddressFamily, BdevConfig, BdevKind, ListenerConfig, NamespaceConfig,
    SubsystemConfig, TargetConfig, TransportConfig, TransportType,
};
use nvmf_core::{Exec, PortInfo, QueuePair, Target};
use nvmf_wire::command::Command;
use nvmf_wire::completion::Completion;
use nvmf_wire::fabrics::{ConnectData, CC};
use nvmf_wire::identify::{IdentifyController, IdentifyNamespace};
use nvmf_wire::opcode::{AdminOpcode, IoOpcode};
use nvmf_wire::status::Status;
use nvmf_wire::zerocopy::{FromBytes, IntoBytes};

const NQN: &str = "nqn.2024-01.io.nvmfd:resv";
const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000a";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b";
const ID_A: [u8; 16] = [0xA; 16];
const ID_B: [u8; 16] = [0xB; 16];

const CONFLICT: Status = Status::RESERVATION_CONFLICT.with_dnr();

fn config(ptpl: Option<&std::path::Path>) -> TargetConfig {
    let ids = derive_namespace_ids(NQN, 1, "Malloc0", None);
    let mut s = SubsystemConfig::new(NQN);
    s.allow_any_host = true;
    s.namespaces = vec![NamespaceConfig {
        nsid: 1,
        bdev_name: "Malloc0".into(),
        nguid: ids.nguid,
        eui64: ids.eui64,
        uuid: ids.uuid,
        anagrpid: 1,
        ptpl_file: ptpl.map(|p| p.display().to_string()),
    }];
    s.listeners = vec![ListenerConfig {
        trtype: TransportType::Tcp,
        adrfam: AddressFamily::Ipv4,
        traddr: "127.0.0.1".into(),
        trsvcid: "4420".into(),
    }];
    TargetConfig {
        bdevs: vec![BdevConfig {
            name: "Malloc0".into(),
            kind: BdevKind::Malloc,
            block_size: 512,
            num_blocks: 1024,
            uuid: None,
            file: None,
            rbd: None,
        }],
        transports: vec![TransportConfig::tcp_default()],
        subsystems: vec![s],
        ..Default::default()
    }
}

fn port() -> Arc<PortInfo> {
    Arc::new(PortInfo {
        trtype: TransportType::Tcp,
        adrfam: AddressFamily::Ipv4,
        traddr: "127.0.0.1".into(),
        trsvcid: "4420".into(),
        peer: "127.0.0.1:50000".parse::<SocketAddr>().unwrap(),
        tls: None,
        caps: nvmf_core::TransportCaps::MESSAGE_BASED,
    })
}

fn done(e: Exec) -> Completion {
    match e {
        Exec::Complete(c) | Exec::CompleteZeroData(c) => c,
        other => panic!("expected a completion, got {other:?}"),
    }
}

fn connect(t: &Arc<Target>, qid: u16, cntlid: u16, host: &str, id: [u8; 16]) -> QueuePair {
    let mut qp = QueuePair::new(t.clone(), port());
    let cmd = Command::connect(1, qid, 31, 0, if qid == 0 { 5000 } else { 0 });
    let mut data = ConnectData::new(id, cntlid, NQN, host).as_bytes().to_vec();
    let c = done(qp.execute(&cmd, &mut data));
    assert_eq!(c.status(), Status::SUCCESS, "connect qid {qid} of {host}");
    if qid == 0 {
        let c = done(qp.execute(&Command::property_set(2, CC, false, 0x0046_0001), &mut []));
        assert_eq!(c.status(), Status::SUCCESS);
    }
    qp
}

/// A host: its admin queue and one I/O queue.
struct Host {
    admin: QueuePair,
    io: QueuePair,
}

fn host(t: &Arc<Target>, nqn: &str, id: [u8; 16]) -> Host {
    let admin = connect(t, 0, 0xFFFF, nqn, id);
    let cntlid = admin.controller().unwrap().cntlid();
    let io = connect(t, 1, cntlid, nqn, id);
    Host { admin, io }
}

/// Runs a command on a queue, waiting (bounded) for one that completes on
/// the PTPL thread.
fn run(qp: &mut QueuePair, cmd: &Command, data: &mut [u8]) -> Status {
    match qp.execute(cmd, data) {
        Exec::Complete(c) | Exec::CompleteZeroData(c) => c.status(),
        Exec::Pending => {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let mut got = None;
                qp.poll(Instant::now(), &mut |c| got = Some(c));
                if let Some(c) = got {
                    assert_eq!(c.cid(), cmd.cid());
                    return c.status();
                }
                assert!(Instant::now() < deadline, "command never completed");
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        other => panic!("{other:?}"),
    }
}

fn keys(a: u64, b: u64) -> Vec<u8> {
    let mut v = a.to_le_bytes().to_vec();
    v.extend_from_slice(&b.to_le_bytes());
    v
}

fn register(h: &mut Host, cdw10: u32, crkey: u64, nrkey: u64) -> Status {
    let mut cmd = Command::new(IoOpcode::ReservationRegister as u8, 30);
    cmd.set_nsid(1).set_cdw10(cdw10);
    run(&mut h.io, &cmd, &mut keys(crkey, nrkey))
}

fn acquire(h: &mut Host, rtype: u8, action: u32, crkey: u64, prkey: u64) -> Status {
    let mut cmd = Command::new(IoOpcode::ReservationAcquire as u8, 31);
    cmd.set_nsid(1).set_cdw10((u32::from(rtype) << 8) | action);
    run(&mut h.io, &cmd, &mut keys(crkey, prkey))
}

fn release(h: &mut Host, rtype: u8, action: u32, crkey: u64) -> Status {
    let mut cmd = Command::new(IoOpcode::ReservationRelease as u8, 32);
    cmd.set_nsid(1).set_cdw10((u32::from(rtype) << 8) | action);
    run(&mut h.io, &cmd, &mut crkey.to_le_bytes())
}

fn report(h: &mut Host, eds: bool) -> (Status, Vec<u8>) {
    let mut cmd = Command::new(IoOpcode::ReservationReport as u8, 33);
    cmd.set_nsid(1)
        .set_cdw10(4096 / 4 - 1)
        .set_cdw11(u32::from(eds));
    let mut buf = vec![0xEEu8; 4096];
    let st = run(&mut h.io, &cmd, &mut buf);
    (st, buf)
}

fn io(h: &mut Host, op: IoOpcode) -> Status {
    let mut cmd = Command::new(op as u8, 40);
    cmd.set_nsid(1).set_lba_range(8, 1);
    let mut buf = vec![0x5Au8; 512];
    let data: &mut [u8] = match op {
        IoOpcode::Read | IoOpcode::Write => &mut buf,
        _ => &mut [],
    };
    done(h.io.execute(&cmd, data)).status()
}

fn notice_log(h: &mut Host) -> Vec<u8> {
    let mut cmd = Command::new(AdminOpcode::GetLogPage as u8, 11);
    cmd.set_nsid(0xFFFF_FFFF).set_get_log_page(0x80, 64, 0);
    let mut buf = vec![0xAAu8; 64];
    assert_eq!(
        done(h.admin.execute(&cmd, &mut buf)).status(),
        Status::SUCCESS
    );
    buf
}

fn aen(h: &mut Host) -> Option<u32> {
    let mut got = Vec::new();
    h.admin.poll(Instant::now(), &mut |c| got.push(c));
    got.first().map(|c| c.dw0())
}

#[test]
fn two_hosts_write_exclusive_preempt_and_notices() {
    let t = Target::from_config(&config(None)).unwrap();
    let mut a = host(&t, HOST_A, ID_A);
    let mut b = host(&t, HOST_B, ID_B);
    // B waits for events.
    assert_eq!(
        b.admin.execute(
            &Command::new(AdminOpcode::AsyncEventRequest as u8, 90),
            &mut []
        ),
        Exec::Pending
    );

    // No reservation: everyone reads and writes.
    assert_eq!(io(&mut b, IoOpcode::Write), Status::SUCCESS);
    assert_eq!(register(&mut a, 0, 0, 0xAAAA), Status::SUCCESS);
    assert_eq!(register(&mut b, 0, 0, 0xBBBB), Status::SUCCESS);
    assert_eq!(acquire(&mut a, 1, 0, 0xAAAA, 0), Status::SUCCESS);

    // Write Exclusive held by A: B (a registrant) reads but cannot write.
    assert_eq!(io(&mut a, IoOpcode::Write), Status::SUCCESS);
    assert_eq!(io(&mut b, IoOpcode::Read), Status::SUCCESS);
    assert_eq!(io(&mut b, IoOpcode::Write), CONFLICT);
    assert_eq!(io(&mut b, IoOpcode::WriteZeroes), CONFLICT);
    assert_eq!(io(&mut b, IoOpcode::Flush), CONFLICT);
    assert_eq!(acquire(&mut b, 1, 0, 0xBBBB, 0), CONFLICT);

    // Report (extended): both registrants, A holds it.
    assert_eq!(
        report(&mut b, false).0,
        Status::HOST_ID_INCONSISTENT_FORMAT.with_dnr()
    );
    let (st, page) = report(&mut b, true);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(page[4], 1, "RTYPE");
    assert_eq!(u16::from_le_bytes([page[5], page[6]]), 2, "REGCTL");
    let entry = |i: usize| &page[64 + 64 * i..128 + 64 * i];
    assert_eq!((entry(0)[2], &entry(0)[16..32]), (1, &ID_A[..]));
    assert_eq!((entry(1)[2], &entry(1)[16..32]), (0, &ID_B[..]));
    assert_eq!(&entry(1)[8..16], &0xBBBBu64.to_le_bytes());

    // B preempts A (Preempt and Abort, as fence_mpath does): B holds
    // Exclusive Access, A is no longer registered and hears about it.
    assert_eq!(
        a.admin.execute(
            &Command::new(AdminOpcode::AsyncEventRequest as u8, 91),
            &mut []
        ),
        Exec::Pending
    );
    assert_eq!(acquire(&mut b, 2, 2, 0xBBBB, 0xAAAA), Status::SUCCESS);
    assert_eq!(io(&mut a, IoOpcode::Read), CONFLICT);
    assert_eq!(io(&mut a, IoOpcode::Write), CONFLICT);
    assert_eq!(io(&mut b, IoOpcode::Write), Status::SUCCESS);
    assert_eq!(
        aen(&mut a),
        Some(6 | (0x80 << 16)),
        "reservation log page AEN"
    );
    let log = notice_log(&mut a);
    assert_eq!(u64::from_le_bytes(log[0..8].try_into().unwrap()), 1);
    assert_eq!(
        (log[8], log[9]),
        (1, 0),
        "registration preempted, none left"
    );
    assert_eq!(u32::from_le_bytes(log[12..16].try_into().unwrap()), 1);
    let log = notice_log(&mut a);
    assert_eq!((log[0], log[8]), (0, 0), "then an empty page");
    assert_eq!(aen(&mut b), None, "the preempting host hears nothing");

    // A registers again; B releases an Exclusive Access reservation: no
    // notice (only the registrants-only and all-registrants types notify).
    assert_eq!(register(&mut a, 0, 0, 0xA2), Status::SUCCESS);
    assert_eq!(
        release(&mut b, 1, 0, 0xBBBB),
        Status::INVALID_FIELD.with_dnr()
    );
    assert_eq!(release(&mut b, 2, 0, 0xBBBB), Status::SUCCESS);
    assert_eq!(io(&mut a, IoOpcode::Write), Status::SUCCESS);
    // Write Exclusive Registrants Only: a release notifies A.
    assert_eq!(acquire(&mut b, 3, 0, 0xBBBB, 0), Status::SUCCESS);
    assert_eq!(
        io(&mut a, IoOpcode::Write),
        Status::SUCCESS,
        "A is a registrant"
    );
    assert_eq!(release(&mut b, 3, 0, 0xBBBB), Status::SUCCESS);
    assert_eq!(
        a.admin.execute(
            &Command::new(AdminOpcode::AsyncEventRequest as u8, 92),
            &mut []
        ),
        Exec::Pending
    );
    assert_eq!(aen(&mut a), Some(6 | (0x80 << 16)));
    let log = notice_log(&mut a);
    assert_eq!((log[0], log[8]), (2, 2), "count 2, reservation released");

    // Clear: every registrant goes, the others hear "reservation preempted".
    assert_eq!(acquire(&mut a, 2, 0, 0xA2, 0), Status::SUCCESS);
    assert_eq!(release(&mut b, 0, 1, 0xBBBB), Status::SUCCESS);
    let log = notice_log(&mut a);
    assert_eq!((log[0], log[8]), (3, 3));
    assert_eq!(io(&mut b, IoOpcode::Write), Status::SUCCESS);
    let (_, page) = report(&mut a, true);
    assert_eq!((page[4], page[5]), (0, 0));
}

#[test]
fn zero_host_id_cannot_register_and_masks_silence_notices() {
    let t = Target::from_config(&config(None)).unwrap();
    let mut z = host(&t, HOST_A, [0; 16]);
    assert_eq!(
        register(&mut z, 0, 0, 1),
        Status::HOST_ID_INCONSISTENT_FORMAT.with_dnr()
    );
    let mut b = host(&t, HOST_B, ID_B);
    let mut c = host(&t, "nqn.2014-08.org.nvmexpress:uuid:c", [0xC; 16]);
    // C masks "registration preempted" for namespace 1.
    let mut cmd = Command::new(AdminOpcode::SetFeatures as u8, 12);
    cmd.set_nsid(1).set_cdw10(0x82).set_cdw11(0x2);
    assert_eq!(
        done(c.admin.execute(&cmd, &mut [])).status(),
        Status::SUCCESS
    );
    let mut cmd = Command::new(AdminOpcode::GetFeatures as u8, 13);
    cmd.set_nsid(1).set_cdw10(0x82);
    assert_eq!(done(c.admin.execute(&cmd, &mut [])).dw0(), 0x2);
    cmd.set_nsid(9);
    assert_eq!(
        done(c.admin.execute(&cmd, &mut [])).status(),
        Status::INVALID_FIELD.with_dnr()
    );
    assert_eq!(register(&mut b, 0, 0, 2), Status::SUCCESS);
    assert_eq!(register(&mut c, 0, 0, 3), Status::SUCCESS);
    assert_eq!(
        acquire(&mut b, 1, 1, 2, 3),
        Status::SUCCESS,
        "preempt C's key"
    );
    assert_eq!(notice_log(&mut c)[8], 0, "masked: nothing logged");
    // Without a PTPL file, PTPL cannot be turned on.
    let mut cmd = Command::new(AdminOpcode::SetFeatures as u8, 14);
    cmd.set_nsid(1).set_cdw10(0x83).set_cdw11(1);
    assert_eq!(
        done(b.admin.execute(&cmd, &mut [])).status(),
        Status::INVALID_FIELD.with_dnr()
    );
    assert_eq!(
        register(&mut b, 3 << 30, 2, 2),
        Status::INVALID_FIELD.with_dnr()
    );
}

#[test]
fn identify_reports_reservation_support() {
    let dir = std::env::temp_dir().join(format!("nvmf-resv-id-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (ptpl, rescap) in [(None, 0xFE), (Some(dir.join("ns1")), 0xFF)] {
        let t = Target::from_config(&config(ptpl.as_deref())).unwrap();
        let mut a = host(&t, HOST_A, ID_A);
        let mut cmd = Command::new(AdminOpcode::Identify as u8, 10);
        cmd.set_cdw10(1);
        let mut buf = vec![0u8; 4096];
        assert_eq!(
            done(a.admin.execute(&cmd, &mut buf)).status(),
            Status::SUCCESS
        );
        let (id, _) = IdentifyController::read_from_prefix(&buf).unwrap();
        assert_ne!(id.oncs.get() & (1 << 5), 0, "ONCS reservations");
        cmd.set_nsid(1).set_cdw10(0);
        assert_eq!(
            done(a.admin.execute(&cmd, &mut buf)).status(),
            Status::SUCCESS
        );
        let (ns, _) = IdentifyNamespace::read_from_prefix(&buf).unwrap();
        assert_eq!(ns.rescap, rescap);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// With PTPL the reservation survives a restart (a new Target from the same
/// configuration); PTPL turned off, the restart clears it.
#[test]
fn ptpl_keeps_the_reservation_through_a_restart() {
    let dir = std::env::temp_dir().join(format!("nvmf-resv-ptpl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ns1.ptpl");
    let _ = std::fs::remove_file(&file);
    {
        let t = Target::from_config(&config(Some(&file))).unwrap();
        let mut a = host(&t, HOST_A, ID_A);
        // Register with CPTPL = 11b (persist), Write Exclusive.
        assert_eq!(register(&mut a, 3 << 30, 0, 0x77), Status::SUCCESS);
        assert_eq!(acquire(&mut a, 1, 0, 0x77, 0), Status::SUCCESS);
        assert!(file.exists(), "written before the command completed");
        let mut cmd = Command::new(AdminOpcode::GetFeatures as u8, 13);
        cmd.set_nsid(1).set_cdw10(0x83);
        assert_eq!(done(a.admin.execute(&cmd, &mut [])).dw0(), 1);
    }
    {
        let t = Target::from_config(&config(Some(&file))).unwrap();
        let mut b = host(&t, HOST_B, ID_B);
        assert_eq!(
            io(&mut b, IoOpcode::Write),
            CONFLICT,
            "held through the restart"
        );
        let (_, page) = report(&mut b, true);
        assert_eq!((page[4], page[5], page[9]), (1, 1, 1));
        let mut a = host(&t, HOST_A, ID_A);
        assert_eq!(io(&mut a, IoOpcode::Write), Status::SUCCESS);
        // PTPL off through Set Features 83h (runs on the PTPL thread).
        let mut cmd = Command::new(AdminOpcode::SetFeatures as u8, 14);
        cmd.set_nsid(1).set_cdw10(0x83).set_cdw11(0);
        assert_eq!(run(&mut a.admin, &cmd, &mut []), Status::SUCCESS);
    }
    {
        let t = Target::from_config(&config(Some(&file))).unwrap();
        let mut b = host(&t, HOST_B, ID_B);
        assert_eq!(
            io(&mut b, IoOpcode::Write),
            Status::SUCCESS,
            "gone without PTPL"
        );
        let (_, page) = report(&mut b, true);
        assert_eq!((page[4], page[5]), (0, 0));
    }
    // A damaged file stops the namespace from being made, with the file named.
    std::fs::write(&file, b"not json").unwrap();
    let e = Target::from_config(&config(Some(&file)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("ns1.ptpl"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn check_cmd(h: &mut Host, op: IoOpcode, slba: u64, nlb: u32, data: &mut [u8]) -> Status {
    let mut cmd = Command::new(op as u8, 50);
    cmd.set_nsid(1).set_lba_range(slba, nlb);
    run(&mut h.io, &cmd, data)
}

/// Compare (05h) and Verify (0Ch) on a RAM disk: equal data succeeds, one
/// byte off is Compare Failure, lengths and ranges are checked, a fused
/// Compare is refused (FUSES 0), and both are read commands for the
/// reservation rule.
#[test]
fn compare_and_verify() {
    let t = Target::from_config(&config(None)).unwrap();
    let mut a = host(&t, HOST_A, ID_A);
    let mut b = host(&t, HOST_B, ID_B);
    let pattern: Vec<u8> = (0..1024u32).map(|i| (i * 7 + 3) as u8).collect();
    let mut cmd = Command::new(IoOpcode::Write as u8, 51);
    cmd.set_nsid(1).set_lba_range(100, 2);
    assert_eq!(run(&mut a.io, &cmd, &mut pattern.clone()), Status::SUCCESS);

    let mut same = pattern.clone();
    assert_eq!(
        check_cmd(&mut a, IoOpcode::Compare, 100, 2, &mut same),
        Status::SUCCESS
    );
    let mut off = pattern.clone();
    off[700] ^= 1;
    let miscompare = Status::COMPARE_FAILURE.with_dnr();
    assert_eq!(
        check_cmd(&mut a, IoOpcode::Compare, 100, 2, &mut off),
        miscompare
    );
    assert_eq!((miscompare.sct, miscompare.sc), (2, 0x85));
    assert_eq!(
        check_cmd(
            &mut a,
            IoOpcode::Compare,
            100,
            2,
            &mut pattern[..512].to_vec()
        ),
        Status::SGL_DATA_LENGTH_INVALID.with_dnr()
    );
    assert_eq!(
        check_cmd(&mut a, IoOpcode::Compare, 1023, 2, &mut pattern.clone()),
        Status::LBA_OUT_OF_RANGE.with_dnr()
    );
    let mut fused = Command::new(IoOpcode::Compare as u8, 52);
    fused.set_nsid(1).set_lba_range(100, 2).set_flags(1);
    assert_eq!(
        run(&mut a.io, &fused, &mut pattern.clone()),
        Status::INVALID_FIELD.with_dnr()
    );
    assert_eq!(
        check_cmd(&mut a, IoOpcode::Verify, 0, 64, &mut []),
        Status::SUCCESS
    );
    assert_eq!(
        check_cmd(&mut a, IoOpcode::Verify, 1000, 64, &mut []),
        Status::LBA_OUT_OF_RANGE.with_dnr()
    );
    // Exclusive Access held by A: B may not compare or verify; A may.
    assert_eq!(register(&mut a, 0, 0, 1), Status::SUCCESS);
    assert_eq!(acquire(&mut a, 2, 0, 1, 0), Status::SUCCESS);
    assert_eq!(
        check_cmd(&mut b, IoOpcode::Compare, 100, 2, &mut pattern.clone()),
        CONFLICT
    );
    assert_eq!(check_cmd(&mut b, IoOpcode::Verify, 0, 1, &mut []), CONFLICT);
    assert_eq!(
        check_cmd(&mut a, IoOpcode::Compare, 100, 2, &mut pattern.clone()),
        Status::SUCCESS
    );
    // Identify: ONCS Compare (bit 0) and Verify (bit 7); VSL = MDTS.
    let mut cmd = Command::new(AdminOpcode::Identify as u8, 10);
    cmd.set_cdw10(1);
    let mut buf = vec![0u8; 4096];
    assert_eq!(
        done(a.admin.execute(&cmd, &mut buf)).status(),
        Status::SUCCESS
    );
    let (id, _) = IdentifyController::read_from_prefix(&buf).unwrap();
    assert_eq!(id.oncs.get() & 0x81, 0x81);
    cmd.set_cdw10(6);
    assert_eq!(
        done(a.admin.execute(&cmd, &mut buf)).status(),
        Status::SUCCESS
    );
    assert_eq!(buf[0], id.mdts);
}

/// Copy range descriptors (format 0): (SLBA, NLB 1-based).
fn copy_ranges(r: &[(u64, u16)]) -> Vec<u8> {
    let mut d = Vec::new();
    for &(slba, nlb) in r {
        let mut e = [0u8; 32];
        e[8..16].copy_from_slice(&slba.to_le_bytes());
        e[16..18].copy_from_slice(&(nlb - 1).to_le_bytes());
        d.extend_from_slice(&e);
    }
    d
}

fn copy(h: &mut Host, sdlba: u64, ranges: &[(u64, u16)], cdw12_extra: u32) -> Status {
    let mut cmd = Command::new(IoOpcode::Copy as u8, 60);
    cmd.set_nsid(1)
        .set_cdw10(sdlba as u32)
        .set_cdw11((sdlba >> 32) as u32)
        .set_cdw12((ranges.len() as u32 - 1) | cdw12_extra);
    run(&mut h.io, &cmd, &mut copy_ranges(ranges))
}

fn read_blocks(h: &mut Host, slba: u64, nlb: u32) -> Vec<u8> {
    let mut cmd = Command::new(IoOpcode::Read as u8, 61);
    cmd.set_nsid(1).set_lba_range(slba, nlb);
    let mut buf = vec![0u8; nlb as usize * 512];
    assert_eq!(run(&mut h.io, &cmd, &mut buf), Status::SUCCESS);
    buf
}

/// Copy (19h) on a RAM disk: two source ranges land back to back at the
/// destination; the limits (MSRC, MSSRL, MCL), ranges, format and the
/// reservation rule (a write-group command) are checked; Identify says so.
#[test]
fn copy_within_a_namespace() {
    let t = Target::from_config(&config(None)).unwrap();
    let mut a = host(&t, HOST_A, ID_A);
    let mut b = host(&t, HOST_B, ID_B);
    let pattern: Vec<u8> = (0..2048u32).map(|i| (i * 13 + 1) as u8).collect();
    let mut cmd = Command::new(IoOpcode::Write as u8, 62);
    cmd.set_nsid(1).set_lba_range(10, 4);
    assert_eq!(run(&mut a.io, &cmd, &mut pattern.clone()), Status::SUCCESS);
    // Blocks 12-13, then 10: to 500..503.
    assert_eq!(copy(&mut a, 500, &[(12, 2), (10, 1)], 0), Status::SUCCESS);
    let got = read_blocks(&mut a, 500, 3);
    assert_eq!(&got[..1024], &pattern[1024..2048]);
    assert_eq!(&got[1024..], &pattern[..512]);

    let size_limit = Status::COMMAND_SIZE_LIMIT_EXCEEDED.with_dnr();
    assert_eq!((size_limit.sct, size_limit.sc), (1, 0x83));
    let many: Vec<(u64, u16)> = (0..129).map(|i| (i, 1)).collect();
    assert_eq!(copy(&mut a, 600, &many, 0), size_limit, "129 ranges");
    // MDTS 128 KiB = 256 blocks of 512 bytes.
    assert_eq!(
        copy(&mut a, 0, &[(0, 257)], 0),
        size_limit,
        "one range > MSSRL"
    );
    assert_eq!(
        copy(&mut a, 0, &[(0, 200), (300, 100)], 0),
        size_limit,
        "> MCL"
    );
    assert_eq!(
        copy(&mut a, 1023, &[(0, 2)], 0),
        Status::LBA_OUT_OF_RANGE.with_dnr(),
        "destination past the end"
    );
    assert_eq!(
        copy(&mut a, 0, &[(1023, 2)], 0),
        Status::LBA_OUT_OF_RANGE.with_dnr(),
        "source past the end"
    );
    assert_eq!(
        copy(&mut a, 0, &[(0, 1)], 1 << 8),
        Status::INVALID_FIELD.with_dnr(),
        "descriptor format 1"
    );
    // Write Exclusive held by A: B may not copy.
    assert_eq!(register(&mut a, 0, 0, 1), Status::SUCCESS);
    assert_eq!(acquire(&mut a, 1, 0, 1, 0), Status::SUCCESS);
    assert_eq!(copy(&mut b, 700, &[(10, 1)], 0), CONFLICT);
    // Identify: ONCS bit 8, OCFS format 0, MSSRL/MCL/MSRC.
    let mut cmd = Command::new(AdminOpcode::Identify as u8, 10);
    cmd.set_cdw10(1);
    let mut buf = vec![0u8; 4096];
    assert_eq!(
        done(a.admin.execute(&cmd, &mut buf)).status(),
        Status::SUCCESS
    );
    let (id, _) = IdentifyController::read_from_prefix(&buf).unwrap();
    assert_ne!(id.oncs.get() & (1 << 8), 0);
    assert_eq!(id.ocfs.get(), 1);
    cmd.set_nsid(1).set_cdw10(0);
    assert_eq!(
        done(a.admin.execute(&cmd, &mut buf)).status(),
        Status::SUCCESS
    );
    let (ns, _) = IdentifyNamespace::read_from_prefix(&buf).unwrap();
    assert_eq!((ns.mssrl.get(), ns.mcl.get(), ns.msrc), (256, 256, 127));
}

/// A command the reservation refuses is answered at once, even when its
/// bdev is out of QoS tokens: it never waits for a budget it will not use,
/// while the holder's commands over the budget do wait.
#[test]
fn a_reservation_conflict_never_waits_for_qos_tokens() {
    let t = Target::from_config(&config(None)).unwrap();
    let mut a = host(&t, HOST_A, ID_A);
    let mut b = host(&t, HOST_B, ID_B);
    assert_eq!(register(&mut a, 0, 0, 1), Status::SUCCESS);
    assert_eq!(acquire(&mut a, 2, 0, 1, 0), Status::SUCCESS);
    t.set_bdev_qos(
        "Malloc0",
        &nvmf_config::QosLimits {
            rw_ios_per_sec: 1000,
            ..Default::default()
        },
    );
    // Use up this slice's token, then more: the holder's next write waits.
    let mut throttled = false;
    for _ in 0..20 {
        let mut cmd = Command::new(IoOpcode::Write as u8, 70);
        cmd.set_nsid(1).set_lba_range(0, 1);
        match a.io.execute(&cmd, &mut [0u8; 512]) {
            Exec::Throttled => {
                throttled = true;
                break;
            }
            e => assert_eq!(done(e).status(), Status::SUCCESS),
        }
    }
    assert!(throttled, "the holder's writes never hit the limit");
    // B's write and read conflict at once, whatever the budget.
    for op in [IoOpcode::Write, IoOpcode::Read] {
        let mut cmd = Command::new(op as u8, 71);
        cmd.set_nsid(1).set_lba_range(0, 1);
        let e = b.io.execute(&cmd, &mut [0u8; 512]);
        assert!(matches!(e, Exec::Complete(_)), "{op:?}: {e:?}");
        assert_eq!(done(e).status(), CONFLICT);
    }
    t.set_bdev_qos("Malloc0", &nvmf_config::QosLimits::default());
}

/// Preempt and Abort completes only once no write of the preempted host
/// can still land: while a write counted before the change is in a backend
/// (here one counted by hand in the namespace's write gate) the Acquire
/// stays pending; the preempted host's new writes get Reservation Conflict
/// at once; other writes wait (parked, not failed) until it completes.
#[test]
fn preempt_and_abort_waits_for_writes_in_flight() {
    let t = Target::from_config(&config(None)).unwrap();
    let mut a = host(&t, HOST_A, ID_A);
    let mut b = host(&t, HOST_B, ID_B);
    assert_eq!(register(&mut a, 0, 0, 0xAAAA), Status::SUCCESS);
    assert_eq!(register(&mut b, 0, 0, 0xBBBB), Status::SUCCESS);
    assert_eq!(acquire(&mut a, 1, 0, 0xAAAA, 0), Status::SUCCESS);
    assert_eq!(io(&mut a, IoOpcode::Write), Status::SUCCESS);
    let ns = t
        .subsystem(NQN)
        .unwrap()
        .namespaces()
        .get(1)
        .unwrap()
        .clone();
    let gate = ns.write_gate().clone();
    // One of A's writes still in a backend.
    assert!(gate.enter(5));

    // B preempts A and aborts: Exclusive Access, A's key.
    let mut cmd = Command::new(IoOpcode::ReservationAcquire as u8, 31);
    cmd.set_nsid(1).set_cdw10((2 << 8) | 2);
    assert_eq!(
        b.io.execute(&cmd, &mut keys(0xBBBB, 0xAAAA)),
        Exec::Pending,
        "waits for the write in flight"
    );
    assert!(gate.is_closed());
    // A is preempted: its new writes conflict at once.
    assert_eq!(io(&mut a, IoOpcode::Write), CONFLICT);
    // B's own writes wait until the Acquire completes.
    let mut w = Command::new(IoOpcode::Write as u8, 41);
    w.set_nsid(1).set_lba_range(8, 1);
    assert_eq!(b.io.execute(&w, &mut [0x5B; 512]), Exec::Throttled);
    let mut got = Vec::new();
    std::thread::sleep(Duration::from_millis(3));
    b.io.poll(Instant::now(), &mut |c| got.push(c));
    assert!(got.is_empty(), "completed with a write in flight: {got:?}");

    // The write ends: the Acquire completes on the next turn.
    gate.leave(5);
    b.io.poll(Instant::now(), &mut |c| got.push(c));
    assert_eq!(
        got.iter()
            .map(|c| (c.cid(), c.status()))
            .collect::<Vec<_>>(),
        [(31, Status::SUCCESS)]
    );
    assert!(!gate.is_closed());
    assert_eq!(io(&mut b, IoOpcode::Write), Status::SUCCESS);
    assert_eq!(io(&mut a, IoOpcode::Read), CONFLICT, "Exclusive Access");
}
