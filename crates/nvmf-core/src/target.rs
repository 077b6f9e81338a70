//! The target: everything one nvmfd process exports.
//!
//! Owns [`Target`] (backends by bdev name, NVM subsystems, the discovery
//! subsystem, listen addresses and their port IDs, the discovery log
//! generation counter, the active controller count) and
//! [`TransportLimits`] (queue depths, I/O sizes from the TCP transport
//! configuration). Built once from `nvmf_config::TargetConfig` and shared by
//! every reactor as `Arc<Target>`. Runtime changes (namespaces now;
//! subsystems, hosts, listeners later) go through methods here so controllers
//! get their asynchronous events.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use nvmf_config::{
    ListenerConfig, NamespaceConfig, TargetConfig, TransportConfig, TransportType, DISCOVERY_NQN,
};

use crate::backend::{self, Backend};
use crate::controller::AEN_DISC_CHANGE;
use crate::error::CoreError;
use crate::namespace::{Namespace, NamespaceTable};
use crate::subsystem::Subsystem;

/// Transport limits the core enforces and reports (CAP.MQES, MDTS, IOCCSZ,
/// MAXCMD, Number of Queues). From the TCP `TransportConfig`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportLimits {
    /// Largest I/O queue (entries).
    pub max_queue_depth: u16,
    /// Largest admin queue (entries).
    pub max_aq_depth: u16,
    /// I/O queues per controller.
    pub max_io_qpairs_per_ctrlr: u16,
    /// In-capsule data bytes a command capsule may carry.
    pub in_capsule_data_size: u32,
    /// Largest data transfer of one command in bytes.
    pub max_io_size: u32,
    /// Buffer unit size in bytes (the transport's business).
    pub io_unit_size: u32,
    /// Send C2HData with SUCCESS and skip the response capsule (the transport's business).
    pub c2h_success: bool,
    /// Data buffer budget in `io_unit_size` units (the transport's business).
    pub num_shared_buffers: u32,
}

impl TransportLimits {
    /// Limits from a transport configuration, with nonsense values fixed up
    /// (depths at least 2, at least one I/O queue, max I/O at least 4 KiB).
    pub fn from_config(t: &TransportConfig) -> TransportLimits {
        TransportLimits {
            max_queue_depth: t.max_queue_depth.max(2),
            max_aq_depth: t.max_aq_depth.max(2),
            max_io_qpairs_per_ctrlr: t.max_io_qpairs_per_ctrlr.max(1),
            in_capsule_data_size: t.in_capsule_data_size,
            max_io_size: t.max_io_size.max(4096),
            io_unit_size: t.io_unit_size,
            c2h_success: t.c2h_success,
            num_shared_buffers: t.num_shared_buffers.max(1),
        }
    }

    /// Identify Controller MDTS: log2(max_io_size / 4 KiB) (CAP.MPSMIN is
    /// 4 KiB). 0 would mean "no limit", so the smallest value reported is 1.
    pub fn mdts(&self) -> u8 {
        let pages = (self.max_io_size / 4096).max(1);
        (31 - pages.leading_zeros()).max(1) as u8
    }

    /// Largest transfer the reported MDTS allows, in bytes: the I/O path
    /// rejects bigger commands with Invalid Field.
    pub fn max_transfer(&self) -> u32 {
        self.max_io_size
    }

    /// Bytes of data buffers above the in-capsule size that all queues may
    /// hold together: `num_shared_buffers × io_unit_size`.
    pub fn data_buffer_budget(&self) -> u64 {
        u64::from(self.num_shared_buffers) * u64::from(self.io_unit_size.max(512))
    }
}

impl Default for TransportLimits {
    fn default() -> Self {
        TransportLimits::from_config(&TransportConfig::tcp_default())
    }
}

/// The whole target. Shared by all reactors as `Arc<Target>`.
#[derive(Debug)]
pub struct Target {
    limits: TransportLimits,
    backends: Mutex<BTreeMap<String, Arc<dyn Backend>>>,
    subsystems: RwLock<Vec<Arc<Subsystem>>>,
    discovery: Arc<Subsystem>,
    /// Every distinct listen address ever used; a listener's port ID is its
    /// index + 1 (append-only, so port IDs stay stable at run time).
    ports: RwLock<Vec<ListenerConfig>>,
    discovery_genctr: AtomicU64,
    active_controllers: AtomicUsize,
}

