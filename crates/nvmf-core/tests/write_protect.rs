//! Write-protected namespaces: a namespace whose backend says it is
//! read-only (`Backend::read_only`, what a `read_only` rbd bdev or a
//! `readonly` file bdev reports) shows NSATTR bit 0 in Identify Namespace,
//! serves Read, answers Write, Write Zeroes and Dataset Management with
//! Deallocate with Namespace Is Write Protected (generic status 20h, DNR)
//! without reaching the backend, and answers Flush at once. A writable
//! namespace of the same subsystem is untouched. Uses a malloc bdev wrapped
//! so that it reports read-only (no Ceph needed) and counts what reaches it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use nvmf_config::{
    derive_namespace_ids, AddressFamily, ListenerConfig, NamespaceConfig, SubsystemConfig,
    TargetConfig, TransportConfig, TransportType,
};
use nvmf_core::backend::DsmRanges;
use nvmf_core::{
    Backend, BlockOp, CompletionSink, Exec, IoTag, MallocBackend, PortInfo, QueuePair, Submitted,
    Target,
};
use nvmf_wire::command::Command;
use nvmf_wire::completion::Completion;
use nvmf_wire::fabrics::{ConnectData, CC};
use nvmf_wire::identify::{IdentifyNamespace, NSATTR_WRITE_PROTECTED};
use nvmf_wire::opcode::{AdminOpcode, IoOpcode};
use nvmf_wire::status::Status;
use nvmf_wire::zerocopy::{FromBytes, IntoBytes};

const NQN: &str = "nqn.2024-01.io.nvmfd:ro";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000ab";

/// A malloc bdev that reports read-only and counts the modifying
/// operations that reach it (there must be none).
#[derive(Debug)]
struct ReadOnlyMalloc {
    inner: MallocBackend,
    modifying: AtomicUsize,
}

impl Backend for ReadOnlyMalloc {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn kind(&self) -> &'static str {
        "malloc"
    }
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.inner.num_blocks()
    }
    fn deallocate_reads_zeroes(&self) -> bool {
        self.inner.deallocate_reads_zeroes()
    }
    fn read_only(&self) -> bool {
        true
    }
    fn submit(&self, op: BlockOp<'_>, tag: IoTag, sink: &Arc<CompletionSink>) -> Submitted {
        if matches!(op, BlockOp::Write { .. } | BlockOp::WriteZeroes { .. }) {
            self.modifying.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.submit(op, tag, sink)
    }
    fn deallocate(&self, r: DsmRanges<'_>, t: IoTag, s: &Arc<CompletionSink>) -> Submitted {
        self.modifying.fetch_add(1, Ordering::Relaxed);
        self.inner.deallocate(r, t, s)
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
        peer: "127.0.0.1:50001".parse::<SocketAddr>().unwrap(),
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

fn status(e: Exec) -> Status {
    match e {
        Exec::Complete(c) | Exec::CompleteZeroData(c) => c.status(),
        other => panic!("expected a completion, got {other:?}"),
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

fn nsattr(qp: &mut QueuePair, nsid: u32) -> u8 {
    let mut cmd = Command::new(AdminOpcode::Identify as u8, 10);
    cmd.set_nsid(nsid).set_cdw10(0);
    let mut buf = vec![0u8; 4096];
    assert_eq!(done(qp.execute(&cmd, &mut buf)).status(), Status::SUCCESS);
    IdentifyNamespace::ref_from_bytes(&buf[..]).unwrap().nsattr
}

fn io(q: &mut QueuePair, op: IoOpcode, nsid: u32, data: &mut [u8]) -> Status {
    let mut cmd = Command::new(op as u8, 20);
    cmd.set_nsid(nsid);
    match op {
        IoOpcode::Read | IoOpcode::Write | IoOpcode::WriteZeroes => {
            cmd.set_lba_range(0, 1);
        }
        _ => {}
    }
    status(q.execute(&cmd, data))
}

/// Dataset Management of one range (LBA 0, 1 block), Deallocate or not.
fn dsm(q: &mut QueuePair, nsid: u32, deallocate: bool) -> Status {
    let mut cmd = Command::new(IoOpcode::DatasetManagement as u8, 21);
    cmd.set_nsid(nsid)
        .set_cdw10(0)
        .set_cdw11(if deallocate { 1 << 2 } else { 1 });
    let mut range = [0u8; 16];
    range[4..8].copy_from_slice(&1u32.to_le_bytes());
    status(q.execute(&cmd, &mut range))
}

#[test]
fn read_only_backend_makes_a_write_protected_namespace() {
    let mut s = SubsystemConfig::new(NQN);
    s.allow_any_host = true;
    s.listeners = vec![listener()];
    let t = Target::from_config(&TargetConfig {
        transports: vec![TransportConfig::tcp_default()],
        subsystems: vec![s],
        ..Default::default()
    })
    .unwrap();
    let ro = Arc::new(ReadOnlyMalloc {
        inner: MallocBackend::new("Ro0", 512, 64).unwrap(),
        modifying: AtomicUsize::new(0),
    });
    t.insert_backend("Ro0", ro.clone()).unwrap();
    t.insert_backend("Rw0", Arc::new(MallocBackend::new("Rw0", 512, 64).unwrap()))
        .unwrap();
    t.add_namespace(NQN, &ns_cfg(1, "Ro0")).unwrap();
    t.add_namespace(NQN, &ns_cfg(2, "Rw0")).unwrap();

    let mut admin = QueuePair::new(t.clone(), port());
    connect(&mut admin, 0, 0xFFFF);
    let c = done(admin.execute(&Command::property_set(2, CC, false, 0x0046_0001), &mut []));
    assert_eq!(c.status(), Status::SUCCESS);
    let cntlid = admin.controller().unwrap().cntlid();
    let mut q = QueuePair::new(t.clone(), port());
    connect(&mut q, 1, cntlid);

    assert_eq!(nsattr(&mut admin, 1), NSATTR_WRITE_PROTECTED);
    assert_eq!(nsattr(&mut admin, 2), 0, "the writable namespace");

    let protected = Status::NS_WRITE_PROTECTED.with_dnr();
    assert_eq!((protected.sct, protected.sc), (0, 0x20));
    let mut block = vec![0xA5u8; 512];
    assert_eq!(io(&mut q, IoOpcode::Write, 1, &mut block), protected);
    assert_eq!(io(&mut q, IoOpcode::WriteZeroes, 1, &mut []), protected);
    assert_eq!(dsm(&mut q, 1, true), protected);
    assert_eq!(ro.modifying.load(Ordering::Relaxed), 0, "none reached it");
    // What does not modify the namespace is served.
    assert_eq!(dsm(&mut q, 1, false), Status::SUCCESS, "a hint only");
    assert_eq!(io(&mut q, IoOpcode::Flush, 1, &mut []), Status::SUCCESS);
    let mut read = vec![0xFFu8; 512];
    assert_eq!(io(&mut q, IoOpcode::Read, 1, &mut read), Status::SUCCESS);
    assert!(read.iter().all(|&b| b == 0), "malloc reads zeroes");

    // The writable namespace beside it takes writes.
    assert_eq!(io(&mut q, IoOpcode::Write, 2, &mut block), Status::SUCCESS);
    assert_eq!(io(&mut q, IoOpcode::Read, 2, &mut read), Status::SUCCESS);
    assert_eq!(read, block);
    assert_eq!(
        io(&mut q, IoOpcode::WriteZeroes, 2, &mut []),
        Status::SUCCESS
    );
    assert_eq!(dsm(&mut q, 2, true), Status::SUCCESS);
}
