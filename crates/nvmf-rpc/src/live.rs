//! Owns the boundary between the RPC server and the running target: the
//! `Change` enum (one validated state change), the `LiveTarget` trait the
//! daemon implements (with [`NamespaceIo`], what it counts per namespace for
//! `bdev_get_iostat`), the
//! daemon implements in phase 2, and two implementations for tests and for
//! running the server without a target (`NoLive`, `RecordingLive`).
//!
//! Order of a state-changing call: the server validates the call on a copy of
//! the model, then calls `LiveTarget::apply(change, new_config)`; only when
//! that succeeds is the copy committed as the model and written to the state
//! file. A failing `apply` leaves model, file and (it must) target unchanged.

use std::sync::Mutex;

use nvmf_config::{
    BdevConfig, ListenerConfig, NamespaceConfig, RbdCluster, SubsystemConfig, TargetConfig,
    TransportConfig,
};
use serde_json::{json, Value};

/// What `nvmf_gateway_group_*` asks of the group member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupRequest {
    /// Members, leases, ANA group owners, epoch, fencings, counters.
    Status,
    /// Make `to` the home of ANA group `anagrpid`: its owner hands it over.
    Move { anagrpid: u32, to: String },
}

/// The error of a group request to an nvmfd that is not in a group.
pub const NOT_A_MEMBER: &str =
    "this nvmfd is not a member of a gateway group (start it with --gateway-group)";

/// One state change, already validated against the model. `nqn` of listener
/// changes may be the discovery NQN (`nvmf_config::DISCOVERY_NQN`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A new bdev (`bdev_malloc_create`, `bdev_null_create`,
    /// `bdev_rbd_create`, ...). Creating it may be slow (an rbd image is
    /// opened over the network): the call blocks only the control plane.
    AddBdev(BdevConfig),
    /// A bdev's QoS rate limits changed (`bdev_set_qos_limit`): they apply
    /// live to every queue serving it.
    SetQosLimit {
        name: String,
    },
    /// A bdev was resized (`bdev_rbd_resize`) to `num_blocks` blocks: the
    /// backend grows the device, namespaces on it take the new size and
    /// hosts get Namespace Attribute Changed. The model is unchanged (the
    /// size lives in the backend).
    ResizeBdev {
        name: String,
        num_blocks: u64,
    },
    /// A Ceph cluster connection was registered (`bdev_rbd_register_cluster`).
    RegisterRbdCluster(RbdCluster),
    /// A registered cluster no bdev uses was unregistered.
    UnregisterRbdCluster {
        name: String,
    },
    /// A bdev no namespace uses was deleted.
    DeleteBdev {
        name: String,
    },
    /// A transport was created (listeners of its type may follow).
    CreateTransport(TransportConfig),
    /// A new, empty subsystem (no namespaces, hosts or listeners yet).
    CreateSubsystem(SubsystemConfig),
    /// A subsystem was deleted with its namespaces, hosts and listeners:
    /// its controllers must be torn down.
    DeleteSubsystem {
        nqn: String,
    },
    AddNamespace {
        nqn: String,
        ns: NamespaceConfig,
    },
    /// Controllers of the subsystem lose the namespace (Namespace Attribute
    /// Changed AEN in the core).
    RemoveNamespace {
        nqn: String,
        nsid: u32,
    },
    /// Start listening (if no other subsystem does on that address) and
    /// report the address in the discovery log.
    AddListener {
        nqn: String,
        listener: ListenerConfig,
    },
    /// Stop reporting the address for this subsystem; stop listening when no
    /// subsystem uses it any more. Connections through it may stay.
    RemoveListener {
        nqn: String,
        listener: ListenerConfig,
    },
    AddHost {
        nqn: String,
        host: String,
    },
    /// Controllers of that host on this subsystem should be disconnected.
    RemoveHost {
        nqn: String,
        host: String,
    },
    AllowAnyHost {
        nqn: String,
        allow: bool,
    },
    /// ANA states of a listener or the ANA group of a namespace changed
    /// (`nvmf_subsystem_listener_set_ana_state`,
    /// `nvmf_subsystem_set_ns_ana_group`): hosts get the ANA Change event.
    AnaChange {
        nqn: String,
    },
    /// Which hosts see a `no_auto_visible` namespace changed
    /// (`nvmf_ns_add_host`, `nvmf_ns_remove_host`; the rules are in
    /// `SubsystemConfig::ns_visibility`): the controllers of the hosts that
    /// gain or lose it get Namespace Attribute Changed.
    NsVisibility {
        nqn: String,
        nsid: u32,
    },
    /// DH-HMAC-CHAP keys or policy changed (`keyring_file_add_key`,
    /// `keyring_file_remove_key`, `nvmf_subsystem_set_keys`,
    /// `nvmf_set_config dhchap_*`): the target reloads the hosts' keys
    /// from their files; the next (re-)authentication uses them.
    AuthKeys,
    /// The whole configuration was replaced (`load_config`): `new_config` is
    /// the complete target to converge to.
    LoadConfig,
}