impl Target {
    /// Build the target: backends, subsystems with their namespaces, the
    /// discovery subsystem.
    pub fn from_config(cfg: &TargetConfig) -> Result<Arc<Target>, CoreError> {
        let transport = cfg
            .transports
            .iter()
            .find(|t| t.trtype == TransportType::Tcp)
            .cloned()
            .unwrap_or_else(TransportConfig::tcp_default);
        let limits = TransportLimits::from_config(&transport);

        let mut backends: BTreeMap<String, Arc<dyn Backend>> = BTreeMap::new();
        for b in &cfg.bdevs {
            if backends.contains_key(&b.name) {
                return Err(CoreError::DuplicateBdev(b.name.clone()));
            }
            backends.insert(b.name.clone(), backend::create(b)?);
        }

        let mut subsystems: Vec<Arc<Subsystem>> = Vec::new();
        for s in &cfg.subsystems {
            let serr = |reason: &str| CoreError::Subsystem {
                nqn: s.nqn.clone(),
                reason: reason.to_string(),
            };
            if s.nqn == DISCOVERY_NQN {
                return Err(serr("the discovery NQN cannot be an NVM subsystem"));
            }
            if subsystems.iter().any(|x| x.nqn() == s.nqn) {
                return Err(serr("defined twice"));
            }
            let max = s.max_namespaces.max(1);
            let mut table = NamespaceTable::new();
            for n in &s.namespaces {
                let ns = build_namespace(&s.nqn, max, n, &backends)?;
                if table.get(n.nsid).is_some() {
                    return Err(CoreError::Namespace {
                        nqn: s.nqn.clone(),
                        nsid: n.nsid,
                        reason: "NSID used twice".to_string(),
                    });
                }
                table = table.with(Arc::new(ns));
            }
            subsystems.push(Arc::new(Subsystem::new_nvm(s, table)));
        }

        let discovery = Arc::new(Subsystem::new_discovery(cfg.discovery_listeners.clone()));

        let mut ports: Vec<ListenerConfig> = Vec::new();
        let all = discovery
            .listeners()
            .into_iter()
            .chain(subsystems.iter().flat_map(|s| s.listeners()));
        for l in all {
            if !ports.contains(&l) {
                ports.push(l);
            }
        }

        Ok(Arc::new(Target {
            limits,
            backends: Mutex::new(backends),
            subsystems: RwLock::new(subsystems),
            discovery,
            ports: RwLock::new(ports),
            discovery_genctr: AtomicU64::new(1),
            active_controllers: AtomicUsize::new(0),
        }))
    }

    /// Transport limits (from the TCP transport configuration).
    pub fn limits(&self) -> &TransportLimits {
        &self.limits
    }

    /// Controllers alive right now (NVM and discovery).
    pub fn active_controllers(&self) -> usize {
        self.active_controllers.load(Ordering::Acquire)
    }

    pub(crate) fn controller_created(&self) -> usize {
        self.active_controllers.fetch_add(1, Ordering::AcqRel) + 1
    }

