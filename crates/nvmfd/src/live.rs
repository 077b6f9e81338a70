//! The running target as the RPC server sees it: `nvmf_rpc::LiveTarget`
//! over `Arc<Target>` and the reactors.
//!
//! Every change converges the running target from the configuration it was
//! last given (`applied`) to the new one: one diff routine serves single
//! RPCs and `load_config` alike. Fallible steps run first and are undone on
//! failure (register rbd clusters, create backends, bind new listen
//! addresses in every reactor);
//! the rest (subsystems, namespaces, hosts, listeners in the core, dropping
//! backends and listen sockets) cannot fail once the model validated it.
//! Called on the RPC thread; reactors get messages (channel + mio Waker) and
//! answer within a bounded wait, so the data path never waits on this.
//! Slow bdev work (opening or resizing an rbd image: cluster round trips)
//! also runs here, so it blocks the control plane only, for at most the
//! backend's connect / operation timeouts. A resize (`bdev_rbd_resize`)
//! changes no configuration: it grows the backend and the namespaces on it.

use std::net::SocketAddr;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mio::Waker;
use nvmf_config::{ListenerConfig, NamespaceConfig, SubsystemConfig, TargetConfig, DISCOVERY_NQN};
use nvmf_core::target::Target;
use nvmf_rpc::{Change, GroupRequest, LiveTarget, NOT_A_MEMBER};
use serde_json::{json, Value};
use tracing::{info, warn};

use crate::listen::{self, ListenAddr};
use crate::paths::{GoneHosts, PathTable};
use crate::reactor::{ReactorCmd, ReactorSnapshot};

/// How long the RPC thread waits for a reactor's answer.
const REPLY_WAIT: Duration = Duration::from_secs(5);

/// The control side of one reactor.
pub struct ReactorHandle {
    pub tx: Mutex<Sender<ReactorCmd>>,
    pub waker: Arc<Waker>,
}

impl ReactorHandle {
    pub(crate) fn send(&self, cmd: ReactorCmd) -> bool {
        let ok = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(cmd)
            .is_ok();
        ok && self.waker.wake().is_ok()
    }
}

struct Applied {
    config: TargetConfig,
    bound: Vec<Arc<ListenAddr>>,
}

/// `LiveTarget` of the daemon.
pub struct Live {
    target: Arc<Target>,
    reactors: Vec<ReactorHandle>,
    applied: Mutex<Applied>,
    started: Instant,
    /// NVMe/RDMA listeners: routed to the reactors' RDMA ports.
    rdma: Arc<crate::rdma::RdmaControl>,
    /// The reactors' [`GoneHosts`], for sweeping snapshots.
    gone: Arc<GoneHosts>,
    /// This nvmfd's gateway group membership (`--gateway-group`), once
    /// its thread started.
    gateway: std::sync::OnceLock<Arc<crate::gateway::Handle>>,
}

impl Live {
    pub fn new(
        target: Arc<Target>,
        reactors: Vec<ReactorHandle>,
        config: TargetConfig,
        bound: Vec<Arc<ListenAddr>>,
        rdma: Arc<crate::rdma::RdmaControl>,
        gone: Arc<GoneHosts>,
    ) -> Live {
        Live {
            target,
            reactors,
            applied: Mutex::new(Applied { config, bound }),
            started: Instant::now(),
            rdma,
            gone,
            gateway: std::sync::OnceLock::new(),
        }
    }

    /// Hands the gateway group's handle to the RPC methods and `/metrics`.
    pub fn set_gateway(&self, h: Arc<crate::gateway::Handle>) {
        let _ = self.gateway.set(h);
    }

    /// The gateway group's handle, if this nvmfd is a member.
    pub fn gateway(&self) -> Option<&Arc<crate::gateway::Handle>> {
        self.gateway.get()
    }

    /// Sends `make(reply)` to every reactor and collects the answers.
    fn ask_all<T>(&self, make: impl Fn(Sender<T>) -> ReactorCmd) -> Vec<Option<T>> {
        let mut rxs = Vec::new();
        for r in &self.reactors {
            let (tx, rx) = channel();
            if r.send(make(tx)) {
                rxs.push(Some(rx));
            } else {
                rxs.push(None);
            }
        }
        let deadline = Instant::now() + REPLY_WAIT;
        rxs.into_iter()
            .map(|rx| {
                let rx = rx?;
                rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
                    .ok()
            })
            .collect()
    }

    /// Counters by path, all reactors added up, gone controllers folded
    /// into their hosts' gone entries (RPC and `--metrics`).
    pub fn gather_paths(&self) -> PathTable {
        let snaps = self.snapshots();
        PathTable::gather(snaps.iter().map(|s| &s.paths), &self.gone)
    }

