//! Asymmetric Namespace Access (NVMe base spec, "Asymmetric Namespace Access
//! Reporting").
//!
//! Owns the ANA state of a subsystem with ANA reporting: one [`PathAna`] per
//! listener (the path a controller connected through) holding the state code
//! of every ANA group 1..=ANAGRPMAX, the subsystem's ANA change count, the
//! status an I/O command gets through a path whose group is not accessible
//! ([`io_status`], one relaxed load per command), and the bytes of the ANA
//! log page (0Ch, with or without the NSID lists).
//!
//! States come from the configuration (`SubsystemConfig::ana_state`), applied
//! by `Target::sync_ana` on the control path, unless this process is a
//! gateway group member: then [`group_ana`] (the group's states, the same
//! on every listener, set by the member thread with atomic stores; no lock,
//! no RPC) overrides them; a controller keeps an
//! `Arc<PathAna>` of its listener from its Connect on, so its queues read the
//! state without a lock. A change raises the ANA Change asynchronous event on
//! the controllers of the paths it touched.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, RwLock};

use nvmf_config::{AnaState, ListenerConfig};
use nvmf_wire::log::{
    AnaGroupDescriptor, AnaLogHeader, ANA_CHANGE, ANA_INACCESSIBLE, ANA_NON_OPTIMIZED,
    ANA_OPTIMIZED, ANA_PERSISTENT_LOSS,
};
use nvmf_wire::status::Status;
use nvmf_wire::zerocopy::{FromZeros, IntoBytes};

use crate::namespace::NamespaceTable;

/// ANA Transition Time reported in Identify Controller (seconds): how long a
/// host waits for a group in the change state before it resets the controller.
pub const ANATT_SECONDS: u8 = 10;
/// Identify Controller ANACAP: reports optimized, non-optimized,
/// inaccessible, persistent loss and change (bits 0..=4). Bit 6 stays clear:
/// `nvmf_subsystem_set_ns_ana_group` may move an attached namespace.
pub const ANACAP: u8 = 0x1F;

/// The ANA state of every group as seen through one listener.
#[derive(Debug)]
pub struct PathAna {
    listener: ListenerConfig,
    /// `states[grp - 1]`: an ANA state code (`nvmf_wire::log::ANA_*`).
    states: Box<[AtomicU8]>,
}

impl PathAna {
    fn new(listener: ListenerConfig, grpmax: u32) -> PathAna {
        PathAna {
            listener,
            states: (0..grpmax).map(|_| AtomicU8::new(ANA_OPTIMIZED)).collect(),
        }
    }

    pub fn listener(&self) -> &ListenerConfig {
        &self.listener
    }

    /// State code of group `grp` (optimized for an ID outside the table,
    /// which the configuration never produces).
    #[inline]
    pub fn state_code(&self, grp: u32) -> u8 {
        let g = group_ana().code(grp);
        if g != 0 {
            return g;
        }
        match self.states.get((grp as usize).wrapping_sub(1)) {
            Some(s) => s.load(Ordering::Relaxed),
            None => ANA_OPTIMIZED,
        }
    }

    /// State of group `grp`.
    pub fn state(&self, grp: u32) -> AnaState {
        AnaState::from_code(self.state_code(grp)).unwrap_or(AnaState::Optimized)
    }

    /// Set group `grp`; true when the state changed.
    fn set(&self, grp: u32, code: u8) -> bool {
        match self.states.get((grp as usize).wrapping_sub(1)) {
            Some(s) => s.swap(code, Ordering::AcqRel) != code,
            None => false,
        }
    }
}

/// Highest ANA group ID a gateway group manages.
pub const GROUP_ANA_MAX: u32 = 4096;

/// The ANA states a gateway group member imposes on every listener of this
/// process (docs/GATEWAY-GROUPS.md): per group, a state code or 0 (not
/// set: the `default`, which is 0 until [`GroupAna::manage`] is called, so
/// a process outside a group reads only zeros and keeps its configured
/// states). One process is at most one group member, hence one table.
#[derive(Debug)]
pub struct GroupAna {
    default: AtomicU8,
    states: [AtomicU8; GROUP_ANA_MAX as usize],
}

static GROUP_ANA: GroupAna = GroupAna {
    default: AtomicU8::new(0),
    states: [const { AtomicU8::new(0) }; GROUP_ANA_MAX as usize],
};

/// This process's [`GroupAna`].
#[inline]
pub fn group_ana() -> &'static GroupAna {
    &GROUP_ANA
}

impl GroupAna {
    /// The state code imposed on group `grp`; 0: none.
    #[inline]
    pub fn code(&self, grp: u32) -> u8 {
        let c = match self.states.get((grp as usize).wrapping_sub(1)) {
            Some(s) => s.load(Ordering::Relaxed),
            None => 0,
        };
        if c != 0 {
            c
        } else {
            self.default.load(Ordering::Relaxed)
        }
    }

    /// From now on every group not set otherwise is in `default` on every
    /// listener (a member starts with everything inaccessible).
    pub fn manage(&self, default: AnaState) {
        self.default.store(default.code(), Ordering::Release);
    }

    /// Whether a group member manages the states.
    pub fn managed(&self) -> bool {
        self.default.load(Ordering::Acquire) != 0
    }