    pub(crate) fn controller_destroyed(&self) -> usize {
        let prev = self
            .active_controllers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(1))
            })
            .unwrap_or(0);
        prev.saturating_sub(1)
    }

    /// The subsystem with this NQN (the discovery NQN names the discovery subsystem).
    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        if nqn == DISCOVERY_NQN {
            return Some(self.discovery.clone());
        }
        let subs = self.subsystems.read().unwrap_or_else(|e| e.into_inner());
        subs.iter().find(|s| s.nqn() == nqn).cloned()
    }

    /// NVM subsystems, in configuration order.
    pub fn subsystems(&self) -> Vec<Arc<Subsystem>> {
        self.subsystems
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The discovery subsystem.
    pub fn discovery_subsystem(&self) -> &Arc<Subsystem> {
        &self.discovery
    }

    /// The backend of a bdev.
    pub fn backend(&self, name: &str) -> Option<Arc<dyn Backend>> {
        let b = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        b.get(name).cloned()
    }

    /// Every distinct listen address (discovery and subsystems): what the
    /// daemon binds.
    pub fn listen_addresses(&self) -> Vec<ListenerConfig> {
        let mut all = self.discovery.listeners();
        for s in self.subsystems() {
            for l in s.listeners() {
                if !all.contains(&l) {
                    all.push(l);
                }
            }
        }
        all
    }

    /// Port ID of a listen address (1-based index; 0 if unknown). An address
    /// that is not configured itself matches a wildcard listener on the same
    /// service ID (a connection's local address on a `0.0.0.0` listener).
    pub fn port_id(&self, trsvcid: &str, traddr: &str) -> u16 {
        let ports = self.ports.read().unwrap_or_else(|e| e.into_inner());
        let exact = ports
            .iter()
            .position(|p| p.trsvcid == trsvcid && p.traddr == traddr);
        let wildcard = || {
            ports
                .iter()
                .position(|p| p.trsvcid == trsvcid && crate::discovery::is_wildcard(&p.traddr))
        };
        exact
            .or_else(wildcard)
            .map(|i| (i + 1).min(u16::MAX as usize) as u16)
            .unwrap_or(0)
    }

    /// Discovery log generation counter.
    pub fn discovery_generation(&self) -> u64 {
        self.discovery_genctr.load(Ordering::Acquire)
    }

    /// The discovery log changed (subsystem, host or listener added or
    /// removed): bump the generation and raise Discovery Log Page Change on
    /// every discovery controller.
    pub fn notify_discovery_change(&self) {
        self.discovery_genctr.fetch_add(1, Ordering::AcqRel);
        for c in self.discovery.controllers() {
            c.raise_event(AEN_DISC_CHANGE);
        }
    }

    /// Add a namespace to a subsystem at run time (the backend must exist).
    /// Controllers of the subsystem get Namespace Attribute Changed.
    pub fn add_namespace(&self, nqn: &str, ns: &NamespaceConfig) -> Result<(), CoreError> {
        let sub = self
            .subsystem(nqn)
            .filter(|s| !s.is_discovery())
            .ok_or_else(|| CoreError::UnknownSubsystem(nqn.to_string()))?;
        let backends = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        let built = build_namespace(nqn, sub.max_namespaces(), ns, &backends)?;
        drop(backends);
        sub.add_namespace(Arc::new(built))
    }

    /// Remove a namespace at run time. In-flight I/O finishes; new I/O gets
    /// Namespace Not Ready until the queues see the new table, then Invalid
    /// Namespace. Controllers get Namespace Attribute Changed.
    pub fn remove_namespace(&self, nqn: &str, nsid: u32) -> Result<(), CoreError> {
        let sub = self
            .subsystem(nqn)
            .filter(|s| !s.is_discovery())
            .ok_or_else(|| CoreError::UnknownSubsystem(nqn.to_string()))?;
        sub.remove_namespace(nsid).map(|_| ())
    }
}

/// Runtime changes (control path: the RPC thread; each takes a lock or two,
/// never one a reactor holds per I/O).
impl Target {
    /// Create a backend for a new bdev.
    pub fn add_backend(&self, cfg: &nvmf_config::BdevConfig) -> Result<(), CoreError> {
        let mut b = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        if b.contains_key(&cfg.name) {
            return Err(CoreError::DuplicateBdev(cfg.name.clone()));
        }
        let backend = backend::create(cfg)?;
        b.insert(cfg.name.clone(), backend);
        Ok(())
    }

    /// Forget a bdev's backend. Namespaces still holding it (none, when the
    /// caller checked) keep it alive until they go.
    pub fn remove_backend(&self, name: &str) -> bool {
        let mut b = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        b.remove(name).is_some()
    }

    /// Names of the bdevs with a backend.
    pub fn backend_names(&self) -> Vec<String> {
        let b = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        b.keys().cloned().collect()
    }

    /// Add an NVM subsystem with its namespaces, hosts and listeners.
    pub fn add_subsystem(&self, cfg: &nvmf_config::SubsystemConfig) -> Result<(), CoreError> {
        let serr = |reason: &str| CoreError::Subsystem {
            nqn: cfg.nqn.clone(),
            reason: reason.to_string(),
        };
        if cfg.nqn == DISCOVERY_NQN {
            return Err(serr("the discovery NQN cannot be an NVM subsystem"));
        }
        let max = cfg.max_namespaces.max(1);
        let mut table = NamespaceTable::new();
        {
            let backends = self.backends.lock().unwrap_or_else(|e| e.into_inner());
            for n in &cfg.namespaces {
                if table.get(n.nsid).is_some() {
                    return Err(CoreError::Namespace {
                        nqn: cfg.nqn.clone(),
                        nsid: n.nsid,
                        reason: "NSID used twice".to_string(),
                    });
                }
                table = table.with(Arc::new(build_namespace(&cfg.nqn, max, n, &backends)?));
            }
        }
        {
            let mut subs = self.subsystems.write().unwrap_or_else(|e| e.into_inner());
            if subs.iter().any(|s| s.nqn() == cfg.nqn) {
                return Err(serr("already exists"));
            }
            subs.push(Arc::new(Subsystem::new_nvm(cfg, table)));
        }
        for l in &cfg.listeners {
            self.note_port(l);
        }
        self.notify_discovery_change();
        Ok(())
    }