    /// What `/metrics` shows of the reactors: counters by path (both
    /// transports), each reactor's busy and idle time and NVMe/RDMA side
    /// (reactors with an RDMA port only), and how many did not answer.
    pub fn gather_metrics(&self) -> crate::metrics::ReactorMetrics {
        let answers = self.ask_all(|reply| ReactorCmd::Snapshot { reply });
        let unanswered = answers.iter().filter(|a| a.is_none()).count();
        let snaps: Vec<ReactorSnapshot> = answers.into_iter().flatten().collect();
        let paths = PathTable::gather(snaps.iter().map(|s| &s.paths), &self.gone);
        let times = snaps
            .iter()
            .map(|s| crate::metrics::ReactorTimes {
                id: s.id,
                busy_ns: s.busy_ns,
                idle_ns: s.idle_ns,
                poll_window_ns: s.poll_window_ns,
                backend_skips: s.backend_skips,
                zc_calls: s.zc_calls,
                zc_copied: s.zc_copied,
            })
            .collect();
        let rdma = snaps
            .into_iter()
            .filter_map(|s| Some((s.id, s.rdma?)))
            .collect();
        crate::metrics::ReactorMetrics {
            paths,
            rdma,
            times,
            unanswered,
        }
    }

    /// The ANA state of every listener of every subsystem with ANA
    /// reporting, for the groups that hold a namespace, and the
    /// subsystems' change counts (`/metrics`; no reactor involved).
    pub fn ana_metrics(&self) -> Vec<crate::metrics::SubsystemAnaMetrics> {
        let mut out = Vec::new();
        for ss in self.target.subsystems() {
            let Some(ana) = ss.ana() else { continue };
            let mut groups: Vec<u32> = ss.namespaces().iter().map(|n| n.anagrpid()).collect();
            groups.sort_unstable();
            groups.dedup();
            let mut states = Vec::new();
            for p in ana.paths() {
                let l = p.listener();
                let name = crate::paths::listener_name(&l.traddr, &l.trsvcid);
                for &g in &groups {
                    states.push((name.clone(), g, p.state_code(g)));
                }
            }
            out.push(crate::metrics::SubsystemAnaMetrics {
                subsystem: ss.nqn().to_string(),
                // The count starts at 1 (the state of the start).
                changes: ana.change_count().saturating_sub(1),
                states,
            });
        }
        out
    }

    /// The host caps, their refusals so far and the controllers alive.
    pub fn host_limit_metrics(&self) -> crate::metrics::HostLimitMetrics {
        crate::metrics::HostLimitMetrics {
            limits: self.target.host_limits(),
            hits: self.target.limit_hits(),
            controllers: self.target.active_controllers(),
        }
    }

    /// Every bdev of the running target with the Reads and Writes that
    /// waited for its QoS tokens and its compare-and-write counts
    /// (`/metrics`).
    pub fn bdev_counters(&self) -> Vec<crate::metrics::BdevCounters> {
        // The target's bdev table (not the applied configuration, whose
        // lock a slow change holds): a scrape never waits for a change.
        self.target
            .backend_names()
            .into_iter()
            .map(|b| {
                let (compare_and_writes, miscompares) = self
                    .target
                    .backend(&b)
                    .map_or((0, 0), |be| nvmf_core::fused::gate_for(&be).counts());
                crate::metrics::BdevCounters {
                    qos_throttled: self.target.bdev_qos(&b).throttled(),
                    compare_and_writes,
                    miscompares,
                    name: b,
                }
            })
            .collect()
    }

    pub fn uptime_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    fn snapshots(&self) -> Vec<ReactorSnapshot> {
        self.ask_all(|reply| ReactorCmd::Snapshot { reply })
            .into_iter()
            .flatten()
            .collect()
    }

    /// Binds `addr` in every reactor; all or nothing.
    fn bind_everywhere(&self, addr: &Arc<ListenAddr>) -> Result<(), String> {
        listen::check_free(addr.addr)
            .map_err(|e| format!("cannot listen on {}: {e}", addr.addr))?;
        let replies = self.ask_all(|reply| ReactorCmd::Listen {
            addr: addr.clone(),
            reply,
        });
        let mut err = None;
        for r in replies {
            match r {
                Some(Ok(())) => {}
                Some(Err(e)) => err = Some(e),
                None => err = Some(format!("a reactor did not answer binding {}", addr.addr)),
            }
        }
        match err {
            None => Ok(()),
            Some(e) => {
                self.drop_addr(addr.addr, None, true);
                Err(e)
            }
        }
    }

    /// Closes connections on `addr` (of subsystem `only_nqn`, or all) and
    /// with `unbind` stops listening there. Returns connections closed.
    fn drop_addr(&self, addr: SocketAddr, only_nqn: Option<&str>, unbind: bool) -> usize {
        self.ask_all(|reply| ReactorCmd::Drop {
            addr,
            only_nqn: only_nqn.map(str::to_string),
            unbind,
            reply,
        })
        .into_iter()
        .flatten()
        .sum()
    }

