//! NVMe reservations (NVMe Base Specification, "Reservations"): one
//! namespace's registrants, holder and type, shared by every controller of
//! that namespace on this nvmfd whichever reactor serves it.
//!
//! Owns [`Reservations`] (the state of one namespace and its optional PTPL
//! file), the access rule the I/O path applies while a reservation is held
//! ([`Reservations::check`]), the four I/O commands (Register 0Dh, Report
//! 0Eh, Acquire 11h, Release 15h) as pure state transitions
//! ([`Reservations::register`] ...), the notifications they cause
//! ([`Notice`], delivered by `queue.rs` to the controllers of the hosts
//! concerned), and the Persist Through Power Loss file (SPDK's `ptpl_file`
//! JSON, written to a temporary file, fsynced and renamed before the command
//! completes; read when the namespace is made).
//!
//! The registrant is the 128-bit host identifier from Connect, so one host
//! over several paths or controllers is one registrant; a host that
//! connected with a zero host identifier cannot register (Host Identifier
//! Inconsistent Format). Keys of 0 are refused for registration (as SPDK
//! does: 0 means "any key" to Preempt).
//!
//! Cost: the I/O path reads one atomic (`held`) per command; only while a
//! reservation is held does it take the read side of a lock to compare host
//! identifiers. Commands that change the state serialise on a mutex; on a
//! namespace with a PTPL file they run on the `nvmfd-ptpl` thread (the
//! write and its fsync never run on a reactor), and readers keep reading
//! the last published state meanwhile.
//!
//! In a gateway group (docs/GATEWAY-GROUPS.md) the state is also kept
//! beyond this process: a [`ResvStore`] attached to the namespace saves
//! every change (on the `nvmfd-ptpl` thread, before the command
//! completes; a failed save fails the command with a path error so the
//! host retries elsewhere), and [`Reservations::install`] puts in the
//! state another member left, before this one serves the namespace.
//!
//! Not done: Preempt and Abort does not abort commands of the preempted
//! host that already reached the backend; every command of that host
//! executed after the preempt gets Reservation Conflict (docs/RESERVATIONS.md).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use nvmf_wire::status::Status;

/// Reservation types (RTYPE).
pub const WRITE_EXCLUSIVE: u8 = 1;
pub const EXCLUSIVE_ACCESS: u8 = 2;
pub const WRITE_EXCLUSIVE_REG_ONLY: u8 = 3;
pub const EXCLUSIVE_ACCESS_REG_ONLY: u8 = 4;
pub const WRITE_EXCLUSIVE_ALL_REGS: u8 = 5;
pub const EXCLUSIVE_ACCESS_ALL_REGS: u8 = 6;

/// Registrants one namespace keeps (a registration outlives its host's
/// connections, so the list is bounded; SPDK keeps 16). A new host past
/// it gets Capacity Exceeded.
pub const MAX_REGISTRANTS: usize = 64;

/// Identify Namespace RESCAP: the six types, and IEKEY as in NVMe 1.3 and
/// later (bit 7); bit 0 (PTPL) is added for namespaces with a PTPL file.
pub const RESCAP_TYPES: u8 = 0x7E | 0x80;
/// RESCAP bit 0: Persist Through Power Loss supported.
pub const RESCAP_PTPL: u8 = 0x01;

/// Reservation notification log page types (log page 80h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum NoticeKind {
    RegistrationPreempted = 1,
    ReservationReleased = 2,
    ReservationPreempted = 3,
}

impl NoticeKind {
    /// Its bit in the Reservation Notification Mask (feature 82h).
    pub fn mask_bit(self) -> u32 {
        1 << (self as u8)
    }
}

/// A notification for every controller of host `hostid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notice {
    pub hostid: [u8; 16],
    pub kind: NoticeKind,
}

/// One registrant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registrant {
    pub hostid: [u8; 16],
    pub rkey: u64,
}

/// The reservation state of one namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResvState {
    /// Persistent Reservation Generation (PRGEN).
    pub generation: u32,
    /// Reservation type, 0 when none is held.
    pub rtype: u8,
    /// The holder (for the all-registrants types: the host that acquired;
    /// every registrant holds it).
    pub holder: Option<[u8; 16]>,
    /// Registrants in registration order.
    pub registrants: Vec<Registrant>,
    /// Persist Through Power Loss is on.
    pub ptpl: bool,
}

fn all_registrants(rtype: u8) -> bool {
    rtype == WRITE_EXCLUSIVE_ALL_REGS || rtype == EXCLUSIVE_ACCESS_ALL_REGS
}

