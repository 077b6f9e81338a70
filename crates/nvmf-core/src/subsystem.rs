//! NVM subsystems and the discovery subsystem.
//!
//! Owns [`Subsystem`]: identity (NQN, serial, model), host access list and the hosts' DH-HMAC-CHAP keys,
//! listeners, the namespace table (copy-on-write snapshot + generation
//! counter that queue pairs check with one atomic load), and the registry of
//! live controllers with dynamic controller ID allocation (within the
//! configured `min_cntlid..=max_cntlid`, so gateways serving one subsystem
//! never hand out the same ID), and, with ANA reporting, the ANA state of
//! each listener (`ana.rs`). Namespace changes are announced to every
//! controller (changed-namespace list + Namespace Attribute Changed event;
//! also when a namespace's bdev is resized),
//! ANA changes to the controllers of the paths they touch.
//! Per-host namespace visibility (`no_auto_visible`, `visibility.rs`): each
//! host's controllers get a table without the namespaces hidden from them
//! (the shared table itself when nothing is hidden), and namespace changes
//! are announced only to the controllers whose host sees (or saw) the
//! namespace.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use nvmf_config::{ListenerConfig, SubsystemConfig, DISCOVERY_NQN};

use crate::ana::{PathAna, SubsystemAna};
use crate::auth::HostKeys;
use crate::backend::Backend;
use crate::controller::{CloseReason, Controller, AEN_ANA_CHANGE};
use crate::error::CoreError;
use crate::namespace::{Namespace, NamespaceState, NamespaceTable};
use crate::queue::PortInfo;
use crate::visibility::{NsVisibility, Visibility};

/// What kind of subsystem this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubsystemKind {
    /// An NVM subsystem with namespaces.
    Nvm,
    /// The discovery subsystem (`nqn.2014-08.org.nvmexpress.discovery`).
    Discovery,
}

/// Live controllers of a subsystem, by controller ID.
#[derive(Debug, Default)]
struct Registry {
    by_id: BTreeMap<u16, Weak<Controller>>,
    /// Where the next search for a free ID starts (round robin, so a
    /// reconnecting host does not get the ID of a controller just destroyed).
    next: u16,
}

/// One subsystem of the target.
#[derive(Debug)]
pub struct Subsystem {
    nqn: String,
    kind: SubsystemKind,
    serial: String,
    model: String,
    /// Access list and listeners change at run time (RPC); read on Connect
    /// and for the discovery log only, never per I/O.
    allow_any_host: AtomicBool,
    hosts: RwLock<Vec<String>>,
    /// DH-HMAC-CHAP keys by host NQN (read at Connect and authentication
    /// messages only).
    host_keys: RwLock<HashMap<String, HostKeys>>,
    max_namespaces: u32,
    min_cntlid: u16,
    max_cntlid: u16,
    listeners: RwLock<Vec<ListenerConfig>>,
    /// ANA state per listener; `None` without ANA reporting.
    ana: Option<SubsystemAna>,
    namespaces: RwLock<Arc<NamespaceTable>>,
    /// Per-host visibility rules and views; changed only with the
    /// `namespaces` write lock held (lock order: `namespaces`, then this).
    visibility: Mutex<Visibility>,
    ns_generation: AtomicU64,
    registry: Mutex<Registry>,
}

impl Subsystem {
    /// An NVM subsystem from its configuration, with the given namespaces.
    pub fn new_nvm(cfg: &SubsystemConfig, namespaces: NamespaceTable) -> Subsystem {
        let (min_cntlid, max_cntlid) = sane_cntlid_range(cfg.min_cntlid, cfg.max_cntlid);
        Subsystem {
            nqn: cfg.nqn.clone(),
            kind: SubsystemKind::Nvm,
            serial: cfg.serial_number.clone(),
            model: cfg.model_number.clone(),
            allow_any_host: AtomicBool::new(cfg.allow_any_host),
            hosts: RwLock::new(cfg.hosts.clone()),
            host_keys: RwLock::new(HashMap::new()),
            max_namespaces: cfg.max_namespaces.max(1),
            min_cntlid,
            max_cntlid,
            listeners: RwLock::new(cfg.listeners.clone()),
            ana: cfg
                .ana_reporting
                .then(|| SubsystemAna::new(cfg.ana_group_max(), &cfg.listeners)),
            visibility: Mutex::new(visibility_of(cfg, &namespaces)),
            namespaces: RwLock::new(Arc::new(namespaces)),
            ns_generation: AtomicU64::new(0),
            registry: Mutex::new(Registry {
                by_id: BTreeMap::new(),
                next: min_cntlid,
            }),
        }
    }

