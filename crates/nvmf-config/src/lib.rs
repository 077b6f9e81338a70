//! nvmf-config: owns nvmfd's configuration model (`TargetConfig` and the types
//! it holds) and its JSON form, which is the shape SPDK's `save_config` RPC
//! writes (`{"subsystems":[{"subsystem":"bdev","config":[{"method":..,"params":..}]}]}`).
//!
//! * [`TargetConfig::from_json_str`] / [`load_file`] parse and validate a file:
//!   either a complete new `TargetConfig` comes back or a [`ConfigError`] that
//!   names the config entry, the SPDK method, the parameter and the problem.
//! * [`TargetConfig::to_json_value`] / [`TargetConfig::to_json_string_pretty`]
//!   write the same shape back (derived namespace identifiers included), so
//!   save → load → save is byte-identical.
//! * [`TargetConfig::embedded_default`] is what nvmfd serves without `-c`.
//! * `format.rs`: the file format version nvmfd writes into its own files
//!   (`"nvmfd": {"format": N}`); a newer format is refused, naming both versions.
//!
//! Method and parameter names are SPDK's (`bdev_malloc_create`,
//! `nvmf_create_transport`, `nvmf_subsystem_add_ns`, ...). Entries that only
//! tune SPDK internals are skipped and listed in [`TargetConfig::skipped`];
//! SPDK parameters nvmfd accepts but does not act on are listed in
//! [`TargetConfig::ignored_params`]. Anything that would change what is
//! exported but that nvmfd cannot honour is an error.
//!
//! Defaults follow SPDK (TCP and RDMA transports: queue depth 128, 127 I/O
//! queues, 4 KiB in-capsule data, 128 KiB max I/O; subsystem serial
//! `00000000000000000000`, 32 namespaces, cntlid 1..=0xFFEF), except the
//! default model number, which is nvmfd's own: [`DEFAULT_MODEL_NUMBER`].

mod default;
mod error;
mod file_bdev;
mod format;
mod ids;
mod keyring;
mod nqn;
mod params;
mod parse;
mod qos;
mod rbd_bdev;
mod write;

use std::collections::BTreeMap;
use std::path::Path;

pub use default::DEFAULT_SUBSYSTEM_NQN;
pub use error::ConfigError;
pub use file_bdev::{probe as probe_file, Probe as FileProbe, FILE_BLOCK_SIZES};
pub use format::{format_object, with_format, FORMAT_KEY, FORMAT_VERSION};
pub use ids::{
    derive_namespace_ids, format_eui64, format_nguid, format_uuid, parse_eui64, parse_nguid,
    parse_uuid, random_namespace_ids, NamespaceIds, Uuid16,
};
pub use keyring::{read_key_file, HostDhchapKeys, KeyringKey, DHCHAP_DHGROUPS, DHCHAP_DIGESTS};
pub use nqn::{validate_nqn, DISCOVERY_NQN, NQN_MAX_LEN};
pub use parse::{ignored_param_names, SKIPPED_METHODS};
pub use qos::{round_ios_per_sec, QosLimits, QOS_IOS_GRANULE, QOS_MAX_MBYTES_PER_SEC};
pub use rbd_bdev::{
    cluster_info as rbd_cluster_info, driver_specific as rbd_driver_specific,
    RBD_DEFAULT_BLOCK_SIZE,
};

/// Default serial number of a subsystem created without `serial_number` (SPDK's).
pub const DEFAULT_SERIAL_NUMBER: &str = "00000000000000000000";
/// Default model number of a subsystem created without `model_number`.
/// SPDK uses "SPDK bdev Controller"; nvmfd reports its own name instead.
pub const DEFAULT_MODEL_NUMBER: &str = "nvmfd Controller";
/// `max_namespaces` when absent or 0 (SPDK's default).
pub const DEFAULT_MAX_NAMESPACES: u32 = 32;
/// Lowest controller ID handed out by default.
pub const DEFAULT_MIN_CNTLID: u16 = 1;
/// Highest controller ID allowed by the NVMe spec (0xFFF0.. are reserved).
pub const DEFAULT_MAX_CNTLID: u16 = 0xFFEF;
/// Longest serial number (Identify Controller SN field).
pub const SERIAL_NUMBER_MAX_LEN: usize = 20;
/// Longest model number (Identify Controller MN field).
pub const MODEL_NUMBER_MAX_LEN: usize = 40;

