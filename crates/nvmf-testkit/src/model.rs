//! Configuration models for in-process tests of the core and the transports: one subsystem
//! with one namespace on one bdev, listening on a documentation address (192.0.2.1:4420) of a
//! given transport type, so a test's `PortInfo` on that address may connect.

use nvmf_config::{
    derive_namespace_ids, AddressFamily, BdevConfig, BdevKind, ListenerConfig, NamespaceConfig,
    SubsystemConfig, TargetConfig, TransportConfig, TransportType,
};

/// The listener address of [`single_namespace`].
pub const TRADDR: &str = "192.0.2.1";
/// The listener port of [`single_namespace`].
pub const TRSVCID: &str = "4420";

/// Subsystem `nqn` (any host allowed) with namespace 1 on bdev `bdev` (`kind`,
/// `block_size` × `num_blocks`), listening on [`TRADDR`]:[`TRSVCID`] over `trtype`; both
/// transports configured with SPDK's defaults.
pub fn single_namespace(
    nqn: &str,
    trtype: TransportType,
    bdev: &str,
    kind: BdevKind,
    block_size: u32,
    num_blocks: u64,
) -> TargetConfig {
    let mut s = SubsystemConfig::new(nqn);
    s.allow_any_host = true;
    s.listeners = vec![ListenerConfig {
        trtype,
        adrfam: AddressFamily::Ipv4,
        traddr: TRADDR.to_string(),
        trsvcid: TRSVCID.to_string(),
    }];
    let ids = derive_namespace_ids(nqn, 1, bdev, None);
    s.namespaces = vec![NamespaceConfig {
        nsid: 1,
        bdev_name: bdev.to_string(),
        nguid: ids.nguid,
        eui64: ids.eui64,
        uuid: ids.uuid,
        anagrpid: 1,
        ptpl_file: None,
    }];
    TargetConfig {
        bdevs: vec![BdevConfig {
            name: bdev.to_string(),
            kind,
            block_size,
            num_blocks,
            uuid: None,
            file: None,
            rbd: None,
        }],
        transports: vec![
            TransportConfig::tcp_default(),
            TransportConfig::rdma_default(),
        ],
        subsystems: vec![s],
        ..TargetConfig::default()
    }
}