impl ResvState {
    fn registrant(&self, hostid: &[u8; 16]) -> Option<&Registrant> {
        self.registrants.iter().find(|r| &r.hostid == hostid)
    }

    /// Whether `hostid` holds the reservation.
    pub fn is_holder(&self, hostid: &[u8; 16]) -> bool {
        match self.rtype {
            0 => false,
            t if all_registrants(t) => self.registrant(hostid).is_some(),
            _ => self.holder.as_ref() == Some(hostid),
        }
    }

    /// The reservation key of the reservation (the holder's; 0 for the
    /// all-registrants types and when none is held).
    fn holder_key(&self) -> u64 {
        match (self.rtype, self.holder) {
            (0, _) | (5 | 6, _) | (_, None) => 0,
            (_, Some(h)) => self.registrant(&h).map_or(0, |r| r.rkey),
        }
    }

    /// The access rule: may `hostid` run a command of the read (`write`
    /// false) or write command group?
    pub fn allows(&self, hostid: &[u8; 16], write: bool) -> bool {
        if self.rtype == 0 || self.is_holder(hostid) {
            return true;
        }
        let registered = self.registrant(hostid).is_some();
        match self.rtype {
            WRITE_EXCLUSIVE => !write,
            EXCLUSIVE_ACCESS => false,
            WRITE_EXCLUSIVE_REG_ONLY | WRITE_EXCLUSIVE_ALL_REGS => !write || registered,
            _ => registered,
        }
    }

    fn release(&mut self) {
        self.rtype = 0;
        self.holder = None;
    }

    /// Removes the registration of `hostid`, releasing what it held.
    /// Returns the notices that causes.
    fn unregister(&mut self, hostid: &[u8; 16], notices: &mut Vec<Notice>) {
        let was_holder = self.is_holder(hostid);
        self.registrants.retain(|r| &r.hostid != hostid);
        if !was_holder {
            return;
        }
        let t = self.rtype;
        if all_registrants(t) {
            if self.registrants.is_empty() {
                self.release();
            } else if self.holder.as_ref() == Some(hostid) {
                self.holder = self.registrants.first().map(|r| r.hostid);
            }
        } else {
            self.release();
            if t == WRITE_EXCLUSIVE_REG_ONLY || t == EXCLUSIVE_ACCESS_REG_ONLY {
                released_to_others(&self.registrants, hostid, notices);
            }
        }
    }

    /// Unregisters every registrant but `issuer` whose key is `key`;
    /// returns whether any was.
    fn remove_by_key(&mut self, issuer: &[u8; 16], key: u64, notices: &mut Vec<Notice>) -> bool {
        let gone: Vec<[u8; 16]> = self
            .registrants
            .iter()
            .filter(|r| r.rkey == key && &r.hostid != issuer)
            .map(|r| r.hostid)
            .collect();
        for h in &gone {
            self.registrants.retain(|r| &r.hostid != h);
            notices.push(Notice {
                hostid: *h,
                kind: NoticeKind::RegistrationPreempted,
            });
        }
        !gone.is_empty()
    }
}

fn released_to_others(regs: &[Registrant], issuer: &[u8; 16], notices: &mut Vec<Notice>) {
    notices.extend(regs.iter().filter(|r| &r.hostid != issuer).map(|r| Notice {
        hostid: r.hostid,
        kind: NoticeKind::ReservationReleased,
    }));
}

const CONFLICT: Status = Status::RESERVATION_CONFLICT.with_dnr();
const INVALID_FIELD: Status = Status::INVALID_FIELD.with_dnr();
const HOSTID_FORMAT: Status = Status::HOST_ID_INCONSISTENT_FORMAT.with_dnr();

/// Where a namespace's reservation state is kept beyond this process (a
/// gateway group's RADOS object). Called under the change lock, on the
/// `nvmfd-ptpl` thread, never on a reactor.
pub trait ResvStore: Send + Sync + std::fmt::Debug {
    /// Makes `new` the kept state; an error leaves everything as it was
    /// and fails the command.
    fn save(&self, new: &ResvState) -> Result<(), String>;
}

/// What a state-changing command did: the notices to deliver, and whether
/// the state changed (and must be persisted).
#[derive(Debug, Default)]
pub struct Effects {
    pub notices: Vec<Notice>,
    pub changed: bool,
}

/// The reservation of one namespace (see the module documentation).
#[derive(Debug, Default)]
pub struct Reservations {
    /// A reservation is held: the I/O path must check access.
    held: AtomicBool,
    /// The published state: what the I/O path and Report read.
    state: RwLock<Arc<ResvState>>,
    /// Serialises commands that change the state (held across a PTPL write).
    change: Mutex<()>,
    /// SPDK's `ptpl_file`: where the state persists through power loss.
    ptpl_file: Option<PathBuf>,
    /// Where the state is shared (a gateway group), once attached.
    store: std::sync::OnceLock<Arc<dyn ResvStore>>,
}