/// The whole target: what nvmfd exports and how.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TargetConfig {
    /// Ceph clusters registered with `bdev_rbd_register_cluster`, in
    /// registration order (before the bdevs that use them).
    pub rbd_clusters: Vec<RbdCluster>,
    /// Block devices, in creation order; names are unique.
    pub bdevs: Vec<BdevConfig>,
    /// Transports (at most one per type: TCP, RDMA).
    pub transports: Vec<TransportConfig>,
    /// NVM subsystems, in creation order (never the discovery NQN).
    pub subsystems: Vec<SubsystemConfig>,
    /// Listeners added to the well-known discovery NQN.
    pub discovery_listeners: Vec<ListenerConfig>,
    /// Discovery listeners added with `secure_channel` (a subset).
    pub secure_discovery_listeners: Vec<ListenerConfig>,
    /// Entries skipped because they only tune SPDK internals, one per entry, as
    /// `"<subsystem section>/<method>"`, e.g. `"sock/sock_impl_set_options"`.
    pub skipped: Vec<String>,
    /// SPDK parameters that were present and accepted but that nvmfd does not
    /// act on, as `"<method>.<parameter>"`, each listed once, in first-seen order.
    pub ignored_params: Vec<String>,
    /// The file keyring (`keyring_file_add_key`): names and paths, never
    /// the keys themselves.
    pub keyring: Vec<KeyringKey>,
    /// DH-HMAC-CHAP digests the target allows (`nvmf_set_config
    /// dhchap_digests`); `None`: all.
    pub dhchap_digests: Option<Vec<String>>,
    /// DH-HMAC-CHAP DH groups the target allows (`nvmf_set_config
    /// dhchap_dhgroups`); `None`: all.
    pub dhchap_dhgroups: Option<Vec<String>>,
    /// QoS rate limits by bdev name (`bdev_set_qos_limit`); only bdevs
    /// with at least one limit, each naming a bdev in `bdevs`.
    pub bdev_qos: std::collections::BTreeMap<String, QosLimits>,
}

/// A block device (SPDK bdev) that namespaces are backed by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BdevConfig {
    pub name: String,
    pub kind: BdevKind,
    /// Logical block size in bytes: a power of two in 512..=4096.
    pub block_size: u32,
    /// Number of logical blocks (> 0).
    pub num_blocks: u64,
    pub uuid: Option<Uuid16>,
    /// File / block-device details; `Some` exactly when `kind` is
    /// [`BdevKind::File`]. `block_size` and `num_blocks` above are then the
    /// values resolved at load (given or detected block size, size of the
    /// file or device divided by it).
    pub file: Option<FileBdev>,
    /// Ceph RBD details; `Some` exactly when `kind` is [`BdevKind::Rbd`].
    /// `num_blocks` above is then 0 until the image has been opened (the
    /// size lives in the cluster, not in the configuration).
    pub rbd: Option<RbdBdev>,
}

/// A Ceph RBD image (`bdev_rbd_create`; SPDK's parameter names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdBdev {
    /// RADOS pool holding the image.
    pub pool_name: String,
    /// Image name inside the pool.
    pub rbd_name: String,
    /// Ceph client id (without "client."); `None`: librados' default
    /// ("admin"). Ignored when `cluster_name` names a registered cluster.
    pub user_id: Option<String>,
    /// Extra Ceph configuration (key → value), applied after the config
    /// file; e.g. `mon_host`, `key`, `rbd_cache`.
    pub config_param: BTreeMap<String, String>,
    /// A cluster registered with `bdev_rbd_register_cluster` whose
    /// connection this bdev shares; `None`: the bdev opens its own.
    pub cluster_name: Option<String>,
    /// Open the image read-only (`read_only`, rpc.py's `-r/--readonly`):
    /// namespaces on it are write-protected.
    pub read_only: bool,
}