    fn converge(&self, st: &mut Applied, new: &TargetConfig) -> Result<(), String> {
        let old = st.config.clone();
        let t = &self.target;

        // 0. Ceph clusters the new bdevs may name (registering may connect:
        // network round trips on this, the RPC thread). A cluster whose
        // definition changed (load_config) is registered again, which is
        // refused while an rbd bdev has its connection open.
        let mut changed_clusters: Vec<&str> = Vec::new();
        for o in &old.rbd_clusters {
            if new.rbd_cluster(&o.name).is_some_and(|n| n != o) {
                if let Some(b) = old.rbd_cluster_user(&o.name) {
                    return Err(format!(
                        "rbd cluster {}: its definition cannot change while rbd bdev {} uses it \
                         (delete the bdevs on it first)",
                        o.name, b.name
                    ));
                }
                changed_clusters.push(&o.name);
            }
        }
        let mut registered: Vec<&str> = Vec::new();
        for c in &new.rbd_clusters {
            if old.rbd_cluster(&c.name) == Some(c) {
                continue;
            }
            if changed_clusters.contains(&c.name.as_str()) {
                crate::rbd_clusters::unregister(&c.name);
            }
            if let Err(e) = crate::rbd_clusters::register(c) {
                for n in &registered {
                    crate::rbd_clusters::unregister(n);
                }
                for n in &changed_clusters {
                    if let Some(o) = old.rbd_cluster(n) {
                        let _ = crate::rbd_clusters::register(o);
                    }
                }
                return Err(format!("rbd cluster {}: {e}", c.name));
            }
            registered.push(&c.name);
        }

        // 1. New backends (may fail: file missing, out of memory). A bdev
        // whose definition changed (load_config) is replaced, and every
        // namespace on it is re-attached in step 3 so hosts see the new one.
        let mut created: Vec<String> = Vec::new();
        let mut redefined: Vec<String> = Vec::new();
        for b in &new.bdevs {
            let before = old.bdev(&b.name);
            if before.is_some_and(|o| o == b) {
                continue;
            }
            if before.is_some() {
                t.remove_backend(&b.name);
                redefined.push(b.name.clone());
            }
            if let Err(e) = t.add_backend(b) {
                for n in &created {
                    t.remove_backend(n);
                }
                // Put back the definitions this call replaced.
                for n in &redefined {
                    if let Some(o) = old.bdev(n) {
                        if let Err(e) = t.add_backend(o) {
                            tracing::error!(bdev = %n, "cannot restore the previous bdev: {e}");
                        }
                    }
                }
                for n in &registered {
                    crate::rbd_clusters::unregister(n);
                }
                return Err(e.to_string());
            }
            created.push(b.name.clone());
        }

        // 2. New listen addresses, bound in every reactor.
        let mut want: Vec<Arc<ListenAddr>> = Vec::new();
        let mut newly_bound: Vec<Arc<ListenAddr>> = Vec::new();
        // NVMe/RDMA listen addresses are reactor 0's RDMA port's (created
        // with the first one); those added here are undone on failure too.
        let rdma_old: Vec<&ListenerConfig> = old
            .listen_addresses()
            .into_iter()
            .filter(|l| l.trtype == nvmf_config::TransportType::Rdma)
            .collect();
        let mut rdma_added: Vec<SocketAddr> = Vec::new();
        let undo = |newly: &[Arc<ListenAddr>], rdma_added: &[SocketAddr], created: &[String]| {
            for a in newly {
                self.drop_addr(a.addr, None, true);
            }
            for a in rdma_added {
                self.rdma.drop_listener(*a, None, true);
            }
            for n in created {
                t.remove_backend(n);
            }
            for n in &registered {
                crate::rbd_clusters::unregister(n);
            }
        };
        for l in new.listen_addresses() {
            if l.trtype == nvmf_config::TransportType::Rdma {
                if rdma_old.contains(&l) {
                    continue;
                }
                let addr = match nvmf_rdma::port::listen_addr(l) {
                    Ok(a) => a,
                    Err(e) => {
                        undo(&newly_bound, &rdma_added, &created);
                        return Err(e);
                    }
                };
                if rdma_added.contains(&addr) {
                    continue;
                }
                if let Err(e) = self.rdma.listen(l) {
                    undo(&newly_bound, &rdma_added, &created);
                    return Err(e);
                }
                rdma_added.push(addr);
                continue;
            }
            let a = match ListenAddr::resolve(l) {
                Ok(a) => Arc::new(a),
                Err(e) => {
                    undo(&newly_bound, &rdma_added, &created);
                    return Err(format!("{e:#}"));
                }
            };
            if let Some(b) = st.bound.iter().find(|b| b.addr == a.addr) {
                want.push(b.clone());
                continue;
            }
            if want.iter().any(|w| w.addr == a.addr) {
                continue;
            }
            if let Err(e) = self.bind_everywhere(&a) {
                undo(&newly_bound, &rdma_added, &created);
                return Err(e);
            }
            info!("listening on {} (tcp)", a.addr);
            newly_bound.push(a.clone());
            want.push(a);
        }

        // 3. Subsystems: gone or redefined ones first, then new ones.
        let ident = |s: &SubsystemConfig| {
            let mut x = s.clone();
            x.namespaces.clear();
            x.hosts.clear();
            x.host_keys.clear(); // keys change live (nvmf_subsystem_set_keys)
            x.listeners.clear();
            x.allow_any_host = false;
            x.ana_states.clear();
            x.ns_visibility.clear(); // changes live (nvmf_ns_add_host)
            x
        };
        let mut fresh: Vec<&SubsystemConfig> = Vec::new();
        for o in &old.subsystems {
            match new.subsystem(&o.nqn) {
                Some(n) if ident(n) == ident(o) => {}
                _ => {
                    if let Ok(sub) = t.remove_subsystem(&o.nqn) {
                        info!(nqn = %o.nqn, controllers = sub.controllers().len(), "subsystem removed");
                    }
                }
            }
        }
        for n in &new.subsystems {
            match old.subsystem(&n.nqn) {
                Some(o) if ident(n) == ident(o) => self.converge_subsystem(o, n, &redefined)?,
                _ => fresh.push(n),
            }
        }
        // Queues of torn-down controllers close now, not on the next tick.
        self.close_dead();
        for n in fresh {
            t.add_subsystem(n).map_err(|e| e.to_string())?;
        }
        // ANA states and namespace groups (after listeners and namespaces
        // exist); controllers that see a change get the ANA Change event.
        for n in &new.subsystems {
            if t.sync_ana(n).map_err(|e| e.to_string())? {
                info!(nqn = %n.nqn, "ANA states changed: hosts notified");
            }
        }
        // Discovery listeners.
        for l in &old.discovery_listeners {
            if !new.discovery_listeners.contains(l) {
                let _ = t.remove_listener(DISCOVERY_NQN, l);
                self.close_on_listener(DISCOVERY_NQN, l);
            }
        }
        for l in &new.discovery_listeners {
            if !old.discovery_listeners.contains(l) {
                t.add_listener(DISCOVERY_NQN, l)
                    .map_err(|e| e.to_string())?;
            }
        }

        // 4. Backends no bdev defines any more, then clusters no longer
        // registered. QoS limits that changed (bdev_set_qos_limit; a
        // deleted bdev's are turned off) apply live, by bdev name.
        for name in old.bdevs.iter().chain(&new.bdevs).map(|b| &b.name) {
            let l = new.qos_limits(name);
            if old.qos_limits(name) != l {
                t.set_bdev_qos(name, &l);
                info!(bdev = %name, limits = ?l, "QoS rate limits set");
            }
        }
        for o in &old.bdevs {
            if new.bdev(&o.name).is_none() {
                t.remove_backend(&o.name);
                t.remove_bdev_qos(&o.name);
            }
        }
        for o in &old.rbd_clusters {
            if new.rbd_cluster(&o.name).is_none() {
                crate::rbd_clusters::unregister(&o.name);
            }
        }

        // 5. Listen addresses nobody uses any more.
        for b in &st.bound {
            if !want.iter().any(|w| w.addr == b.addr) {
                let n = self.drop_addr(b.addr, None, true);
                info!("stopped listening on {} ({n} connection(s) closed)", b.addr);
            }
        }
        let rdma_new = new.listen_addresses();
        for l in rdma_old {
            if !rdma_new.contains(&l) {
                if let Ok(a) = nvmf_rdma::port::listen_addr(l) {
                    let n = self.rdma.drop_listener(a, None, true);
                    info!("stopped listening on {a} (rdma; {n} queue(s) disconnected)");
                }
            }
        }
        st.bound = want;
        st.config = new.clone();
        Ok(())
    }