impl Reservations {
    /// No reservation, no PTPL file.
    pub fn new() -> Reservations {
        Reservations::default()
    }

    /// With a PTPL file: the state it holds is restored when its `ptpl`
    /// is true (a file that does not exist yet is an empty state). An
    /// unreadable or malformed file is an error, naming the file.
    pub fn with_ptpl_file(path: &Path) -> Result<Reservations, String> {
        let state = match std::fs::read(path) {
            Ok(bytes) => parse_ptpl(&bytes).map_err(|e| format!("{}: {e}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ResvState::default(),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let state = if state.ptpl {
            state
        } else {
            ResvState::default()
        };
        Ok(Reservations {
            held: AtomicBool::new(state.rtype != 0),
            state: RwLock::new(Arc::new(state)),
            change: Mutex::new(()),
            ptpl_file: Some(path.to_path_buf()),
            store: std::sync::OnceLock::new(),
        })
    }

    /// Shares the state through `store` from now on (once; false when a
    /// store was attached already).
    pub fn attach_store(&self, store: Arc<dyn ResvStore>) -> bool {
        self.store.set(store).is_ok()
    }

    /// The attached store, if any.
    pub fn store(&self) -> Option<&Arc<dyn ResvStore>> {
        self.store.get()
    }

    /// Whether a change is written somewhere before its command completes
    /// (a PTPL file or a store): such commands run on the `nvmfd-ptpl`
    /// thread.
    pub fn persists(&self) -> bool {
        self.ptpl_file.is_some() || self.store.get().is_some()
    }

    /// Puts in `st` as the current state (what another gateway of the group
    /// left, loaded before this one serves the namespace). No notices: the
    /// hosts concerned were told by the gateway that made the change.
    pub fn install(&self, st: ResvState) {
        let _g = self.change.lock().unwrap_or_else(|e| e.into_inner());
        let held = st.rtype != 0;
        *self.state.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(st);
        self.held.store(held, Ordering::Release);
    }

    /// The PTPL file, if the namespace has one.
    pub fn ptpl_file(&self) -> Option<&Path> {
        self.ptpl_file.as_deref()
    }

    /// A reservation is held (one relaxed load: the I/O path's check).
    #[inline]
    pub fn held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// The current state (a snapshot).
    pub fn snapshot(&self) -> Arc<ResvState> {
        self.state.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The access rule for a command of host `hostid` while a reservation
    /// is held: Reservation Conflict when the type forbids it.
    #[cold]
    pub fn check(&self, hostid: &[u8; 16], write: bool) -> Result<(), Status> {
        let st = self.state.read().unwrap_or_else(|e| e.into_inner());
        if st.allows(hostid, write) {
            Ok(())
        } else {
            Err(CONFLICT)
        }
    }

    /// Runs `f` on a copy of the state under the change lock; publishes the
    /// copy (after writing the PTPL file when PTPL is on or was just turned
    /// off) when `f` succeeded and changed it.
    fn change(
        &self,
        f: impl FnOnce(&mut ResvState, &mut Effects) -> Result<(), Status>,
    ) -> Result<Effects, Status> {
        let _g = self.change.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.snapshot();
        let mut new = (*old).clone();
        let mut fx = Effects::default();
        f(&mut new, &mut fx)?;
        if new == *old {
            return Ok(fx);
        }
        fx.changed = true;
        if let Some(store) = self.store.get() {
            if let Err(e) = store.save(&new) {
                tracing::error!(
                    "reservation state not saved to the gateway group, command fails: {e}"
                );
                return Err(Status::INTERNAL_PATH_ERROR);
            }
        }
        if let Some(path) = &self.ptpl_file {
            if new.ptpl || old.ptpl {
                if let Err(e) = write_ptpl(path, &new) {
                    tracing::error!(file = %path.display(), "reservation state not persisted, command fails: {e}");
                    return Err(Status::INTERNAL_ERROR);
                }
            }
        }
        let held = new.rtype != 0;
        *self.state.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(new);
        self.held.store(held, Ordering::Release);
        Ok(fx)
    }

    /// Reservation Register: CDW10 RREGA 2:0, IEKEY 3, CPTPL 31:30; data
    /// CRKEY, NRKEY.
    pub fn register(
        &self,
        hostid: &[u8; 16],
        cdw10: u32,
        crkey: u64,
        nrkey: u64,
    ) -> Result<Effects, Status> {
        let action = cdw10 & 7;
        let iekey = cdw10 & 8 != 0;
        let cptpl = cdw10 >> 30;
        if hostid == &[0; 16] {
            return Err(HOSTID_FORMAT);
        }
        if action > 2 || cptpl == 1 || (cptpl == 3 && self.ptpl_file.is_none()) {
            return Err(INVALID_FIELD);
        }
        self.change(|st, fx| {
            let current = st.registrant(hostid).map(|r| r.rkey);
            match (action, current) {
                (0, Some(k)) if k == nrkey => {}
                (0, Some(_)) => return Err(CONFLICT),
                (0, None) => {
                    if nrkey == 0 {
                        return Err(INVALID_FIELD);
                    }
                    if st.registrants.len() >= MAX_REGISTRANTS {
                        return Err(Status::CAPACITY_EXCEEDED.with_dnr());
                    }
                    st.registrants.push(Registrant {
                        hostid: *hostid,
                        rkey: nrkey,
                    });
                    st.generation = st.generation.wrapping_add(1);
                }
                (1, Some(k)) if iekey || k == crkey => {
                    st.unregister(hostid, &mut fx.notices);
                    st.generation = st.generation.wrapping_add(1);
                }
                (2, Some(k)) if iekey || k == crkey => {
                    if nrkey == 0 {
                        return Err(INVALID_FIELD);
                    }
                    if let Some(r) = st.registrants.iter_mut().find(|r| &r.hostid == hostid) {
                        r.rkey = nrkey;
                    }
                }
                _ => return Err(CONFLICT),
            }
            match cptpl {
                2 => st.ptpl = false,
                3 => st.ptpl = true,
                _ => {}
            }
            Ok(())
        })
    }

    /// Reservation Acquire: CDW10 RACQA 2:0, RTYPE 15:8; data CRKEY,
    /// PRKEY. (IEKEY is not honoured here, as from NVMe 1.3: RESCAP bit 7.)
    pub fn acquire(
        &self,
        hostid: &[u8; 16],
        cdw10: u32,
        crkey: u64,
        prkey: u64,
    ) -> Result<Effects, Status> {
        let action = cdw10 & 7;
        let rtype = ((cdw10 >> 8) & 0xFF) as u8;
        if action > 2 || !(1..=6).contains(&rtype) {
            return Err(INVALID_FIELD);
        }
        self.change(|st, fx| {
            match st.registrant(hostid) {
                Some(r) if r.rkey == crkey => {}
                _ => return Err(CONFLICT),
            }
            if action == 0 {
                return match st.rtype {
                    0 => {
                        st.rtype = rtype;
                        st.holder = Some(*hostid);
                        Ok(())
                    }
                    t if t == rtype && st.is_holder(hostid) => Ok(()),
                    _ => Err(CONFLICT),
                };
            }
            // Preempt (1) and Preempt and Abort (2).
            let holder_key = st.holder_key();
            if st.rtype == 0 {
                if prkey == 0 {
                    return Err(INVALID_FIELD);
                }
                if !st.remove_by_key(hostid, prkey, &mut fx.notices) {
                    return Err(CONFLICT);
                }
            } else if all_registrants(st.rtype) && prkey == 0 {
                let others: Vec<[u8; 16]> = st
                    .registrants
                    .iter()
                    .filter(|r| &r.hostid != hostid)
                    .map(|r| r.hostid)
                    .collect();
                st.registrants.retain(|r| &r.hostid == hostid);
                fx.notices.extend(others.into_iter().map(|h| Notice {
                    hostid: h,
                    kind: NoticeKind::RegistrationPreempted,
                }));
                st.rtype = rtype;
                st.holder = Some(*hostid);
            } else if !all_registrants(st.rtype) && prkey == holder_key {
                st.remove_by_key(hostid, prkey, &mut fx.notices);
                st.rtype = rtype;
                st.holder = Some(*hostid);
            } else {
                if prkey == 0 {
                    return Err(INVALID_FIELD);
                }
                if !st.remove_by_key(hostid, prkey, &mut fx.notices) {
                    return Err(CONFLICT);
                }
                if all_registrants(st.rtype)
                    && st.holder.is_some_and(|h| st.registrant(&h).is_none())
                {
                    st.holder = st.registrants.first().map(|r| r.hostid);
                }
            }
            st.generation = st.generation.wrapping_add(1);
            Ok(())
        })
    }

    /// Reservation Release: CDW10 RRELA 2:0, RTYPE 15:8; data CRKEY.
    pub fn release(&self, hostid: &[u8; 16], cdw10: u32, crkey: u64) -> Result<Effects, Status> {
        let action = cdw10 & 7;
        let rtype = ((cdw10 >> 8) & 0xFF) as u8;
        if action > 1 {
            return Err(INVALID_FIELD);
        }
        self.change(|st, fx| {
            match st.registrant(hostid) {
                Some(r) if r.rkey == crkey => {}
                _ => return Err(CONFLICT),
            }
            if action == 1 {
                // Clear.
                fx.notices.extend(
                    st.registrants
                        .iter()
                        .filter(|r| &r.hostid != hostid)
                        .map(|r| Notice {
                            hostid: r.hostid,
                            kind: NoticeKind::ReservationPreempted,
                        }),
                );
                st.registrants.clear();
                st.release();
                st.generation = st.generation.wrapping_add(1);
                return Ok(());
            }
            if st.rtype == 0 || !st.is_holder(hostid) {
                return Ok(());
            }
            if rtype != st.rtype {
                return Err(INVALID_FIELD);
            }
            let t = st.rtype;
            st.release();
            if t != WRITE_EXCLUSIVE && t != EXCLUSIVE_ACCESS {
                released_to_others(&st.registrants, hostid, &mut fx.notices);
            }
            Ok(())
        })
    }

    /// Sets Persist Through Power Loss (feature 83h, or CPTPL): turning it
    /// on needs a PTPL file.
    pub fn set_ptpl(&self, on: bool) -> Result<Effects, Status> {
        if on && self.ptpl_file.is_none() {
            return Err(INVALID_FIELD);
        }
        self.change(|st, _| {
            st.ptpl = on;
            Ok(())
        })
    }

    /// Reservation Report into `out` (the host's buffer): the extended
    /// data structure (`eds`), the only one a fabrics controller offers
    /// (its host identifiers are 128-bit). Returns the status.
    pub fn report(&self, eds: bool, out: &mut [u8]) -> Status {
        if !eds {
            return HOSTID_FORMAT;
        }
        let st = self.snapshot();
        out.fill(0);
        let mut page = vec![0u8; 64 + 64 * st.registrants.len()];
        page[0..4].copy_from_slice(&st.generation.to_le_bytes());
        page[4] = st.rtype;
        page[5..7].copy_from_slice(&(st.registrants.len() as u16).to_le_bytes());
        page[9] = u8::from(st.ptpl);
        for (i, r) in st.registrants.iter().enumerate() {
            let e = &mut page[64 + 64 * i..128 + 64 * i];
            // Dynamic controller model: a registrant is a host, not one controller.
            e[0..2].copy_from_slice(&0xFFFFu16.to_le_bytes());
            e[2] = u8::from(st.is_holder(&r.hostid));
            e[8..16].copy_from_slice(&r.rkey.to_le_bytes());
            e[16..32].copy_from_slice(&r.hostid);
        }
        let n = page.len().min(out.len());
        out[..n].copy_from_slice(&page[..n]);
        Status::SUCCESS
    }
}

/// A host identifier as SPDK's PTPL file writes it (UUID text).
fn uuid_text(h: &[u8; 16]) -> String {
    let x: String = h.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &x[0..8],
        &x[8..12],
        &x[12..16],
        &x[16..20],
        &x[20..32]
    )
}

fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The PTPL file's JSON: SPDK's keys (`ptpl`, `rtype`, `crkey`,
/// `holder_uuid`, `registrants` of `rkey` + `host_uuid`), plus our
/// `generation`.
pub fn ptpl_json(st: &ResvState) -> serde_json::Value {
    let mut v = serde_json::json!({
        "ptpl": st.ptpl,
        "rtype": st.rtype,
        "crkey": st.holder_key(),
        "generation": st.generation,
        "registrants": st.registrants.iter().map(|r| serde_json::json!({
            "rkey": r.rkey,
            "host_uuid": uuid_text(&r.hostid),
        })).collect::<Vec<_>>(),
    });
    if let (Some(h), serde_json::Value::Object(m)) = (st.holder.filter(|_| st.rtype != 0), &mut v) {
        m.insert("holder_uuid".into(), uuid_text(&h).into());
    }
    v
}

/// Reads a PTPL file's JSON.
pub fn parse_ptpl(bytes: &[u8]) -> Result<ResvState, String> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let field = |k: &str| v.get(k);
    let ptpl = field("ptpl").and_then(|x| x.as_bool()).unwrap_or(false);
    let rtype = field("rtype").and_then(|x| x.as_u64()).unwrap_or(0);
    if rtype > 6 {
        return Err(format!("rtype {rtype} is not a reservation type"));
    }
    let mut registrants = Vec::new();
    if let Some(list) = field("registrants").and_then(|x| x.as_array()) {
        if list.len() > MAX_REGISTRANTS {
            return Err(format!(
                "{} registrants, more than the {MAX_REGISTRANTS} a namespace keeps",
                list.len()
            ));
        }
        for r in list {
            let rkey = r
                .get("rkey")
                .and_then(|x| x.as_u64())
                .ok_or("a registrant without rkey")?;
            let hostid = r
                .get("host_uuid")
                .and_then(|x| x.as_str())
                .and_then(parse_uuid)
                .ok_or("a registrant without a valid host_uuid")?;
            registrants.push(Registrant { hostid, rkey });
        }
    }
    let holder = match field("holder_uuid").and_then(|x| x.as_str()) {
        Some(s) => Some(parse_uuid(s).ok_or("holder_uuid is not a UUID")?),
        None => None,
    };
    if rtype != 0 && holder.is_none_or(|h| !registrants.iter().any(|r| r.hostid == h)) {
        return Err("a reservation whose holder is not a registrant".into());
    }
    Ok(ResvState {
        generation: field("generation").and_then(|x| x.as_u64()).unwrap_or(0) as u32,
        rtype: rtype as u8,
        holder: if rtype == 0 { None } else { holder },
        registrants,
        ptpl,
    })
}

/// Writes the state crash-safely: a temporary file beside it, fsync,
/// rename over the old one, fsync of the directory.
fn write_ptpl(path: &Path, st: &ResvState) -> std::io::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let text = serde_json::to_vec_pretty(&ptpl_json(st)).map_err(std::io::Error::other)?;
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&text)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

/// The thread that runs reservation commands of namespaces with a PTPL
/// file (their file write and fsync never run on a reactor).
pub(crate) static PTPL_POOL: nvmf_backend::helper::JobPool =
    nvmf_backend::helper::JobPool::new("nvmfd-ptpl", 1);

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 16] = [0xA; 16];
    const B: [u8; 16] = [0xB; 16];
    const C: [u8; 16] = [0xC; 16];

    fn acq(rtype: u8, action: u32) -> u32 {
        (u32::from(rtype) << 8) | action
    }

    #[test]
    fn register_rules() {
        let r = Reservations::new();
        assert_eq!(r.register(&[0; 16], 0, 0, 1).unwrap_err(), HOSTID_FORMAT);
        assert_eq!(r.register(&A, 0, 0, 0).unwrap_err(), INVALID_FIELD);
        assert!(r.register(&A, 0, 0, 10).unwrap().changed);
        // Same key again: success, nothing changes.
        assert!(!r.register(&A, 0, 0, 10).unwrap().changed);
        assert_eq!(r.register(&A, 0, 0, 11).unwrap_err(), CONFLICT);
        // Replace needs the current key unless IEKEY.
        assert_eq!(r.register(&A, 2, 9, 12).unwrap_err(), CONFLICT);
        r.register(&A, 2, 10, 12).unwrap();
        r.register(&A, 2 | 8, 0, 13).unwrap();
        assert_eq!(r.snapshot().registrants[0].rkey, 13);
        assert_eq!(r.snapshot().generation, 1, "replace keeps the generation");
        // Unregister.
        assert_eq!(r.register(&B, 1, 0, 0).unwrap_err(), CONFLICT);
        r.register(&A, 1, 13, 0).unwrap();
        assert!(r.snapshot().registrants.is_empty());
        assert_eq!(r.snapshot().generation, 2);
        // A bounded list.
        for i in 0..MAX_REGISTRANTS as u8 - 1 {
            r.register(&[i + 0x20; 16], 0, 0, 5).unwrap();
        }
        r.register(&A, 0, 0, 1).unwrap();
        assert_eq!(
            r.register(&B, 0, 0, 1).unwrap_err(),
            Status::CAPACITY_EXCEEDED.with_dnr()
        );
        r.register(&A, 1, 1, 0).unwrap();
        r.register(&B, 0, 0, 1).unwrap();
        // PTPL needs a file.
        assert_eq!(r.register(&A, 3 << 30, 0, 1).unwrap_err(), INVALID_FIELD);
        assert_eq!(r.register(&A, 1 << 30, 0, 1).unwrap_err(), INVALID_FIELD);
        assert_eq!(r.register(&A, 3, 0, 1).unwrap_err(), INVALID_FIELD);
    }

    /// The access table of the spec, for holder, registrant and other.
    #[test]
    fn access_by_type() {
        // (type, [holder r, holder w, registrant r, registrant w, other r, other w])
        let table = [
            (WRITE_EXCLUSIVE, [1, 1, 1, 0, 1, 0]),
            (EXCLUSIVE_ACCESS, [1, 1, 0, 0, 0, 0]),
            (WRITE_EXCLUSIVE_REG_ONLY, [1, 1, 1, 1, 1, 0]),
            (EXCLUSIVE_ACCESS_REG_ONLY, [1, 1, 1, 1, 0, 0]),
            (WRITE_EXCLUSIVE_ALL_REGS, [1, 1, 1, 1, 1, 0]),
            (EXCLUSIVE_ACCESS_ALL_REGS, [1, 1, 1, 1, 0, 0]),
        ];
        for (t, want) in table {
            let r = Reservations::new();
            r.register(&A, 0, 0, 1).unwrap();
            r.register(&B, 0, 0, 2).unwrap();
            assert!(!r.held());
            r.acquire(&A, acq(t, 0), 1, 0).unwrap();
            assert!(r.held());
            let got: Vec<u8> = [
                (A, false),
                (A, true),
                (B, false),
                (B, true),
                (C, false),
                (C, true),
            ]
            .iter()
            .map(|(h, w)| u8::from(r.check(h, *w).is_ok()))
            .collect();
            assert_eq!(got, want, "type {t}");
        }
    }

    #[test]
    fn acquire_release_and_notices() {
        let r = Reservations::new();
        assert_eq!(
            r.acquire(&A, acq(1, 0), 1, 0).unwrap_err(),
            CONFLICT,
            "not registered"
        );
        r.register(&A, 0, 0, 1).unwrap();
        r.register(&B, 0, 0, 2).unwrap();
        assert_eq!(r.acquire(&A, acq(7, 0), 1, 0).unwrap_err(), INVALID_FIELD);
        assert_eq!(
            r.acquire(&A, acq(3, 0), 9, 0).unwrap_err(),
            CONFLICT,
            "wrong key"
        );
        r.acquire(&A, acq(3, 0), 1, 0).unwrap();
        r.acquire(&A, acq(3, 0), 1, 0).unwrap();
        assert_eq!(r.acquire(&A, acq(1, 0), 1, 0).unwrap_err(), CONFLICT);
        assert_eq!(r.acquire(&B, acq(3, 0), 2, 0).unwrap_err(), CONFLICT);
        // Release: a non-holder's is a no-op; the type must match.
        assert!(!r.release(&B, 3 << 8, 2).unwrap().changed);
        assert_eq!(r.release(&A, 1 << 8, 1).unwrap_err(), INVALID_FIELD);
        let fx = r.release(&A, 3 << 8, 1).unwrap();
        assert_eq!(
            fx.notices,
            vec![Notice {
                hostid: B,
                kind: NoticeKind::ReservationReleased
            }]
        );
        assert!(!r.held());
        // Write Exclusive releases silently.
        r.acquire(&A, acq(1, 0), 1, 0).unwrap();
        assert!(r.release(&A, 1 << 8, 1).unwrap().notices.is_empty());
        // Clear: everyone else hears "reservation preempted".
        r.acquire(&A, acq(1, 0), 1, 0).unwrap();
        let g = r.snapshot().generation;
        let fx = r.release(&A, 1, 1).unwrap();
        assert_eq!(fx.notices.len(), 1);
        assert_eq!(fx.notices[0].kind, NoticeKind::ReservationPreempted);
        let s = r.snapshot();
        assert!(s.registrants.is_empty() && s.rtype == 0 && s.generation == g + 1);
    }

    #[test]
    fn preempt() {
        let r = Reservations::new();
        for (h, k) in [(A, 1), (B, 2), (C, 2)] {
            r.register(&h, 0, 0, k).unwrap();
        }
        r.acquire(&A, acq(EXCLUSIVE_ACCESS, 0), 1, 0).unwrap();
        // B preempts the holder A (PRKEY = A's key): A unregistered, B holds.
        let fx = r.acquire(&B, acq(WRITE_EXCLUSIVE, 2), 2, 1).unwrap();
        assert_eq!(
            fx.notices,
            vec![Notice {
                hostid: A,
                kind: NoticeKind::RegistrationPreempted
            }]
        );
        let s = r.snapshot();
        assert_eq!((s.rtype, s.holder), (WRITE_EXCLUSIVE, Some(B)));
        assert_eq!(r.check(&A, true), Err(CONFLICT));
        assert_eq!(r.check(&A, false), Ok(()));
        // A non-holder's key: those registrants go, the reservation stays.
        r.register(&A, 0, 0, 5).unwrap();
        let fx = r.acquire(&C, acq(WRITE_EXCLUSIVE, 1), 2, 5).unwrap();
        assert_eq!(fx.notices.len(), 1);
        assert_eq!(r.snapshot().holder, Some(B));
        assert_eq!(r.acquire(&C, acq(1, 1), 2, 77).unwrap_err(), CONFLICT);
        assert_eq!(r.acquire(&C, acq(1, 1), 2, 0).unwrap_err(), INVALID_FIELD);
        // All registrants: PRKEY 0 takes over from everyone.
        let r = Reservations::new();
        for (h, k) in [(A, 1), (B, 2), (C, 3)] {
            r.register(&h, 0, 0, k).unwrap();
        }
        r.acquire(&A, acq(EXCLUSIVE_ACCESS_ALL_REGS, 0), 1, 0)
            .unwrap();
        assert!(r.snapshot().is_holder(&C));
        let fx = r.acquire(&C, acq(EXCLUSIVE_ACCESS, 1), 3, 0).unwrap();
        assert_eq!(fx.notices.len(), 2);
        let s = r.snapshot();
        assert_eq!((s.rtype, s.holder, s.registrants.len()), (2, Some(C), 1));
    }

    #[test]
    fn holder_unregistering_releases() {
        let r = Reservations::new();
        r.register(&A, 0, 0, 1).unwrap();
        r.register(&B, 0, 0, 2).unwrap();
        r.acquire(&A, acq(EXCLUSIVE_ACCESS_REG_ONLY, 0), 1, 0)
            .unwrap();
        let fx = r.register(&A, 1, 1, 0).unwrap();
        assert_eq!(fx.notices[0].kind, NoticeKind::ReservationReleased);
        assert!(!r.held());
        // All registrants: held until the last one goes.
        r.register(&A, 0, 0, 1).unwrap();
        r.acquire(&A, acq(WRITE_EXCLUSIVE_ALL_REGS, 0), 1, 0)
            .unwrap();
        r.register(&A, 1, 1, 0).unwrap();
        assert!(r.held());
        assert_eq!(r.snapshot().holder, Some(B));
        r.register(&B, 1, 2, 0).unwrap();
        assert!(!r.held());
    }

    #[test]
    fn report_extended_only() {
        let r = Reservations::new();
        r.register(&A, 0, 0, 0x1122).unwrap();
        r.acquire(&A, acq(1, 0), 0x1122, 0).unwrap();
        let mut buf = [0xFFu8; 4096];
        assert_eq!(r.report(false, &mut buf), HOSTID_FORMAT);
        assert_eq!(r.report(true, &mut buf), Status::SUCCESS);
        assert_eq!(&buf[0..4], &1u32.to_le_bytes());
        assert_eq!((buf[4], buf[5], buf[9]), (1, 1, 0));
        assert_eq!(&buf[64..66], &[0xFF, 0xFF]);
        assert_eq!(buf[66], 1);
        assert_eq!(&buf[72..80], &0x1122u64.to_le_bytes());
        assert_eq!(&buf[80..96], &A);
        assert!(buf[128..].iter().all(|&b| b == 0));
        // A short buffer gets what fits.
        let mut small = [0u8; 8];
        assert_eq!(r.report(true, &mut small), Status::SUCCESS);
    }

    #[test]
    fn ptpl_file_round_trip() {
        let dir = std::env::temp_dir().join(format!("nvmf-ptpl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ns1.json");
        let _ = std::fs::remove_file(&path);
        let r = Reservations::with_ptpl_file(&path).unwrap();
        // Without PTPL nothing is written.
        r.register(&A, 0, 0, 7).unwrap();
        assert!(!path.exists());
        r.register(&B, 3 << 30, 0, 8).unwrap();
        r.acquire(&B, acq(WRITE_EXCLUSIVE_REG_ONLY, 0), 8, 0)
            .unwrap();
        let again = Reservations::with_ptpl_file(&path).unwrap();
        assert_eq!(*again.snapshot(), *r.snapshot());
        assert!(again.held());
        // PTPL off: the file says so, and a restart starts empty.
        r.set_ptpl(false).unwrap();
        let again = Reservations::with_ptpl_file(&path).unwrap();
        assert_eq!(*again.snapshot(), ResvState::default());
        assert!(!again.held());
        // A damaged file is an error naming it.
        std::fs::write(&path, b"{\"ptpl\": true, \"rtype\": 9}").unwrap();
        let e = Reservations::with_ptpl_file(&path).unwrap_err();
        assert!(e.contains("ns1.json") && e.contains("rtype 9"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