/// A Ceph cluster connection registered with `bdev_rbd_register_cluster`
/// (SPDK's parameter names); rbd bdevs that name it share one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdCluster {
    /// Registration name (what `cluster_name` refers to).
    pub name: String,
    /// Ceph client id (without "client.").
    pub user_id: Option<String>,
    /// Extra Ceph configuration (key → value), applied after `config_file`.
    pub config_param: BTreeMap<String, String>,
    /// ceph.conf to read (`None`: librados' default search).
    pub config_file: Option<String>,
    /// Keyring file to use.
    pub key_file: Option<String>,
}

/// A bdev backed by a regular file or a block device (`bdev_uring_create`,
/// `bdev_aio_create`; both are served by nvmfd's io_uring backend).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileBdev {
    /// Path of the file or block device, as given.
    pub filename: String,
    /// Serve reads only; writes fail with Namespace Is Write Protected.
    pub readonly: bool,
    /// Use fallocate(2) for Deallocate (punch hole) and Write Zeroes
    /// (zero range). `bdev_aio_create`'s `fallocate` (default false);
    /// always true for `bdev_uring_create`.
    pub fallocate: bool,
    /// The file is a block device (size and logical block size from the
    /// kernel) rather than a regular file.
    pub is_block_device: bool,
    /// Logical block size of the underlying device (block devices: the
    /// device's; files: 512). `block_size` is never smaller.
    pub device_block_size: u32,
}

impl BdevConfig {
    /// The bdev serves reads only (a `readonly` file bdev, a `read_only`
    /// rbd bdev): namespaces on it are write-protected.
    pub fn read_only(&self) -> bool {
        self.file.as_ref().is_some_and(|f| f.readonly)
            || self.rbd.as_ref().is_some_and(|r| r.read_only)
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.num_blocks.saturating_mul(u64::from(self.block_size))
    }
}

/// Backend type of a bdev.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BdevKind {
    /// RAM-backed (`bdev_malloc_create`).
    Malloc,
    /// Discards writes, reads zeroes (`bdev_null_create`).
    Null,
    /// A file or block device ([`BdevConfig::file`] holds the details); the
    /// method it was created with is kept so save_config writes it back.
    File(FileMethod),
    /// A Ceph RBD image ([`BdevConfig::rbd`] holds the details;
    /// `bdev_rbd_create`).
    Rbd,
}

/// Which SPDK method created a file bdev.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileMethod {
    /// `bdev_uring_create`.
    Uring,
    /// `bdev_aio_create`.
    Aio,
}

impl BdevKind {
    /// The SPDK method that creates this kind of bdev.
    pub fn create_method(self) -> &'static str {
        match self {
            BdevKind::Malloc => "bdev_malloc_create",
            BdevKind::Null => "bdev_null_create",
            BdevKind::File(FileMethod::Uring) => "bdev_uring_create",
            BdevKind::File(FileMethod::Aio) => "bdev_aio_create",
            BdevKind::Rbd => "bdev_rbd_create",
        }
    }
}

/// NVMe-oF transport type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportType {
    Tcp,
    /// NVMe/RDMA (RoCE, InfiniBand, iWARP).
    Rdma,
}

impl TransportType {
    /// SPDK's spelling (`"TCP"`, `"RDMA"`).
    pub fn as_str(self) -> &'static str {
        match self {
            TransportType::Tcp => "TCP",
            TransportType::Rdma => "RDMA",
        }
    }

    /// Parses SPDK's trtype string (case-insensitive). `None` for transports
    /// nvmfd does not implement (VFIOUSER, PCIe, FC, ...).
    pub fn parse(s: &str) -> Option<TransportType> {
        if s.eq_ignore_ascii_case("tcp") {
            Some(TransportType::Tcp)
        } else if s.eq_ignore_ascii_case("rdma") {
            Some(TransportType::Rdma)
        } else {
            None
        }
    }
}

