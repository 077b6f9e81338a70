//! What in-process tests of the request engine and the transports build around a
//! [`model::single_namespace`](crate::model::single_namespace) target: the target itself, the
//! `PortInfo` of a connection to its listener, request-engine limits like an NVMe/RDMA
//! queue's (4 KiB in-capsule data on both queues, 128 KiB MDTS, a 64 MiB buffer budget), and
//! the I/O commands such tests send.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use nvmf_config::{AddressFamily, BdevKind, TransportType};
use nvmf_core::request::{BufPolicy, RequestParams};
use nvmf_core::{PortInfo, Target, TransportCaps};
use nvmf_wire::command::{Command, SglDescriptor};
use nvmf_wire::opcode::IoOpcode;

use crate::model::{single_namespace, TRADDR, TRSVCID};

/// The peer address of [`port`].
pub const PEER: &str = "192.0.2.2:50000";

/// A target serving [`single_namespace`] (subsystem `nqn`, namespace 1 on a `kind` bdev of
/// `num_blocks` × `block_size`, listening over `trtype`).
pub fn target(
    nqn: &str,
    trtype: TransportType,
    kind: BdevKind,
    block_size: u32,
    num_blocks: u64,
) -> Arc<Target> {
    let cfg = single_namespace(nqn, trtype, "Ram", kind, block_size, num_blocks);
    Target::from_config(&cfg).expect("target from the single-namespace model")
}

/// A connection from [`PEER`] to the model's listener over `trtype`, with `caps`.
pub fn port(trtype: TransportType, caps: TransportCaps) -> Arc<PortInfo> {
    Arc::new(PortInfo {
        trtype,
        adrfam: AddressFamily::Ipv4,
        traddr: TRADDR.to_string(),
        trsvcid: TRSVCID.to_string(),
        peer: PEER.parse::<SocketAddr>().expect("peer address"),
        tls: None,
        caps,
    })
}

/// Keyed SGLs and one data descriptor (NVMe/RDMA's capabilities).
pub const KEYED_CAPS: TransportCaps = TransportCaps {
    keyed_sgls: true,
    msdbd: 1,
};

/// Request-engine limits of an NVMe/RDMA queue: at most `max_fetch_bytes` of host data being
/// fetched at once, and a fetch whose data is not all there after `fetch_timeout` closes the
/// queue ("RDMA READ timeout").
pub fn rdma_request_params(max_fetch_bytes: u32, fetch_timeout: Duration) -> RequestParams {
    RequestParams {
        in_capsule_data_size: 4096,
        admin_in_capsule_data_size: 4096,
        max_io_size: 131_072,
        buffers: BufPolicy::new(64 << 20, 4096, 131_072),
        max_fetch_bytes,
        fetch_timeout,
        fetch_timeout_name: "RDMA READ timeout",
    }
}

/// Read or Write (`op`) of `nlb` blocks at `slba` of namespace 1, its data described by `sgl`.
pub fn rw(op: IoOpcode, cid: u16, slba: u64, nlb: u32, sgl: SglDescriptor) -> Command {
    let mut c = Command::new(op as u8, cid);
    c.set_nsid(1).set_lba_range(slba, nlb).set_sgl(sgl);
    c
}