impl Change {
    /// Short name for logs: `"AddNamespace"`, ...
    pub fn kind(&self) -> &'static str {
        match self {
            Change::AddBdev(_) => "AddBdev",
            Change::DeleteBdev { .. } => "DeleteBdev",
            Change::ResizeBdev { .. } => "ResizeBdev",
            Change::SetQosLimit { .. } => "SetQosLimit",
            Change::RegisterRbdCluster(_) => "RegisterRbdCluster",
            Change::UnregisterRbdCluster { .. } => "UnregisterRbdCluster",
            Change::CreateTransport(_) => "CreateTransport",
            Change::CreateSubsystem(_) => "CreateSubsystem",
            Change::DeleteSubsystem { .. } => "DeleteSubsystem",
            Change::AddNamespace { .. } => "AddNamespace",
            Change::RemoveNamespace { .. } => "RemoveNamespace",
            Change::AddListener { .. } => "AddListener",
            Change::RemoveListener { .. } => "RemoveListener",
            Change::AddHost { .. } => "AddHost",
            Change::RemoveHost { .. } => "RemoveHost",
            Change::AllowAnyHost { .. } => "AllowAnyHost",
            Change::AnaChange { .. } => "AnaChange",
            Change::NsVisibility { .. } => "NsVisibility",
            Change::AuthKeys => "AuthKeys",
            Change::LoadConfig => "LoadConfig",
        }
    }
}

/// The running target as the RPC server sees it. Implemented by the daemon
/// (phase 2); called from the RPC thread, never from a reactor.
pub trait LiveTarget: Send + Sync {
    /// Makes `change` live. `new_config` is the whole model after the change
    /// (what the target must look like afterwards). An `Err` is sent to the
    /// client as an internal error and the model is not changed, so the
    /// implementation must leave the target as it was.
    fn apply(&self, change: &Change, new_config: &TargetConfig) -> Result<(), String>;
    /// A gateway group request (`nvmf_gateway_group_status`,
    /// `nvmf_gateway_group_move`); an error when this nvmfd is not a
    /// member of a group.
    fn gateway_group(&self, _request: &GroupRequest) -> Result<Value, String> {
        Err(NOT_A_MEMBER.to_string())
    }
    /// `nvmf_subsystem_get_controllers` entries of a subsystem (SPDK shape:
    /// `cntlid, cntrltype, hostnqn, hostid, num_io_qpairs`).
    fn controllers(&self, nqn: &str) -> Vec<Value>;
    /// `nvmf_subsystem_get_qpairs` entries (`cntlid, qid, state, listen_address`).
    fn qpairs(&self, nqn: &str) -> Vec<Value>;
    /// `nvmf_get_stats` result (`tick_rate, poll_groups: [...]`).
    fn stats(&self) -> Value;
    /// `thread_get_stats` result (`tick_rate, threads: [{name, id, cpumask,
    /// busy, idle}]`): busy and idle ticks of each reactor.
    fn thread_stats(&self) -> Value {
        json!({ "tick_rate": 1_000_000_000u64, "threads": [] })
    }
    /// The current size in blocks of bdev `name` as the running target sees
    /// it (`bdev_get_bdevs`, `bdev_rbd_resize`); `None`: the model's value
    /// (an rbd bdev's size is only known to its backend).
    fn bdev_num_blocks(&self, name: &str) -> Option<u64> {
        let _ = name;
        None
    }
    /// `nvmf_get_path_stats` result (nvmfd's own method, see docs/RPC.md):
    /// counters and latency histograms per path (subsystem, listener,
    /// host, controller) and namespace.
    fn path_stats(&self) -> Value {
        json!({ "tick_rate": 1_000_000_000u64, "paths": [] })
    }
    /// Reads and Writes to bdev `name` that had to wait for its QoS
    /// tokens since it was created (`bdev_get_iostat` `qos_throttled_ios`).
    fn bdev_qos_throttled(&self, name: &str) -> u64 {
        let _ = name;
        0
    }
    /// `nvmf_ns_get_reservation` (nvmfd's own method): the reservation of
    /// namespace `nsid` of `nqn` (`generation, rtype, holder, ptpl,
    /// ptpl_file, registrants: [{hostid, rkey, holder}]`); `None` when the
    /// running target has no such namespace.
    fn reservation(&self, nqn: &str, nsid: u32) -> Option<Value> {
        let _ = (nqn, nsid);
        None
    }
    /// Reads and Writes per namespace since the target started, every
    /// queue and path together (open and closed), for `bdev_get_iostat`:
    /// (now in nanoseconds on a monotonic clock, the namespaces with I/O).
    fn namespace_io(&self) -> (u64, Vec<NamespaceIo>) {
        (0, Vec::new())
    }
}