impl std::fmt::Display for TransportType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Transport options (`nvmf_create_transport`), SPDK's names and defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportConfig {
    pub trtype: TransportType,
    /// Largest I/O queue size a host may create (entries).
    pub max_queue_depth: u16,
    /// I/O queues per controller (SPDK's `max_qpairs_per_ctrlr - 1`).
    pub max_io_qpairs_per_ctrlr: u16,
    /// In-capsule data size in bytes (IOCCSZ is derived from it).
    pub in_capsule_data_size: u32,
    /// Largest single I/O in bytes (MDTS is derived from it).
    pub max_io_size: u32,
    /// Buffer unit size in bytes.
    pub io_unit_size: u32,
    /// Largest admin queue size (entries).
    pub max_aq_depth: u16,
    /// Send C2HData with the SUCCESS flag and skip the response capsule
    /// (NVMe/TCP only; always false for RDMA).
    pub c2h_success: bool,
    /// Data buffer budget in units of `io_unit_size` (SPDK's shared buffer
    /// pool). In nvmfd: all request slot buffers larger than the in-capsule
    /// data size, across every connection, share
    /// `num_shared_buffers × io_unit_size` bytes (see nvmf-tcp).
    pub num_shared_buffers: u32,
    /// The NVMe/RDMA-only options: `Some` exactly when `trtype` is RDMA.
    pub rdma: Option<RdmaOptions>,
}

/// Options only the RDMA transport has (`nvmf_create_transport`, SPDK's
/// names and defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaOptions {
    /// Receive entries of the shared receive queue of each poller
    /// (`max_srq_depth`, `-s`).
    pub max_srq_depth: u32,
    /// Give every queue pair its own receive queue even on devices with
    /// shared receive queues (`no_srq`, `-r`).
    pub no_srq: bool,
    /// Completion queue entries per poller; used when there is no shared
    /// receive queue (`num_cqe`, `-d`).
    pub num_cqe: u32,
    /// Connection requests the RDMA CM listener queues before refusing
    /// (`acceptor_backlog`, `-l`).
    pub acceptor_backlog: u32,
    /// Post every work request on its own instead of chaining them
    /// (`no_wr_batching`, `-w`).
    pub no_wr_batching: bool,
}

impl Default for RdmaOptions {
    /// SPDK's RDMA defaults.
    fn default() -> Self {
        RdmaOptions {
            max_srq_depth: 4096,
            no_srq: false,
            num_cqe: 4096,
            acceptor_backlog: 100,
            no_wr_batching: false,
        }
    }
}

impl TransportConfig {
    /// TCP transport with SPDK's defaults.
    pub fn tcp_default() -> TransportConfig {
        TransportConfig {
            trtype: TransportType::Tcp,
            max_queue_depth: 128,
            max_io_qpairs_per_ctrlr: 127,
            in_capsule_data_size: 4096,
            max_io_size: 131_072,
            io_unit_size: 131_072,
            max_aq_depth: 128,
            c2h_success: true,
            num_shared_buffers: 511,
            rdma: None,
        }
    }

    /// RDMA transport with SPDK's defaults (lib/nvmf/rdma.c: queue depth
    /// 128, 127 I/O queues, 4 KiB in-capsule data, 128 KiB max I/O in
    /// 8 KiB units, admin queue 128, 4095 shared buffers, SRQ depth 4096,
    /// 4096 CQ entries, backlog 100, work request batching on).
    pub fn rdma_default() -> TransportConfig {
        TransportConfig {
            trtype: TransportType::Rdma,
            max_queue_depth: 128,
            max_io_qpairs_per_ctrlr: 127,
            in_capsule_data_size: 4096,
            max_io_size: 131_072,
            io_unit_size: 8192,
            max_aq_depth: 128,
            c2h_success: false,
            num_shared_buffers: 4095,
            rdma: Some(RdmaOptions::default()),
        }
    }

    /// The `nvmf_create_transport` params that recreate this transport
    /// (what save_config writes; also the shape of `nvmf_get_transports`).
    pub fn to_json_params(&self) -> serde_json::Value {
        write::transport_params(self)
    }

    /// SPDK's defaults for a transport of this type.
    pub fn default_for(trtype: TransportType) -> TransportConfig {
        match trtype {
            TransportType::Tcp => TransportConfig::tcp_default(),
            TransportType::Rdma => TransportConfig::rdma_default(),
        }
    }
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig::tcp_default()
    }
}

