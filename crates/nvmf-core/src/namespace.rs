//! Namespaces and the per-subsystem namespace table.
//!
//! Owns [`Namespace`] (NSID, backend, geometry, NGUID/EUI-64/UUID, ANA group
//! ID, a state atomic for removal, its reservation (`reservation.rs`), the write-protected flag taken from the
//! backend's `read_only` when the namespace is made; the block count is an atomic too: it
//! changes when the bdev is resized, see `Subsystem::resize_backend`) and [`NamespaceTable`], the immutable snapshot that
//! queue pairs cache: lookup by NSID is one bounds-checked vector index.
//! A subsystem replaces its table wholesale on change (copy on write) and
//! bumps a generation counter; see `subsystem.rs`.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use crate::backend::Backend;
use crate::qos::BdevQos;
use crate::reservation::Reservations;

/// Lifecycle of a namespace, read on every I/O (one relaxed load).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum NamespaceState {
    /// Serving I/O.
    Active = 0,
    /// Being removed: I/O answers Internal Path Error (io.rs says why).
    Removing = 1,
}

/// One namespace of an NVM subsystem.
#[derive(Debug)]
pub struct Namespace {
    nsid: u32,
    backend: Arc<dyn Backend>,
    block_size: u32,
    block_shift: u8,
    /// Write-protected (the backend serves reads only): Identify NSATTR
    /// bit 0, and io.rs refuses commands that modify the namespace. Fixed
    /// for the namespace's life, so the I/O path reads a plain bool.
    read_only: bool,
    /// Size in blocks (NSZE = NCAP = NUSE); changes on a resize, read with
    /// one relaxed load by each I/O's LBA range check and by Identify.
    num_blocks: AtomicU64,
    /// Namespace Globally Unique Identifier.
    pub nguid: [u8; 16],
    /// IEEE Extended Unique Identifier.
    pub eui64: [u8; 8],
    /// Namespace UUID.
    pub uuid: [u8; 16],
    /// ANA group (changeable at run time: `nvmf_subsystem_set_ns_ana_group`).
    anagrpid: AtomicU32,
    state: AtomicU8,
    /// The QoS limits of the bdev (shared by every namespace on it).
    qos: Arc<BdevQos>,
    /// Registrants, holder and type (`reservation.rs`): shared by every
    /// controller of this namespace.
    reservations: Reservations,
    /// The bdev's write gate (`fused.rs`): shared by every namespace on
    /// the bdev; write-group commands count themselves in it.
    write_gate: Arc<crate::fused::WriteGate>,
    /// Its name for hosts (the bdev's), in Identify Namespace's
    /// vendor-specific area; empty: none.
    name: String,
}

impl Namespace {
    /// A namespace exposing `backend` with the backend's block size.
    pub fn new(
        nsid: u32,
        backend: Arc<dyn Backend>,
        nguid: [u8; 16],
        eui64: [u8; 8],
        uuid: [u8; 16],
    ) -> Namespace {
        let block_size = backend.block_size();
        let num_blocks = backend.num_blocks();
        Namespace {
            nsid,
            read_only: backend.read_only(),
            block_shift: block_size.trailing_zeros() as u8,
            block_size,
            num_blocks: AtomicU64::new(num_blocks),
            nguid,
            eui64,
            uuid,
            anagrpid: AtomicU32::new(nsid),
            state: AtomicU8::new(NamespaceState::Active as u8),
            qos: Arc::new(BdevQos::new()),
            reservations: Reservations::new(),
            write_gate: crate::fused::gate_for(&backend),
            backend,
            name: String::new(),
        }
    }

    /// The same namespace named `name` for hosts (Identify Namespace's
    /// vendor-specific area: readable device names, `nvmf udev-name`).
    pub fn with_name(mut self, name: &str) -> Namespace {
        self.name = name.to_string();
        self
    }

    /// Its name for hosts ("" when none).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The same namespace under the QoS limits `qos` of its bdev (the
    /// target's, by bdev name; `new` gives it limits of its own, none).
    pub fn with_qos(mut self, qos: Arc<BdevQos>) -> Namespace {
        self.qos = qos;
        self
    }

