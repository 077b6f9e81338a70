//! A namespace's size follows its bdev: a resize through the control plane
//! (`Target::resize_bdev`) and one the backend notices by itself
//! (`Backend::watch_size` hook, called on a foreign thread, delivered as a
//! `SizeChange` message and applied by the control plane) both change
//! Identify NSZE/NCAP/NUSE and the I/O path's LBA range check, put the NSID in
//! the Changed Namespace List (log 04h) and raise Namespace Attribute
//! Changed. Uses a test backend whose size can change (no Ceph needed).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvmf_config::{
    derive_namespace_ids, AddressFamily, ListenerConfig, NamespaceConfig, SubsystemConfig,
    TargetConfig, TransportConfig, TransportType,
};
use nvmf_core::backend::{BdevError, DsmRanges, ResizeHook};
use nvmf_core::{
    Backend, BlockOp, CompletionSink, Exec, IoTag, NullBackend, PortInfo, QueuePair, SizeChange,
    Submitted, Target,
};
use nvmf_wire::command::Command;
use nvmf_wire::completion::Completion;
use nvmf_wire::fabrics::{ConnectData, CC};
use nvmf_wire::identify::IdentifyNamespace;
use nvmf_wire::opcode::{AdminOpcode, IoOpcode};
use nvmf_wire::status::Status;
use nvmf_wire::zerocopy::{FromBytes, IntoBytes};

const NQN: &str = "nqn.2024-01.io.nvmfd:resize";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000aa";

/// A device whose size changes: `resize` (ours) and `grow_elsewhere` (as if
/// another client resized the image) both tell the watcher from another
/// thread, as librbd's callbacks do.
#[derive(Default)]
struct Growable {
    blocks: AtomicU64,
    hook: Mutex<Option<ResizeHook>>,
}

impl Growable {
    fn new(blocks: u64) -> Arc<Growable> {
        let g = Growable::default();
        g.blocks.store(blocks, Ordering::Release);
        Arc::new(g)
    }

    fn tell(&self, blocks: u64) {
        let hook = self.hook.lock().unwrap().clone();
        if let Some(h) = hook {
            std::thread::spawn(move || h(blocks)).join().unwrap();
        }
    }

    fn grow_elsewhere(&self, blocks: u64) {
        self.blocks.store(blocks, Ordering::Release);
        self.tell(blocks);
    }
}

impl std::fmt::Debug for Growable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Growable({})", self.num_blocks())
    }
}

impl Backend for Growable {
    fn name(&self) -> &str {
        "Grow0"
    }
    fn kind(&self) -> &'static str {
        "growable"
    }
    fn block_size(&self) -> u32 {
        512
    }
    fn num_blocks(&self) -> u64 {
        self.blocks.load(Ordering::Acquire)
    }
    fn deallocate_reads_zeroes(&self) -> bool {
        true
    }
    fn submit(&self, op: BlockOp<'_>, _tag: IoTag, _sink: &Arc<CompletionSink>) -> Submitted {
        if let BlockOp::Read { buf, .. } = op {
            buf.fill(0);
        }
        Submitted::Done(Status::SUCCESS)
    }
    fn deallocate(&self, _r: DsmRanges<'_>, _t: IoTag, _s: &Arc<CompletionSink>) -> Submitted {
        Submitted::Done(Status::SUCCESS)
    }
    fn resize(&self, num_blocks: u64) -> Result<(), BdevError> {
        self.blocks.store(num_blocks, Ordering::Release);
        // librbd also reports our own resize through the watch.
        self.tell(num_blocks);
        Ok(())
    }
    fn watch_size(&self, hook: ResizeHook) {
        *self.hook.lock().unwrap() = Some(hook);
    }
}