/// An NVM subsystem (`nvmf_create_subsystem` plus its hosts, namespaces and listeners).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsystemConfig {
    pub nqn: String,
    /// Printable ASCII, at most 20 characters.
    pub serial_number: String,
    /// Printable ASCII, at most 40 characters.
    pub model_number: String,
    pub allow_any_host: bool,
    /// Allowed host NQNs (`nvmf_subsystem_add_host`), in order, unique.
    pub hosts: Vec<String>,
    /// DH-HMAC-CHAP key names of hosts that must authenticate (a subset of
    /// `hosts`; `nvmf_subsystem_add_host dhchap_key`, `nvmf_subsystem_set_keys`).
    pub host_keys: std::collections::BTreeMap<String, HostDhchapKeys>,
    /// TLS PSK key names of hosts (`nvmf_subsystem_add_host psk`): host NQN →
    /// keyring key holding a `NVMeTLSkey-1:xx:...:` PSK (a subset of `hosts`).
    pub host_psks: std::collections::BTreeMap<String, String>,
    /// Highest NSID (and Identify Controller NN); never 0 after load.
    pub max_namespaces: u32,
    /// Asymmetric Namespace Access reporting (`-r/--ana-reporting`): CMIC
    /// bit 3, the ANA log page, ANA Change events and ANA statuses on I/O.
    pub ana_reporting: bool,
    /// ANA states set per listener (`nvmf_subsystem_add_listener
    /// ana_state`, `nvmf_subsystem_listener_set_ana_state`), in the order
    /// they were set; what no entry names is optimized. See [`Self::ana_state`].
    pub ana_states: Vec<AnaStateEntry>,
    /// Controller IDs are handed out from `min_cntlid..=max_cntlid`.
    pub min_cntlid: u16,
    pub max_cntlid: u16,
    /// Namespaces, in the order they were added.
    pub namespaces: Vec<NamespaceConfig>,
    pub listeners: Vec<ListenerConfig>,
    /// Listeners added with `secure_channel` (a subset of `listeners`): a
    /// host must speak TLS 1.3 there.
    pub secure_listeners: Vec<ListenerConfig>,
    /// Per-host namespace visibility (docs/VISIBILITY.md): the NSIDs of the
    /// namespaces added with `no_auto_visible`, each with the hosts that see
    /// it (`nvmf_ns_add_host`, in the order they were added, unique). A
    /// namespace absent from this map is visible to every host.
    pub ns_visibility: std::collections::BTreeMap<u32, Vec<String>>,
}

impl SubsystemConfig {
    /// A subsystem with SPDK's defaults and nothing in it.
    pub fn new(nqn: impl Into<String>) -> SubsystemConfig {
        SubsystemConfig {
            nqn: nqn.into(),
            serial_number: DEFAULT_SERIAL_NUMBER.to_string(),
            model_number: DEFAULT_MODEL_NUMBER.to_string(),
            allow_any_host: false,
            hosts: Vec::new(),
            host_keys: std::collections::BTreeMap::new(),
            host_psks: std::collections::BTreeMap::new(),
            max_namespaces: DEFAULT_MAX_NAMESPACES,
            ana_reporting: false,
            ana_states: Vec::new(),
            min_cntlid: DEFAULT_MIN_CNTLID,
            max_cntlid: DEFAULT_MAX_CNTLID,
            namespaces: Vec::new(),
            listeners: Vec::new(),
            secure_listeners: Vec::new(),
            ns_visibility: std::collections::BTreeMap::new(),
        }
    }

    /// The namespace with this NSID.
    pub fn namespace(&self, nsid: u32) -> Option<&NamespaceConfig> {
        self.namespaces.iter().find(|ns| ns.nsid == nsid)
    }

    /// Whether namespace `nsid` was added with `no_auto_visible` (only the
    /// hosts `nvmf_ns_add_host` named see it).
    pub fn ns_no_auto_visible(&self, nsid: u32) -> bool {
        self.ns_visibility.contains_key(&nsid)
    }

    /// Whether `hostnqn` sees namespace `nsid` (every host does unless the
    /// namespace is `no_auto_visible`).
    pub fn ns_visible_to(&self, nsid: u32, hostnqn: &str) -> bool {
        self.ns_visibility
            .get(&nsid)
            .is_none_or(|hosts| hosts.iter().any(|h| h == hostnqn))
    }

