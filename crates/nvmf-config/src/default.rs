//! Owns the embedded default configuration: what nvmfd serves when started
//! without `-c` (docs/DESIGN.md "Defaults"). `examples/default.json` is the
//! same configuration as a file; a test keeps the two equal.

use crate::ids::derive_namespace_ids;
use crate::{
    AddressFamily, BdevConfig, BdevKind, ListenerConfig, NamespaceConfig, SubsystemConfig,
    TargetConfig, TransportConfig, TransportType,
};

/// NQN of the default subsystem.
pub const DEFAULT_SUBSYSTEM_NQN: &str = "nqn.2024-01.io.nvmfd:default";

pub(crate) fn embedded_default() -> TargetConfig {
    let listener = ListenerConfig {
        trtype: TransportType::Tcp,
        adrfam: AddressFamily::Ipv4,
        traddr: "127.0.0.1".to_string(),
        trsvcid: "4420".to_string(),
    };
    let ids = derive_namespace_ids(DEFAULT_SUBSYSTEM_NQN, 1, "Malloc0", None);
    let mut sub = SubsystemConfig::new(DEFAULT_SUBSYSTEM_NQN);
    sub.serial_number = "NVMFD0000000001".to_string();
    sub.model_number = "nvmfd RAM disk".to_string();
    sub.allow_any_host = true;
    sub.namespaces.push(NamespaceConfig {
        nsid: 1,
        bdev_name: "Malloc0".to_string(),
        nguid: ids.nguid,
        eui64: ids.eui64,
        uuid: ids.uuid,
        anagrpid: 1,
        ptpl_file: None,
    });
    sub.listeners.push(listener.clone());
    TargetConfig {
        rbd_clusters: Vec::new(),
        bdevs: vec![BdevConfig {
            name: "Malloc0".to_string(),
            kind: BdevKind::Malloc,
            file: None,
            rbd: None,
            block_size: 512,
            num_blocks: (1u64 << 30) / 512,
            uuid: None,
        }],
        transports: vec![TransportConfig::tcp_default()],
        subsystems: vec![sub],
        discovery_listeners: vec![listener],
        secure_discovery_listeners: Vec::new(),
        skipped: Vec::new(),
        ignored_params: Vec::new(),
        keyring: Vec::new(),
        dhchap_digests: None,
        dhchap_dhgroups: None,
        bdev_qos: Default::default(),
    }
}