    /// The discovery subsystem, reachable on `listeners`.
    pub fn new_discovery(listeners: Vec<ListenerConfig>) -> Subsystem {
        Subsystem {
            nqn: DISCOVERY_NQN.to_string(),
            kind: SubsystemKind::Discovery,
            serial: String::new(),
            model: "nvmfd discovery".to_string(),
            allow_any_host: AtomicBool::new(true),
            hosts: RwLock::new(Vec::new()),
            host_keys: RwLock::new(HashMap::new()),
            max_namespaces: 0,
            min_cntlid: 1,
            max_cntlid: 0xFFEF,
            listeners: RwLock::new(listeners),
            ana: None,
            namespaces: RwLock::new(Arc::new(NamespaceTable::new())),
            visibility: Mutex::new(Visibility::default()),
            ns_generation: AtomicU64::new(0),
            registry: Mutex::new(Registry {
                by_id: BTreeMap::new(),
                next: 1,
            }),
        }
    }

    pub fn nqn(&self) -> &str {
        &self.nqn
    }

    pub fn kind(&self) -> SubsystemKind {
        self.kind
    }

    pub fn is_discovery(&self) -> bool {
        self.kind == SubsystemKind::Discovery
    }

    /// Serial number (Identify Controller SN).
    pub fn serial(&self) -> &str {
        &self.serial
    }

    /// Model number (Identify Controller MN).
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Highest NSID (Identify Controller NN); 0 for discovery.
    pub fn max_namespaces(&self) -> u32 {
        self.max_namespaces
    }