    /// Whether `hostnqn` may connect.
    pub fn host_allowed(&self, hostnqn: &str) -> bool {
        self.allow_any_host || self.hosts.iter().any(|h| h == hostnqn)
    }

    /// ANA group IDs run from 1 to this (ANAGRPMAX = NANAGRPID, as SPDK:
    /// one possible group per NSID).
    pub fn ana_group_max(&self) -> u32 {
        self.max_namespaces
    }

    /// The ANA state of group `anagrpid` reached through listener `l`: the
    /// last entry naming that group, else the listener's all-groups entry,
    /// else optimized.
    pub fn ana_state(&self, l: &ListenerConfig, anagrpid: u32) -> AnaState {
        let mut all = AnaState::Optimized;
        for e in self.ana_states.iter().filter(|e| &e.listener == l) {
            match e.anagrpid {
                Some(g) if g == anagrpid => return e.state,
                Some(_) => {}
                None => all = e.state,
            }
        }
        all
    }

    /// Record an ANA state for listener `l`: for one group, or for every
    /// group (`None`, which replaces the listener's earlier entries).
    pub fn set_ana_state(&mut self, l: &ListenerConfig, anagrpid: Option<u32>, state: AnaState) {
        match anagrpid {
            None => {
                self.ana_states.retain(|e| &e.listener != l);
                if state != AnaState::Optimized {
                    self.ana_states.push(AnaStateEntry {
                        listener: l.clone(),
                        anagrpid: None,
                        state,
                    });
                }
            }
            Some(g) => {
                self.ana_states
                    .retain(|e| !(&e.listener == l && e.anagrpid == Some(g)));
                let base = self.ana_state(l, 0);
                if state != base {
                    self.ana_states.push(AnaStateEntry {
                        listener: l.clone(),
                        anagrpid: Some(g),
                        state,
                    });
                }
            }
        }
        // One canonical order (listener, then all-groups before single groups),
        // so equal states compare equal however they were reached.
        self.ana_states.sort_by(|a, b| {
            let key = |e: &AnaStateEntry| {
                (
                    e.listener.traddr.clone(),
                    e.listener.trsvcid.clone(),
                    e.listener.adrfam.as_str(),
                    e.anagrpid,
                )
            };
            key(a).cmp(&key(b))
        });
    }

    /// Forget the ANA states of a removed listener.
    pub fn forget_ana_states(&mut self, l: &ListenerConfig) {
        self.ana_states.retain(|e| &e.listener != l);
    }
}

/// One ANA state setting of a listener (see [`SubsystemConfig::ana_state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnaStateEntry {
    pub listener: ListenerConfig,
    /// `None`: every group of the subsystem.
    pub anagrpid: Option<u32>,
    pub state: AnaState,
}

/// Asymmetric Namespace Access state of a group through one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnaState {
    Optimized,
    NonOptimized,
    Inaccessible,
    /// nvmfd extension (SPDK's RPC takes only the first three).
    PersistentLoss,
    /// nvmfd extension: a transition in progress (hosts wait up to ANATT).
    Change,
}

impl AnaState {
    /// Every state, in the order of their names.
    pub const ALL: [AnaState; 5] = [
        AnaState::Optimized,
        AnaState::NonOptimized,
        AnaState::Inaccessible,
        AnaState::PersistentLoss,
        AnaState::Change,
    ];

    /// SPDK's spelling: `optimized`, `non_optimized`, `inaccessible`,
    /// `persistent_loss`, `change`.
    pub fn as_str(self) -> &'static str {
        match self {
            AnaState::Optimized => "optimized",
            AnaState::NonOptimized => "non_optimized",
            AnaState::Inaccessible => "inaccessible",
            AnaState::PersistentLoss => "persistent_loss",
            AnaState::Change => "change",
        }
    }

    /// Parses [`Self::as_str`]'s spelling (also with `-` for `_`).
    pub fn parse(s: &str) -> Option<AnaState> {
        let s = s.replace('-', "_");
        AnaState::ALL.into_iter().find(|a| a.as_str() == s)
    }

    /// The state code of the ANA log page (NVMe base spec: 1, 2, 3, 4, 0Fh).
    pub fn code(self) -> u8 {
        match self {
            AnaState::Optimized => 0x1,
            AnaState::NonOptimized => 0x2,
            AnaState::Inaccessible => 0x3,
            AnaState::PersistentLoss => 0x4,
            AnaState::Change => 0xF,
        }
    }

    /// Inverse of [`Self::code`].
    pub fn from_code(c: u8) -> Option<AnaState> {
        AnaState::ALL.into_iter().find(|a| a.code() == c)
    }
}