    /// Closes, in every reactor, the connections whose controller was torn
    /// down (deleted subsystem, removed host). Their queues take no new
    /// command once the controller is dead (nvmf-core queue.rs); closing
    /// them at once lets the host resend what was unanswered without
    /// waiting for a reactor tick.
    fn close_dead(&self) {
        let n: usize = self
            .ask_all(|reply| ReactorCmd::CloseDead { reply })
            .into_iter()
            .flatten()
            .sum();
        if n > 0 {
            info!("{n} connection(s) of torn-down controllers closed");
        }
    }

    /// Closes the connections of subsystem `nqn` that came in on `l`.
    fn close_on_listener(&self, nqn: &str, l: &ListenerConfig) {
        if l.trtype == nvmf_config::TransportType::Rdma {
            if let Ok(a) = nvmf_rdma::port::listen_addr(l) {
                let n = self.rdma.drop_listener(a, Some(nqn), false);
                if n > 0 {
                    info!(
                        nqn,
                        "{n} NVMe/RDMA queue(s) on removed listener {a} disconnected"
                    );
                }
            }
            return;
        }
        if let Ok(a) = ListenAddr::resolve(l) {
            let n = self.drop_addr(a.addr, Some(nqn), false);
            if n > 0 {
                info!(
                    nqn,
                    "{n} connection(s) on removed listener {} closed", a.addr
                );
            }
        }
    }