    /// Listen addresses of this subsystem (a copy: they change at run time).
    pub fn listeners(&self) -> Vec<ListenerConfig> {
        self.listeners
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether this subsystem listens on `l`.
    pub fn has_listener(&self, l: &ListenerConfig) -> bool {
        let ls = self.listeners.read().unwrap_or_else(|e| e.into_inner());
        ls.contains(l)
    }

    /// Whether a connection that came in on `port` may reach this subsystem.
    pub fn listens_on(&self, port: &PortInfo) -> bool {
        let ls = self.listeners.read().unwrap_or_else(|e| e.into_inner());
        ls.iter().any(|l| {
            l.trtype == port.trtype
                && l.adrfam == port.adrfam
                && l.traddr == port.traddr
                && l.trsvcid == port.trsvcid
        })
    }

    /// Start reporting `l` (false when it was already there). With ANA
    /// reporting its groups start optimized until `sync_ana` says otherwise.
    pub fn add_listener(&self, l: &ListenerConfig) -> bool {
        let mut ls = self.listeners.write().unwrap_or_else(|e| e.into_inner());
        if ls.contains(l) {
            return false;
        }
        ls.push(l.clone());
        if let Some(a) = &self.ana {
            a.add_path(l);
        }
        true
    }

    /// Stop reporting `l` (false when it was not there).
    pub fn remove_listener(&self, l: &ListenerConfig) -> bool {
        let mut ls = self.listeners.write().unwrap_or_else(|e| e.into_inner());
        let before = ls.len();
        ls.retain(|x| x != l);
        if let Some(a) = &self.ana {
            a.remove_path(l);
        }
        ls.len() != before
    }

    /// ANA state, when the subsystem reports ANA.
    pub fn ana(&self) -> Option<&SubsystemAna> {
        self.ana.as_ref()
    }

    /// The ANA path of the listener a connection came in on (`None` without
    /// ANA reporting).
    pub fn ana_path_for(&self, port: &PortInfo) -> Option<Arc<PathAna>> {
        let ana = self.ana.as_ref()?;
        let ls = self.listeners.read().unwrap_or_else(|e| e.into_inner());
        let l = ls.iter().find(|l| {
            l.trtype == port.trtype
                && l.adrfam == port.adrfam
                && l.traddr == port.traddr
                && l.trsvcid == port.trsvcid
        })?;
        ana.path(l)
    }

    /// Apply the configuration's ANA states (every listener, every group)
    /// and namespace ANA groups. Controllers whose path changed, or all of
    /// them when a namespace moved to another group, get the ANA Change
    /// event. Returns whether anything changed.
    /// The gateway group's states changed ([`crate::ana::group_ana`]): the
    /// ANA change count moves and every controller gets the ANA Change
    /// event. False without ANA reporting.
    pub fn notify_group_ana(&self) -> bool {
        let Some(ana) = &self.ana else {
            return false;
        };
        ana.bump();
        for c in self.controllers() {
            c.raise_event(AEN_ANA_CHANGE);
        }
        true
    }

    pub fn sync_ana(&self, cfg: &SubsystemConfig) -> bool {
        let Some(ana) = &self.ana else {
            return false;
        };
        let mut changed_paths: Vec<Arc<PathAna>> = Vec::new();
        for l in &cfg.listeners {
            let mut changed = false;
            for g in 1..=ana.grpmax() {
                changed |= ana.set(l, g, cfg.ana_state(l, g));
            }
            if changed {
                if let Some(p) = ana.path(l) {
                    changed_paths.push(p);
                }
            }
        }
        let table = self.namespaces();
        let mut moved = false;
        for n in &cfg.namespaces {
            if let Some(ns) = table.get(n.nsid) {
                moved |= ns.set_anagrpid(n.anagrpid);
            }
        }
        if changed_paths.is_empty() && !moved {
            return false;
        }
        ana.bump();
        for c in self.controllers() {
            let hit = moved
                || c.ana_path()
                    .is_some_and(|p| changed_paths.iter().any(|x| Arc::ptr_eq(x, p)));
            if hit {
                c.raise_event(AEN_ANA_CHANGE);
            }
        }
        true
    }

    pub fn allow_any_host(&self) -> bool {
        self.allow_any_host.load(Ordering::Acquire)
    }

    /// The DH-HMAC-CHAP keys of `hostnqn` (`None`: the host does not
    /// authenticate).
    pub fn host_keys(&self, hostnqn: &str) -> Option<HostKeys> {
        self.host_keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(hostnqn)
            .cloned()
    }

    /// Replace every host's DH-HMAC-CHAP keys.
    pub fn replace_host_keys(&self, keys: HashMap<String, HostKeys>) {
        *self.host_keys.write().unwrap_or_else(|e| e.into_inner()) = keys;
    }

    /// Set or clear the DH-HMAC-CHAP keys of `hostnqn`.
    pub fn set_host_keys(&self, hostnqn: &str, keys: Option<HostKeys>) {
        let mut m = self.host_keys.write().unwrap_or_else(|e| e.into_inner());
        match keys {
            Some(k) => {
                m.insert(hostnqn.to_string(), k);
            }
            None => {
                m.remove(hostnqn);
            }
        }
    }

    /// Allowed host NQNs (ignored when `allow_any_host`).
    pub fn hosts(&self) -> Vec<String> {
        self.hosts.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether `hostnqn` may connect (and see this subsystem in discovery).
    pub fn host_allowed(&self, hostnqn: &str) -> bool {
        self.kind == SubsystemKind::Discovery
            || self.allow_any_host()
            || self
                .hosts
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|h| h == hostnqn)
    }

    /// Add `hostnqn` to the allow list (no-op when present).
    pub fn add_host(&self, hostnqn: &str) {
        let mut hs = self.hosts.write().unwrap_or_else(|e| e.into_inner());
        if !hs.iter().any(|h| h == hostnqn) {
            hs.push(hostnqn.to_string());
        }
    }

    /// Remove `hostnqn` from the allow list and disconnect the controllers
    /// it may no longer have (as SPDK does). Returns how many were closed.
    pub fn remove_host(&self, hostnqn: &str) -> usize {
        self.hosts
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|h| h != hostnqn);
        self.disconnect_disallowed_hosts()
    }