    /// The QoS limits of the bdev.
    #[inline]
    pub fn qos(&self) -> &Arc<BdevQos> {
        &self.qos
    }

    /// With a Persist Through Power Loss file (SPDK's `ptpl_file`): the
    /// reservation it holds is restored when its PTPL flag is set. An
    /// unreadable or malformed file is an error naming it.
    pub fn with_ptpl_file(mut self, path: &std::path::Path) -> Result<Namespace, String> {
        self.reservations = Reservations::with_ptpl_file(path)?;
        Ok(self)
    }

    /// The bdev's write gate (fused Compare and Write, `fused.rs`).
    #[inline]
    pub fn write_gate(&self) -> &Arc<crate::fused::WriteGate> {
        &self.write_gate
    }

    /// The namespace's reservation.
    #[inline]
    pub fn reservations(&self) -> &Reservations {
        &self.reservations
    }

    pub fn nsid(&self) -> u32 {
        self.nsid
    }

    /// ANA group ID (the NSID unless set otherwise).
    #[inline]
    pub fn anagrpid(&self) -> u32 {
        self.anagrpid.load(Ordering::Relaxed)
    }

    /// Move the namespace to another ANA group; true when it changed.
    pub fn set_anagrpid(&self, grp: u32) -> bool {
        self.anagrpid.swap(grp, Ordering::AcqRel) != grp
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Logical block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Write-protected: Write, Write Zeroes and Deallocate get Namespace
    /// Is Write Protected (from the backend's `Backend::read_only`).
    #[inline]
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// log2 of the block size (LBADS).
    pub fn block_shift(&self) -> u8 {
        self.block_shift
    }

    /// Namespace size in blocks (NSZE).
    #[inline]
    pub fn num_blocks(&self) -> u64 {
        self.num_blocks.load(Ordering::Relaxed)
    }

    /// Set the size in blocks (the bdev was resized); true when it changed.
    /// The caller announces the change (Changed Namespace List + AEN).
    pub fn set_num_blocks(&self, num_blocks: u64) -> bool {
        self.num_blocks.swap(num_blocks, Ordering::AcqRel) != num_blocks
    }

    pub fn state(&self) -> NamespaceState {
        match self.state.load(Ordering::Relaxed) {
            0 => NamespaceState::Active,
            _ => NamespaceState::Removing,
        }
    }

    /// True while the namespace serves I/O.
    #[inline]
    pub fn is_active(&self) -> bool {
        self.state.load(Ordering::Relaxed) == NamespaceState::Active as u8
    }

    pub fn set_state(&self, state: NamespaceState) {
        self.state.store(state as u8, Ordering::Release);
    }
}

/// Immutable NSID → namespace map, shared as `Arc<NamespaceTable>`.
#[derive(Debug, Default, Clone)]
pub struct NamespaceTable {
    /// `slots[nsid - 1]`; sized to the highest NSID present.
    slots: Vec<Option<Arc<Namespace>>>,
    /// NSIDs present, ascending.
    active: Vec<u32>,
    /// Some namespace's backend keeps pointers into data buffers after
    /// submit (see `Backend::needs_stable_buffers`).
    stable_buffers: bool,
}

impl NamespaceTable {
    /// An empty table.
    pub fn new() -> NamespaceTable {
        NamespaceTable::default()
    }

    /// Build from namespaces (NSIDs must be non-zero and distinct; a later
    /// duplicate replaces an earlier one).
    pub fn from_namespaces(list: impl IntoIterator<Item = Arc<Namespace>>) -> NamespaceTable {
        let mut t = NamespaceTable::new();
        for ns in list {
            t = t.with(ns);
        }
        t
    }

    /// The namespace with this NSID, if present. Never panics.
    #[inline]
    pub fn get(&self, nsid: u32) -> Option<&Arc<Namespace>> {
        let idx = (nsid as usize).checked_sub(1)?;
        self.slots.get(idx)?.as_ref()
    }