fn listener() -> ListenerConfig {
    ListenerConfig {
        trtype: TransportType::Tcp,
        adrfam: AddressFamily::Ipv4,
        traddr: "127.0.0.1".to_string(),
        trsvcid: "4420".to_string(),
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

fn done(e: Exec) -> Completion {
    match e {
        Exec::Complete(c) => c,
        other => panic!("expected a completion, got {other:?}"),
    }
}

fn connect(qp: &mut QueuePair, qid: u16, cntlid: u16) {
    let cmd = Command::connect(1, qid, 31, 0, if qid == 0 { 5000 } else { 0 });
    let mut data = ConnectData::new([7; 16], cntlid, NQN, HOST)
        .as_bytes()
        .to_vec();
    assert_eq!(done(qp.execute(&cmd, &mut data)).status(), Status::SUCCESS);
}

fn nsze(qp: &mut QueuePair) -> (u64, u64, u64) {
    let mut cmd = Command::new(AdminOpcode::Identify as u8, 10);
    cmd.set_nsid(1).set_cdw10(0);
    let mut buf = vec![0u8; 4096];
    assert_eq!(done(qp.execute(&cmd, &mut buf)).status(), Status::SUCCESS);
    let id = IdentifyNamespace::ref_from_bytes(&buf[..]).unwrap();
    (id.nsze.get(), id.ncap.get(), id.nuse.get())
}

fn changed_ns_log(qp: &mut QueuePair) -> Vec<u32> {
    let mut cmd = Command::new(AdminOpcode::GetLogPage as u8, 11);
    cmd.set_nsid(0xFFFF_FFFF).set_get_log_page(0x04, 4096, 0);
    let mut buf = vec![0u8; 4096];
    assert_eq!(done(qp.execute(&cmd, &mut buf)).status(), Status::SUCCESS);
    buf.chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .take_while(|&n| n != 0)
        .collect()
}

fn read_block(q: &mut QueuePair, lba: u64) -> Status {
    let mut cmd = Command::new(IoOpcode::Read as u8, 20);
    cmd.set_nsid(1).set_lba_range(lba, 1);
    let mut buf = vec![0u8; 512];
    match q.execute(&cmd, &mut buf) {
        Exec::Complete(c) | Exec::CompleteZeroData(c) => c.status(),
        other => panic!("read: {other:?}"),
    }
}

fn aer(qp: &mut QueuePair, cid: u16) {
    let e = qp.execute(
        &Command::new(AdminOpcode::AsyncEventRequest as u8, cid),
        &mut [],
    );
    assert_eq!(e, Exec::Pending);
}

fn events(qp: &mut QueuePair) -> Vec<Completion> {
    let mut got = Vec::new();
    qp.poll(Instant::now(), &mut |c| got.push(c));
    got
}

#[test]
fn namespace_follows_its_bdev_size() {
    let mut s = SubsystemConfig::new(NQN);
    s.allow_any_host = true;
    s.listeners = vec![listener()];
    let t = Target::from_config(&TargetConfig {
        transports: vec![TransportConfig::tcp_default()],
        subsystems: vec![s],
        ..Default::default()
    })
    .unwrap();
    let grow = Growable::new(1000);
    t.insert_backend("Grow0", grow.clone()).unwrap();
    t.add_namespace(NQN, &ns_cfg(1, "Grow0")).unwrap();
    let changes = t.take_size_changes().expect("first take");
    assert!(t.take_size_changes().is_none(), "taken once");

    let mut admin = QueuePair::new(t.clone(), port());
    connect(&mut admin, 0, 0xFFFF);
    let c = done(admin.execute(&Command::property_set(2, CC, false, 0x0046_0001), &mut []));
    assert_eq!(c.status(), Status::SUCCESS);
    let cntlid = admin.controller().unwrap().cntlid();
    let mut io = QueuePair::new(t.clone(), port());
    connect(&mut io, 1, cntlid);

    assert_eq!(nsze(&mut admin), (1000, 1000, 1000));
    assert_eq!(read_block(&mut io, 999), Status::SUCCESS);
    assert_eq!(
        read_block(&mut io, 1000),
        Status::LBA_OUT_OF_RANGE.with_dnr()
    );
    aer(&mut admin, 100);
    aer(&mut admin, 101);
    assert!(events(&mut admin).is_empty());

    // 1. Resized through the control plane.
    assert_eq!(
        t.resize_bdev("Grow0", 3000).unwrap(),
        vec![(NQN.to_string(), 1)]
    );
    let got = events(&mut admin);
    assert_eq!(got.len(), 1, "one Namespace Attribute Changed event");
    assert_eq!((got[0].cid(), got[0].dw0()), (100, 0x0004_0002));
    assert_eq!(nsze(&mut admin), (3000, 3000, 3000));
    assert_eq!(changed_ns_log(&mut admin), vec![1]);
    assert_eq!(read_block(&mut io, 2999), Status::SUCCESS);
    assert_eq!(
        read_block(&mut io, 3000),
        Status::LBA_OUT_OF_RANGE.with_dnr()
    );
    assert_eq!(t.bdev_num_blocks("Grow0"), Some(3000));

    // The backend's own report of that resize arrives as a message; applying
    // it changes nothing (same size): no second event.
    let echo: SizeChange = changes.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((echo.bdev.as_str(), echo.num_blocks), ("Grow0", 3000));
    assert!(t.apply_size_change(&echo).is_empty());
    assert!(events(&mut admin).is_empty());

    // 2. Resized elsewhere: the hook (another thread) only sends; the
    // control plane applies it.
    grow.grow_elsewhere(5000);
    assert_eq!(nsze(&mut admin), (3000, 3000, 3000), "not applied yet");
    let ch = changes.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(t.apply_size_change(&ch), vec![(NQN.to_string(), 1)]);
    let got = events(&mut admin);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].cid(), got[0].dw0()), (101, 0x0004_0002));
    assert_eq!(nsze(&mut admin), (5000, 5000, 5000));
    assert_eq!(changed_ns_log(&mut admin), vec![1]);
    assert_eq!(read_block(&mut io, 4999), Status::SUCCESS);

    // A late report of an older size does not take the size back: the
    // backend's current size is applied.
    let late = SizeChange {
        num_blocks: 3000,
        ..ch.clone()
    };
    assert!(t.apply_size_change(&late).is_empty());
    assert_eq!(nsze(&mut admin), (5000, 5000, 5000));

    // A report from a backend that no longer serves the bdev is dropped.
    let other: Arc<dyn Backend> = Growable::new(7);
    let stale = SizeChange {
        bdev: "Grow0".to_string(),
        backend: Arc::downgrade(&other),
        num_blocks: 7,
    };
    assert!(t.apply_size_change(&stale).is_empty());
    assert_eq!(nsze(&mut admin), (5000, 5000, 5000));

    // Backends of a fixed size refuse, naming themselves.
    t.insert_backend("Null0", Arc::new(NullBackend::new("Null0", 512, 8)))
        .unwrap();
    let e = t.resize_bdev("Null0", 16).unwrap_err().to_string();
    assert!(e.contains("null bdevs cannot be resized"), "{e}");
    assert!(t.resize_bdev("nope", 16).is_err());
}