    /// Set allow_any_host; turning it off disconnects the controllers of
    /// hosts not on the list. Returns how many were closed.
    pub fn set_allow_any_host(&self, allow: bool) -> usize {
        self.allow_any_host.store(allow, Ordering::Release);
        if allow {
            0
        } else {
            self.disconnect_disallowed_hosts()
        }
    }

    fn disconnect_disallowed_hosts(&self) -> usize {
        let mut n = 0;
        for c in self.controllers() {
            if !self.host_allowed(c.hostnqn()) && !c.is_dead() {
                c.kill(CloseReason::HostRemoved);
                n += 1;
            }
        }
        n
    }

    /// Tear down every controller (the subsystem is being deleted).
    pub fn disconnect_all(&self, reason: CloseReason) -> usize {
        let ctrls = self.controllers();
        for c in &ctrls {
            c.kill(reason);
        }
        ctrls.len()
    }

    /// The current namespace table (control path: takes a read lock).
    pub fn namespaces(&self) -> Arc<NamespaceTable> {
        self.namespaces
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Bumped after every namespace table change; compare with a cached
    /// value to know when to refresh a cached table.
    #[inline]
    pub fn ns_generation(&self) -> u64 {
        self.ns_generation.load(Ordering::Acquire)
    }

    /// Table and generation read together (the table is at least as new as
    /// the generation).
    pub fn namespaces_with_generation(&self) -> (u64, Arc<NamespaceTable>) {
        let generation = self.ns_generation();
        (generation, self.namespaces())
    }

    /// The table `hostnqn`'s controllers see: the current one without the
    /// namespaces hidden from that host (the current `Arc` itself when none
    /// is). Control path (locks; the result is cached per host until the
    /// next change).
    pub fn namespaces_for(&self, hostnqn: &str) -> Arc<NamespaceTable> {
        let table = self.namespaces.read().unwrap_or_else(|e| e.into_inner());
        let mut vis = self.visibility.lock().unwrap_or_else(|e| e.into_inner());
        vis.view(&table, hostnqn)
    }

    /// [`Self::namespaces_for`] and the generation, read together (the
    /// table is at least as new as the generation).
    pub fn namespaces_with_generation_for(&self, hostnqn: &str) -> (u64, Arc<NamespaceTable>) {
        let generation = self.ns_generation();
        (generation, self.namespaces_for(hostnqn))
    }

    /// Which hosts see namespace `nsid` (`All` unless it is `no_auto_visible`).
    pub fn ns_visibility(&self, nsid: u32) -> NsVisibility {
        let _table = self.namespaces.read().unwrap_or_else(|e| e.into_inner());
        let vis = self.visibility.lock().unwrap_or_else(|e| e.into_inner());
        vis.get(nsid)
    }

    /// Whether `hostnqn` sees namespace `nsid` (true for an NSID with no
    /// namespace: whether it exists is the table's business).
    pub fn ns_visible_to(&self, nsid: u32, hostnqn: &str) -> bool {
        let _table = self.namespaces.read().unwrap_or_else(|e| e.into_inner());
        let vis = self.visibility.lock().unwrap_or_else(|e| e.into_inner());
        vis.sees(nsid, hostnqn)
    }

    /// Set which hosts see namespace `nsid` (`nvmf_ns_add_host`,
    /// `nvmf_ns_remove_host`, a configuration load). Each controller of a
    /// host that gains or loses the namespace gets it in its Changed
    /// Namespace List and a Namespace Attribute Changed event; its queues
    /// take the new table at their next command (the generation moves).
    /// Returns how many controllers were told.
    pub fn set_ns_visibility(&self, nsid: u32, v: NsVisibility) -> Result<usize, CoreError> {
        let old = {
            let table = self.namespaces.write().unwrap_or_else(|e| e.into_inner());
            if table.get(nsid).is_none() {
                return Err(CoreError::Namespace {
                    nqn: self.nqn.clone(),
                    nsid,
                    reason: "no such namespace".to_string(),
                });
            }
            let mut vis = self.visibility.lock().unwrap_or_else(|e| e.into_inner());
            let old = vis.set(nsid, v.clone());
            if old == v {
                return Ok(0);
            }
            self.ns_generation.fetch_add(1, Ordering::AcqRel);
            old
        };
        Ok(self.announce_ns_change_to(nsid, |h| old.sees(h) != v.sees(h)))
    }

    /// Apply the configuration's visibility rules (`ns_visibility`) to every
    /// namespace of this subsystem; see [`Self::set_ns_visibility`].
    /// Returns how many controllers were told of a change.
    pub fn sync_visibility(&self, cfg: &SubsystemConfig) -> usize {
        let mut told = 0;
        for nsid in self.namespaces().active_nsids() {
            let v = NsVisibility::from_hosts(cfg.ns_visibility.get(nsid));
            told += self.set_ns_visibility(*nsid, v).unwrap_or(0);
        }
        told
    }

    /// Add a namespace visible to every host; every controller of the
    /// subsystem gets a Namespace Attribute Changed event.
    pub fn add_namespace(&self, ns: Arc<Namespace>) -> Result<(), CoreError> {
        self.add_namespace_visible(ns, NsVisibility::All)
    }

    /// Add a namespace that the hosts `v` names see (all of them with
    /// `NsVisibility::All`); the controllers of those hosts get a Namespace
    /// Attribute Changed event, the others never learn of it.
    pub fn add_namespace_visible(
        &self,
        ns: Arc<Namespace>,
        v: NsVisibility,
    ) -> Result<(), CoreError> {
        let nsid = ns.nsid();
        let err = |reason: &str| CoreError::Namespace {
            nqn: self.nqn.clone(),
            nsid,
            reason: reason.to_string(),
        };
        if self.is_discovery() {
            return Err(err("the discovery subsystem has no namespaces"));
        }
        if nsid == 0 || nsid > self.max_namespaces {
            return Err(err(&format!(
                "NSID must be 1..={} (max_namespaces)",
                self.max_namespaces
            )));
        }
        {
            let mut table = self.namespaces.write().unwrap_or_else(|e| e.into_inner());
            if table.get(nsid).is_some() {
                return Err(err("NSID already in use"));
            }
            let mut vis = self.visibility.lock().unwrap_or_else(|e| e.into_inner());
            vis.set(nsid, v.clone());
            *table = Arc::new(table.with(ns));
            self.ns_generation.fetch_add(1, Ordering::AcqRel);
        }
        self.announce_ns_change_to(nsid, |h| v.sees(h));
        Ok(())
    }

    /// Remove a namespace: it answers Internal Path Error from now on, leaves
    /// the table (and its visibility rule goes), and every controller that
    /// saw it gets a Namespace Attribute Changed event.
    pub fn remove_namespace(&self, nsid: u32) -> Result<Arc<Namespace>, CoreError> {
        let (removed, saw) = {
            let mut table = self.namespaces.write().unwrap_or_else(|e| e.into_inner());
            let ns = table
                .get(nsid)
                .cloned()
                .ok_or_else(|| CoreError::Namespace {
                    nqn: self.nqn.clone(),
                    nsid,
                    reason: "no such namespace".to_string(),
                })?;
            ns.set_state(NamespaceState::Removing);
            let mut vis = self.visibility.lock().unwrap_or_else(|e| e.into_inner());
            let saw = vis.set(nsid, NsVisibility::All);
            *table = Arc::new(table.without(nsid));
            self.ns_generation.fetch_add(1, Ordering::AcqRel);
            (ns, saw)
        };
        self.announce_ns_change_to(nsid, |h| saw.sees(h));
        Ok(removed)
    }

    /// The bdev behind `backend` now has `num_blocks` blocks: every
    /// namespace of this subsystem on it takes the new size, and for each
    /// one whose size changed every controller gets the NSID in its Changed
    /// Namespace List and a Namespace Attribute Changed event. Returns the
    /// NSIDs that changed.
    pub fn resize_backend(&self, backend: &Arc<dyn Backend>, num_blocks: u64) -> Vec<u32> {
        let same = |b: &Arc<dyn Backend>| std::ptr::addr_eq(Arc::as_ptr(b), Arc::as_ptr(backend));
        let mut changed = Vec::new();
        for ns in self.namespaces().iter() {
            if same(ns.backend()) && ns.set_num_blocks(num_blocks) {
                changed.push(ns.nsid());
            }
        }
        for &nsid in &changed {
            let v = self.ns_visibility(nsid);
            self.announce_ns_change_to(nsid, |h| v.sees(h));
        }
        changed
    }

    /// Tell the controllers of the hosts `to` accepts that namespace `nsid`
    /// changed (Changed Namespace List + Namespace Attribute Changed); a
    /// host that does not see the namespace never hears its NSID. Returns
    /// how many were told.
    fn announce_ns_change_to(&self, nsid: u32, to: impl Fn(&str) -> bool) -> usize {
        let mut n = 0;
        for ctrl in self.controllers() {
            if to(ctrl.hostnqn()) {
                ctrl.namespace_changed(nsid);
                n += 1;
            }
        }
        n
    }

    /// Live controllers.
    pub fn controllers(&self) -> Vec<Arc<Controller>> {
        let reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        reg.by_id.values().filter_map(Weak::upgrade).collect()
    }

    /// The live controller with this ID.
    pub fn controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        let reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        reg.by_id
            .get(&cntlid)
            .and_then(Weak::upgrade)
            .filter(|c| !c.is_dead())
    }