/// One namespace's Reads and Writes as the running target counted them
/// (see [`LiveTarget::namespace_io`]). Latencies are sums in nanoseconds,
/// from the command capsule received to the response queued.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceIo {
    /// Subsystem NQN.
    pub nqn: String,
    pub nsid: u32,
    pub reads: u64,
    pub writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub read_latency_ns: u64,
    pub write_latency_ns: u64,
}

/// No target behind the server: every change is accepted, nothing is connected.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoLive;

impl LiveTarget for NoLive {
    fn apply(&self, _change: &Change, _new_config: &TargetConfig) -> Result<(), String> {
        Ok(())
    }
    fn controllers(&self, _nqn: &str) -> Vec<Value> {
        Vec::new()
    }
    fn qpairs(&self, _nqn: &str) -> Vec<Value> {
        Vec::new()
    }
    fn stats(&self) -> Value {
        empty_stats()
    }
}

/// `nvmf_get_stats` of a target with no poll groups.
pub fn empty_stats() -> Value {
    json!({ "tick_rate": 1_000_000_000u64, "poll_groups": [] })
}

/// Test double: records every applied change; can be told to refuse the next
/// ones; returns canned controllers/qpairs/stats.
#[derive(Debug, Default)]
pub struct RecordingLive {
    inner: Mutex<Recording>,
}

#[derive(Debug, Default)]
struct Recording {
    changes: Vec<Change>,
    fail_with: Option<String>,
    controllers: Vec<(String, Value)>,
    qpairs: Vec<(String, Value)>,
    stats: Option<Value>,
    sizes: Vec<(String, u64)>,
    namespace_io: Vec<NamespaceIo>,
}

impl RecordingLive {
    pub fn new() -> RecordingLive {
        RecordingLive::default()
    }

    /// The changes applied so far, in order.
    pub fn changes(&self) -> Vec<Change> {
        self.lock().changes.clone()
    }

    /// Empties the record and returns what it held.
    pub fn take_changes(&self) -> Vec<Change> {
        std::mem::take(&mut self.lock().changes)
    }

    /// From now on `apply` fails with `msg` (None: succeeds again).
    pub fn fail_with(&self, msg: Option<&str>) {
        self.lock().fail_with = msg.map(str::to_string);
    }

    /// Adds a controller entry reported for `nqn`.
    pub fn push_controller(&self, nqn: &str, entry: Value) {
        self.lock().controllers.push((nqn.to_string(), entry));
    }

    /// Adds a qpair entry reported for `nqn`.
    pub fn push_qpair(&self, nqn: &str, entry: Value) {
        self.lock().qpairs.push((nqn.to_string(), entry));
    }

    /// Sets what `bdev_num_blocks(name)` returns (also updated by an
    /// applied `ResizeBdev`).
    pub fn set_num_blocks(&self, name: &str, num_blocks: u64) {
        let mut r = self.lock();
        r.sizes.retain(|(n, _)| n != name);
        r.sizes.push((name.to_string(), num_blocks));
    }

    /// Sets what `stats` returns.
    pub fn set_stats(&self, stats: Value) {
        self.lock().stats = Some(stats);
    }

    /// Sets what `namespace_io` returns (its clock reads 1 s).
    pub fn set_namespace_io(&self, io: Vec<NamespaceIo>) {
        self.lock().namespace_io = io;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recording> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl LiveTarget for RecordingLive {
    fn apply(&self, change: &Change, _new_config: &TargetConfig) -> Result<(), String> {
        let mut r = self.lock();
        if let Some(msg) = &r.fail_with {
            return Err(msg.clone());
        }
        if let Change::ResizeBdev { name, num_blocks } = change {
            r.sizes.retain(|(n, _)| n != name);
            r.sizes.push((name.clone(), *num_blocks));
        }
        r.changes.push(change.clone());
        Ok(())
    }
    fn bdev_num_blocks(&self, name: &str) -> Option<u64> {
        let r = self.lock();
        r.sizes.iter().find(|(n, _)| n == name).map(|(_, b)| *b)
    }
    fn controllers(&self, nqn: &str) -> Vec<Value> {
        let r = self.lock();
        r.controllers
            .iter()
            .filter(|(n, _)| n == nqn)
            .map(|(_, v)| v.clone())
            .collect()
    }
    fn qpairs(&self, nqn: &str) -> Vec<Value> {
        let r = self.lock();
        r.qpairs
            .iter()
            .filter(|(n, _)| n == nqn)
            .map(|(_, v)| v.clone())
            .collect()
    }
    fn stats(&self) -> Value {
        self.lock().stats.clone().unwrap_or_else(empty_stats)
    }
    fn namespace_io(&self) -> (u64, Vec<NamespaceIo>) {
        (1_000_000_000, self.lock().namespace_io.clone())
    }
}