impl std::fmt::Display for AnaState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A namespace: an NSID in a subsystem backed by a bdev. The identifiers are
/// always filled after load (explicit from the file, else derived).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceConfig {
    pub nsid: u32,
    pub bdev_name: String,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    pub uuid: [u8; 16],
    /// ANA group (`anagrpid`; SPDK's default: the NSID). 1..=max_namespaces.
    pub anagrpid: u32,
    /// SPDK's `ptpl_file`: where the namespace's reservation persists
    /// through power loss (Persist Through Power Loss is offered only with
    /// one).
    pub ptpl_file: Option<String>,
}

/// Address family of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressFamily {
    Ipv4,
    Ipv6,
}

impl AddressFamily {
    /// SPDK's spelling (`"IPv4"`, `"IPv6"`).
    pub fn as_str(self) -> &'static str {
        match self {
            AddressFamily::Ipv4 => "IPv4",
            AddressFamily::Ipv6 => "IPv6",
        }
    }

    /// Parses SPDK's adrfam string (case-insensitive); `None` for IB, FC, ...
    pub fn parse(s: &str) -> Option<AddressFamily> {
        if s.eq_ignore_ascii_case("ipv4") {
            Some(AddressFamily::Ipv4)
        } else if s.eq_ignore_ascii_case("ipv6") {
            Some(AddressFamily::Ipv6)
        } else {
            None
        }
    }
}