    /// Present NSIDs in ascending order.
    pub fn active_nsids(&self) -> &[u32] {
        &self.active
    }

    /// Number of namespaces present.
    pub fn len(&self) -> usize {
        self.active.len()
    }

    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// True when some backend needs data buffers that stay put until the
    /// command completes (`Backend::needs_stable_buffers`).
    #[inline]
    pub fn needs_stable_buffers(&self) -> bool {
        self.stable_buffers
    }

    fn update_stable_buffers(&mut self) {
        self.stable_buffers = self
            .slots
            .iter()
            .flatten()
            .any(|n| n.backend().needs_stable_buffers());
    }

    /// Namespaces in NSID order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Namespace>> {
        self.slots.iter().flatten()
    }

    /// A copy with `ns` added (or replacing the same NSID).
    pub fn with(&self, ns: Arc<Namespace>) -> NamespaceTable {
        let mut t = self.clone();
        let nsid = ns.nsid();
        if nsid == 0 {
            return t;
        }
        let idx = nsid as usize - 1;
        if t.slots.len() <= idx {
            t.slots.resize(idx + 1, None);
        }
        t.slots[idx] = Some(ns);
        if let Err(pos) = t.active.binary_search(&nsid) {
            t.active.insert(pos, nsid);
        }
        t.update_stable_buffers();
        t
    }

    /// A copy with only the namespaces `keep` accepts (a host's view when
    /// some namespaces are hidden from it: `visibility.rs`).
    pub fn filtered(&self, keep: impl Fn(&Namespace) -> bool) -> NamespaceTable {
        let mut t = NamespaceTable::new();
        for ns in self.iter().filter(|n| keep(n)) {
            let idx = ns.nsid() as usize - 1;
            if t.slots.len() <= idx {
                t.slots.resize(idx + 1, None);
            }
            t.slots[idx] = Some(ns.clone());
            t.active.push(ns.nsid());
        }
        t.update_stable_buffers();
        t
    }

    /// A copy without `nsid`.
    pub fn without(&self, nsid: u32) -> NamespaceTable {
        let mut t = self.clone();
        if let Some(slot) = (nsid as usize)
            .checked_sub(1)
            .and_then(|i| t.slots.get_mut(i))
        {
            *slot = None;
        }
        t.active.retain(|&n| n != nsid);
        while matches!(t.slots.last(), Some(None)) {
            t.slots.pop();
        }
        t.update_stable_buffers();
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::NullBackend;

    fn ns(nsid: u32) -> Arc<Namespace> {
        let b: Arc<dyn Backend> = Arc::new(NullBackend::new("n", 512, 8));
        Arc::new(Namespace::new(nsid, b, [1; 16], [2; 8], [3; 16]))
    }

    #[test]
    fn table_lookup_is_bounds_checked() {
        let t = NamespaceTable::from_namespaces([ns(3), ns(1)]);
        assert_eq!(t.active_nsids(), &[1, 3]);
        assert!(t.get(0).is_none());
        assert!(t.get(2).is_none());
        assert!(t.get(4).is_none());
        assert!(t.get(u32::MAX).is_none());
        assert_eq!(t.get(3).unwrap().nsid(), 3);
        assert_eq!(t.iter().map(|n| n.nsid()).collect::<Vec<_>>(), vec![1, 3]);

        let t2 = t.without(3);
        assert_eq!(t2.active_nsids(), &[1]);
        assert!(t2.get(3).is_none());
        assert_eq!(t.len(), 2, "copy on write leaves the original alone");
        let t3 = t2.with(ns(2)).without(7).with(ns(0));
        assert_eq!(t3.active_nsids(), &[1, 2]);
    }

    #[test]
    fn state_and_geometry() {
        let n = ns(1);
        assert!(n.is_active());
        assert_eq!(
            (n.block_size(), n.block_shift(), n.num_blocks()),
            (512, 9, 8)
        );
        n.set_state(NamespaceState::Removing);
        assert!(!n.is_active());
        assert_eq!(n.state(), NamespaceState::Removing);
    }
}