    /// Remove an NVM subsystem: its controllers are torn down (their queues
    /// close on the next reactor tick). Returns the removed subsystem.
    pub fn remove_subsystem(&self, nqn: &str) -> Result<Arc<Subsystem>, CoreError> {
        let sub = {
            let mut subs = self.subsystems.write().unwrap_or_else(|e| e.into_inner());
            let pos = subs
                .iter()
                .position(|s| s.nqn() == nqn)
                .ok_or_else(|| CoreError::UnknownSubsystem(nqn.to_string()))?;
            subs.remove(pos)
        };
        // Namespaces answer Not Ready to whatever is still in flight.
        for ns in sub.namespaces().iter() {
            ns.set_state(crate::namespace::NamespaceState::Removing);
        }
        sub.disconnect_all(crate::controller::CloseReason::SubsystemRemoved);
        self.notify_discovery_change();
        Ok(sub)
    }

    /// Report `l` for subsystem `nqn` (the discovery NQN included).
    pub fn add_listener(&self, nqn: &str, l: &ListenerConfig) -> Result<(), CoreError> {
        let sub = self
            .subsystem(nqn)
            .ok_or_else(|| CoreError::UnknownSubsystem(nqn.to_string()))?;
        self.note_port(l);
        if sub.add_listener(l) {
            self.notify_discovery_change();
        }
        Ok(())
    }

    /// Stop reporting `l` for subsystem `nqn`.
    pub fn remove_listener(&self, nqn: &str, l: &ListenerConfig) -> Result<(), CoreError> {
        let sub = self
            .subsystem(nqn)
            .ok_or_else(|| CoreError::UnknownSubsystem(nqn.to_string()))?;
        if sub.remove_listener(l) {
            self.notify_discovery_change();
        }
        Ok(())
    }

    /// Allow `host` on subsystem `nqn`.
    pub fn add_host(&self, nqn: &str, host: &str) -> Result<(), CoreError> {
        let sub = self.nvm_subsystem(nqn)?;
        sub.add_host(host);
        self.notify_discovery_change();
        Ok(())
    }

    /// Disallow `host` on subsystem `nqn` and disconnect its controllers there.
    pub fn remove_host(&self, nqn: &str, host: &str) -> Result<usize, CoreError> {
        let sub = self.nvm_subsystem(nqn)?;
        let n = sub.remove_host(host);
        self.notify_discovery_change();
        Ok(n)
    }

    /// Set allow_any_host of subsystem `nqn`.
    pub fn set_allow_any_host(&self, nqn: &str, allow: bool) -> Result<usize, CoreError> {
        let sub = self.nvm_subsystem(nqn)?;
        let n = sub.set_allow_any_host(allow);
        self.notify_discovery_change();
        Ok(n)
    }

    fn nvm_subsystem(&self, nqn: &str) -> Result<Arc<Subsystem>, CoreError> {
        self.subsystem(nqn)
            .filter(|s| !s.is_discovery())
            .ok_or_else(|| CoreError::UnknownSubsystem(nqn.to_string()))
    }

    fn note_port(&self, l: &ListenerConfig) {
        let mut ports = self.ports.write().unwrap_or_else(|e| e.into_inner());
        if !ports.contains(l) {
            ports.push(l.clone());
        }
    }
}

fn build_namespace(
    nqn: &str,
    max_namespaces: u32,
    n: &NamespaceConfig,
    backends: &BTreeMap<String, Arc<dyn Backend>>,
) -> Result<Namespace, CoreError> {
    let err = |reason: String| CoreError::Namespace {
        nqn: nqn.to_string(),
        nsid: n.nsid,
        reason,
    };
    if n.nsid == 0 || n.nsid > max_namespaces {
        return Err(err(format!(
            "NSID must be 1..={max_namespaces} (max_namespaces)"
        )));
    }
    let backend = backends
        .get(&n.bdev_name)
        .cloned()
        .ok_or_else(|| err(format!("bdev {} not found", n.bdev_name)))?;
    Ok(Namespace::new(n.nsid, backend, n.nguid, n.eui64, n.uuid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mdts_from_max_io_size() {
        let mut l = TransportLimits::default();
        for (size, mdts) in [
            (131_072, 5),
            (1 << 20, 8),
            (4096, 1),
            (8192, 1),
            (12288, 1),
            (65536, 4),
        ] {
            l.max_io_size = size;
            assert_eq!(l.mdts(), mdts, "max_io_size {size}");
        }
    }
}