impl std::fmt::Display for AddressFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A listen address (`listen_address` of `nvmf_subsystem_add_listener`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ListenerConfig {
    pub trtype: TransportType,
    pub adrfam: AddressFamily,
    /// IP address (or host name) to bind.
    pub traddr: String,
    /// Port (TCP port, or the RDMA CM port space's), as a decimal string
    /// (SPDK keeps it as a string).
    pub trsvcid: String,
}

impl ListenerConfig {
    /// The port as a number (validated on load).
    pub fn port(&self) -> Option<u16> {
        self.trsvcid.parse().ok()
    }
}

impl TargetConfig {
    /// Parses and validates an SPDK `save_config`-shaped JSON document.
    pub fn from_json_str(s: &str) -> Result<TargetConfig, ConfigError> {
        parse::from_json_str(s)
    }

    /// Parses and validates an already-decoded JSON document.
    pub fn from_json_value(v: &serde_json::Value) -> Result<TargetConfig, ConfigError> {
        parse::from_json_value(v)
    }

    /// Reads and parses a config file; I/O errors name the path.
    pub fn load_file(path: impl AsRef<Path>) -> Result<TargetConfig, ConfigError> {
        load_file(path)
    }

    /// Applies one SPDK method call (as a later JSON-RPC server would) to this
    /// config. On error nothing is changed.
    pub fn apply_method(
        &mut self,
        method: &str,
        params: Option<&serde_json::Value>,
    ) -> Result<(), ConfigError> {
        parse::apply_method(self, method, params)
    }

    /// The SPDK `save_config` shape: a `bdev` section and an `nvmf` section, in
    /// a stable order, namespace identifiers written explicitly.
    pub fn to_json_value(&self) -> serde_json::Value {
        write::to_json_value(self)
    }

    /// [`Self::to_json_value`] pretty-printed (2-space indent, SPDK-like key
    /// order: `method` before `params`, `nqn` first, ...) with a final newline.
    pub fn to_json_string_pretty(&self) -> String {
        write::pretty(&self.to_json_value())
    }

    /// [`Self::to_json_string_pretty`] with the file format object first
    /// (`"nvmfd": {"format": N, "version": ..}`): what nvmfd writes for itself
    /// (the state file), so that an older nvmfd refuses it instead of
    /// misreading it.
    pub fn to_versioned_json_string_pretty(&self) -> String {
        write::pretty(&format::with_format(self.to_json_value()))
    }

    /// What nvmfd serves when started without `-c` (see docs/DESIGN.md "Defaults").
    pub fn embedded_default() -> TargetConfig {
        default::embedded_default()
    }

    /// The bdev with this name.
    pub fn bdev(&self, name: &str) -> Option<&BdevConfig> {
        self.bdevs.iter().find(|b| b.name == name)
    }

    /// The Ceph cluster registered under this name.
    pub fn rbd_cluster(&self, name: &str) -> Option<&RbdCluster> {
        self.rbd_clusters.iter().find(|c| c.name == name)
    }

    /// The first rbd bdev that uses the registered cluster `name`.
    pub fn rbd_cluster_user(&self, name: &str) -> Option<&BdevConfig> {
        self.bdevs.iter().find(|b| {
            b.rbd
                .as_ref()
                .is_some_and(|r| r.cluster_name.as_deref() == Some(name))
        })
    }

    /// Whether the TCP listen address `traddr:trsvcid` requires TLS: some
    /// subsystem (or the discovery NQN) added a listener there with
    /// `secure_channel` (RDMA listeners never do). One socket serves every subsystem on an address, so
    /// all of them agree (`nvmf_subsystem_add_listener` refuses a mix).
    pub fn listener_secure(&self, traddr: &str, trsvcid: &str) -> bool {
        self.secure_listener_users(traddr, trsvcid).next().is_some()
    }

    /// Subsystems (NQN) with a secure TCP listener on `traddr:trsvcid`.
    pub(crate) fn secure_listener_users<'a>(
        &'a self,
        traddr: &'a str,
        trsvcid: &'a str,
    ) -> impl Iterator<Item = &'a str> + 'a {
        let at = move |l: &&ListenerConfig| {
            l.trtype == TransportType::Tcp && l.traddr == traddr && l.trsvcid == trsvcid
        };
        self.secure_discovery_listeners
            .iter()
            .filter(at)
            .map(|_| DISCOVERY_NQN)
            .chain(self.subsystems.iter().flat_map(move |s| {
                s.secure_listeners
                    .iter()
                    .filter(at)
                    .map(move |_| s.nqn.as_str())
            }))
    }

    /// Subsystems (NQN) listening on TCP `traddr:trsvcid` in clear text.
    pub(crate) fn clear_listener_users<'a>(
        &'a self,
        traddr: &'a str,
        trsvcid: &'a str,
    ) -> impl Iterator<Item = &'a str> + 'a {
        let at = move |l: &&ListenerConfig| {
            l.trtype == TransportType::Tcp && l.traddr == traddr && l.trsvcid == trsvcid
        };
        self.discovery_listeners
            .iter()
            .filter(at)
            .filter(|l| !self.secure_discovery_listeners.contains(l))
            .map(|_| DISCOVERY_NQN)
            .chain(self.subsystems.iter().flat_map(move |s| {
                s.listeners
                    .iter()
                    .filter(at)
                    .filter(|l| !s.secure_listeners.contains(l))
                    .map(move |_| s.nqn.as_str())
            }))
    }

    /// The NVM subsystem with this NQN.
    pub fn subsystem(&self, nqn: &str) -> Option<&SubsystemConfig> {
        self.subsystems.iter().find(|s| s.nqn == nqn)
    }

    /// The transport of this type.
    pub fn transport(&self, trtype: TransportType) -> Option<&TransportConfig> {
        self.transports.iter().find(|t| t.trtype == trtype)
    }

    /// Every distinct listen address (subsystem and discovery listeners), in
    /// first-seen order: what the daemon binds.
    pub fn listen_addresses(&self) -> Vec<&ListenerConfig> {
        let mut out: Vec<&ListenerConfig> = Vec::new();
        let all = self
            .discovery_listeners
            .iter()
            .chain(self.subsystems.iter().flat_map(|s| s.listeners.iter()));
        for l in all {
            if !out.contains(&l) {
                out.push(l);
            }
        }
        out
    }
}

/// Reads and parses the config file at `path` (`nvmfd -c FILE`).
pub fn load_file(path: impl AsRef<Path>) -> Result<TargetConfig, ConfigError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse::from_json_str(&text).map_err(|e| e.with_path(path))
}