    /// Allocate a free controller ID and register the controller `make`
    /// builds for it. `None` when every ID of the range is in use.
    pub(crate) fn register_controller(
        &self,
        make: impl FnOnce(u16) -> Arc<Controller>,
    ) -> Option<Arc<Controller>> {
        let mut reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        // Forget controllers that went away without unregistering.
        reg.by_id.retain(|_, w| w.strong_count() > 0);
        let span = (self.max_cntlid - self.min_cntlid) as u32 + 1;
        let mut id = reg.next.clamp(self.min_cntlid, self.max_cntlid);
        for _ in 0..span {
            if let Entry::Vacant(slot) = reg.by_id.entry(id) {
                let ctrl = make(id);
                slot.insert(Arc::downgrade(&ctrl));
                reg.next = if id >= self.max_cntlid {
                    self.min_cntlid
                } else {
                    id + 1
                };
                return Some(ctrl);
            }
            id = if id >= self.max_cntlid {
                self.min_cntlid
            } else {
                id + 1
            };
        }
        None
    }

    /// Forget a controller (its admin queue went away).
    pub(crate) fn unregister_controller(&self, cntlid: u16) {
        let mut reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        reg.by_id.remove(&cntlid);
    }
}

/// The visibility rules of `cfg` for the namespaces of `table`.
fn visibility_of(cfg: &SubsystemConfig, table: &NamespaceTable) -> Visibility {
    let mut v = Visibility::default();
    for (nsid, hosts) in &cfg.ns_visibility {
        if table.get(*nsid).is_some() {
            v.set(*nsid, NsVisibility::from_hosts(Some(hosts)));
        }
    }
    v
}

/// Controller IDs must lie in 1..=0xFFEF; fix up nonsense rather than panic.
fn sane_cntlid_range(min: u16, max: u16) -> (u16, u16) {
    let min = min.clamp(1, 0xFFEF);
    let max = max.clamp(1, 0xFFEF);
    if min <= max {
        (min, max)
    } else {
        (1, 0xFFEF)
    }
}