    /// Imposes `state` on group `grp`; true when it changed. Hosts learn it
    /// from `Target::notify_group_ana`.
    pub fn set(&self, grp: u32, state: AnaState) -> bool {
        match self.states.get((grp as usize).wrapping_sub(1)) {
            Some(s) => s.swap(state.code(), Ordering::AcqRel) != state.code(),
            None => false,
        }
    }
}

/// The status of an I/O command to a namespace of group `grp` sent through
/// `path`: `None` when the group is optimized or non-optimized there, else
/// the path-related ANA status (Do Not Retry clear, so a multipath host
/// retries the command on another path).
#[inline]
pub fn io_status(path: &PathAna, grp: u32) -> Option<Status> {
    match path.state_code(grp) {
        ANA_OPTIMIZED | ANA_NON_OPTIMIZED => None,
        ANA_INACCESSIBLE => Some(Status::ANA_INACCESSIBLE),
        ANA_PERSISTENT_LOSS => Some(Status::ANA_PERSISTENT_LOSS),
        ANA_CHANGE => Some(Status::ANA_TRANSITION),
        _ => Some(Status::ANA_INACCESSIBLE),
    }
}

/// ANA state of a subsystem with ANA reporting.
#[derive(Debug)]
pub struct SubsystemAna {
    grpmax: u32,
    change_count: AtomicU64,
    paths: RwLock<Vec<Arc<PathAna>>>,
}

impl SubsystemAna {
    /// Groups 1..=`grpmax`, one path per listener, everything optimized.
    pub(crate) fn new(grpmax: u32, listeners: &[ListenerConfig]) -> SubsystemAna {
        let grpmax = grpmax.max(1);
        SubsystemAna {
            grpmax,
            change_count: AtomicU64::new(1),
            paths: RwLock::new(
                listeners
                    .iter()
                    .map(|l| Arc::new(PathAna::new(l.clone(), grpmax)))
                    .collect(),
            ),
        }
    }

    /// ANAGRPMAX = NANAGRPID.
    pub fn grpmax(&self) -> u32 {
        self.grpmax
    }

    /// ANA change count (log page header and group descriptors).
    pub fn change_count(&self) -> u64 {
        self.change_count.load(Ordering::Acquire)
    }

    pub(crate) fn bump(&self) {
        self.change_count.fetch_add(1, Ordering::AcqRel);
    }

    /// The path of listener `l`.
    pub fn path(&self, l: &ListenerConfig) -> Option<Arc<PathAna>> {
        let p = self.paths.read().unwrap_or_else(|e| e.into_inner());
        p.iter().find(|x| &x.listener == l).cloned()
    }

    /// Every listener's path (`/metrics`).
    pub fn paths(&self) -> Vec<Arc<PathAna>> {
        self.paths.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn add_path(&self, l: &ListenerConfig) {
        let mut p = self.paths.write().unwrap_or_else(|e| e.into_inner());
        if !p.iter().any(|x| &x.listener == l) {
            p.push(Arc::new(PathAna::new(l.clone(), self.grpmax)));
        }
    }

    pub(crate) fn remove_path(&self, l: &ListenerConfig) {
        let mut p = self.paths.write().unwrap_or_else(|e| e.into_inner());
        p.retain(|x| &x.listener != l);
    }

    /// Set the state of group `grp` through listener `l`; true when it changed.
    pub(crate) fn set(&self, l: &ListenerConfig, grp: u32, state: AnaState) -> bool {
        self.path(l).is_some_and(|p| p.set(grp, state.code()))
    }
}

/// The ANA log page (0Ch) as seen through `path`: one descriptor per group
/// that holds a namespace, ascending, each followed by its NSIDs unless
/// `groups_only` (RGO).
pub fn ana_log(
    ana: &SubsystemAna,
    path: &PathAna,
    table: &NamespaceTable,
    groups_only: bool,
) -> Vec<u8> {
    let mut groups: Vec<(u32, u32)> = table.iter().map(|ns| (ns.anagrpid(), ns.nsid())).collect();
    groups.sort_unstable();
    let chgcnt = ana.change_count();
    let mut page = Vec::with_capacity(16 + groups.len() * 36);
    let mut hdr = AnaLogHeader::new_zeroed();
    hdr.chgcnt.set(chgcnt);
    page.extend_from_slice(hdr.as_bytes());
    let mut ngrps: u16 = 0;
    let mut i = 0;
    while i < groups.len() {
        let grp = groups[i].0;
        let end = groups[i..]
            .iter()
            .position(|g| g.0 != grp)
            .map_or(groups.len(), |n| i + n);
        let mut d = AnaGroupDescriptor::new_zeroed();
        d.anagrpid.set(grp);
        d.chgcnt.set(chgcnt);
        d.state = path.state_code(grp);
        if !groups_only {
            d.nnsids.set((end - i) as u32);
        }
        page.extend_from_slice(d.as_bytes());
        if !groups_only {
            for &(_, nsid) in &groups[i..end] {
                page.extend_from_slice(&nsid.to_le_bytes());
            }
        }
        ngrps += 1;
        i = end;
    }
    page[8..10].copy_from_slice(&ngrps.to_le_bytes());
    page
}