    fn converge_subsystem(
        &self,
        o: &SubsystemConfig,
        n: &SubsystemConfig,
        redefined_bdevs: &[String],
    ) -> Result<(), String> {
        let t = &self.target;
        let nqn = &n.nqn;
        // A namespace is re-attached when its entry changed or its bdev was
        // redefined (it still holds the replaced backend otherwise).
        // (A new ANA group alone does not re-attach: `sync_ana` moves it.)
        let same = |a: &NamespaceConfig, b: Option<&NamespaceConfig>| {
            b.is_some_and(|b| {
                NamespaceConfig {
                    anagrpid: a.anagrpid,
                    ..b.clone()
                } == *a
            }) && !redefined_bdevs.contains(&a.bdev_name)
        };
        for ns in &o.namespaces {
            if !same(ns, n.namespace(ns.nsid)) {
                t.remove_namespace(nqn, ns.nsid)
                    .map_err(|e| e.to_string())?;
                info!(nqn = %nqn, nsid = ns.nsid, "namespace removed");
            }
        }
        for ns in &n.namespaces {
            if !same(ns, o.namespace(ns.nsid)) {
                // A no_auto_visible namespace is hidden from its first moment.
                let v = nvmf_core::NsVisibility::from_hosts(n.ns_visibility.get(&ns.nsid));
                t.add_namespace_visible(nqn, ns, v)
                    .map_err(|e| e.to_string())?;
                info!(nqn = %nqn, nsid = ns.nsid, bdev = %ns.bdev_name, "namespace added");
            }
        }
        // Per-host visibility of the namespaces that stayed
        // (nvmf_ns_add_host / nvmf_ns_remove_host, load_config).
        if o.ns_visibility != n.ns_visibility {
            let told = t.sync_visibility(n).map_err(|e| e.to_string())?;
            info!(nqn = %nqn, controllers = told, "namespace visibility changed");
        }
        for h in &n.hosts {
            if !o.hosts.contains(h) {
                t.add_host(nqn, h).map_err(|e| e.to_string())?;
            }
        }
        for h in &o.hosts {
            if !n.hosts.contains(h) {
                let k = t.remove_host(nqn, h).map_err(|e| e.to_string())?;
                if k > 0 {
                    info!(nqn = %nqn, host = %h, "{k} controller(s) of a removed host disconnected");
                }
            }
        }
        if o.allow_any_host != n.allow_any_host {
            t.set_allow_any_host(nqn, n.allow_any_host)
                .map_err(|e| e.to_string())?;
        }
        for l in &o.listeners {
            if !n.listeners.contains(l) {
                t.remove_listener(nqn, l).map_err(|e| e.to_string())?;
                self.close_on_listener(nqn, l);
            }
        }
        for l in &n.listeners {
            if !o.listeners.contains(l) {
                t.add_listener(nqn, l).map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}

impl LiveTarget for Live {
    fn apply(&self, change: &Change, new_config: &TargetConfig) -> Result<(), String> {
        // A gateway group member writes a change of the shared
        // configuration to RADOS first (docs/GATEWAY-GROUPS.md); refused
        // there, nothing changes here either.
        if let Some(h) = self.gateway.get() {
            if !matches!(change, Change::ResizeBdev { .. }) {
                h.publish_config(new_config).inspect_err(|e| {
                    warn!("rpc: {} refused: {e}", change.kind());
                })?;
            }
        }
        let mut st = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        if let Change::CreateTransport(tc) = change {
            if tc.trtype == nvmf_config::TransportType::Tcp
                && *self.target.limits() != nvmf_core::target::TransportLimits::from_config(tc)
            {
                info!(
                    "transport limits are fixed while nvmfd runs: the new TCP transport \
                     parameters are saved and take effect at the next start"
                );
            }
        }
        if let Change::ResizeBdev { name, num_blocks } = change {
            // The model does not change (the size lives in the backend):
            // grow the device, then every namespace on it.
            return match self.target.resize_bdev(name, *num_blocks) {
                Ok(hit) => {
                    info!(bdev = %name, num_blocks, namespaces = ?hit, "rpc: bdev resized, hosts notified");
                    Ok(())
                }
                Err(e) => {
                    warn!("rpc: ResizeBdev refused: {e}");
                    Err(e.to_string())
                }
            };
        }
        // Keys are read and checked before anything changes: a bad key
        // file refuses the whole change.
        let keys = nvmf_core::auth::load_keys(new_config).inspect_err(|e| {
            warn!("rpc: {} refused: DH-HMAC-CHAP keys: {e}", change.kind());
        })?;
        let tls = nvmf_core::tls::load_tls(new_config).inspect_err(|e| {
            warn!("rpc: {} refused: TLS PSKs: {e}", change.kind());
        })?;
        // The TLS table goes in before listeners are bound: a connection
        // on a new secure listener is never taken for clear text.
        let old_tls = self.target.tls();
        self.target.set_tls(Arc::new(tls));
        let r = self.converge(&mut st, new_config);
        if r.is_ok() {
            keys.install(&self.target);
        } else {
            self.target.set_tls(old_tls);
        }
        match &r {
            Ok(()) => info!("rpc: {} applied", change.kind()),
            Err(e) => warn!("rpc: {} refused: {e}", change.kind()),
        }
        r
    }

    fn bdev_num_blocks(&self, name: &str) -> Option<u64> {
        self.target.bdev_num_blocks(name)
    }

    fn bdev_qos_throttled(&self, name: &str) -> u64 {
        self.target.bdev_qos(name).throttled()
    }

    fn controllers(&self, nqn: &str) -> Vec<Value> {
        let Some(sub) = self.target.subsystem(nqn) else {
            return Vec::new();
        };
        sub.controllers()
            .iter()
            .filter(|c| !c.is_dead())
            .map(|c| {
                json!({
                    "cntlid": c.cntlid(),
                    "cntrltype": if c.is_discovery() { "discovery" } else { "io" },
                    "hostnqn": c.hostnqn(),
                    "hostid": format_hostid(c.hostid()),
                    "num_io_qpairs": c.connected_io_queues(),
                })
            })
            .collect()
    }

    fn qpairs(&self, nqn: &str) -> Vec<Value> {
        qpairs_json(&self.snapshots(), nqn)
    }

    fn gateway_group(&self, request: &GroupRequest) -> Result<Value, String> {
        let h = self.gateway.get().ok_or_else(|| NOT_A_MEMBER.to_string())?;
        match request {
            GroupRequest::Status => Ok(h.status()),
            GroupRequest::Move { anagrpid, to } => h.move_group(*anagrpid, to),
        }
    }

    fn reservation(&self, nqn: &str, nsid: u32) -> Option<Value> {
        let sub = self.target.subsystem(nqn)?;
        let table = sub.namespaces();
        let ns = table.get(nsid)?;
        let r = ns.reservations();
        let st = r.snapshot();
        Some(json!({
            "generation": st.generation,
            "rtype": st.rtype,
            "holder": st.holder.filter(|_| st.rtype != 0).map(|h| format_hostid(&h)),
            "ptpl": st.ptpl,
            "ptpl_file": r.ptpl_file().map(|p| p.display().to_string()),
            "registrants": st.registrants.iter().map(|g| json!({
                "hostid": format_hostid(&g.hostid),
                "rkey": g.rkey,
                "holder": st.is_holder(&g.hostid),
            })).collect::<Vec<_>>(),
        }))
    }

    fn thread_stats(&self) -> Value {
        let threads: Vec<Value> = self
            .snapshots()
            .iter()
            .map(|s| {
                json!({
                    "name": poll_group_name(s.id),
                    "id": s.id + 1,
                    "cpumask": s.cpu.map_or_else(String::new, |c| format!("{:x}", 1u128 << c.min(127))),
                    "busy": s.busy_ns,
                    "idle": s.idle_ns,
                })
            })
            .collect();
        // 1 tick = 1 ns.
        json!({ "tick_rate": 1_000_000_000u64, "threads": threads })
    }

    fn path_stats(&self) -> Value {
        let t = self.gather_paths();
        crate::paths::path_stats_json(&t, 1_000_000_000, self.uptime_us())
    }

    fn stats(&self) -> Value {
        stats_json(&self.snapshots(), self.uptime_us(), &self.gone)
    }

    fn namespace_io(&self) -> (u64, Vec<nvmf_rpc::NamespaceIo>) {
        let t = self.gather_paths();
        (
            self.uptime_us().saturating_mul(1000),
            crate::paths::namespace_io(&t),
        )
    }
}

/// `nvmf_subsystem_get_qpairs` of subsystem `nqn` from the reactors'
/// snapshots: both transports, SPDK's fields (`listen_address` and
/// `peer_address` carry the queue's `trtype`) and nvmfd's `stats`.
fn qpairs_json(snaps: &[ReactorSnapshot], nqn: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for s in snaps {
        for q in &s.qpairs {
            if q.subnqn.as_deref() != Some(nqn) {
                continue;
            }
            let state = if q.closing {
                "deactivating"
            } else if q.connected {
                "active"
            } else {
                "connecting"
            };
            out.push(json!({
                "cntlid": q.cntlid,
                "qid": q.qid,
                "state": state,
                "thread": poll_group_name(s.id),
                "listen_address": listener_json(&q.listen),
                "peer_address": {
                    "trtype": q.listen.trtype.as_str(),
                    "adrfam": if q.peer.is_ipv6() { "IPv6" } else { "IPv4" },
                    "traddr": q.peer.ip().to_string(),
                    "trsvcid": q.peer.port().to_string(),
                },
                // nvmfd's addition: this queue's counters.
                "stats": {
                    "commands": q.stats.commands,
                    "reads": q.stats.reads,
                    "writes": q.stats.writes,
                    "bytes_read": q.stats.bytes_read,
                    "bytes_written": q.stats.bytes_written,
                    "errors": q.stats.errors,
                    "in_flight": q.in_flight,
                },
            }));
        }
    }
    out
}

/// `nvmf_get_stats` from the reactors' snapshots: one poll group per
/// reactor with a transport entry for NVMe/TCP and, where the reactor has
/// an RDMA port, one for NVMe/RDMA (its queues, I/O counters and
/// completion-polling counters).
fn stats_json(snaps: &[ReactorSnapshot], uptime_us: u64, gone: &GoneHosts) -> Value {
    let paths = PathTable::gather(snaps.iter().map(|s| &s.paths), gone);
    let groups: Vec<Value> = snaps
        .iter()
        .map(|s| {
            let tcp_in_flight: u64 = s
                .qpairs
                .iter()
                .filter(|q| {
                    q.listen.trtype == nvmf_config::TransportType::Tcp && q.qid != 0 && q.connected
                })
                .map(|q| q.in_flight as u64)
                .sum();
            let mut transports = vec![json!({
                "trtype": "TCP",
                "pending_qpairs": s.pending_qpairs,
                "reads": s.stats.reads,
                "writes": s.stats.writes,
                "bytes_read": s.stats.bytes_read,
                "bytes_written": s.stats.bytes_written,
                "errors": s.stats.errors,
                "errors_by_status": crate::paths::errors_json(&s.stats),
                "in_flight": tcp_in_flight,
            })];
            let mut completed = s.stats.commands;
            if let Some(r) = &s.rdma {
                completed += r.stats.commands;
                transports.push(json!({
                    "trtype": "RDMA",
                    "qpairs": r.qpairs,
                    "pending_qpairs": r.pending_qpairs,
                    "reads": r.stats.reads,
                    "writes": r.stats.writes,
                    "bytes_read": r.stats.bytes_read,
                    "bytes_written": r.stats.bytes_written,
                    "errors": r.stats.errors,
                    "errors_by_status": crate::paths::errors_json(&r.stats),
                    "in_flight": r.in_flight,
                    // The reactor's port, all its devices together (SPDK
                    // breaks its poll counts out per device).
                    "cq_wakeups": r.poll.cq_wakeups,
                    "busy_polls": r.poll.busy_polls,
                    "completions": r.poll.completions,
                    "polled_completions": r.poll.polled_completions,
                    "async_events": r.poll.async_events,
                    "srq_unconfirmed_teardowns": r.poll.srq_unconfirmed_teardowns,
                }));
            }
            json!({
                "name": poll_group_name(s.id),
                "admin_qpairs": s.admin_qpairs,
                "io_qpairs": s.io_qpairs,
                "current_admin_qpairs": s.current_admin_qpairs,
                "current_io_qpairs": s.current_io_qpairs,
                "pending_bdev_io": s.pending_bdev_io,
                "completed_nvme_io": completed,
                "transports": transports,
            })
        })
        .collect();
    json!({
        // Counters are plain counts; nvmfd has no TSC ticks: 1 tick = 1 µs.
        "tick_rate": 1_000_000u64,
        "uptime_us": uptime_us,
        "poll_groups": groups,
        "listeners": crate::paths::listeners_json(&paths),
    })
}

fn poll_group_name(id: usize) -> String {
    format!("nvmf_tgt_poll_group_{id:03}")
}

fn listener_json(l: &ListenerConfig) -> Value {
    json!({
        "trtype": l.trtype.as_str(),
        "adrfam": l.adrfam.as_str(),
        "traddr": l.traddr,
        "trsvcid": l.trsvcid,
    })
}

/// Host identifier as SPDK prints it (UUID form).
fn format_hostid(id: &[u8; 16]) -> String {
    nvmf_config::format_uuid(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::{PathKey, PathStats};
    use crate::reactor::{QpairSnapshot, RdmaSnapshot};
    use nvmf_config::{AddressFamily, TransportType};
    use nvmf_core::controller::QueueStats;

    const NQN: &str = "nqn.2016-06.io.spdk:cnode1";

    fn qpair(trtype: TransportType, qid: u16, port: &str, peer: &str) -> QpairSnapshot {
        QpairSnapshot {
            subnqn: Some(NQN.into()),
            cntlid: Some(1),
            qid,
            connected: true,
            closing: false,
            listen: ListenerConfig {
                trtype,
                adrfam: AddressFamily::Ipv4,
                traddr: "10.0.0.1".into(),
                trsvcid: port.into(),
            },
            peer: peer.parse().unwrap(),
            stats: QueueStats {
                commands: 5,
                reads: 3,
                ..Default::default()
            },
            in_flight: 2,
        }
    }

    /// Reactor 0 serves a TCP I/O queue and an RDMA admin queue, reactor 1
    /// an RDMA I/O queue being disconnected; reactor 2 has no RDMA port.
    fn snaps() -> Vec<ReactorSnapshot> {
        let rdma = |qpairs, wakeups| RdmaSnapshot {
            poll: nvmf_rdma::PollStats {
                cq_wakeups: wakeups,
                busy_polls: 40,
                completions: 100,
                polled_completions: 60,
                ..Default::default()
            },
            qpairs,
            pending_qpairs: 0,
            stats: QueueStats {
                commands: 9,
                writes: 4,
                ..Default::default()
            },
            in_flight: 1,
        };
        let mut closing = qpair(TransportType::Rdma, 1, "4420", "10.0.0.2:40001");
        closing.closing = true;
        vec![
            ReactorSnapshot {
                id: 0,
                qpairs: vec![
                    qpair(TransportType::Tcp, 1, "4420", "10.0.0.2:50000"),
                    qpair(TransportType::Rdma, 0, "4420", "10.0.0.2:40000"),
                ],
                stats: QueueStats {
                    commands: 7,
                    ..Default::default()
                },
                rdma: Some(rdma(1, 12)),
                ..Default::default()
            },
            ReactorSnapshot {
                id: 1,
                qpairs: vec![closing],
                rdma: Some(rdma(1, 30)),
                ..Default::default()
            },
            ReactorSnapshot {
                id: 2,
                ..Default::default()
            },
        ]
    }

    #[test]
    fn rdma_queues_are_listed_with_their_transport() {
        let q = qpairs_json(&snaps(), NQN);
        assert_eq!(q.len(), 3, "{q:#?}");
        assert_eq!(q[0]["listen_address"]["trtype"], "TCP");
        assert_eq!(q[0]["peer_address"]["trtype"], "TCP");
        let admin = &q[1];
        assert_eq!(
            admin["listen_address"],
            json!({"trtype": "RDMA", "adrfam": "IPv4", "traddr": "10.0.0.1", "trsvcid": "4420"})
        );
        assert_eq!(
            admin["peer_address"],
            json!({"trtype": "RDMA", "adrfam": "IPv4", "traddr": "10.0.0.2", "trsvcid": "40000"})
        );
        assert_eq!(admin["cntlid"], 1);
        assert_eq!(admin["qid"], 0);
        assert_eq!(admin["state"], "active");
        assert_eq!(admin["thread"], "nvmf_tgt_poll_group_000");
        assert_eq!(admin["stats"]["commands"], 5);
        let io = &q[2];
        assert_eq!(io["qid"], 1);
        assert_eq!(io["state"], "deactivating");
        assert_eq!(io["thread"], "nvmf_tgt_poll_group_001");
        assert!(qpairs_json(&snaps(), "nqn.other").is_empty());
    }

    #[test]
    fn rdma_transport_stats_per_poll_group() {
        let v = stats_json(&snaps(), 1000, &GoneHosts::default());
        let g = v["poll_groups"].as_array().unwrap();
        assert_eq!(g.len(), 3);
        let t0 = g[0]["transports"].as_array().unwrap();
        assert_eq!(t0.len(), 2, "{v:#}");
        assert_eq!(t0[0]["trtype"], "TCP");
        // the TCP entry counts the TCP queue only
        assert_eq!(t0[0]["in_flight"], 2);
        let r = &t0[1];
        assert_eq!(r["trtype"], "RDMA");
        assert_eq!(r["qpairs"], 1);
        assert_eq!(r["cq_wakeups"], 12);
        assert_eq!(r["busy_polls"], 40);
        assert_eq!(r["completions"], 100);
        assert_eq!(r["polled_completions"], 60);
        assert_eq!(r["writes"], 4);
        assert_eq!(r["in_flight"], 1);
        // completed_nvme_io: both transports
        assert_eq!(g[0]["completed_nvme_io"], 16);
        assert_eq!(g[1]["transports"][1]["cq_wakeups"], 30);
        // no RDMA port: TCP only
        assert_eq!(g[2]["transports"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn listeners_are_told_apart_by_transport() {
        let mut t = PathTable::default();
        for (trtype, commands) in [("TCP", 3), ("RDMA", 5)] {
            let key = PathKey {
                subnqn: NQN.into(),
                listener: "10.0.0.1:4420".into(),
                trtype,
                hostnqn: "nqn.host".into(),
                cntlid: 1,
            };
            let mut p = PathStats {
                qpairs: 2,
                ..Default::default()
            };
            p.stats.commands = commands;
            t.paths.insert(key, p);
        }
        let l = crate::paths::listeners_json(&t);
        let l = l.as_array().unwrap();
        assert_eq!(l.len(), 2, "{l:#?}");
        let rdma = l.iter().find(|x| x["trtype"] == "RDMA").unwrap();
        assert_eq!(rdma["commands"], 5);
        assert_eq!(rdma["listener"], "10.0.0.1:4420");
        let p = crate::paths::path_stats_json(&t, 1, 1);
        assert!(p["paths"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["trtype"] == "RDMA" && x["commands"] == 5));
    }
}
